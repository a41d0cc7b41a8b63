"""Agentic teams: tools, shared environments and turn order for teams of LLM agents (services; no trainer code).

- `tools`: tool schemas (transformers' `get_json_schema`), rendering, parsing tool calls with TRL 1.16's
  `parse_response`, and a `ToolExecutor` (sync and async tools, bounded concurrency, timeouts, counters).
- `environment`: TRL's `environment_factory` contract for a team (one environment per joint rollout branch, shared
  by the agents) and its validation; `EnvironmentRegistry` routes items by their `environment` column.
- `episode`: turn order and `Branch`, the state of one joint rollout; `lockstep`: driving many branches with one
  generation per agent position per tool round.
- `games`: the built-in cooperative signalling game.
- `textarena` / `pettingzoo` (optional extras `trl-marl[textarena]`, `trl-marl[pettingzoo]`): adapters that turn
  games other people wrote into team environments. Imported on first use.

This package imports only `trl_marl.algorithms` from trl_marl (nothing here depends on the trainers).
"""

from __future__ import annotations

import importlib
from typing import Any

from trl_marl.environments.environment import (
    RESERVED_ATTRIBUTES,
    RESERVED_METHODS,
    EnvironmentRegistry,
    EnvironmentSpec,
    check_reset_output,
    check_reward,
    copy_environment,
)
from trl_marl.environments.episode import (
    TURN_ORDERS,
    Branch,
    EpisodeConfig,
    Segment,
    default_executor,
    episode_metrics,
    merge_user_messages,
    per_agent_tools,
    sees_same_turn,
)
from trl_marl.environments.games import SECRETS, SignalGame, signal_game_dataset, signal_game_prompts
from trl_marl.environments.lockstep import begin_position, play, release_branches, run_tool_round, start_branches
from trl_marl.environments.tools import (
    AGENT_INDEX_ARG,
    COMPACT_TOOL_CHAT_TEMPLATE,
    Tool,
    ToolCallRequest,
    ToolExecutor,
    ToolResult,
    ToolStats,
    as_tools,
    make_tool,
    parse_completion,
    prepare_tool_tokenizer,
    render_prompt,
    tool_suffix_ids,
    use_compact_tool_template,
)

_LAZY = {
    "TextArenaEnvironment": ".textarena",
    "textarena_factory": ".textarena",
    "TextArenaUnavailable": ".textarena",
    "PettingZooEnvironment": ".pettingzoo",
    "pettingzoo_factory": ".pettingzoo",
}

__all__ = [
    "AGENT_INDEX_ARG",
    "COMPACT_TOOL_CHAT_TEMPLATE",
    "RESERVED_ATTRIBUTES",
    "RESERVED_METHODS",
    "SECRETS",
    "TURN_ORDERS",
    "Branch",
    "EnvironmentRegistry",
    "EnvironmentSpec",
    "EpisodeConfig",
    "Segment",
    "SignalGame",
    "Tool",
    "ToolCallRequest",
    "ToolExecutor",
    "ToolResult",
    "ToolStats",
    "as_tools",
    "begin_position",
    "check_reset_output",
    "check_reward",
    "copy_environment",
    "default_executor",
    "episode_metrics",
    "make_tool",
    "merge_user_messages",
    "parse_completion",
    "per_agent_tools",
    "play",
    "prepare_tool_tokenizer",
    "release_branches",
    "render_prompt",
    "run_tool_round",
    "sees_same_turn",
    "signal_game_dataset",
    "signal_game_prompts",
    "start_branches",
    "tool_suffix_ids",
    "use_compact_tool_template",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
