"""Model building blocks beyond the agents: value heads, separate critics and the actor-critic team module."""

from trl_marl.data_types.batches import CriticBatch, collate_critic_batch
from trl_marl.models.value_head import (
    ActorCriticTeam,
    CausalLMWithValueHead,
    ValueHead,
    check_critic_tokenizer,
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
