"""`ActorCriticTrainer`: what MAAC, IAC and MAPPO share: critics passed as `critic_model=` / `critics=`, and the
trainer's RL step, an `ActorCriticStep` (`step.py`) of the trainer's `step_class`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers import PreTrainedModel

from trl_marl.models.value_head import CausalLMWithValueHead
from trl_marl.trainers.actor_critic.config import ActorCriticConfig
from trl_marl.trainers.actor_critic.step import ActorCriticStep
from trl_marl.trainers.rl_step import RLStepTrainer

__all__ = ["ActorCriticTrainer"]


class ActorCriticTrainer(RLStepTrainer):
    """Base of the actor-critic trainers: critics inside the team, frozen TD targets, (agent, turn) groups
    (`ActorCriticStep`).

    Arguments as `MultiAgentTrainer`, plus:
        critic_model: the critic source broadcast to every critic: a model id / path (loaded once per critic:
            independent parameters), a causal LM object or a `CausalLMWithValueHead` (ONE object broadcast: the
            critics share its parameters).
        critics: a list of critic sources, one per critic (ids, model objects; the same object twice is shared).

    `reward_funcs` may return one float per joint action (shared) or one list of `num_agents` floats (per agent).
    """

    config_class = ActorCriticConfig
    step_class: type[ActorCriticStep] = ActorCriticStep  # the variant's step (`MAACStep`, `IACStep`, `MAPPOStep`)
    resume_types = ActorCriticStep.resume_types

    def __init__(
        self,
        model: str | PreTrainedModel | Sequence[str | PreTrainedModel] | None = None,
        reward_funcs: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
        args: ActorCriticConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        *,
        critic_model: str | PreTrainedModel | CausalLMWithValueHead | None = None,
        critics: Sequence[str | PreTrainedModel | CausalLMWithValueHead] | None = None,
        **kwargs: Any,
    ):
        args = self._checked_args(args)
        self.rl_step = self.step_class(self, args, critic_model, critics)
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, **kwargs)
