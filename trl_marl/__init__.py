"""trl_marl: train teams of cooperating LLM agents with multi-agent RL and preference learning, on Hugging Face TRL.

Every `XConfig` / `XTrainer` is importable from the package top; imports are lazy so `import trl_marl` is cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

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
    # building blocks
    "TeamModel": "trl_marl.team",
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
    from .rewards import RewardFunction, RewardProcessors
    from .rollout import JointRollout
    from .tasks import load_task
    from .team import TeamModel
    from .trainers.base import MultiAgentTrainer
    from .trainers.config import MultiAgentConfig
    from .trainers.reinforce import (
        MAGRPOConfig,
        MAGRPOTrainer,
        MAREINFORCEConfig,
        MAREINFORCETrainer,
        MAReMaxConfig,
        MAReMaxTrainer,
        MARLOOConfig,
        MARLOOTrainer,
    )
