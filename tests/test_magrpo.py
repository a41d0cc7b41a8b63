"""MAGRPO family end to end on the tiny local models."""

import json
import os

import pytest
import torch
from conftest import completions_read_as
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_marl import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)
from trl_marl.rollout.returns import rollout_returns


def length_reward(c1, c2):
    return [float(len(a) - len(b)) / 10 for a, b in zip(c1, c2)]


def test_magrpo_learns_the_coordination_task(task_trainer):
    trainer, before = task_trainer(MAGRPOTrainer, MAGRPOConfig, "coordination", max_steps=40)
    trainer.train()
    after = trainer.evaluate_reward()["eval_reward"]
    assert after > before + 0.1, (before, after)
    logged = trainer.state.log_history[0]
    for key in (
        "agent_1/loss",
        "agent_2/grad_norm",
        "agent_1/learning_rate",
        "agent_2/completion_length",
        "turn_1/reward_mean",
        "turn_1/expected_return",
        "env_step",
    ):
        assert key in logged, key
    assert logged["env_step"] == 10 * 8 * 4  # 10 steps x 8 items x G joint actions


@pytest.mark.parametrize(
    "trainer_cls, config_cls",
    [(MAREINFORCETrainer, MAREINFORCEConfig), (MARLOOTrainer, MARLOOConfig), (MAReMaxTrainer, MAReMaxConfig)],
)
def test_baseline_variants_train_and_default_normalization_off(make_args, items, tiny_path, trainer_cls, config_cls):
    args = make_args(config_cls, max_steps=2)
    assert args.advantage_normalization is None and not args.seed_zscore
    t = trainer_cls(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)
    t.train()
    assert t.state.global_step == 2


def test_variants_differ_from_magrpo_without_normalization(make_args, items, tiny_path):
    """Same seed, same samples: MARLOO's update differs from MAGRPO's only through the baseline."""
    weights = []
    for trainer_cls, cfg in ((MAGRPOTrainer, MAGRPOConfig), (MARLOOTrainer, MARLOOConfig)):
        args = make_args(cfg, max_steps=1, scale_rewards="none", num_generations=3, learning_rate=1e-2)
        t = trainer_cls(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)
        t.train()
        weights.append(torch.cat([p.detach().flatten() for p in t.team.agents[0].parameters()]))
    # loo advantage = G/(G-1) x mean advantage: same direction, different size
    assert not torch.allclose(weights[0], weights[1])


def test_cross_mode_multi_turn_kl_and_trace(make_args, items, tiny_path, tmp_path):
    def transition(prompt, agent_completions, num_agents, **_):
        return [f"Improve: {c[:20]}" for c in agent_completions]

    seen = []
    args = make_args(
        joint_mode="cross",
        num_turns=2,
        max_steps=1,
        reference_kl_enabled=True,
        reference_kl_coef=0.05,
        discount=0.9,
        trace_dir=str(tmp_path / "trace"),
    )
    t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_reward,
        args=args,
        train_dataset=items,
        external_transition=transition,
        metrics_callback=lambda recs: seen.append(len(recs)) or {"joint_actions": len(recs)},
    )
    t.train()
    # 2 items x (4 + 4 x 4) joint actions
    assert seen == [2 * (4 + 16)]
    log = t.state.log_history[0]
    assert "agent_1/kl" in log and "turn_2/reward_mean" in log and log["joint_actions"] == 40
    lines = (tmp_path / "trace" / "trace_rank0.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    assert len(lines) == 40 and set(rec) >= {"step", "prompts", "completions", "reward", "advantages"}


def test_trace_writes_invalid_unicode_as_replacement_characters_and_valid_text_as_it_is(
    make_args, items, tiny_path, tmp_path
):
    # old code: UnicodeEncodeError ('utf-8' codec can't encode character '\ud800': surrogates not allowed) in
    # append_trace; the run stopped at its first step, its trace file empty
    args = make_args(max_steps=2, trace_dir=str(tmp_path / "trace"))
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)
    completions_read_as(t, ["bad \ud800 end \udfff", "café 中文 😀 \x00"])
    t.train()
    assert t.state.global_step == 2
    text = (tmp_path / "trace" / "trace_rank0.jsonl").read_bytes().decode("utf-8")  # strict: valid UTF-8
    assert "café 中文 😀" in text  # valid text written as it is, not escaped
    records = [json.loads(line) for line in text.splitlines()]
    assert {r["step"] for r in records} == {0, 1}
    assert all(r["completions"] == ["bad \ufffd end \ufffd", "café 中文 😀 \x00"] for r in records)


def test_a_trace_record_that_cannot_be_written_leaves_the_file_as_it_was(tmp_path):
    from trl_marl.trainers.metrics import append_trace

    path = tmp_path / "trace_rank0.jsonl"
    append_trace(path, [{"completions": ["é \ud800"]}], 0, 1)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="keys must be"):  # a record that is not JSON: nothing of its step is written
        append_trace(path, [{"completions": ["fine"]}, {"item": {("a", "b"): 1}}], 1, 2)
    assert path.read_bytes() == before and json.loads(before)["completions"] == ["é \ufffd"]


def test_trace_values_json_has_no_type_for_are_written_as_text(tmp_path):
    """A record value JSON has no type for (a date, an array, bytes) made the trace's write raise (TypeError: Object
    of type date is not JSON serializable); a date is written in ISO 8601, an array as a list, bytes as text."""
    import datetime

    import numpy as np

    from trl_marl.trainers.metrics import append_trace

    path = tmp_path / "trace_rank0.jsonl"
    append_trace(path, [{"info": {"when": datetime.date(2026, 1, 2), "ids": np.arange(3), "raw": b"x"}}], 0, 1)
    assert json.loads(path.read_text())["info"] == {"when": "2026-01-02", "ids": [0, 1, 2], "raw": "b'x'"}


def test_an_environment_text_with_invalid_unicode_is_generated_from_and_traced(make_args, items, tiny_path, tmp_path):
    # old code: TypeError (TextEncodeInput must be Union[...]) tokenizing turn 2's prompts (prompt_token_ids)
    def transition(prompt, agent_completions, num_agents, **_):
        return [f"The judge said: bad \ud800 caf\u00e9. {c[:10]}" for c in agent_completions]

    args = make_args(num_turns=2, max_steps=1, trace_dir=str(tmp_path / "trace"))
    t = MAGRPOTrainer(
        model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items, external_transition=transition
    )
    t.train()
    assert t.state.global_step == 1
    records = [
        json.loads(line) for line in (tmp_path / "trace" / "trace_rank0.jsonl").read_text("utf-8").split("\n")[:-1]
    ]
    second = [r for r in records if r["turn"] == 2]
    assert second and all(p.startswith("The judge said: bad \ufffd caf\u00e9.") for r in second for p in r["prompts"])


def test_heterogeneous_team_with_own_tokenizers(make_args, items, tiny_path, tiny_qwen_path):
    toks = [AutoTokenizer.from_pretrained(tiny_path), AutoTokenizer.from_pretrained(tiny_qwen_path)]
    agents = [AutoModelForCausalLM.from_pretrained(tiny_path), tiny_qwen_path]
    t = MAGRPOTrainer(
        model=agents,
        processing_class=toks,
        reward_funcs=length_reward,
        args=make_args(max_steps=1),
        train_dataset=items,
        formatters=[lambda x: x["prompt"], lambda x: [{"role": "user", "content": x["prompt"]}]],
    )
    t.train()
    assert type(t.team.agents[1]).__name__.startswith("Qwen2")


def test_per_agent_learning_rate_groups(make_args, items, tiny_path):
    t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_reward,
        train_dataset=items,
        args=make_args(agent_learning_rate=2e-4, learning_rate=1e-3),
    )
    opt = t.create_optimizer()
    names = {g["name"] for g in opt.param_groups}
    assert names == {"agent_1", "agent_2"}
    assert all(g["lr"] == 2e-4 for g in opt.param_groups)
    ids = [{id(p) for g in opt.param_groups if g["name"] == f"agent_{i}" for p in g["params"]} for i in (1, 2)]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    assert ids[0] == {id(p) for p in t.team.agents[0].parameters()}


def test_agent_learning_rate_per_agent(make_args, items, tiny_path):
    """A list gives each agent's parameter groups their own rate (it used to raise TypeError)."""
    t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_reward,
        train_dataset=items,
        args=make_args(agent_learning_rate=[2e-4, 3e-4], learning_rate=1e-3),
    )
    lrs = {(g["name"], g["lr"]) for g in t.create_optimizer().param_groups}
    assert lrs == {("agent_1", 2e-4), ("agent_2", 3e-4)}
    one = make_args(agent_learning_rate=[5e-4])  # one rate for every agent (a single command-line value)
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=length_reward, train_dataset=items, args=one)
    assert {g["lr"] for g in t.create_optimizer().param_groups} == {5e-4}
    with pytest.raises(ValueError, match=r"agent_learning_rate has 3 entries; give 1 or num_agents=2"):
        make_args(agent_learning_rate=[1e-4, 2e-4, 3e-4])
    with pytest.raises(ValueError, match=r"agent_learning_rate must be >= 0 for every agent"):
        make_args(agent_learning_rate=[1e-4, -1.0])


def test_save_model_writes_one_loadable_folder_per_agent(make_args, items, tiny_path, tmp_path):
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=length_reward, args=make_args(max_steps=1), train_dataset=items)
    t.train()
    out = tmp_path / "saved"
    t.save_model(str(out))
    team = json.loads((out / "team.json").read_text())
    assert team["algorithm"] == "MAGRPO" and [a["folder"] for a in team["agents"]] == ["agent_1", "agent_2"]
    for i in (1, 2):
        loaded = AutoModelForCausalLM.from_pretrained(out / f"agent_{i}")
        AutoTokenizer.from_pretrained(out / f"agent_{i}")
        for (k, a), b in zip(loaded.state_dict().items(), t.team.agents[i - 1].state_dict().values()):
            torch.testing.assert_close(a, b, msg=k)


def test_checkpoint_resume_restores_the_agents(make_args, items, tiny_path, tmp_path):
    args = make_args(max_steps=2, save_strategy="steps", save_steps=2, output_dir=str(tmp_path / "ck"))
    a = MAGRPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)
    a.train()
    ckpt = tmp_path / "ck" / "checkpoint-2"
    assert (ckpt / "agent_1" / "model.safetensors").exists() and (ckpt / "optimizer.pt").exists()
    args_b = make_args(max_steps=3, save_strategy="no", output_dir=str(tmp_path / "ck"))
    b = MAGRPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args_b, train_dataset=items)
    b._load_from_checkpoint(str(ckpt))
    for pa, pb in zip(a.team.parameters(), b.team.parameters()):
        torch.testing.assert_close(pa, pb)
    b.train(resume_from_checkpoint=str(ckpt))
    assert b.state.global_step == 3


def test_evaluate_logs_task_reward(make_args, items, tiny_path):
    t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_reward,
        args=make_args(eval_num_samples=3),
        train_dataset=items,
        eval_dataset=items,
    )
    m1 = t.evaluate()
    m2 = t.evaluate()
    assert set(m1) >= {"eval_reward", "eval_turn_1/reward_mean", "eval_agent_1/completion_length"}
    assert m1["eval_reward"] == m2["eval_reward"]  # same weights, same evaluation stream
    assert any("eval_reward" in h for h in t.state.log_history)


def test_an_evaluation_outside_train_has_the_process_group_destroyed_at_exit(make_args, items, tiny_path, monkeypatch):
    """An evaluation-only script ends after the evaluation's collectives (its gather) as a training script ends after
    training's: the exit hook that lets gloo's workers release their last work must be registered
    (`trl_marl.distributed.collective.destroy_process_group_at_exit`); before, only `train()` registered it. Inside
    `train()` an evaluation does not (the hook waits for the run's success), nor does a failed one."""
    import trl_marl.trainers.base as base

    registered = []
    monkeypatch.setattr(base, "destroy_process_group_at_exit", lambda: registered.append(True), raising=False)
    t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_reward,
        args=make_args(eval_num_samples=2),
        train_dataset=items,
        eval_dataset=items,
    )
    t.is_in_train = True
    t.evaluate()
    assert registered == []
    t.is_in_train = False
    with pytest.raises(ValueError, match="eval_dataset"):
        t.eval_dataset = None
        t.evaluate()
    assert registered == []
    t.evaluate(items)
    assert registered == [True]


def test_eval_interval_sets_the_strategy(make_args):
    args = make_args(eval_interval=5)
    assert args.eval_strategy == "steps" and args.eval_steps == 5


def test_rollout_buffer_split_into_training_steps(make_args, items, tiny_path):
    calls = []

    def counting_reward(c1, c2):
        calls.append(len(c1))
        return [float(len(a)) for a in c1]

    args = make_args(rollout_buffer_size=4, train_batch_size=2, max_steps=4)
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=counting_reward, args=args, train_dataset=items)
    t.train()
    assert calls == [8, 8]  # 2 rollouts of 4 items x G=2, each feeding 2 training steps
    assert t.state.global_step == 4
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_remax_greedy_baseline(make_args, items, tiny_path):
    calls = []

    def counting(c1, c2):
        calls.append(len(c1))
        return [float(len(a)) for a in c1]

    args = make_args(MAReMaxConfig, remax_baseline="greedy", num_generations=2, max_steps=1)
    t = MAReMaxTrainer(model=tiny_path, reward_funcs=counting, args=args, train_dataset=items)
    inputs = t._rollout_step([items[0], items[1]])[0]
    rollout = inputs["rollout"]
    assert calls == [2 * 2 + 2]  # the sampled AND the greedy joint actions, in one reward call
    greedy = t.generate([[t._render(0, items[0]["prompt"])], [t._render(1, items[0]["prompt"])]], 1, greedy=True)
    node = rollout.nodes[0]
    assert node.greedy_reward == float(len(greedy[0].texts[0]))  # deterministic: the same greedy decode
    returns = rollout_returns(rollout, t.args.discount)
    for i in range(2):
        want = returns.of_node(node.id, i) - node.greedy_reward
        torch.testing.assert_close(inputs["advantages"][i][node.id], want)
    with pytest.raises(ValueError, match="remax_baseline='greedy' needs num_turns=1"):
        make_args(MAReMaxConfig, remax_baseline="greedy", num_turns=2)


def test_prompts_past_the_models_context_are_warned_once_per_agent_naming_max_prompt_length(
    make_args, tmp_path, caplog
):
    """A prompt longer than the model's context (here 48 positions) trained with transformers' reminder only (a model
    with learned positions fails inside its forward there). Now each agent is warned once, with the cure
    (`max_prompt_length`); with it set, nothing is said."""
    import logging

    from datasets import Dataset

    from trl_marl.testing import tiny_model_path

    path = tiny_model_path(max_position_embeddings=48)
    items = Dataset.from_list([{"prompt": "a long prompt about topic " * 3 + str(i)} for i in range(8)])
    caplog.set_level(logging.WARNING, logger="trl_marl.generation.hf")
    t = MAGRPOTrainer(model=path, reward_funcs=length_reward, args=make_args(max_steps=2), train_dataset=items)
    t.train()
    warned = [r.getMessage() for r in caplog.records if "max_position_embeddings=48" in r.getMessage()]
    assert [m.split(":")[0] for m in warned] == ["agent 1", "agent 2"]
    assert "plus max_completion_length=6" in warned[0] and "set max_prompt_length" in warned[0]
    caplog.clear()
    args = make_args(max_steps=1, max_prompt_length=40, output_dir=str(tmp_path / "cut"))
    MAGRPOTrainer(model=path, reward_funcs=length_reward, args=args, train_dataset=items).train()
    assert "max_position_embeddings" not in caplog.text
