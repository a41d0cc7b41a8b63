"""Trainers: one `XConfig` + `XTrainer` pair per algorithm, all on `MultiAgentTrainer`."""

from .actor_critic import (
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MAPPOConfig,
    MAPPOTrainer,
)
from .base import MultiAgentTrainer
from .config import MultiAgentConfig
from .reinforce import (
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
