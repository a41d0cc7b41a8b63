"""The reward of an agentic rollout: the reward functions plus the environment's `get_reward()`.

TRL 1.16 (`GRPOTrainer(environment_factory=...)`) appends an environment that defines `get_reward` to its reward
functions, named after the environment class, with weight 1. A team does the same, per joint action j:

    raw_j = f(joint action j) + e_j

`f` is the team reward of `reward_funcs` (optional when an environment owns the reward); `e_j` is the environment's
reward for the branch of joint action j, given on the turn its episode ends (0 on the turns before, and for an
environment without `get_reward`), so that the undiscounted return of a branch adds up to its final `get_reward()`.
Either part may be one float per joint action or one float per agent; the sum is per agent when either is. The
reward processor, if any, applies to the sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trl_marl.rewards.functions import RewardFunction, apply_processor

__all__ = ["EnvironmentReward", "RewardSources"]


@dataclass(frozen=True)
class EnvironmentReward:
    """One branch's environment reward: `values` one float per agent, `joint` whether `get_reward` returned one float
    (repeated for every agent), `source` the environment class (the reward's name in the metrics)."""

    values: Sequence[float]
    joint: bool
    source: str


class RewardSources:
    """The reward functions (`funcs`, a `RewardFunction`, or None) and the environments' rewards, summed (see the
    module docstring). `name` names both in `team.json`; `drain_component_means` reports each part as
    `rewards/<name>/mean` (TRL's metric), the environment's over the joint actions whose episode ended."""

    def __init__(
        self,
        funcs: RewardFunction | None,
        num_agents: int,
        processor: Callable[[float], float] | None = None,
        environments: Sequence[str] = (),
    ):
        if funcs is None and not environments:
            raise ValueError(
                "no reward source: pass reward_funcs, or an environment_factory whose environment defines get_reward()"
            )
        self.funcs = funcs
        self.num_agents = num_agents
        self.processor = processor
        self.environments = list(environments)
        self._sums: dict[str, list[float]] = {}

    @property
    def name(self) -> str:
        parts = ([self.funcs.name] if self.funcs is not None else []) + [f"{e}.get_reward" for e in self.environments]
        return " + ".join(parts)

    def __call__(
        self,
        completions_per_agent: Sequence[Sequence[str]],
        prompts: Sequence[str],
        batch_items: Sequence[dict],
        environment: Sequence[EnvironmentReward | None],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(processed, raw)` rewards of J joint actions: `(J,)`, or `(J, n)` when a part is per agent.
        `environment[j]` is joint action j's environment reward, None where it has none this turn."""
        J = len(environment)
        raw = torch.zeros(J)
        if self.funcs is not None and J:
            raw = self.funcs.raw(completions_per_agent, prompts, batch_items)
        scored = [e for e in environment if e is not None]
        if scored:
            per_agent = raw.ndim == 2 or not all(e.joint for e in scored)
            env = torch.zeros((J, self.num_agents) if per_agent else (J,))
            for j, e in enumerate(environment):
                if e is not None:
                    env[j] = torch.tensor(list(e.values), dtype=torch.float32) if per_agent else float(e.values[0])
            if per_agent and raw.ndim == 1:
                raw = raw.unsqueeze(1).expand(J, self.num_agents)
            raw = raw + env
            for e in scored:
                acc = self._sums.setdefault(e.source, [0.0, 0.0])
                acc[0] += sum(e.values) / len(e.values)
                acc[1] += 1
        return apply_processor(self.processor, raw, self.name), raw

    def drain_component_means(self) -> dict[str, float]:
        """Each part's mean raw reward since the last drain (the reward functions', then each environment's)."""
        out = self.funcs.drain_component_means() if self.funcs is not None else {}
        out.update({name: total / count for name, (total, count) in self._sums.items() if count})
        self._sums = {}
        return out
