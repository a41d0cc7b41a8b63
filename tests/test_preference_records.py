"""Preference records in, training pairs out: `PreferencePair.from_record` and `preference_pairs=` (issue 13)."""

import json

import pytest
import torch
from datasets import Dataset

from trl_marl import MADPOConfig, MADPOIterConfig, MADPOIterTrainer, MADPOTrainer, MARLHFConfig, MARLHFTrainer
from trl_marl.trainers.preference import PreferencePair
from trl_marl.trainers.preference.round_files import read_round_file


def letters_reward(c1, c2):
    return [float(sum(ch in "aeiou" for ch in a + b)) for a, b in zip(c1, c2)]


RECORD = {
    "prompts": ["Write about rain.", "Edit about rain."],
    "winner_completions": ["the rain", "a rain"],
    "loser_completions": ["the sun", "sun"],
    "winner_reward": 0.9,
    "loser_reward": 0.1,
    "candidate_reward_mean": 0.5,
}


@pytest.fixture
def madpo(make_args, items, tiny_path):
    def build(pairs=None, cls=MADPOTrainer, cfg=MADPOConfig, **kw):
        kw = {"preference_num_candidates": 3, "max_steps": 1, "train_batch_size": 2, **kw}
        args = make_args(cfg, **kw)
        return cls(
            model=tiny_path,
            reward_funcs=letters_reward,
            args=args,
            train_dataset=items,
            **({"preference_pairs": pairs} if pairs is not None else {}),
        )

    return build


def test_from_record_tokenizes_as_the_trainer(madpo):
    t = madpo()
    pair = t.pair_from_record(RECORD)
    for i in range(2):
        assert torch.equal(pair.prompt_ids[i], t.tokenize_prompt(i, RECORD["prompts"][i]))
        body = t.tokenizers[i](RECORD["winner_completions"][i], add_special_tokens=False)["input_ids"]
        assert pair.winner_ids[i].tolist() == [*body, t.tokenizers[i].eos_token_id]
    # the recorded ending wins: a completion cut at max_new_tokens gets no EOS
    cut = {**RECORD, "winner_eos": [None, None], "loser_eos": ["<|endoftext|>", "<|endoftext|>"]}
    pair = t.pair_from_record(cut)
    assert pair.winner_ids[0].tolist() == t.tokenizers[0]("the rain", add_special_tokens=False)["input_ids"]
    assert pair.to_record()["winner_eos"] == [None, None]
    # chat messages as prompts are rendered with the agent's chat template
    msgs = {**RECORD, "prompts": [[{"role": "user", "content": "hi"}]] * 2}
    pair = t.pair_from_record(msgs)
    assert pair.prompts[0].startswith("<|im_start|>user") and pair.prompts[0].endswith("assistant\n")
    with pytest.raises(ValueError, match="one entry per agent"):
        t.pair_from_record({**RECORD, "prompts": ["only one"]})
    with pytest.raises(ValueError, match="missing"):
        t.pair_from_record({"prompts": RECORD["prompts"]})


def test_a_record_with_invalid_unicode_tokenizes_as_replacement_characters(madpo):
    # old code: TypeError (TextEncodeInput must be Union[...]) tokenizing the prompt
    t = madpo()
    bad = {**RECORD, "prompts": ["Write about \ud800.", "Edit."], "winner_completions": ["the \udfff rain", "a"]}
    good = {**bad, "prompts": ["Write about \ufffd.", "Edit."], "winner_completions": ["the \ufffd rain", "a"]}
    pair, expected = t.pair_from_record(bad), t.pair_from_record(good)
    assert torch.equal(pair.prompt_ids[0], expected.prompt_ids[0])
    assert torch.equal(pair.prompt_ids[0], t.tokenize_prompt(0, "Write about \ud800."))
    assert torch.equal(pair.winner_ids[0], expected.winner_ids[0])


@pytest.mark.parametrize("form", ["records", "dataset", "pairs_without_ids", "round_file"])
def test_preference_pairs_accepts_records_pairs_and_datasets(madpo, form):
    records = [RECORD, {**RECORD, "winner_reward": 0.7}]
    given = {
        "records": records,
        "dataset": Dataset.from_list(records),
        "pairs_without_ids": [PreferencePair(**r) for r in records],
        "round_file": {"iteration": 1, "num_pairs": 2, "pairs": records},
    }[form]
    t = madpo(given)
    assert len(t.pairs) == 2 and all(len(p.winner_ids) == 2 for p in t.pairs)
    t.train()
    assert t.state.global_step == 1


def test_round_files_of_one_run_train_another_both_ways(madpo, make_args, items, tiny_path, tmp_path):
    # an iterative run's round file -> MADPO and MARLHF of another run
    it = madpo(cls=MADPOIterTrainer, cfg=MADPOIterConfig, num_rounds=1, max_steps=-1)
    it.train()
    rounds = read_round_file(it.rounds.stored[0]["path"])
    assert rounds["pairs"] and all("winner_eos" in r for r in rounds["pairs"])
    exact = list(it.rounds._current_pairs.values())
    again = [it.pair_from_record(p.to_record()) for p in exact]
    for a, b in zip(exact, again):
        for i in range(2):  # how each completion ended survives the file: same last token when it had an EOS
            for x, y, end in ((a.winner_ids[i], b.winner_ids[i], a.winner_eos[i]),):
                assert (end is None) == (int(x[-1]) not in it.eos_ids[i])
                if end is not None:
                    assert int(y[-1]) == int(x[-1])
    m = madpo(rounds)
    assert len(m.pairs) == rounds["num_pairs"]
    m.train()
    args = make_args(MARLHFConfig, preference_num_candidates=3, max_steps=1, eval_num_samples=2)
    rl = MARLHFTrainer(
        model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=items, preference_pairs=rounds
    )
    rl.fit_reward_model()
    # the other way: a MADPO run's collected pairs, stored as records, train another run
    src = madpo()
    collected = src.collect_preference_pairs()
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps([p.to_record() for p in collected]))
    dst = madpo(json.loads(path.read_text()))
    assert [p.to_record() for p in dst.pairs] == [p.to_record() for p in collected]
    dst.train()
