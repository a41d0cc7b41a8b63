"""trl_marl: train teams of cooperating LLM agents with multi-agent RL and preference learning, on Hugging Face TRL.

Every `XConfig` / `XTrainer` is importable from the package top; imports are lazy so `import trl_marl` is cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from trl_marl import _moved

__version__ = "0.1.0"

_moved.install()  # old import paths of modules that moved, for one release (trl_marl/_moved.py)

_LAZY = {
    # trainers
    "MultiAgentConfig": "trl_marl.trainers.config",
    "MultiAgentTrainer": "trl_marl.trainers.base",
    "MAGRPOConfig": "trl_marl.trainers.reinforce",
    "MAGRPOTrainer": "trl_marl.trainers.reinforce",
    "MAREINFORCEConfig": "trl_marl.trainers.reinforce",
    "MAREINFORCETrainer": "trl_marl.trainers.reinforce",
    "MARLOOConfig": "trl_marl.trainers.reinforce",
    "MARLOOTrainer": "trl_marl.trainers.reinforce",
    "MAReMaxConfig": "trl_marl.trainers.reinforce",
    "MAReMaxTrainer": "trl_marl.trainers.reinforce",
    "MAACConfig": "trl_marl.trainers.actor_critic",
    "MAACTrainer": "trl_marl.trainers.actor_critic",
    "IACConfig": "trl_marl.trainers.actor_critic",
    "IACTrainer": "trl_marl.trainers.actor_critic",
    "MAPPOConfig": "trl_marl.trainers.actor_critic",
    "MAPPOTrainer": "trl_marl.trainers.actor_critic",
    "CentralizedMAGRPOTrainer": "trl_marl.trainers.reinforce",
    "MADPOConfig": "trl_marl.trainers.preference.madpo",
    "MADPOTrainer": "trl_marl.trainers.preference.madpo",
    "MARLHFConfig": "trl_marl.trainers.preference.marlhf",
    "MARLHFTrainer": "trl_marl.trainers.preference.marlhf",
    "JointRewardModel": "trl_marl.trainers.preference.reward_model",
    "MADPOIterConfig": "trl_marl.trainers.preference.iterative_config",
    "MADPOIterTrainer": "trl_marl.trainers.preference.iterative_trainers",
    "MARLHFIterConfig": "trl_marl.trainers.preference.iterative_config",
    "MARLHFIterTrainer": "trl_marl.trainers.preference.iterative_trainers",
    "PreferencePair": "trl_marl.trainers.preference.pairs",
    # building blocks
    "TeamModel": "trl_marl.models.team",
    "AgentTeam": "trl_marl.hub",
    "push_team_to_hub": "trl_marl.hub",
    "ActorCriticTeam": "trl_marl.models.value_head",
    "CausalLMWithValueHead": "trl_marl.models.value_head",
    "JointRollout": "trl_marl.rollout",
    "RewardFunction": "trl_marl.rewards",
    "RewardProcessors": "trl_marl.rewards",
    "load_task": "trl_marl.tasks",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trl_marl' has no attribute {name!r}")


def __dir__():
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from trl_marl.hub import AgentTeam, push_team_to_hub
    from trl_marl.models.team import TeamModel
    from trl_marl.models.value_head import ActorCriticTeam, CausalLMWithValueHead
    from trl_marl.rewards import RewardFunction, RewardProcessors
    from trl_marl.rollout.engine import JointRollout
    from trl_marl.tasks import load_task
    from trl_marl.trainers.actor_critic import (
        IACConfig,
        IACTrainer,
        MAACConfig,
        MAACTrainer,
        MAPPOConfig,
        MAPPOTrainer,
    )
    from trl_marl.trainers.base import MultiAgentTrainer
    from trl_marl.trainers.config import MultiAgentConfig
    from trl_marl.trainers.preference import (
        JointRewardModel,
        MADPOConfig,
        MADPOIterConfig,
        MADPOIterTrainer,
        MADPOTrainer,
        MARLHFConfig,
        MARLHFIterConfig,
        MARLHFIterTrainer,
        MARLHFTrainer,
        PreferencePair,
    )
    from trl_marl.trainers.reinforce import (
        CentralizedMAGRPOTrainer,
        MAGRPOConfig,
        MAGRPOTrainer,
        MAREINFORCEConfig,
        MAREINFORCETrainer,
        MAReMaxConfig,
        MAReMaxTrainer,
        MARLOOConfig,
        MARLOOTrainer,
    )
