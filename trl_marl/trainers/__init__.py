"""Trainers: one `XConfig` + `XTrainer` pair per algorithm, all on `MultiAgentTrainer` (`base`); `registry` lists them.

`MultiAgentTrainer` composes the parts every algorithm shares: `building` (the team, its references and parameter
groups), `trl_marl.generation` (the engine it samples with), `agentic` (`tools=`, `environment_factory=`, the turn
order: the agentic rollout), `metrics` (`MetricsRecorder`), `evaluation` (`TaskEvaluator`), `checkpoints` (team
folders, resume state, the phases of `train()` and preemption), `finite` (a non-finite loss, gradient or weight stops
the run), `arguments`, `names` and `config_checks` (the checks and TRL's argument names), `data` (what a training step
gets), `per_agent` (settings given once or per agent). An RL algorithm adds its step, a part its trainer holds
(`rl_step`: `RLStep`, and `RLStepTrainer` whose hooks delegate to it): `group_baseline` (`GroupBaselineStep`, the
group baselines of `reinforce`'s trainers, whose configs with GRPOConfig's fields are in `reinforce_config`; TRL's
GRPO loss family per agent in `grpo_step`), `actor_critic/` (critics: `ActorCriticStep` and the MAAC / IAC / MAPPO
variants); `preference/` adds pairs, DPO and a learned reward (MARLHF holds the step of its `rl_algorithm`).

The names below import on first use, as at the package root, so that `trl_marl.trainers.registry` (which the command
line reads) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_LAZY = {
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
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trl_marl.trainers' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover
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
