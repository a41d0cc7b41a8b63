"""Training runs on the real built-in tasks (`code`, `writing`) with the tiny model: they finish and log the task
reward. The tiny model does not learn to code or to write; these tests only prove the wiring (formatters, the
sandboxed reward, the multi-turn feedback transition, the recipes' `--task` flag) holds together in a trainer."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from trl_marl import MAGRPOConfig, MAGRPOTrainer
from trl_marl.tasks import load_task
from trl_marl.tasks.code import MAX_REWARD as CODE_MAX
from trl_marl.tasks.writing import MAX_REWARD as WRITING_MAX

ROOT = Path(__file__).resolve().parents[1]

# HumanEval prompts reach ~1000 tokens of the tiny tokenizer; keep their end (the signature and docstring) only,
# which keeps every run short.
SMALL = dict(max_completion_length=8, max_prompt_length=192, rollout_buffer_size=2, eval_num_samples=2)


@pytest.fixture(scope="module")
def code_task():
    return load_task("code", max_workers=2)


def _trainer(task, tiny_path, make_args, **overrides) -> MAGRPOTrainer:
    args = make_args(MAGRPOConfig, **{**SMALL, **overrides})
    return MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=task.reward_func,
        formatters=task.formatters,
        external_transition=task.external_transition if args.num_turns > 1 else None,
        train_dataset=task.train_dataset.select(range(4)),
        eval_dataset=task.eval_dataset.select(range(2)),
        args=args,
    )


def _logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


def test_magrpo_runs_on_the_code_task(code_task, tiny_path, make_args):
    trainer = _trainer(code_task, tiny_path, make_args, max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2
    rewards = _logged(trainer, "turn_1/reward_mean")
    assert len(rewards) == 2 and all(0.0 <= r <= CODE_MAX for r in rewards)
    assert all(math.isfinite(v) for v in _logged(trainer, "loss"))
    ev = trainer.evaluate_reward()
    assert 0.0 <= ev["eval_reward"] <= CODE_MAX


def test_magrpo_two_turns_with_code_feedback(code_task, tiny_path, make_args, tmp_path):
    trainer = _trainer(code_task, tiny_path, make_args, num_turns=2, max_steps=1, trace_dir=str(tmp_path / "trace"))
    trainer.train()
    assert trainer.state.global_step == 1
    (log,) = [h for h in trainer.state.log_history if "turn_2/reward_mean" in h]
    assert 0.0 <= log["turn_2/reward_mean"] <= CODE_MAX
    # the second turn's prompts are the transition's feedback prompts, not the formatters' first-turn prompts
    records = [json.loads(line) for line in (tmp_path / "trace" / "trace_rank0.jsonl").read_text().splitlines()]
    second = [r for r in records if r["turn"] == 2]
    assert len(second) == 8  # 2 items x G=2 child nodes x G=2 aligned joint actions
    assert all("Previous round:" in p and "Results:" in p for r in second for p in r["prompts"])
    assert not any("Previous round:" in p for r in records if r["turn"] == 1 for p in r["prompts"])


def test_magrpo_runs_on_the_writing_task(tiny_path, make_args):
    task = load_task("writing")
    trainer = _trainer(task, tiny_path, make_args, max_steps=1, eval_interval=1)
    trainer.train()
    evals = _logged(trainer, "eval_reward")
    assert evals and all(0.0 <= r <= WRITING_MAX for r in evals)


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("recipe, task", [("magrpo", "code"), ("magrpo", "writing"), ("maac", "code")])
def test_recipe_accepts_the_task(recipe, task, tmp_path, tiny_path):
    flags = {
        "--task": task,
        "--output_dir": str(tmp_path / task),
        "--max_steps": "1",
        "--num_generations": "2",
        "--max_completion_length": "8",
        "--max_prompt_length": "192",
        "--rollout_buffer_size": "2",
        "--eval_num_samples": "2",
        "--disable_tqdm": "true",
    }
    trainer = _recipe(recipe).main([a for kv in flags.items() for a in kv])
    assert trainer.state.global_step == 1
    assert trainer.before_reward is not None and trainer.after_reward is not None
    assert (tmp_path / task / "agent_2" / "config.json").exists()
