"""Preference learning between joint responses: pairs, the joint reward model, MADPO and MARLHF, and their
iterative versions (rounds run by a `RoundDriver`)."""

from trl_marl.trainers.preference import iterative_config, iterative_trainers, marlhf
from trl_marl.trainers.preference.iterative_config import MADPOIterConfig, MARLHFIterConfig
from trl_marl.trainers.preference.iterative_trainers import MADPOIterTrainer, MARLHFIterTrainer
from trl_marl.trainers.preference.madpo import MADPOConfig, MADPOTrainer, PreferenceConfig
from trl_marl.trainers.preference.marlhf import MARLHFConfig, MARLHFTrainer
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
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFTrainer",
    "PreferenceConfig",
    "PreferencePair",
    "RoundDriver",
    "joint_text",
    "select_pairs",
]

# removed backend classes (`MARLHFTrainer` / `MARLHFIterTrainer` with `rl_algorithm`), forwarded for one release
_REMOVED = {**marlhf._REMOVED, **iterative_config._REMOVED, **iterative_trainers._REMOVED}


def __getattr__(name: str):
    return marlhf.removed_name(__name__, name, _REMOVED, globals())
