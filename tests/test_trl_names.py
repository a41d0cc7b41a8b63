"""TRL's names as the primary API: trainer arguments, config fields, reward functions (`trl.rewards` included)."""

import sys
import types
import warnings

import pytest
import torch
from conftest import completions_read_as
from datasets import Dataset
from trl.rewards import think_format_reward

from trl_marl import MADPOConfig, MAGRPOConfig, MAGRPOTrainer
from trl_marl.rewards import RewardFunction, lift, team_reward, weighted_sum
from trl_marl.utils.deprecation import TrlMarlFutureWarning


def cfg(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        num_agents=2,
        num_generations=2,
        rollout_buffer_size=2,
        max_completion_length=4,
        report_to="none",
        save_strategy="no",
        max_steps=1,
    )
    return MAGRPOConfig(**{**base, **kw})


ITEMS = Dataset.from_list([{"prompt": f"p{i}", "solution": f"s{i}"} for i in range(4)])


def count_a(a, b):
    return [float(x.count("a") + y.count("a")) for x, y in zip(a, b)]


# ---------------------------------------------------------------- config fields
def test_config_aliases_warn_and_mirror(tmp_path):
    with pytest.warns(TrlMarlFutureWarning, match="`max_new_tokens` is deprecated; use `max_completion_length`"):
        c = MAGRPOConfig(output_dir=str(tmp_path), max_new_tokens=7, report_to="none")
    assert c.max_completion_length == 7 and c.max_new_tokens == 7
    with pytest.warns(TrlMarlFutureWarning, match="`dpo_beta` is deprecated; use `beta`"):
        d = MADPOConfig(output_dir=str(tmp_path), dpo_beta=0.3, report_to="none")
    assert d.beta == 0.3 and d.dpo_beta == 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the primary names: no warning of ours
        c = MAGRPOConfig(output_dir=str(tmp_path), max_completion_length=9, report_to="none")
    assert c.max_new_tokens == 9


def test_config_alias_and_name_disagreeing_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="max_new_tokens=7 and max_completion_length=9 disagree.*set only"):
        MAGRPOConfig(output_dir=str(tmp_path), max_new_tokens=7, max_completion_length=9)
    with pytest.raises(ValueError, match="beta must be > 0"):
        MADPOConfig(output_dir=str(tmp_path), beta=0.0)


def test_per_device_train_batch_size_means_train_batch_size_or_is_refused(tmp_path):
    """It used to be overwritten silently: TrainingArguments' default 8 became 4 while 16 was refused."""
    for value in (8, 16):  # neither divides rollout_buffer_size=4: refused, never overwritten
        with pytest.raises(
            ValueError, match=f"per_device_train_batch_size={value} .*must divide rollout_buffer_size=4"
        ):
            MAGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=value, rollout_buffer_size=4)
    alone = MAGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, rollout_buffer_size=4)
    assert alone.per_device_train_batch_size == alone.train_batch_size == 2  # it means what it says
    unset = MAGRPOConfig(output_dir=str(tmp_path), train_batch_size=2, rollout_buffer_size=4)
    assert unset.per_device_train_batch_size == 2
    with pytest.raises(ValueError, match="per_device_train_batch_size=2 and train_batch_size=4 disagree"):
        MAGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, train_batch_size=4)
    with pytest.raises(ValueError, match="preference pairs per step"):
        MADPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=3, train_batch_size=4)
    assert MADPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8).train_batch_size == 8


def test_help_and_docs_agree_on_per_device_train_batch_size():
    from pathlib import Path

    from trl_marl.cli.recipes import make_parser

    help_text = " ".join(make_parser("magrpo").format_help().split())
    start = help_text.index("--per_device_train_batch_size PER_DEVICE_TRAIN_BATCH_SIZE, ")
    flag_help = help_text[start : help_text.index("--num_train_epochs NUM_TRAIN_EPOCHS,", start)]
    assert "the same as train_batch_size" in flag_help and flag_help.rstrip().endswith("(default: None)"), flag_help
    docs = (Path(__file__).resolve().parents[1] / "docs" / "comparison.md").read_text()
    assert "a value that differs from `train_batch_size` is refused (never overwritten)" in docs


# ---------------------------------------------------------------- trainer arguments
def test_trl_positional_order_and_names(tmp_path, tiny_path, tiny_tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        t = MAGRPOTrainer(tiny_path, count_a, cfg(tmp_path), ITEMS, None, tiny_tokenizer)
    assert t.reward.func is count_a and t.tokenizers[0] is tiny_tokenizer and len(t.team.agents) == 2
    t2 = MAGRPOTrainer(model=[tiny_path, tiny_path], reward_funcs=count_a, args=cfg(tmp_path), train_dataset=ITEMS)
    assert t2.agent_names == [tiny_path, tiny_path]


def test_old_trainer_names_warn(tmp_path, tiny_path, tiny_tokenizer):
    with pytest.warns(TrlMarlFutureWarning, match="`agent_model=` is deprecated; use `model=`"):
        MAGRPOTrainer(agent_model=tiny_path, reward_funcs=count_a, args=cfg(tmp_path), train_dataset=ITEMS)
    with pytest.warns(TrlMarlFutureWarning, match="`agents=` is deprecated; use `model=`"):
        t = MAGRPOTrainer(agents=[tiny_path, tiny_path], reward_funcs=count_a, args=cfg(tmp_path), train_dataset=ITEMS)
    assert t.agent_names == [tiny_path, tiny_path]
    with pytest.warns(TrlMarlFutureWarning, match="`reward_func=` is deprecated; use `reward_funcs=`"):
        MAGRPOTrainer(model=tiny_path, reward_func=count_a, args=cfg(tmp_path), train_dataset=ITEMS)
    with pytest.warns(TrlMarlFutureWarning, match="`tokenizer=` is deprecated; use `processing_class=`"):
        t = MAGRPOTrainer(
            model=tiny_path, reward_funcs=count_a, args=cfg(tmp_path), train_dataset=ITEMS, tokenizer=tiny_tokenizer
        )
    assert t.tokenizers[0] is tiny_tokenizer
    with pytest.raises(TypeError, match="pass model= .* or its deprecated alias agent_model=, not both"):
        MAGRPOTrainer(model=tiny_path, agent_model=tiny_path, reward_funcs=count_a, args=cfg(tmp_path),
                      train_dataset=ITEMS)  # fmt: skip


def test_unknown_trainer_keyword_is_named(tmp_path):
    """Only the earlier names are translated; any other unknown keyword is a TypeError naming it, before any model
    loads (the model path does not exist)."""
    with pytest.raises(TypeError, match="MAGRPOTrainer.__init__\\(\\) got an unexpected keyword argument 'rewards'"):
        MAGRPOTrainer(model="/nonexistent/model", rewards=count_a, args=cfg(tmp_path), train_dataset=ITEMS)


def test_old_names_reach_trainers_with_their_own_arguments(tmp_path, tiny_path):
    """A trainer with arguments of its own (here the centralized one's `adapter`) gets the earlier names translated
    by `MultiAgentTrainer.__init__` too, positional TRL order included."""
    from trl_marl import CentralizedMAGRPOTrainer

    with pytest.warns(FutureWarning, match="`(agent_model|reward_func)=` is deprecated"):
        t = CentralizedMAGRPOTrainer(
            agent_model=tiny_path, reward_func=count_a, args=cfg(tmp_path), train_dataset=ITEMS
        )
    assert t.num_roles == 2 and t.num_agents == 1
    t2 = CentralizedMAGRPOTrainer(tiny_path, count_a, cfg(tmp_path), ITEMS)
    assert t2.num_agents == 1 and t2.reward.name


def test_reward_funcs_list_with_reward_weights(tmp_path, tiny_path):
    def n_chars(a, b):
        return [float(len(x) + len(y)) for x, y in zip(a, b)]

    args = cfg(tmp_path, reward_weights=[2.0, -1.0])
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=[count_a, n_chars], args=args, train_dataset=ITEMS)
    raw = t.reward.raw([["aa", "b"], ["a", "cc"]])
    assert raw.tolist() == [2 * 3 - 3, 2 * 0 - 3]
    assert t.reward.last_components["count_a"].tolist() == [3.0, 0.0]
    assert t.reward.last_components["test_reward_funcs_list_with_reward_weights.<locals>.n_chars"].tolist() == [3, 3]


@pytest.mark.parametrize("trainer", ["MAGRPOTrainer", "MAPPOTrainer", "MADPOTrainer", "MARLHFTrainer"])
@pytest.mark.parametrize(
    "reward_funcs, weights, message",
    [
        ("one", [1.0, 2.0], r"reward_weights has 2 entries for 1 reward function \(reward_funcs is one function\)"),
        ("one", [], r"reward_weights has 0 entries for 1 reward function"),
        ("two", [1.0], r"reward_weights has 1 entries for 2 reward functions"),
        ("two", [1.0, 2.0, 3.0], r"reward_weights has 3 entries for 2 reward functions"),
    ],
)
def test_reward_weights_of_another_length_than_reward_funcs_fail_at_construction(
    make_args, trainer, reward_funcs, weights, message
):
    """As TRL's GRPOTrainer: one weight per reward function, checked when the trainer is built (before any model
    loads: the model path does not exist). On the old code a single function took any weights and trained on it
    unweighted."""
    import trl_marl

    config = getattr(trl_marl, trainer.replace("Trainer", "Config"))
    extra = {"critic_model": "/nonexistent/critic"} if trainer == "MAPPOTrainer" else {}
    funcs = count_a if reward_funcs == "one" else [count_a, count_a]
    with pytest.raises(ValueError, match=message):
        getattr(trl_marl, trainer)(
            model="/nonexistent/model/path",
            reward_funcs=funcs,
            args=make_args(config, reward_weights=weights),
            train_dataset=ITEMS,
            **extra,
        )


def test_one_reward_function_takes_its_one_weight(tmp_path, tiny_path):
    """TRL weighs a single reward function too; the old code dropped its weight."""
    t = MAGRPOTrainer(
        model=tiny_path, reward_funcs=count_a, args=cfg(tmp_path, reward_weights=[2.0]), train_dataset=ITEMS
    )
    assert t.reward.raw([["aa", "b"], ["a", "cc"]]).tolist() == [6.0, 0.0]


def test_reward_weights_without_reward_funcs_fail_at_construction(make_args):
    """A preference trainer given pairs needs no reward_funcs; reward_weights then weigh nothing."""
    from trl_marl import MADPOTrainer

    pairs = Dataset.from_list(
        [
            {"prompt_1": "p", "chosen_1": "a", "rejected_1": "b", "prompt_2": "q", "chosen_2": "c", "rejected_2": "d"}
            for _ in range(2)
        ]
    )
    with pytest.raises(ValueError, match=r"reward_weights has 1 entries but no reward_funcs is given"):
        MADPOTrainer(
            model="/nonexistent/model/path", args=make_args(MADPOConfig, reward_weights=[1.0]), train_dataset=pairs
        )


def test_model_init_kwargs_that_are_not_a_json_object_name_the_field(tmp_path):
    """On the old code: a bare JSONDecodeError naming no field; a JSON list failed when the agents loaded."""
    with pytest.raises(ValueError, match=r"model_init_kwargs='\{dtype: float64\}' is not valid JSON \(.*\); write"):
        cfg(tmp_path, model_init_kwargs="{dtype: float64}")
    with pytest.raises(ValueError, match=r"model_init_kwargs must be a dict .*, got \[1\]"):
        cfg(tmp_path, model_init_kwargs="[1]")


def test_model_init_kwargs_reach_from_pretrained(tmp_path, tiny_path):
    t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=count_a,
        args=cfg(tmp_path, model_init_kwargs='{"dtype": "float64"}'),
        train_dataset=ITEMS,
    )
    assert all(next(a.parameters()).dtype == torch.float64 for a in t.team.agents)


# ---------------------------------------------------------------- reward conventions
def test_keyword_convention_gets_columns_and_both_views():
    seen = {}

    def f(prompts, completions, agent_completions, solution):
        seen.update(prompts=prompts, completions=completions, agent_completions=agent_completions, solution=solution)
        return [float(len(j[0]) + len(j[1])) for j in agent_completions]

    rf = RewardFunction(f, 2, column_names=["prompt", "solution"])
    rows = [{"prompt": "p0", "solution": "s0"}, {"prompt": "p1", "solution": "s1"}]
    out = rf.raw([["a", "bb"], ["ccc", "d"]], prompts=["p0", "p1"], batch_items=rows)
    assert out.tolist() == [4.0, 3.0]
    assert seen["completions"] == [["a", "bb"], ["ccc", "d"]]
    assert seen["agent_completions"] == [["a", "ccc"], ["bb", "d"]]
    assert seen["solution"] == ["s0", "s1"] and seen["prompts"] == ["p0", "p1"]


def test_team_reward_decorator_and_kwargs():
    @team_reward
    def g(completions, **kwargs):
        return [float(kwargs["solution"][j] == "s0") + len(completions) for j in range(len(completions[0]))]

    rf = RewardFunction(g, 3)
    rows = [{"solution": "s0"}, {"solution": "s1"}]
    assert rf.raw([["x", "y"]] * 3, batch_items=rows).tolist() == [4.0, 3.0]


def test_ambiguous_trl_style_signature_is_refused():
    """`f(completions, solution, **kw)` with 2 agents was silently called with agent 2's completions as
    `solution`."""

    def trl_style(completions, solution, **kwargs):
        return [1.0] * len(completions)

    with pytest.raises(TypeError, match="(?s)ambiguous.*accepted forms:.*agent_completions.*lift"):
        RewardFunction(trl_style, 2)
    with pytest.raises(TypeError, match="named like dataset columns"):
        RewardFunction(lambda answer, solution: [0.0], 2, column_names=["prompt", "solution"])
    with pytest.raises(TypeError, match="neither a keyword of the convention"):
        RewardFunction(lambda agent_completions, answer: [0.0], 2, column_names=["prompt"])
    # the existing positional forms stay unambiguous
    assert RewardFunction(lambda completions: [0.0], 2)._mode == "nested_list"
    assert RewardFunction(lambda a, b: [0.0], 2)._mode == "per_agent_args"


def test_trl_rewards_are_refused_raw_and_lifted_to_the_team():
    with pytest.raises(TypeError, match="TRL's per-completion rewards.*lift"):
        RewardFunction(think_format_reward, 2)
    good, bad = "<think>\nplan\n</think>\nanswer", "no tags"
    each = RewardFunction(lift(think_format_reward), 2)
    # think_format_reward gives 1 to the well-formed completion: the team reward is the mean over the agents
    assert each.raw([[good, bad, good], [good, good, bad]]).tolist() == [1.0, 0.5, 0.5]
    second = RewardFunction(lift(think_format_reward, agent=1), 2)
    assert second.raw([[good, bad], [bad, good]]).tolist() == [0.0, 1.0]
    summed = RewardFunction(lift(think_format_reward, combine="sum"), 2)
    assert summed.raw([[good], [good]]).tolist() == [2.0]
    assert lift(think_format_reward).__name__ == "think_format_reward"


def test_lift_passes_dataset_columns_to_a_user_per_completion_reward():
    def exact(completions, solution, **kwargs):
        return [float(c == s) for c, s in zip(completions, solution)]

    rf = RewardFunction(lift(exact, combine="max"), 2, column_names=["solution"])
    rows = [{"solution": "x"}, {"solution": "y"}]
    assert rf.raw([["x", "q"], ["q", "q"]], batch_items=rows).tolist() == [1.0, 0.0]


def test_weighted_sum_logs_components():
    rf = RewardFunction(weighted_sum([count_a, lift(think_format_reward, agent=0)], [1.0, 10.0]), 2)
    good = "<think>\nx\n</think>\ny"
    assert rf.raw([[good, "aa"], ["a", "b"]]).tolist() == [11.0, 2.0]
    assert set(rf.last_components) == {"count_a", "think_format_reward/agent_0"}
    with pytest.raises(ValueError, match="reward_weights has 1 entries for 2"):
        weighted_sum([count_a, count_a], [1.0])


# ---------------------------------------------------------------- TRL's metric names
def test_team_rollout_metrics_on_hand_computed_numbers():
    from types import SimpleNamespace as NS

    from trl_marl.trainers.metrics import rollout_num_tokens, team_rollout_metrics

    nodes = [NS(raw_rewards=torch.tensor([1.0, 3.0])), NS(raw_rewards=torch.tensor([[2.0, 2.0], [2.0, 2.0]]))]
    eos = 9
    samples = [
        NS(agent=0, completion_ids=torch.tensor([5, eos]), prompt_ids=torch.tensor([1, 2, 3])),
        NS(agent=0, completion_ids=torch.tensor([5, 6, 7, 8]), prompt_ids=torch.tensor([1])),  # clipped
        NS(agent=1, completion_ids=torch.tensor([eos]), prompt_ids=torch.tensor([1, 2])),
        NS(agent=1, completion_ids=torch.tensor([], dtype=torch.long), prompt_ids=torch.tensor([1])),  # clipped
    ]
    m = team_rollout_metrics(NS(nodes=nodes, samples=samples), [[eos], [eos]])
    assert m["reward"] == pytest.approx((1 + 3 + 2 + 2) / 4)
    assert m["reward_std"] == pytest.approx((1.0 + 0.0) / 2)  # population std per node, then the mean
    assert m["frac_reward_zero_std"] == 0.5
    assert m["completions/mean_length"] == pytest.approx(7 / 4)
    assert m["completions/min_length"] == 0 and m["completions/max_length"] == 4
    assert m["completions/clipped_ratio"] == 0.5
    assert rollout_num_tokens(NS(samples=samples)) == 7 + 7


def test_training_logs_trl_metric_names_and_the_completions_table(tmp_path, tiny_path, capsys):
    def n_chars(a, b):
        return [float(len(x) + len(y)) for x, y in zip(a, b)]

    args = cfg(
        tmp_path,
        max_steps=2,
        logging_steps=1,
        reference_kl_enabled=True,
        log_completions=True,
        num_completions_to_print=2,
        disable_tqdm=True,
    )
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=[count_a, n_chars], args=args, train_dataset=ITEMS)
    t.train()
    logs = [h for h in t.state.log_history if "loss" in h]
    for key in [
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "rewards/count_a/mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "kl",
        "num_tokens",
        "agent_1/kl",
    ]:
        assert key in logs[0], key
    assert logs[1]["num_tokens"] > logs[0]["num_tokens"] > 0  # cumulative, as in TRL
    assert logs[0]["kl"] == pytest.approx((logs[0]["agent_1/kl"] + logs[0]["agent_2/kl"]) / 2)
    out = capsys.readouterr().out
    assert "Step 1" in out and "reward" in out  # TRL's rich table of prompts / completions


def test_completions_table_shows_invalid_unicode_as_replacement_characters(tmp_path, tiny_path, capsys):
    # old code: UnicodeEncodeError ('utf-8' codec can't encode character '\ud800': surrogates not allowed) from
    # rich's console, in TRL's print_prompt_completions_sample called by MultiAgentTrainer.log: the run stopped
    args = cfg(tmp_path, max_steps=2, logging_steps=1, log_completions=True, disable_tqdm=True)
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=count_a, args=args, train_dataset=ITEMS)
    completions_read_as(t, ["bad \ud800", "café 中文 😀"])
    t.train()
    assert t.state.global_step == 2
    out = capsys.readouterr().out
    assert out.count("Step 1") == out.count("Step 2") == 1  # both steps' tables
    assert "bad \ufffd" in out and "café 中文 😀" in out


def test_completions_table_reported_to_wandb_holds_valid_text(monkeypatch):
    # old code: UnicodeEncodeError ('utf-8' codec can't encode character '\udfff') from pyarrow, building the
    # table's DataFrame (pandas' Arrow strings)
    from trl_marl.trainers.metrics import log_completions_table

    logged = []
    wandb = types.SimpleNamespace(run=object(), Table=lambda dataframe: dataframe, log=logged.append)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setattr("transformers.utils.is_rich_available", lambda: False)  # the table only
    record = {"prompts": ["p \udfff", "p"], "completions": ["bad \ud800", "café 中文 😀"], "raw_reward": 1.0}
    log_completions_table([{**record, "advantages": [0.5, 0.5]}], 3, types.SimpleNamespace(report_to=["wandb"]))
    table = logged[0]["completions"]
    assert table["agent_1/completion"].tolist() == ["bad \ufffd"]
    assert table["agent_2/completion"].tolist() == ["café 中文 😀"]
    assert table["prompt"].tolist() == ["[1] p \ufffd\n[2] p"]


def test_madpo_final_evaluation_is_printed_and_returned_with_progress_bars(tmp_path, tiny_path, capsys):
    from trl_marl import MADPOTrainer

    args = MADPOConfig(
        output_dir=str(tmp_path),
        num_agents=2,
        rollout_buffer_size=2,
        preference_num_candidates=2,
        max_completion_length=4,
        train_batch_size=2,
        max_steps=1,
        eval_num_samples=2,
        report_to="none",
        save_strategy="no",
        temperature=2.0,
    )
    t = MADPOTrainer(model=tiny_path, reward_funcs=count_a, args=args, train_dataset=ITEMS, eval_dataset=ITEMS)
    out = t.train()
    assert out.metrics["eval_reward"] == t.state.log_history[-1]["eval_reward"]
    captured = capsys.readouterr()
    assert f"final evaluation: eval_reward={out.metrics['eval_reward']:.4f}" in captured.out
    assert "Collecting preference pairs" in captured.err and "Evaluating" in captured.err


def test_marlhf_positional_order_builds_the_actor_critic_backend(tmp_path, tiny_path):
    from trl_marl import MARLHFConfig, MARLHFTrainer

    args = MARLHFConfig(output_dir=str(tmp_path), rl_algorithm="maac", report_to="none", rollout_buffer_size=2)
    t = MARLHFTrainer(tiny_path, count_a, args, ITEMS, critic_model=tiny_path)
    assert type(t) is MARLHFTrainer and type(t.rl_step).__name__ == "MAACStep" and t.reward.func is count_a


def test_signatures_show_trls_names():
    import inspect

    from trl_marl import MADPOIterTrainer

    for cls in (MAGRPOTrainer, MADPOIterTrainer):
        names = list(inspect.signature(cls.__init__).parameters)
        assert names[1:7] == ["model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class"]
        assert "agent_model" not in names and "reward_func" not in names
