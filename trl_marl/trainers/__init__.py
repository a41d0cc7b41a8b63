"""Trainers: one `XConfig` + `XTrainer` pair per algorithm, all on `MultiAgentTrainer`."""

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
from trl_marl.trainers.reinforce import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)

__all__ = [
    "MultiAgentConfig",
    "MultiAgentTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MAACConfig",
    "MAACTrainer",
    "IACConfig",
    "IACTrainer",
    "MAPPOConfig",
    "MAPPOTrainer",
]
