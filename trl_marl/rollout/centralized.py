"""Centralized collaboration: ONE model writes every role's output as one tagged joint completion.

    <agent_1>...role 1's output...</agent_1>
    <agent_2>...role 2's output...</agent_2>

The joint prompt joins the roles' own prompts (each role's formatter) with instructions to answer in that format.
The completion is parsed back into role outputs only to call the task reward, whose signature stays the
decentralized one (one list of completions per role). This is the single-model baseline a decentralized team is
compared against (`CentralizedMAGRPOTrainer`, MADPO's `collaboration_mode="centralized"`), and the way a comparator
model writes a whole joint response (iterative preference training).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = [
    "CentralizedAdapter",
    "TaggedCentralizedAdapter",
    "CentralizedParseError",
    "centralize",
    "centralized_setup",
]


class CentralizedParseError(ValueError):
    """A joint completion could not be split into role outputs."""


class CentralizedAdapter(Protocol):
    """How a centralized model is prompted and how its completion is split into role outputs."""

    num_roles: int

    def build_prompt(self, item: dict, role_prompts: Sequence[str]) -> str:
        """The joint prompt for one item, from each role's own prompt."""

    def parse_completion(self, text: str) -> list[str]:
        """Role outputs of one joint completion; raises `CentralizedParseError` when it cannot."""


class TaggedCentralizedAdapter:
    """`<agent_i>...</agent_i>` tags, one block per role, in order.

    Parsing takes the FIRST block of each role (text between `<agent_i>` and `</agent_i>`, stripped). A missing
    role, or a missing closing tag, is a parse error.
    """

    def __init__(self, num_roles: int, instruction: str | None = None):
        if num_roles < 1:
            raise ValueError(f"num_roles must be >= 1, got {num_roles}")
        self.num_roles = num_roles
        self.instruction = instruction or (
            f"You play {num_roles} roles at once. Answer every role, each inside its own tags, in order: "
            + " ".join(f"<agent_{i + 1}>...</agent_{i + 1}>" for i in range(num_roles))
        )
        self._patterns = [re.compile(rf"<agent_{i + 1}>(.*?)</agent_{i + 1}>", re.S) for i in range(num_roles)]

    def build_prompt(self, item: dict, role_prompts: Sequence[str]) -> str:
        blocks = "\n".join(f"Role {i + 1} (agent_{i + 1}): {p}" for i, p in enumerate(role_prompts))
        return f"{self.instruction}\n{blocks}\n"

    def parse_completion(self, text: str) -> list[str]:
        out = []
        for i, pattern in enumerate(self._patterns):
            m = pattern.search(text)
            if m is None:
                raise CentralizedParseError(f"no <agent_{i + 1}>...</agent_{i + 1}> block in the joint completion")
            out.append(m.group(1).strip())
        return out

    def format_completion(self, role_outputs: Sequence[str]) -> str:
        """The tagged joint completion of the given role outputs (inverse of `parse_completion`)."""
        return "".join(f"<agent_{i + 1}>{t}</agent_{i + 1}>" for i, t in enumerate(role_outputs))


class _CentralizedReward:
    """A one-agent reward that parses each joint completion and calls the n-role task reward once, batched.

    A completion that fails to parse gives every role an empty string and is counted in `parse_failures`.
    """

    def __init__(self, reward: Any, adapter: CentralizedAdapter):
        from trl_marl.rewards import RewardFunction

        self.task_reward = RewardFunction(reward, adapter.num_roles)
        self.adapter = adapter
        self.parse_failures = 0
        self.parsed = 0
        self.__qualname__ = f"centralized({self.task_reward.name})"

    def __call__(
        self, completions: list[str], batch_items: list[dict] | None = None, prompts: list[str] | None = None
    ) -> list[float]:
        roles: list[list[str]] = [[] for _ in range(self.adapter.num_roles)]
        for text in completions:
            self.parsed += 1
            try:
                parts = self.adapter.parse_completion(text)
            except CentralizedParseError:
                self.parse_failures += 1
                parts = [""] * self.adapter.num_roles
            for r, p in enumerate(parts):
                roles[r].append(p)
        return self.task_reward.raw(roles, prompts, batch_items).tolist()


def centralize(
    reward_func: Any,
    formatters: Sequence[Callable] | Callable | None,
    num_roles: int,
    adapter: CentralizedAdapter | None = None,
) -> tuple[Callable, Callable, _CentralizedReward, CentralizedAdapter]:
    """Turn an n-role task (reward + per-role formatters) into a one-model task.

    Returns `(joint_formatter, joint_reward, the reward object (for parse metrics), adapter)`.
    """
    from trl_marl.rollout.prompts import resolve_formatters

    adapter = adapter or TaggedCentralizedAdapter(num_roles)
    role_formatters = resolve_formatters(formatters, num_roles)

    def joint_formatter(item: dict) -> str:
        role_prompts = []
        for f in role_formatters:
            p = f(item)
            if not isinstance(p, str):
                p = "\n".join(m.get("content", "") for m in p)  # chat messages: their text
            role_prompts.append(p)
        return adapter.build_prompt(item, role_prompts)

    reward = _CentralizedReward(reward_func, adapter)
    return joint_formatter, reward, reward, adapter


def centralized_setup(args: Any, reward_func: Any, formatters: Any, adapter: CentralizedAdapter | None = None):
    """Rewrite a trainer's inputs for centralized collaboration: `args.num_agents` roles, ONE model.

    Returns `(args with num_agents=1, joint reward, joint formatter, reward object, adapter)`.
    """
    import dataclasses

    formatter, joint_reward, reward_obj, adapter = centralize(reward_func, formatters, args.num_agents, adapter)
    return dataclasses.replace(args, num_agents=1), joint_reward, formatter, reward_obj, adapter
