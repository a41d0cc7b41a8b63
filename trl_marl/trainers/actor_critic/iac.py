"""`IACTrainer`: independent actor-critic, one critic per agent over its own history."""

from __future__ import annotations

from trl_marl.data_types.critic import ValueStream
from trl_marl.trainers.actor_critic.config import IACConfig
from trl_marl.trainers.actor_critic.critics import AGENT_COPY
from trl_marl.trainers.actor_critic.step import ActorCriticStep
from trl_marl.trainers.actor_critic.trainer import ActorCriticTrainer

__all__ = ["IACStep", "IACTrainer"]


class IACStep(ActorCriticStep):
    """IAC's step: one critic per agent over its own history (a separate model, or a value head on the actor)."""

    joint_critic = False

    def _resolve_critic_sources(self, args, critic_model, critics):
        if not args.use_separate_critic:
            if critic_model is not None or critics is not None:
                raise ValueError(
                    "IACTrainer with use_separate_critic=False puts a value head on each actor and takes no critic "
                    "model: do not pass critic_model or critics (or set use_separate_critic=True)"
                )
            return None
        if critic_model is None and critics is None:
            return [AGENT_COPY] * args.num_agents
        return super()._resolve_critic_sources(args, critic_model, critics)

    def _critics_length_message(self, args, got: int) -> str:
        return f"critics has {got} entries but num_agents is {args.num_agents}: IAC has one critic per agent"

    def _value_clip_range(self, stream: ValueStream) -> float | None:
        return self.args.value_clip_range if stream.module is None else None


class IACTrainer(ActorCriticTrainer):
    """Independent actor-critic: one critic per agent over that agent's own history; agent i gets ITS OWN TD error.

        delta_{i,t} = r_{i,t} + gamma * V_i(h_{i,t+1}) - V_i(h_{i,t})
        loss = sum_i [ - mean( logprob_sum(a_{i,t}) * delta_{i,t} ) + value_loss_coef * L(phi_i) ]

    With `use_separate_critic=True` (default) `critic_model` / `critics` give the critics (default: a separately
    loaded copy of each agent's model); they read the agent's own token ids, so each must share its agent's tokenizer.
    With `use_separate_critic=False` a value head on each actor's backbone is the critic (no critic may be passed),
    trained together with the actor, with optional value clipping (`value_clip_range`).
    """

    _name = "IAC"
    _tag_names = ["trl", "trl_marl", "multi-agent", "iac", "actor-critic"]
    config_class = IACConfig
    step_class = IACStep
