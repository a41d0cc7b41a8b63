"""Preference learning between joint responses: pairs, the joint reward model, MADPO and MARLHF, and their
iterative versions (rounds run by a `RoundDriver`)."""

from trl_marl.trainers.preference.iterative_config import MADPOIterConfig, MARLHFIterConfig
from trl_marl.trainers.preference.iterative_trainers import (
    MADPOIterTrainer,
    MARLHFIterIACTrainer,
    MARLHFIterMAACTrainer,
    MARLHFIterTrainer,
)
from trl_marl.trainers.preference.madpo import MADPOConfig, MADPOTrainer, PreferenceConfig
from trl_marl.trainers.preference.marlhf import MARLHFConfig, MARLHFIACTrainer, MARLHFMAACTrainer, MARLHFTrainer
from trl_marl.trainers.preference.pairs import PreferencePair, select_pairs
from trl_marl.trainers.preference.reward_model import JointRewardModel, joint_text
from trl_marl.trainers.preference.rounds import RoundDriver

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
    "RoundDriver",
    "joint_text",
    "select_pairs",
]
