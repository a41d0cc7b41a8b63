"""Preference learning between joint responses: pairs, the joint reward model, MADPO and MARLHF."""

from .iterative import (
    MADPOIterConfig,
    MADPOIterTrainer,
    MARLHFIterConfig,
    MARLHFIterIACTrainer,
    MARLHFIterMAACTrainer,
    MARLHFIterTrainer,
)
from .madpo import MADPOConfig, MADPOTrainer, PreferenceConfig
from .marlhf import MARLHFConfig, MARLHFIACTrainer, MARLHFMAACTrainer, MARLHFTrainer
from .pairs import PreferencePair, select_pairs
from .reward_model import JointRewardModel, joint_text

__all__ = [
    "JointRewardModel",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFIterIACTrainer",
    "MARLHFIterMAACTrainer",
    "MARLHFIACTrainer",
    "MARLHFMAACTrainer",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFTrainer",
    "PreferenceConfig",
    "PreferencePair",
    "joint_text",
    "select_pairs",
]
