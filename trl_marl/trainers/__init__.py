"""Trainers: one `XConfig` + `XTrainer` pair per algorithm, all on `MultiAgentTrainer` (`base`).

`MultiAgentTrainer` composes the parts every algorithm shares: `building` (the team, its references and parameter
groups), `trl_marl.generation` (the engine it samples with), `metrics` (`MetricsRecorder`), `evaluation`
(`TaskEvaluator`), `checkpoints` (team folders, resume state, preemption), `arguments` and `names` (the checks and
TRL's argument names), `data` (what a training step gets). An algorithm adds its step: `reinforce` (the group
baselines), `actor_critic/` (critics), `preference/` (pairs, DPO, a learned reward).
"""

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
