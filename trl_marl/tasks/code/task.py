"""The `code` task assembled: the joint reward, the default evaluator shared by `code_reward` and
`code_feedback_transition`, and `code_task`."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from trl_marl.tasks.base import Task
from trl_marl.tasks.code.data import code_datasets, load_humaneval
from trl_marl.tasks.code.evaluator import MAX_REWARD, CodeEvaluator
from trl_marl.tasks.code.feedback import CodeFeedbackTransition, make_formatter
from trl_marl.tasks.code.harness import DEFAULT_TRUSTED_MODULES
from trl_marl.tasks.code.problem import problem_imports

__all__ = ["CodeReward", "code_feedback_transition", "code_reward", "code_task"]


class CodeReward:
    """The joint reward of the coding task (see the package docstring): `reward(completions_agent_1,
    completions_agent_2, batch_items=[...]) -> list[float]`, one value in [0, 4] per joint action. A completion
    that breaks the scoring in any way scores as failing (counted in `evaluator.scoring_errors`); the call never
    raises because of a completion."""

    reward_range = (0.0, MAX_REWARD)

    def __init__(self, evaluator: CodeEvaluator | None = None):
        self.evaluator = evaluator or CodeEvaluator()

    def __call__(
        self,
        completions_agent_1: Sequence[str],
        completions_agent_2: Sequence[str],
        batch_items: Sequence[dict] | None = None,
    ) -> list[float]:
        if batch_items is None:
            raise ValueError("the code reward needs batch_items (the HumanEval item of each joint action)")
        return [ev.reward for ev in self.evaluator.evaluate(completions_agent_1, completions_agent_2, batch_items)]


_DEFAULT: CodeEvaluator | None = None
_DEFAULT_LOCK = threading.Lock()


def _default_evaluator() -> CodeEvaluator:
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = CodeEvaluator()
        return _DEFAULT


def code_reward(
    completions_agent_1: Sequence[str], completions_agent_2: Sequence[str], batch_items: Sequence[dict] | None = None
) -> list[float]:
    """`CodeReward` with the default `CodeEvaluator` settings."""
    return CodeReward(_default_evaluator())(completions_agent_1, completions_agent_2, batch_items=batch_items)


code_reward.reward_range = (0.0, MAX_REWARD)


def code_feedback_transition(
    *,
    prompt: str | None = None,
    agent_completions: Sequence[str],
    num_agents: int = 2,
    prompt_history_per_agent: Sequence[Sequence[str]] | None = None,
    response_history_per_agent: Sequence[Sequence[str]] | None = None,
    batch_item: dict | None = None,
) -> list[str]:
    """`CodeFeedbackTransition` with the default `CodeEvaluator` settings (shares its cache with `code_reward`)."""
    return CodeFeedbackTransition(_default_evaluator())(
        prompt=prompt,
        agent_completions=agent_completions,
        num_agents=num_agents,
        prompt_history_per_agent=prompt_history_per_agent,
        response_history_per_agent=response_history_per_agent,
        batch_item=batch_item,
    )


def code_task(
    eval_size: int = 32,
    chat: bool = False,
    test_timeout_s: float = 2.0,
    max_timeouts: int = 2,
    timeout_s: float = 10.0,
    max_workers: int | None = None,
    allow_weak_sandbox: bool = False,
    **evaluator_options: Any,
) -> Task:
    """The cooperative HumanEval task (see the package docstring).

    Refuses to start (`SandboxUnavailable`, naming what is missing and how to install it) where the strong sandbox
    cannot run, unless `allow_weak_sandbox=True` (unsafe for reinforcement learning; one warning per process).

    Args:
        eval_size: problems held out for evaluation (32 gives the 132/32 split).
        chat: formatters return chat messages (`[{"role": "user", "content": ...}]`) instead of plain strings.
        allow_weak_sandbox: accept a weak sandbox where the strong one cannot run.
        test_timeout_s, max_timeouts, timeout_s, max_workers, evaluator_options: `CodeEvaluator` settings.
    """
    trusted = [
        *DEFAULT_TRUSTED_MODULES,
        *sorted(problem_imports({**p, "problem": p["prompt"]} for p in load_humaneval())),
    ]
    evaluator = CodeEvaluator(
        test_timeout_s=test_timeout_s,
        max_timeouts=max_timeouts,
        timeout_s=timeout_s,
        max_workers=max_workers,
        allow_weak_sandbox=allow_weak_sandbox,
        trusted_modules=evaluator_options.pop("trusted_modules", trusted),
        **evaluator_options,
    )
    train, evaluation = code_datasets(eval_size)
    return Task(
        name="code",
        num_agents=2,
        train_dataset=train,
        eval_dataset=evaluation,
        formatters=[make_formatter(0, chat), make_formatter(1, chat)],
        reward_func=CodeReward(evaluator),
        external_transition=CodeFeedbackTransition(evaluator),
        roles=["helper", "main"],
        description=(
            "HumanEval as a two-agent team: agent 1 writes a helper `aux`, agent 2 the entry point that calls it. "
            "Level-gated reward up to 4.0 (definitions, syntax, fraction of tests passed in a sandbox, use of the "
            "helper's result); multi-turn rounds feed back each round's test results."
        ),
        metrics_callback=lambda records: evaluator.drain_metrics(),
    )
