"""Model building blocks beyond the agents: value heads, separate critics and the actor-critic team module."""

from .value_head import (
    ActorCriticTeam,
    CausalLMWithValueHead,
    CriticBatch,
    ValueHead,
    check_critic_tokenizer,
    collate_critic_batch,
    load_critic,
    load_critics,
    load_value_head,
    save_value_head,
)

__all__ = [
    "ActorCriticTeam",
    "CausalLMWithValueHead",
    "CriticBatch",
    "ValueHead",
    "check_critic_tokenizer",
    "collate_critic_batch",
    "load_critic",
    "load_critics",
    "load_value_head",
    "save_value_head",
]
