"""Preference data you already have (issue 30 point 1, issue 31 points 6 and 7): TRL's preference format with one set
of columns per agent trains MADPO and MARLHF's reward model on exactly its pairs, without reward_funcs; data that
looks like preference data but does not match the scheme is refused; every pair is checked from every source."""

import json
import logging
import math
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset, DatasetDict
from trl.data_utils import extract_prompt, maybe_apply_chat_template

from trl_marl import MADPOConfig, MADPOIterConfig, MADPOIterTrainer, MADPOTrainer, MARLHFConfig, MARLHFTrainer
from trl_marl.checkpointing.state_files import CorruptedStateError
from trl_marl.trainers.preference import JointRewardModel, PreferencePair
from trl_marl.trainers.preference.pairs import to_dataset
from trl_marl.trainers.preference.round_files import StoredRound, write_round_file

PAIR_LOGGER = "trl_marl.trainers.preference.madpo"


def rows(count=4, chosen=("good {j}", "fine {j}"), rejected=("bad {j}", "poor {j}")):
    """Rows of the one-dataset scheme for two agents: prompt_i / chosen_i / rejected_i."""
    return [
        {
            "prompt_1": f"Write about topic {j}.",
            "chosen_1": chosen[0].format(j=j),
            "rejected_1": rejected[0].format(j=j),
            "prompt_2": f"Edit about topic {j}.",
            "chosen_2": chosen[1].format(j=j),
            "rejected_2": rejected[1].format(j=j),
        }
        for j in range(count)
    ]


def per_agent(data: list[dict], agent: int) -> Dataset:
    """Agent `agent`'s side of `rows()` as one TRL preference dataset (prompt, chosen, rejected)."""
    return Dataset.from_list([{k: r[f"{k}_{agent}"] for k in ("prompt", "chosen", "rejected")} for r in data])


@pytest.fixture
def build(make_args, tiny_path):
    """`build(cls=MADPOTrainer, cfg=MADPOConfig, **trainer_kwargs, config=dict)`: a trainer for the tiny team, no
    reward_funcs unless given."""

    def make(cls=MADPOTrainer, cfg=MADPOConfig, config=None, **kwargs):
        defaults = {"train_batch_size": 2, "max_completion_length": 8} if cfg is not MARLHFConfig else {}
        return cls(model=tiny_path, args=make_args(cfg, **{**defaults, **(config or {})}), **kwargs)

    return make


def letters_reward(c1, c2):
    return [float(sum(ch in "aeiou" for ch in a + b)) for a, b in zip(c1, c2)]


# ---------------------------------------------------------------- training on exactly the given pairs
def _rarest_text(trainer, prompts: list[str], repeat: int = 6) -> str:
    """`repeat` copies of the token agent 1 is least likely to emit after `prompts` (a non-special token that
    tokenizes back to itself): a completion it would never sample."""
    tok, model = trainer.tokenizers[0], trainer.team.agents[0]
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        logp = model(**enc).logits[:, -1].log_softmax(-1).mean(0)
    for t in logp.argsort().tolist():
        text = tok.decode([t]) * repeat
        if t not in tok.all_special_ids and tok(text, add_special_tokens=False)["input_ids"] == [t] * repeat:
            return text
    raise AssertionError("no round-tripping token")


def test_madpo_trains_on_a_preference_dataset_it_would_never_sample(build, monkeypatch):
    probe = build(train_dataset=Dataset.from_list(rows()))
    never = _rarest_text(probe, [r["prompt_1"] for r in rows()])
    data = rows(8, chosen=(never, never), rejected=("bad {j}", "poor {j}"))
    t = build(
        train_dataset=Dataset.from_list(data), config={"max_steps": 4, "train_batch_size": 4, "learning_rate": 1e-2}
    )
    # exactly the dataset's pairs, in its order, and nothing sampled to get them
    assert [p.winner_completions for p in t.pairs] == [[r["chosen_1"], r["chosen_2"]] for r in data]
    assert [p.loser_completions for p in t.pairs] == [[r["rejected_1"], r["rejected_2"]] for r in data]
    assert t.train_dataset == [{"prompt_1": r["prompt_1"], "prompt_2": r["prompt_2"]} for r in data]

    def no_sampling(*args, **kwargs):
        raise AssertionError("MADPO sampled completions while training on given pairs")

    monkeypatch.setattr(t, "generate", no_sampling)
    chosen, rejected, _, _ = t.preference_logps(t.team, t.pairs)
    assert chosen.sum(0).max() < math.log(1e-20)  # the team would never sample these joint responses
    t.train()
    assert t.state.global_step == 4
    after_c, after_r, _, _ = t.preference_logps(t.team, t.pairs)
    assert after_c.sum(0).mean() > chosen.sum(0).mean() + 1.0  # the chosen completions got likelier
    assert (after_c - after_r).sum(0).mean() > (chosen - rejected).sum(0).mean() + 1.0  # and the margin grew


def test_marlhf_reward_model_fits_a_preference_dataset_without_reward_funcs(build, monkeypatch):
    data = rows(8, chosen=("yes yes {j}", "ok ok {j}"), rejected=("no", "nope"))
    t = build(
        MARLHFTrainer,
        MARLHFConfig,
        train_dataset=Dataset.from_list(data),
        config={"reward_learning_rate": 1e-3, "reward_num_train_epochs": 3, "reward_train_batch_size": 4},
    )
    assert t.train_dataset == [{"prompt_1": r["prompt_1"], "prompt_2": r["prompt_2"]} for r in data]  # RL prompts

    def margin(rm, pairs):
        w = rm.score([p.prompts for p in pairs], [p.winner_completions for p in pairs])
        lo = rm.score([p.prompts for p in pairs], [p.loser_completions for p in pairs])
        return sum(a - b for a, b in zip(w, lo)) / len(w)

    seen = {}
    fit = JointRewardModel.fit

    def spy(self, pairs, **kwargs):  # the fresh reward model, before its fit
        seen["pairs"] = [(p.winner_completions, p.loser_completions) for p in pairs]
        seen["margin"] = margin(self, pairs)
        return fit(self, pairs, **kwargs)

    monkeypatch.setattr(JointRewardModel, "fit", spy)
    rm = t.fit_reward_model()
    assert seen["pairs"] == [([r["chosen_1"], r["chosen_2"]], [r["rejected_1"], r["rejected_2"]]) for r in data]
    assert margin(rm, t.pairs) > seen["margin"] + 0.5


def test_implicit_prompt_form_is_read_as_trl_reads_it(build):
    data = [
        {
            "chosen_1": f"Question {j}: the answer is yes",
            "rejected_1": f"Question {j}: the answer is no",
            "chosen_2": f"Check {j} done",
            "rejected_2": f"Check {j} failed",
        }
        for j in range(2)
    ]
    t = build(train_dataset=Dataset.from_list(data))
    for row, pair in zip(data, t.pairs):
        for i in (1, 2):
            trl = extract_prompt({"chosen": row[f"chosen_{i}"], "rejected": row[f"rejected_{i}"]})
            assert pair.prompts[i - 1] == trl["prompt"]
            assert (pair.winner_completions[i - 1], pair.loser_completions[i - 1]) == (trl["chosen"], trl["rejected"])
    assert t.pairs[0].prompts[0] == "Question 0: the answer is"
    assert torch.equal(t.pairs[0].prompt_ids[0], t.tokenize_prompt(0, "Question 0: the answer is"))


def test_conversational_form_is_rendered_with_each_agents_chat_template(build, tiny_tokenizer):
    data = [
        {
            "prompt_1": [{"role": "user", "content": f"Agent 1 task {j}"}],
            "chosen_1": [{"role": "assistant", "content": f"yes {j}"}],
            "rejected_1": [{"role": "assistant", "content": f"no {j}"}],
            # agent 2: conversational with an implicit prompt (the shared first message)
            "chosen_2": [{"role": "user", "content": f"Agent 2 task {j}"}, {"role": "assistant", "content": "ok"}],
            "rejected_2": [{"role": "user", "content": f"Agent 2 task {j}"}, {"role": "assistant", "content": "ko"}],
        }
        for j in range(2)
    ]
    t = build(train_dataset=Dataset.from_list(data))
    pair = t.pairs[1]
    for i, messages in enumerate([[{"role": "user", "content": f"Agent {i} task 1"}] for i in (1, 2)]):
        trl = maybe_apply_chat_template({"prompt": messages}, tiny_tokenizer)["prompt"]  # TRL's own rendering
        assert pair.prompts[i] == trl and pair.prompt_messages[i] == messages
        assert torch.equal(pair.prompt_ids[i], t.tokenize_prompt(i, pair.prompts[i]))
    assert (pair.winner_completions, pair.loser_completions) == (["yes 1", "ok"], ["no 1", "ko"])
    # a conversational completion is ONE assistant message
    bad = [{**data[0], "chosen_1": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}]
    with pytest.raises(ValueError, match=r"row 0: agent 1's chosen \(chosen_1\) holds the messages"):
        build(train_dataset=Dataset.from_list(bad))


@pytest.mark.parametrize("route", ["train_dataset=[ds1, ds2]", "preference_pairs=[ds1, ds2]", "preference_pairs=ds"])
def test_every_route_of_a_preference_dataset_trains(build, items, route):
    data = rows(4)
    given = {
        "train_dataset=[ds1, ds2]": {"train_dataset": [per_agent(data, 1), per_agent(data, 2)]},
        "preference_pairs=[ds1, ds2]": {"preference_pairs": [per_agent(data, 1), per_agent(data, 2)]},
        "preference_pairs=ds": {"preference_pairs": Dataset.from_list(data), "train_dataset": items},
    }[route]
    t = build(**given)
    # row j of each per-agent dataset is pair j
    assert [p.winner_completions for p in t.pairs] == [[r["chosen_1"], r["chosen_2"]] for r in data]
    assert [p.prompts for p in t.pairs] == [[r["prompt_1"], r["prompt_2"]] for r in data]
    t.train()
    assert t.state.global_step == 1


def test_exported_datasets_train_as_given(build):
    pairs = [
        PreferencePair([f"task {j}", f"edit {j}"], [f"good {j}", "yes"], [f"bad {j}", "no"], 1.0, 0.0, 0.5)
        for j in range(3)
    ]
    for given in (to_dataset(pairs), [to_dataset(pairs, agent=i) for i in range(2)]):
        t = build(train_dataset=given)
        assert [(p.prompts, p.winner_completions, p.loser_completions) for p in t.pairs] == [
            (p.prompts, p.winner_completions, p.loser_completions) for p in pairs
        ]


def test_exported_dataset_holds_invalid_unicode_as_replacement_characters():
    # old code: UnicodeEncodeError ('utf-8' codec can't encode character '\ud800': surrogates not allowed) from
    # pyarrow, building the dataset
    pair = PreferencePair(["task \udfff", "café 中文"], ["good \ud800", "😀"], ["bad", "no"], 1.0, 0.0, 0.5)
    joint, agent_1 = to_dataset([pair]), to_dataset([pair], agent=0)
    assert joint[0]["agent_prompts"] == ["task \ufffd", "café 中文"]
    assert joint[0]["agent_chosen"] == ["good \ufffd", "😀"] and "good \ufffd" in joint[0]["chosen"]
    assert agent_1[0]["prompt"] == "task \ufffd" and agent_1[0]["chosen"] == "good \ufffd"


# ---------------------------------------------------------------- data that does not match: clear errors
@pytest.mark.parametrize(
    "columns, message",
    [
        # TRL's one-model columns for a team: today MADPO silently samples its own pairs instead
        (
            {"prompt": "p", "chosen": "a", "rejected": "b"},
            r"has the columns \['prompt', 'chosen', 'rejected'\]: TRL's preference columns for ONE model, but a team "
            r"of 2 agents needs one set per agent: .*prompt_1, chosen_1, rejected_1, prompt_2, chosen_2, rejected_2",
        ),
        ({"chosen_1": "a", "rejected_1": "b", "chosen_2": "c"}, r"\['rejected_2'\] missing; expected one dataset"),
        (
            {f"{s}_{i}": "x" for s in ("chosen", "rejected") for i in (1, 2, 3)},
            r"columns for agent\(s\) \[3\], but num_agents=2",
        ),
        (
            {"chosen": "a", "rejected": "b", "chosen_1": "a", "rejected_1": "b"},
            "both unsuffixed and per-agent",
        ),
        ({"agent_chosen": ["a", "b"], "agent_rejected": ["c", "d"]}, r"missing \['agent_prompts'\]"),
    ],
)
def test_preference_like_data_that_does_not_match_the_scheme_is_refused(build, columns, message):
    with pytest.raises(ValueError, match=message):
        build(reward_funcs=letters_reward, train_dataset=Dataset.from_list([columns] * 2))


def test_per_agent_datasets_must_align(build):
    data = rows(4)
    with pytest.raises(ValueError, match=r"same number of rows \(row j of each is pair j\), got \[4, 3\]"):
        build(train_dataset=[per_agent(data, 1), per_agent(data[:3], 2)])
    with pytest.raises(
        ValueError, match="a list of 3 datasets, read as one preference dataset per agent, but num_agents=2"
    ):
        build(train_dataset=[per_agent(data, 1)] * 3)
    with pytest.raises(ValueError, match=r"train_dataset\[1\] has the columns \['prompt'\].*ONE agent's"):
        build(train_dataset=[per_agent(data, 1), Dataset.from_list([{"prompt": "p"}] * 4)])


def test_routes_that_cannot_work_say_which_does(build, items):
    data = Dataset.from_list(rows(2))
    with pytest.raises(ValueError, match=r"DatasetDict with the splits \['train'\]: pass one split"):
        build(train_dataset=DatasetDict(train=data))
    with pytest.raises(ValueError, match="preference_pairs is given too: pass the pairs one way"):
        build(train_dataset=data, preference_pairs=data)
    with pytest.raises(ValueError, match="formatters= turns task items into prompts"):
        build(train_dataset=data, formatters=lambda item: item["prompt_1"])
    with pytest.raises(ValueError, match="eval_dataset is given but reward_funcs is not"):
        build(train_dataset=data, eval_dataset=data)
    with pytest.raises(
        ValueError, match=r"reward_funcs is required: MADPOTrainer collects .* pass them as train_dataset"
    ):
        build(train_dataset=items)
    with pytest.raises(
        ValueError, match="MADPOIterTrainer collects its preference pairs from the task items every round"
    ):
        build(
            MADPOIterTrainer,
            MADPOIterConfig,
            reward_funcs=letters_reward,
            train_dataset=data,
            config={"num_rounds": 1},
        )
    # today the iterative trainers ignore preference_pairs= without a word
    with pytest.raises(ValueError, match="preference_pairs is given: pass task items as train_dataset"):
        build(
            MADPOIterTrainer,
            MADPOIterConfig,
            reward_funcs=letters_reward,
            train_dataset=items,
            preference_pairs=data,
            config={"num_rounds": 1},
        )
    with pytest.raises(ValueError, match="a fitted reward model is given"):
        build(MARLHFTrainer, MARLHFConfig, train_dataset=data, config={"reward_model_path": "/nonexistent"})
    # a preference eval_dataset is read as the training data is, and scored with reward_funcs
    t = build(train_dataset=data, eval_dataset=data, reward_funcs=letters_reward)
    assert t.eval_dataset == t.train_dataset


def test_an_empty_pair_list_names_the_problem_and_the_fix(build, items):
    for empty in ([], Dataset.from_list(rows(2)).select([])):
        with pytest.raises(
            ValueError, match=r"preference_pairs is empty: there is no preference pair to train on.*leave"
        ):
            build(reward_funcs=letters_reward, train_dataset=items, preference_pairs=empty)


def test_without_pairs_or_reward_the_error_points_at_the_preference_route(build, items):
    with pytest.raises(ValueError, match="docs/offline-preference.md"):
        build(train_dataset=items)


# ---------------------------------------------------------------- every pair checked, from every source
def record(j: int, chosen: tuple[str, str] | None = None) -> dict:
    """A pair record for two agents (`PreferencePair.to_record()`'s shape); `chosen` defaults to a good answer."""
    loser = [f"bad {j}", f"poor {j}"]
    return {
        "prompts": [f"Write about topic {j}.", f"Edit about topic {j}."],
        "winner_completions": list(chosen or (f"good {j}", f"fine {j}")),
        "loser_completions": loser,
        "winner_reward": 1.0,
        "loser_reward": 0.0,
    }


def test_pairs_whose_chosen_equals_rejected_are_dropped_counted_and_move_nothing(build, items, caplog):
    good = [record(0), record(1)]
    same = [record(j, chosen=(f"bad {j}", f"poor {j}")) for j in (2, 3)]
    config = {"max_steps": 2, "train_batch_size": 2, "learning_rate": 1e-2}
    given = {"reward_funcs": letters_reward, "train_dataset": items, "config": config}
    clean = build(preference_pairs=good, **given)
    caplog.set_level(logging.WARNING, logger=PAIR_LOGGER)
    mixed = build(preference_pairs=[same[0], good[0], same[1], good[1]], **given)
    clean.train()
    mixed.train()
    for a, b in zip(clean.team.parameters(), mixed.team.parameters(), strict=True):
        assert torch.equal(a, b)  # today the identical pairs change the weights (Adam normalises their noise)
    assert [p.to_record() for p in mixed.pairs] == [p.to_record() for p in clean.pairs]
    assert (
        "dropped 2 of 4 preference pairs: 2 whose chosen equals rejected for every agent (pairs 0, 2)" in caplog.text
    )
    # only such pairs: nothing to train on, said at construction
    with pytest.raises(ValueError, match=r"preference_pairs: dropped 2 of 2 .* no pair left to train on"):
        build(preference_pairs=same, **given)


def test_empty_completions_are_dropped_and_counted(build, caplog):
    data = rows(3)
    data[1]["chosen_2"] = ""
    caplog.set_level(logging.WARNING, logger=PAIR_LOGGER)
    t = build(train_dataset=Dataset.from_list(data))
    assert len(t.pairs) == 2 and "1 with an empty completion (pairs 1)" in caplog.text
    # a trainer's record of a completion that stopped at once (its EOS recorded) is kept
    record = {**t.pairs[0].to_record(), "winner_completions": ["", "x"], "winner_eos": ["<|endoftext|>", None]}
    record["loser_eos"] = [None, None]
    assert (
        len(build(reward_funcs=letters_reward, train_dataset=[{"prompt": "p"}], preference_pairs=[record]).pairs) == 1
    )


def test_given_completions_cut_at_max_completion_length_are_counted(build, caplog):
    """Given pairs whose completions are longer than max_completion_length (8 here; TRL's DPO cuts at max_length,
    1024 by default) are cut to it: said once with the count (the old code cut them silently)."""
    caplog.set_level(logging.WARNING, logger=PAIR_LOGGER)
    build(train_dataset=Dataset.from_list(rows(3)))
    assert "longer than max_completion_length" not in caplog.text
    data = rows(3)
    data[1]["chosen_1"] = "a very long chosen completion " * 20
    data[2]["rejected_2"] = "and a long rejected one " * 20
    t = build(train_dataset=Dataset.from_list(data))
    assert len(t.pairs[1].winner_ids[0]) == 8
    assert "2 of the 12 given pairs' completions are longer than max_completion_length=8 tokens" in caplog.text


@pytest.mark.parametrize(
    "change, message",
    [
        ({"chosen_2": None}, r"train_dataset row 1: agent 2's chosen \(chosen_2\) is None, not a string"),
        ({"winner_reward": 0.1, "loser_reward": 0.9}, "row 1: winner_reward 0.1 is below loser_reward 0.9"),
        (
            {"winner_reward": float("nan"), "loser_reward": 0.0},
            "row 1: winner_reward is nan: recorded rewards must be finite",
        ),
        ({"winner_reward": "0.9", "loser_reward": 0.1}, r"row 1: winner_reward is '0.9' \(str\), not a number"),
    ],
)
def test_bad_rows_are_refused_naming_row_agent_and_field(build, change, message):
    data = [{**r, "winner_reward": 1.0, "loser_reward": 0.0} for r in rows(2)]
    data[1].update(change)
    with pytest.raises(ValueError, match=message):
        build(train_dataset=data)  # a list of dict rows, as task items may be


@pytest.mark.parametrize(
    "change, message",
    [
        ({"loser_completions": ["x", 3]}, r"preference_pairs\[1\]: agent 2's rejected completion is 3 \(int\)"),
        ({"winner_reward": 0.0, "loser_reward": float("inf")}, r"preference_pairs\[1\]: loser_reward is inf"),
        ({"prompts": ["p", None]}, r"preference_pairs\[1\]: agent 2's prompt is None"),
        (
            {"winner_completions": ["a"]},
            r"preference_pairs\[1\]: record\['winner_completions'\] must be a list with one",
        ),
    ],
)
def test_bad_records_and_pairs_are_refused_naming_their_index(build, items, change, message):
    record = {
        "prompts": ["p", "q"],
        "winner_completions": ["a", "b"],
        "loser_completions": ["c", "d"],
        "winner_reward": 1.0,
        "loser_reward": 0.0,
    }
    as_records = [record, {**record, **change}]
    as_pairs = [PreferencePair(**r, candidate_reward_mean=0.5) for r in as_records]
    for given in (as_records, as_pairs):
        with pytest.raises(ValueError, match=message):
            build(reward_funcs=letters_reward, train_dataset=items, preference_pairs=given)


def test_a_swapped_round_file_is_refused_on_replay_naming_file_and_pair(tmp_path):
    record = {
        "prompts": ["p", "q"],
        "winner_completions": ["a", "b"],
        "loser_completions": ["c", "d"],
        "winner_reward": 0.9,
        "loser_reward": 0.1,
        "candidate_reward_mean": 0.5,
    }
    swapped = {**record, "winner_reward": 0.1, "loser_reward": 0.9}
    path = str(tmp_path / "iteration_0001.json")
    write_round_file(path, 1, [record, swapped])
    with pytest.raises(CorruptedStateError, match=rf"{path}: pair 1: winner_reward 0.1 is below loser_reward 0.9"):
        StoredRound(path, 2, 1, 2)[0]  # what a replay mode reads
    data = json.loads((tmp_path / "iteration_0001.json").read_text())
    assert data["pairs"][1] == swapped  # written as given: the check is on reading


def test_api_comparator_drops_candidates_with_an_empty_completion(caplog):
    from trl_marl.plugins.comparators import APIComparator

    comp = APIComparator(SimpleNamespace(num_agents=2), url="http://127.0.0.1:1/x")
    comp.client.close()
    comp.client = SimpleNamespace(
        generate=lambda prompts, n, **kw: [["ok", ""] if k == 0 else ["ok", "fine"] for k in range(len(prompts))],
        close=lambda: None,
    )
    args = SimpleNamespace(max_completion_length=4, temperature=1.0, top_p=1.0, top_k=0)
    caplog.set_level(logging.WARNING, logger="trl_marl.plugins.comparators")
    joint = comp.generate([{"prompt": "x"}], [["a"], ["b"]], 2, SimpleNamespace(args=args))
    # agent 1's completion of candidate 1 is empty: that joint candidate is dropped, never compared
    assert joint == [[["ok", "ok"], None]]
    assert comp.empty_completions == 1 and comp.state_dict()["empty_completions"] == 1
    assert "dropped 1 joint candidate(s) with an empty completion" in caplog.text
