"""What the actor-critic trainers know of critics beyond the team module: the centralized critic's input text, where
critics come from (ids, objects, a copy of each agent) and how they load, and the value-normalization file saved
beside a critic."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trl_marl.models.loading import MODEL_CONFIG_KEYS, loading_kwargs

__all__ = ["joint_critic_text", "split_model_config", "AGENT_COPY", "NORMALIZER_FILE", "CRITIC_MODEL_CONFIG_KEYS"]

NORMALIZER_FILE = "value_normalizer.json"
# model_config keys that shape or load the critics (the reference library's names); not passed to the agents
CRITIC_MODEL_CONFIG_KEYS = ("critic_value_head_hidden_dim", "critic_model_kwargs")


def joint_critic_text(prompts: Sequence[str], completions: Sequence[str] | None = None) -> str:
    """The centralized critic's input text: every agent's prompt, tagged, plus the joint action for a Q critic.

    [Agent 1] <prompt of agent 1>
    [Agent 2] <prompt of agent 2>
    [Joint Action]                       (Q critics only, followed by the completions)
    [Agent 1] <completion of agent 1>
    [Agent 2] <completion of agent 2>
    """
    lines = [f"[Agent {i + 1}] {p}" for i, p in enumerate(prompts)]
    if completions is not None:
        lines.append("[Joint Action]")
        lines += [f"[Agent {i + 1}] {c}" for i, c in enumerate(completions)]
    return "\n".join(lines)


AGENT_COPY = object()  # IAC default critic source: a separately loaded copy of the agent's own model


def split_model_config(model_config: Any, args: Any) -> tuple[Any, dict]:
    """Separate the critic options of `model_config` (the reference library's `critic_value_head_hidden_dim` and
    `critic_model_kwargs`) from the agents' loading options; returns `(agents' model_config, critic loading kwargs)`.
    """
    if not isinstance(model_config, dict):
        return model_config, loading_kwargs(model_config)
    rest = {k: v for k, v in model_config.items() if k not in CRITIC_MODEL_CONFIG_KEYS}
    dim = model_config.get("critic_value_head_hidden_dim")
    if dim is not None:
        if args.critic_value_head_hidden_dim not in (None, dim):
            raise ValueError(
                f"critic_value_head_hidden_dim is {args.critic_value_head_hidden_dim} in the config but {dim} in "
                "model_config; give it once"
            )
        args.critic_value_head_hidden_dim = dim
    critic_kwargs = loading_kwargs({k: v for k, v in rest.items() if k in MODEL_CONFIG_KEYS})
    critic_kwargs.update(model_config.get("critic_model_kwargs") or {})
    return rest or None, critic_kwargs
