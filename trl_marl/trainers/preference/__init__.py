"""Preference learning between joint responses: pairs, the joint reward model, MADPO and MARLHF."""

from trl_marl.trainers.preference.iterative import (
    MADPOIterConfig,
    MADPOIterTrainer,
    MARLHFIterConfig,
    MARLHFIterIACTrainer,
    MARLHFIterMAACTrainer,
    MARLHFIterTrainer,
)
from trl_marl.trainers.preference.madpo import MADPOConfig, MADPOTrainer, PreferenceConfig
from trl_marl.trainers.preference.marlhf import MARLHFConfig, MARLHFIACTrainer, MARLHFMAACTrainer, MARLHFTrainer
from trl_marl.trainers.preference.pairs import PreferencePair, select_pairs
from trl_marl.trainers.preference.reward_model import JointRewardModel, joint_text

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
