"""Settings given once for the team or once per agent.

A heterogeneous team (a 7B coder with a 0.5B helper) wants different sampling and loss settings per agent. A config
field listed here takes either one value (every agent) or a list: one value per agent, or a list of one value (every
agent). From Python and YAML configs a list is written as such; the command line takes one value.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["SAMPLING_FIELDS", "agent_value", "agent_values", "check_per_agent"]

# the per-agent sampling fields every config declares (`MultiAgentConfig`); only configs with
# `_per_agent_settings = True` (the MAGRPO family) take lists for them
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_completion_length")


def agent_value(value: Any, i: int) -> Any:
    """Agent i's value of a per-agent setting: `value` itself, `value[0]` for a list of one, else `value[i]`."""
    if isinstance(value, (list, tuple)):
        return value[0] if len(value) == 1 else value[i]
    return value


def agent_values(value: Any, num_agents: int) -> list[Any]:
    """The setting of each of `num_agents` agents (`agent_value` for each)."""
    return [agent_value(value, i) for i in range(num_agents)]


def check_per_agent(config: Any, names: Iterable[str], num_agents: int, allowed: bool = True) -> None:
    """Raise a ValueError naming the field when a per-agent list has neither 1 nor `num_agents` entries, or when
    `allowed` is False (the config takes one value for the team) and a field holds a list."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, (list, tuple)):
            continue
        if not allowed:
            raise ValueError(
                f"{name} takes one value on {type(config).__name__}, got the list {list(value)!r} (one value per "
                "agent is a setting of the MAGRPO family: MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, "
                "MAReMaxConfig)"
            )
        if len(value) not in (1, num_agents):
            raise ValueError(
                f"{name} has {len(value)} entries; give one value, or a list of 1 or num_agents={num_agents} values "
                f"(one per agent), got {list(value)!r}"
            )
