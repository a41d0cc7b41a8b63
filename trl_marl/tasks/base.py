"""What a task is (built in or registered by another package, see `trl_marl.tasks`): datasets, one formatter per
agent, a joint reward, optionally a multi-turn transition."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Task"]


@dataclass
class Task:
    """A cooperative task for a team of `num_agents` agents.

    Attributes:
        name: the task's short name (as registered in the `trl_marl.tasks` entry-point group, the recipes' `--task`).
        num_agents: team size the task is written for.
        train_dataset: `datasets.Dataset` of task items.
        eval_dataset: held-out items (a separate split), or None.
        formatters: one callable per agent, `formatter(item) -> str | list[dict]` (a prompt string, or chat
            messages that the agent's tokenizer's chat template turns into a prompt).
        reward_func: the joint reward, called with the convention of `trl_marl.rewards` (one float per joint
            action).
        external_transition: the multi-turn transition (see `trl_marl.rollout`), or None for single-turn tasks.
        roles: a short role name per agent (written to `team.json` and model cards).
        description: one paragraph for docs and model cards.
        metrics_callback: optional `callable(rollout_samples) -> dict[str, float]` of domain metrics.
    """

    name: str
    num_agents: int
    train_dataset: Any
    eval_dataset: Any
    formatters: list[Callable[[dict], Any]]
    reward_func: Callable[..., Any]
    external_transition: Callable[..., Any] | None = None
    roles: list[str] = field(default_factory=list)
    description: str = ""
    metrics_callback: Callable[..., dict] | None = None

    def __post_init__(self):
        if len(self.formatters) != self.num_agents:
            raise ValueError(
                f"Task {self.name!r}: formatters has {len(self.formatters)} entries, num_agents is {self.num_agents}"
            )
        if not self.roles:
            self.roles = [f"agent_{i + 1}" for i in range(self.num_agents)]
        # Trainers only see the formatters: tag each with its role so team.json and the model cards name it
        # (`trl_marl.hub.agent_role`). A callable shared by several agents is left untagged (it has no one role).
        for formatter, role in zip(self.formatters, self.roles):
            if sum(f is formatter for f in self.formatters) == 1 and getattr(formatter, "role", None) is None:
                with contextlib.suppress(AttributeError, TypeError):
                    formatter.role = role
