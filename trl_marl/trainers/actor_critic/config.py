"""The actor-critic trainers' configs: `ActorCriticConfig` (the fields they share), `MAACConfig`, `IACConfig` and
`MAPPOConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl_marl.models.value_head import CRITIC_TYPES
from trl_marl.trainers.config import MultiAgentConfig
from trl_marl.trainers.config_checks import check_devices, check_mp_only

__all__ = [
    "ActorCriticConfig",
    "MAACConfig",
    "IACConfig",
    "MAPPOConfig",
    "RATIO_LEVELS",
    "check_actor_critic_fields",
    "check_iac_fields",
    "check_maac_fields",
]

RATIO_LEVELS = ("token", "sequence")


@dataclass
class ActorCriticConfig(MultiAgentConfig):
    r"""Fields shared by the actor-critic trainers (`MAACConfig`, `IACConfig`, `MAPPOConfig`).

    All `MultiAgentConfig` fields, with these defaults changed: `num_generations=1` (one trajectory per item; more
    than 1 is allowed only with `num_turns=1`) and `rollout_buffer_size=8`. A rollout of `rollout_buffer_size` items
    gives `rollout_buffer_size * num_generations` samples per (agent, turn) group; the update uses every group,
    including smaller ones (later turns of rollouts that ended early). `joint_mode` must be `"aligned"`.

    Parameters:
        critic_type: `"v"` for a state-value critic V(h) (read at the last prompt token), `"q"` for an action-value
            critic Q(h, a) (read at the last completion token); in Q mode the bootstrap uses the sampled next action.
        critic_learning_rate: learning rate of the separate critics' parameter groups; `None` uses the first
            agent's (`agent_learning_rate`, or `learning_rate`).
        value_loss_coef: weight of the critic loss in the total loss.
        advantage_normalization: z-score the advantages (TD errors) inside each (agent, turn) group before the
            update; a group of one sample, or of equal values, gets zero.
        critic_value_head_hidden_dim: hidden size of the separate critics' value head (`None`: a linear head).
        critic_devices: one device per critic (or one for all) in `parallel_training="mp"` mode, where separate
            critics need it; read there only, so it is refused in `"none"` mode (accelerate places the critics) and
            with value heads on the actors (IAC's `use_separate_critic=False`).
    """

    num_generations: int = field(
        default=1, metadata={"help": "Completions per agent per prompt (must be 1 when num_turns > 1)."}
    )
    rollout_buffer_size: int = field(default=8, metadata={"help": "Task items rolled out together per process."})
    critic_type: str = field(
        default="v", metadata={"help": "'v' for V(h), 'q' for Q(h, a).", "choices": list(CRITIC_TYPES)}
    )
    critic_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the separate critics; None uses the agents' rate."}
    )
    value_loss_coef: float = field(default=0.6, metadata={"help": "Weight of the critic loss."})
    advantage_normalization: bool = field(
        default=True, metadata={"help": "Z-score advantages inside each (agent, turn) group."}
    )
    critic_value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden size of the separate critics' value head; None = linear."}
    )
    critic_devices: list[str] | None = field(
        default=None, metadata={"help": "One device per critic (or one for all) in 'mp' mode."}
    )

    @property
    def uses_separate_critics(self) -> bool:
        """Whether the critics are models of their own (they then need `critic_devices` in `mp` mode)."""
        return True

    @property
    def num_critics(self) -> int:
        """How many critics (value streams) the trainer trains."""
        return 1

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        check_actor_critic_fields(self, self.num_critics, self.uses_separate_critics)


@dataclass
class MAACConfig(ActorCriticConfig):
    r"""Configuration of `MAACTrainer` (multi-agent actor-critic with ONE centralized critic).

    All `ActorCriticConfig` fields, plus:

    Parameters:
        critic_max_length: the centralized critic's input (every agent's prompt, plus the completions in Q mode) is
            truncated to this many tokens from the left (the end, where the value is read, is kept); `None` keeps
            it whole.

    There is no `value_clip_range`: MAAC's critic uses the unclipped squared error, and its actors no ratio.
    """

    critic_max_length: int | None = field(
        default=None, metadata={"help": "Truncate the joint critic input to this many tokens (from the left)."}
    )

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        check_maac_fields(self)


@dataclass
class IACConfig(ActorCriticConfig):
    r"""Configuration of `IACTrainer` (independent actor-critic: one critic per agent over its own history).

    All `ActorCriticConfig` fields, plus:

    Parameters:
        use_separate_critic: `True`: each agent's critic is a separate model (`critic_model` / `critics`, by default
            a separately loaded copy of the agent's model), trained with the unclipped squared error at
            `critic_learning_rate`. `False`: a value head on each actor's backbone, trained with the actor on
            `actor_loss + value_loss_coef * critic_loss` at `agent_learning_rate`.
        value_clip_range: PPO-style value clipping `eps` in shared-model mode (`use_separate_critic=False`);
            `None` disables it. Setting it with separate critics is an error (they do not clip).
        value_head_hidden_dim: hidden size of the value heads on the actors in shared-model mode (`None`: linear).
    """

    use_separate_critic: bool = field(
        default=True, metadata={"help": "Separate critic models (True) or value heads on the actors (False)."}
    )
    value_clip_range: float | None = field(
        default=None, metadata={"help": "Value clipping eps in shared-model mode; None disables."}
    )
    value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden size of the value heads on the actors; None = linear."}
    )

    @property
    def uses_separate_critics(self) -> bool:
        return self.use_separate_critic

    @property
    def num_critics(self) -> int:
        return self.num_agents

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        check_iac_fields(self)


@dataclass
class MAPPOConfig(MAACConfig):
    r"""Configuration of `MAPPOTrainer` (multi-agent PPO with a centralized value function).

    All `MAACConfig` fields, plus:

    Parameters:
        ppo_epochs: optimisation passes over each rollout (each pass takes `rollout_buffer_size / train_batch_size`
            steps, on minibatches reshuffled every pass).
        clip_range: `eps` of the clipped surrogate, `min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)`.
        ratio_level: `"token"`: one ratio per completion token (the surrogate is averaged over the minibatch's
            completion tokens); `"sequence"`: one ratio per completion, `exp(logprob_sum - old_logprob_sum)`
            (averaged over completions).
        gae_lambda: lambda of GAE across turns (`0`: one-step TD errors; `1`: Monte Carlo returns minus values).
        value_clip_range: value clipping `eps` around the rollout-time prediction; `None` disables.
        value_normalization: the critic predicts targets normalized by a running mean / std of all targets seen
            (saved with the critic); advantages use the de-normalized values.
        popart: with value normalization, rescale the value head's last layer whenever the statistics change so that
            its de-normalized outputs are preserved (PopArt); not available under DeepSpeed.
        shared_critic: `True`: one centralized critic for the team (team reward, the same advantage for every agent);
            `False`: one critic per agent, each reading the JOINT history and learning that agent's reward (the
            CTDE critic of MADDPG).
    """

    ppo_epochs: int = field(default=2, metadata={"help": "Optimisation passes over each rollout."})
    clip_range: float = field(default=0.2, metadata={"help": "PPO ratio clipping eps."})
    ratio_level: str = field(
        default="token",
        metadata={"help": "Policy ratio per 'token' or per 'sequence'.", "choices": list(RATIO_LEVELS)},
    )
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda across turns."})
    value_clip_range: float | None = field(default=0.2, metadata={"help": "Value clipping eps; None disables."})
    value_normalization: bool = field(
        default=True, metadata={"help": "Normalize value targets with a running mean / std."}
    )
    popart: bool = field(default=False, metadata={"help": "PopArt: preserve outputs when the statistics change."})
    shared_critic: bool = field(
        default=True, metadata={"help": "One shared critic (True) or one per agent on the joint history (False)."}
    )

    @property
    def num_critics(self) -> int:
        return 1 if self.shared_critic else self.num_agents

    @property
    def steps_per_rollout(self) -> int:
        """Training steps per rollout: `ppo_epochs * rollout_buffer_size / train_batch_size`."""
        return self.ppo_epochs * super().steps_per_rollout

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(self.ppo_epochs >= 1, f"ppo_epochs must be >= 1, got {self.ppo_epochs}")
        need(self.clip_range > 0, f"clip_range must be > 0, got {self.clip_range}")
        need(
            self.ratio_level in RATIO_LEVELS,
            f"ratio_level must be one of {list(RATIO_LEVELS)}, got {self.ratio_level!r}",
        )
        need(0.0 <= self.gae_lambda <= 1.0, f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        need(
            self.value_clip_range is None or self.value_clip_range > 0,
            f"value_clip_range must be None or > 0, got {self.value_clip_range}",
        )
        need(not self.popart or self.value_normalization, "popart=True needs value_normalization=True")


def check_actor_critic_fields(cfg: Any, num_critics: int, separate_critics: bool) -> None:
    """The checks of the fields every actor-critic config has (`ActorCriticConfig`, and `MARLHFConfig` with an
    actor-critic backend): `num_critics` critics, separate models or value heads.

    Raises:
        ValueError: naming the field and what it allows.
    """

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ValueError(msg)

    need(
        cfg.critic_type in CRITIC_TYPES,
        f"critic_type must be 'v' (V(h)) or 'q' (Q(h, a)), got {cfg.critic_type!r}",
    )
    need(
        cfg.num_turns == 1 or cfg.num_generations == 1,
        f"num_turns={cfg.num_turns} needs num_generations=1: actor-critic trainers follow one trajectory per "
        f"item, got num_generations={cfg.num_generations}",
    )
    need(
        cfg.joint_mode == "aligned",
        "actor-critic trainers need joint_mode='aligned' (each sample belongs to exactly one joint action and "
        f"gets one TD error), got {cfg.joint_mode!r}",
    )
    need(cfg.value_loss_coef >= 0, f"value_loss_coef must be >= 0, got {cfg.value_loss_coef}")
    need(
        cfg.critic_learning_rate is None or cfg.critic_learning_rate >= 0,
        f"critic_learning_rate must be None or >= 0, got {cfg.critic_learning_rate}",
    )
    need(
        cfg.critic_value_head_hidden_dim is None or cfg.critic_value_head_hidden_dim >= 1,
        f"critic_value_head_hidden_dim must be None or >= 1, got {cfg.critic_value_head_hidden_dim}",
    )
    if cfg.parallel_training == "mp" and separate_critics:
        need(
            bool(cfg.critic_devices),
            "parallel_training='mp' needs critic_devices (one device per critic, or one for all) for the "
            "separate critics",
        )
    # read when separate critics are placed in "mp" mode only (`critic_device`): elsewhere it was ignored
    check_mp_only("critic_devices", cfg.critic_devices, cfg.parallel_training, "the critics")
    if cfg.critic_devices is not None and not separate_critics:
        raise ValueError(
            f"critic_devices={cfg.critic_devices!r} places separate critic models, and with "
            "use_separate_critic=False the critics are value heads on the actors, placed with their agents "
            "(agent_devices): leave critic_devices unset, or set use_separate_critic=True"
        )
    check_devices("critic_devices", cfg.critic_devices, "accelerate places the critics")
    if cfg.critic_devices is not None:
        need(
            len(cfg.critic_devices) in (1, num_critics),
            f"critic_devices has {len(cfg.critic_devices)} entries; give 1 or one per critic ({num_critics})",
        )


def check_maac_fields(cfg: Any) -> None:
    """The checks of MAAC's own field (`critic_max_length`)."""
    if cfg.critic_max_length is not None and cfg.critic_max_length < 1:
        raise ValueError(f"critic_max_length must be None or >= 1, got {cfg.critic_max_length}")


def check_iac_fields(cfg: Any) -> None:
    """The checks of IAC's own fields (`use_separate_critic`, `value_clip_range`, `value_head_hidden_dim`)."""
    if cfg.value_clip_range is not None:
        if cfg.use_separate_critic:
            raise ValueError(
                "value_clip_range applies only in shared-model mode (use_separate_critic=False); separate "
                "critics use the unclipped squared error. Set value_clip_range=None or use_separate_critic=False"
            )
        if cfg.value_clip_range <= 0:
            raise ValueError(f"value_clip_range must be None or > 0, got {cfg.value_clip_range}")
    if cfg.value_head_hidden_dim is not None and cfg.value_head_hidden_dim < 1:
        raise ValueError(f"value_head_hidden_dim must be None or >= 1, got {cfg.value_head_hidden_dim}")
