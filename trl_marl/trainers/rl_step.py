"""The RL step: what one RL algorithm adds to `MultiAgentTrainer`, as a part the trainer holds.

`RLStep` is the interface: the hooks in which the REINFORCE family (`trainers/group_baseline.py`:
`GroupBaselineStep`) and the actor-critic trainers (`trainers/actor_critic/step.py`: `ActorCriticStep` and its MAAC,
IAC and MAPPO variants) differ. `RLStepTrainer` is a `MultiAgentTrainer` whose hooks delegate to its step
(`self.rl_step`); the algorithm's trainers (`MAGRPOTrainer`, `MAACTrainer`, ...) build one step each, and
`MARLHFTrainer` builds the one its `rl_algorithm` names, so MARLHF trains with the same code as the trainer of its
backend and stays a `MARLHFTrainer`.

The step is attached to ONE trainer (`self.trainer`) when it is built, before `MultiAgentTrainer.__init__` (the team
is built through it: `loading_config`, `build_team`); `attach` runs once the Trainer exists (callbacks, devices).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from trl_marl.data_types.rollout import Rollout
from trl_marl.models.team import TeamModel
from trl_marl.rollout.returns import RolloutReturns
from trl_marl.trainers.base import MultiAgentTrainer
from trl_marl.trainers.config import MultiAgentConfig
from trl_marl.trainers.data import Experience, consecutive_chunks

__all__ = ["RLStep", "RLStepTrainer"]


class RLStep:
    """The algorithm-specific part of an RL trainer (see the module docstring). The defaults are a plain team of
    agents with nothing beside them; `experience` and `compute_loss` are the algorithm's own.

    Attributes:
        resume_types: classes a checkpoint's resume state may hold because of this step (its experience's data).
        supports_per_agent_rewards: whether rewards may be one list of `num_agents` floats per joint action.
        supports_shared_base: whether the agents may be adapters on one shared base (`share_base_model=True`).
    """

    resume_types: tuple[type, ...] = ()
    supports_per_agent_rewards = False
    supports_shared_base = True

    def __init__(self, trainer: MultiAgentTrainer):
        self.trainer = trainer

    # ---- building (before and right after MultiAgentTrainer.__init__)
    def loading_config(self, model_config: Any, args: MultiAgentConfig) -> Any:
        """The agents' loading options from the merged `model_config`; a step that loads other models (critics)
        takes their options out here."""
        return model_config

    def build_team(self, models: list[PreTrainedModel], names: list[str], args: MultiAgentConfig) -> TeamModel:
        """The team module (agents, plus whatever the step trains beside them)."""
        return TeamModel(models, names)

    def attach(self) -> None:
        """Once the Trainer is built: callbacks, device placement, state that needs the engine."""

    # ---- the optimizer
    def extra_param_groups(self, team: nn.Module, decay: set[str]) -> list[dict]:
        """Parameter groups beyond the agents' (critics, value heads)."""
        return []

    def extra_clip_groups(self) -> list[list[torch.nn.Parameter]]:
        """Parameter sets clipped by their own norm beyond the agents'."""
        return []

    def extra_grad_norm_modules(self) -> list[tuple[str, nn.Module]]:
        """Modules beyond the agents whose gradient norm is logged (`<name>/grad_norm`)."""
        return []

    # ---- the step
    def experience(self, rollout: Rollout, returns: RolloutReturns) -> Experience:
        """The algorithm's view of a training rollout: per-agent advantages as tensors, and the step's inputs."""
        raise NotImplementedError(f"{type(self).__name__} does not train on rollouts")

    def update_chunks(self, num_items: int) -> list[list[int]]:
        """The item indices of each training step taken on one rollout: `steps_per_rollout` consecutive slices."""
        return consecutive_chunks(num_items, self.trainer.args.steps_per_rollout)

    def compute_loss(self, model: nn.Module, inputs: dict) -> torch.Tensor:
        """This training step's loss on `inputs` (one entry of what `_rollout_step` returned)."""
        raise NotImplementedError

    # ---- saving
    def save_extra(self, output_dir: str, state_dict: dict) -> None:
        """Write what the step trains beside the agents into a team folder."""

    def load_extra(self, checkpoint: str, team: nn.Module) -> None:
        """Load what `save_extra` wrote."""

    def describe(self, description: dict) -> dict:
        """`team.json`'s description of the team, with what the step adds."""
        return description


class RLStepTrainer(MultiAgentTrainer):
    """A `MultiAgentTrainer` whose algorithm hooks delegate to its RL step, `self.rl_step`: a subclass sets it before
    calling `__init__` (the team is built through it)."""

    rl_step: RLStep

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rl_step.attach()

    @property
    def supports_per_agent_rewards(self) -> bool:  # type: ignore[override]
        return self.rl_step.supports_per_agent_rewards

    @property
    def supports_shared_base(self) -> bool:  # type: ignore[override]
        return self.rl_step.supports_shared_base

    def _loading_config(self, model_config: Any, args: MultiAgentConfig) -> Any:
        return self.rl_step.loading_config(super()._loading_config(model_config, args), args)

    def _build_team(self, models: list[PreTrainedModel], names: list[str], args: MultiAgentConfig) -> TeamModel:
        return self.rl_step.build_team(models, names, args)

    def _extra_param_groups(self, team: nn.Module, decay: set[str]) -> list[dict]:
        return super()._extra_param_groups(team, decay) + self.rl_step.extra_param_groups(team, decay)

    def _extra_clip_groups(self) -> list[list[torch.nn.Parameter]]:
        return super()._extra_clip_groups() + self.rl_step.extra_clip_groups()

    def _grad_norm_modules(self) -> list[tuple[str, nn.Module]]:
        return super()._grad_norm_modules() + self.rl_step.extra_grad_norm_modules()

    def _experience(self, rollout: Rollout, returns: RolloutReturns) -> Experience:
        return self.rl_step.experience(rollout, returns)

    def _update_chunks(self, num_items: int) -> list[list[int]]:
        return self.rl_step.update_chunks(num_items)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The RL step's loss on this step's inputs (`RLStep.compute_loss`)."""
        return self.rl_step.compute_loss(model, inputs)

    def _save_extra(self, output_dir: str, state_dict: dict) -> None:
        super()._save_extra(output_dir, state_dict)
        self.rl_step.save_extra(output_dir, state_dict)

    def _load_extra(self, checkpoint: str, team: nn.Module) -> None:
        super()._load_extra(checkpoint, team)
        self.rl_step.load_extra(checkpoint, team)

    def _team_description(self) -> dict:
        return self.rl_step.describe(super()._team_description())
