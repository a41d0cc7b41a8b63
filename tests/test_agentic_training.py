"""Agentic teams trained for real on the tiny model: LoRA teams, exact resume, the reward rising on the signalling
game (slow), two processes under ZeRO-3 (slow) and the colocated vLLM engine (vllm)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import torch
from conftest import agentic_args, tool_tokenizer
from peft import LoraConfig

from trl_marl import MAGRPOTrainer
from trl_marl.environments import SignalGame, signal_game_dataset

ROOT = Path(__file__).resolve().parents[1]
LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def vowels(c1, c2):
    """A reward that varies with every sample (the game's own is 0 for a random tiny model): something to learn."""
    return [float(sum(ch in "aeiou" for ch in a + b)) for a, b in zip(c1, c2)]


def signal_trainer(tiny_path, tmp_path, **overrides):
    """MAGRPO on the signalling game with `vowels` beside the game's reward (TRL's sum of reward sources)."""
    kwargs = {k: overrides.pop(k) for k in ("peft_config", "callbacks") if k in overrides}
    defaults = dict(max_completion_length=16, max_tool_calling_iterations=1, num_generations=2)
    return MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=vowels,
        args=agentic_args(tmp_path, **{**defaults, **overrides}),
        train_dataset=signal_game_dataset(8, seed=1),
        processing_class=tool_tokenizer(tiny_path),
        environment_factory=SignalGame,
        **kwargs,
    )


@pytest.mark.parametrize("shared", [False, True], ids=["adapter_per_agent", "shared_base"])
def test_lora_team_trains_adapters_on_episodes(tiny_path, tmp_path, shared):
    trainer = signal_trainer(tiny_path, tmp_path, peft_config=LORA, share_base_model=shared)
    team = trainer.team
    before = {k: v.detach().clone() for k, v in team.named_parameters() if v.requires_grad}
    frozen = {k: v.detach().clone() for k, v in team.named_parameters() if not v.requires_grad}
    trainer.train()
    after = dict(team.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the adapters moved
    assert all(torch.equal(frozen[k], after[k]) for k in frozen)  # the base did not
    logs = trainer.state.log_history[0]
    assert "agent_2/tools/calls" in logs and "rewards/vowels/mean" in logs and "rewards/SignalGame/mean" in logs


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.team.state_dict().items()}


def _rewards(trainer):
    return [
        {k: v for k, v in e.items() if ("reward" in k and not k.startswith("time/")) or k in ("loss", "env_step")}
        for e in trainer.state.log_history
        if "loss" in e
    ]


def test_resume_at_a_step_boundary_is_exact(tiny_path, tmp_path):
    """Three steps straight, or one then a new trainer resumed from checkpoint-1 (inside a rollout of two steps: its
    buffered episodes restored, then a new rollout from the restored random streams): the same weights and logs.
    What the environment provides for it: a `reset(**item)` that depends only on the item (SignalGame's secret)."""
    common = dict(max_steps=3, save_strategy="steps", save_steps=1, rollout_buffer_size=2, train_batch_size=1)
    full = signal_trainer(tiny_path, tmp_path / "full", **common)
    full.train()
    resumed = signal_trainer(tiny_path, tmp_path / "resumed", **{**common, "output_dir": str(tmp_path / "full")})
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "out" / "checkpoint-1"))
    a, b = _weights(full), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _rewards(resumed)[-1] == _rewards(full)[-1]


# ------------------------------------------------------------------------------------------------------- slow


def signal_curve(seed: int, tiny_path: str, out: str, steps: int = 100, **overrides) -> list[float]:
    """The per-step mean reward of MAGRPO on the signalling game (tiny random Llamas, compact tool template)."""
    from trl_marl.testing import tiny_model_path

    model = tiny_model_path(seed=seed)
    settings = dict(
        num_generations=4,
        rollout_buffer_size=8,
        max_completion_length=8,
        max_tool_calling_iterations=1,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        max_steps=steps,
        seed=seed,
    )
    trainer = MAGRPOTrainer(
        model=model,
        args=agentic_args(Path(out), **{**settings, **overrides}),
        train_dataset=signal_game_dataset(64, seed=seed),
        processing_class=tool_tokenizer(model),
        environment_factory=SignalGame,
    )
    trainer.train()
    return [e["reward"] for e in trainer.state.log_history if "reward" in e and "loss" in e]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_signal_game_reward_rises(tiny_path, tmp_path, seed):
    """The team learns to signal: the mean reward of the last 20 steps beats the first 20 by a clear margin (figures
    in docs/agentic.md)."""
    curve = signal_curve(seed, tiny_path, str(tmp_path))
    first, last = sum(curve[:20]) / 20, sum(curve[-20:]) / 20
    print(f"seed {seed}: first 20 steps {first:.3f}, last 20 steps {last:.3f}")
    assert last > first + 0.05 and last > 2 * first


ZERO3_SCRIPT = """
import atexit, json, os, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
# registered before the trainer's exit hook, so it runs after it: the group is gone before the interpreter's teardown
atexit.register(lambda: print("TEARDOWN " + json.dumps(torch.distributed.is_initialized()), flush=True))
sys.path.insert(0, {tests!r})
from conftest import agentic_args, tool_tokenizer
from trl_marl import MAGRPOTrainer
from trl_marl.environments import SignalGame, signal_game_dataset

class Uneven(SignalGame):
    # rank 0's episodes end with agent 1's first message; rank 1's run two turns: agent 2 generates on rank 1 only
    def on_message(self, agent_index, text):
        super().on_message(agent_index, text)
        if os.environ["RANK"] == "0":
            self.done = True

tiny = {tiny!r}
trainer = MAGRPOTrainer(
    model=tiny,
    args=agentic_args(Path({out!r}), rollout_buffer_size=2, max_completion_length=6, num_turns=2, max_steps=2),
    train_dataset=signal_game_dataset(8, seed=0),
    processing_class=tool_tokenizer(tiny),
    environment_factory=Uneven,
)
trainer.train()
player = trainer.train_rollout_engine.player
info = dict(rank=trainer.accelerator.process_index, steps=trainer.state.global_step, calls=player.generate_calls,
            rows=player.rows, collective=trainer.generation.collective)
print("RESULT " + json.dumps(info), flush=True)  # one write (PYTHONUNBUFFERED writes each print argument apart)
"""


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero3_cpu", "multi_cpu"])
def test_two_processes_with_uneven_episodes(tiny_path, tmp_path, engine):
    """Two processes, rank 0's episodes ending after one message and rank 1's running two turns. Under ZeRO-3
    generation is a collective: both ranks make the same `generate` calls (rank 0 with no prompts where it has
    nothing left; a rank that skipped one would hang the other until the timeout). Under DDP each rank generates on
    its own: rank 0 makes fewer calls."""
    if engine.startswith("zero3"):
        pytest.importorskip("deepspeed")
    from conftest import accelerate_launch

    script = tmp_path / "run.py"
    script.write_text(ZERO3_SCRIPT.format(tests=str(ROOT / "tests"), tiny=tiny_path, out=str(tmp_path / "out")))
    proc = accelerate_launch(ROOT / "accelerate_configs" / f"{engine}.yaml", script, timeout=900)
    # the two ranks' lines can interleave on the shared stdout: find each JSON object, not each line
    results = sorted((json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", proc.stdout)), key=lambda r: r["rank"])
    collective = engine.startswith("zero3")
    assert [r["rank"] for r in results] == [0, 1], proc.stdout[-3000:] and all(r["steps"] == 2 for r in results)
    assert all(r["collective"] == collective for r in results)
    assert results[0]["rows"] < results[1]["rows"]  # rank 0 had less to generate
    # the exit hook ran (rank 1's exit aborted twice in CI: a gloo worker asking for the GIL during finalization,
    # tests/test_collective.py::test_gloo_workers_release_their_last_work_before_the_interpreter_finalizes)
    assert proc.stdout.count("TEARDOWN false") == 2, proc.stdout[-2000:]
    if collective:
        assert results[0]["calls"] == results[1]["calls"]  # in step
    else:
        assert results[0]["calls"] < results[1]["calls"]


@pytest.mark.vllm
def test_colocated_vllm_engine_plays_episodes(tiny_path, tmp_path, monkeypatch):
    """The signalling game sampled by vLLM's colocated engines (CPU build): token prompts after tool results,
    sampled log-probs close to the trainer's (TRL's sampling_logp_difference)."""
    pytest.importorskip("vllm")
    from trl_marl.testing import tiny_model_path

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    vllm_path = tiny_model_path(hidden_size=128, num_attention_heads=2, num_key_value_heads=2)  # head_dim >= 32
    trainer = signal_trainer(
        vllm_path, tmp_path, use_vllm=True, vllm_max_model_length=1024, max_completion_length=24, max_steps=2
    )
    trainer.train()
    logs = trainer.state.log_history[0]
    assert "agent_2/tools/calls" in logs and math.isfinite(logs["reward"])
    gap = logs.get("sampling/sampling_logp_difference/mean")
    assert gap is not None and gap < 1e-2
    # a turn resumed after a tool result goes to vLLM as its exact ids (its text is not re-tokenized); an agent
    # given None takes no part
    from trl_marl.data_types.text import PromptText

    ids = trainer.tokenizers[0]("Agent 1: The secret is blue.", add_special_tokens=False)["input_ids"]
    out = trainer.generation.generate([[PromptText.of_ids("not these words", ids)], None], 2)
    assert [p.tolist() for p in out[0].prompt_ids] == [ids, ids] and len(out[0].completion_ids) == 2
    assert out[1].completion_ids == []


@pytest.mark.vllm
def test_vllm_importance_sampling_correction_with_tools(tiny_path, tmp_path, monkeypatch):
    """TRL's loss with vLLM's IS correction (its default) on an agentic team, sampled by the colocated engines: every
    turn brings vLLM's log-probs, and the ratio of an engine that samples what the trainer scores is close to 1. The
    old code refused this configuration. (A random tiny model rarely calls a tool: the alignment of the log-probs
    around inserted tool results is `test_agentic.py::test_vllm_importance_sampling_correction_on_an_agentic_team`.)"""
    pytest.importorskip("vllm")
    from trl_marl.testing import tiny_model_path

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    vllm_path = tiny_model_path(hidden_size=128, num_attention_heads=2, num_key_value_heads=2)  # head_dim >= 32
    trainer = signal_trainer(
        vllm_path, tmp_path, use_vllm=True, vllm_max_model_length=1024, max_completion_length=24, max_steps=1,
        loss_type="grpo",
    )  # fmt: skip
    assert trainer.args.vllm_importance_sampling_correction
    trainer.train()
    logs = trainer.state.log_history[0]
    for i in (1, 2):
        assert 0.9 < logs[f"agent_{i}/sampling/importance_sampling_ratio/mean"] <= 1.1
        assert logs[f"agent_{i}/sampling/sampling_logp_difference/mean"] < 1e-2


def test_agentic_command_trains_on_the_signalling_game(tmp_path, capsys):
    """`trl-marl agentic`: the tiny model on the built-in game, through the registry's MAGRPO family."""
    from trl_marl.cli.recipes import RECIPES, make_parser, run_command

    assert RECIPES["agentic"].trainer_class() is MAGRPOTrainer
    assert "--environment" in make_parser("agentic").format_help()
    argv = ["--output_dir", str(tmp_path), "--max_steps", "1", "--num_generations", "2", "--rollout_buffer_size", "2"]
    trainer = run_command("agentic", argv + ["--eval_num_samples", "2", "--num_items", "4", "--baseline", "loo"])
    out = capsys.readouterr().out
    assert "environment=signal eval reward after training" in out and (tmp_path / "agent_2").is_dir()
    assert type(trainer).__name__ == "MARLOOTrainer" and trainer.args.turn_order == "sequential"
    assert isinstance(trainer.rollout_engine.registry.specs[None].cls, type)
    with pytest.raises(ValueError, match="expected 'signal', 'textarena:GAME'"):
        run_command("agentic", argv + ["--environment", "chess"])
