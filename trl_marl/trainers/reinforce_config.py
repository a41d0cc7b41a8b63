"""The configs of the REINFORCE family (`MAGRPOConfig` and its siblings): the team's fields plus `GRPOConfig`'s loss
family, with TRL 1.16's names and meanings, each loss and sampling setting given once or per agent.

`loss_type=None` (the default) keeps trl_marl's seed loss (`trl_marl.algorithms.grpo.seed_loss_mapping` says what it
is in TRL terms); setting `loss_type` trains with `trl_marl.algorithms.grpo.grpo_loss`, per agent, on that agent's
tokens (`trl_marl.trainers.grpo_step`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, fields

from trl_marl.algorithms.grpo import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    VLLM_IMPORTANCE_SAMPLING_MODES,
    GRPOLossSettings,
)
from trl_marl.algorithms.grpo_advantages import MULTI_OBJECTIVE_AGGREGATIONS, SCALE_REWARDS
from trl_marl.generation.kwargs_checks import check_generation_kwargs
from trl_marl.trainers.config import MultiAgentConfig
from trl_marl.trainers.config_checks import parse_json_field
from trl_marl.trainers.per_agent import agent_value, agent_values, check_per_agent
from trl_marl.utils.deprecation import warn_deprecated

__all__ = [
    "MAGRPOConfig",
    "MAREINFORCEConfig",
    "MARLOOConfig",
    "MAReMaxConfig",
    "LOSS_SETTING_FIELDS",
    "PER_AGENT_FIELDS",
]

# `GRPOLossSettings` fields a config carries under the same name, each one value or one per agent
LOSS_SETTING_FIELDS = tuple(f.name for f in fields(GRPOLossSettings) if f.name != "max_completion_length")
# every field of the family that takes one value per agent (the sampling fields of `MultiAgentConfig` too)
PER_AGENT_FIELDS = (
    *LOSS_SETTING_FIELDS,
    "scale_rewards",
    "mask_truncated_completions",
    "min_p",
    "repetition_penalty",
    "generation_kwargs",
)
# fields that change TRL's loss and nothing under the seed loss: refused with loss_type=None unless at their default
_TRL_LOSS_ONLY = (
    *(name for name in LOSS_SETTING_FIELDS if name != "loss_type"),
    "num_iterations",
    "mask_truncated_completions",
    "sync_ref_model",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
)


@dataclass
class MAGRPOConfig(MultiAgentConfig):
    r"""Configuration of `MAGRPOTrainer` (multi-agent group-relative policy optimisation) and its siblings.

    All `MultiAgentConfig` fields, plus the fields of TRL's `GRPOConfig` with TRL 1.16's meaning (docs/magrpo.md has
    each formula). Settings marked "per agent" take one value for the team or a list with one value per agent (a
    list of one: every agent), each applied to that agent's tokens; so do `temperature`, `top_p`, `top_k` and
    `max_completion_length` here (each agent is scored at its own temperature). From the command line they take one
    value.

    Parameters:
        loss_type: per agent. None (default): trl_marl's seed loss, `-mean_b(A_b * sum_t logp_bt)` on-policy (its
            gradient is `max_completion_length` x TRL's `dr_grpo`'s, `seed_loss_mapping`); or one of TRL's
            `"grpo"`, `"dapo"` (GRPOConfig's default), `"dr_grpo"`, `"bnpo"`, `"cispo"`, `"sapo"`, `"luspo"`,
            `"vespo"`. The other loss fields below need it set.
        scale_rewards: per agent. How advantages are scaled: `"group"` (by the Bessel std of the agent's group of
            G samples at a node, plus 1e-4: GRPOConfig's default), `"batch"` (the std of the agent's whole
            generation batch), `"none"` (Dr. GRPO). The baseline is the trainer's (MAGRPO: the group mean, exactly
            TRL's). None (default): the seed's scaling, `advantage_normalization`'s.
        advantage_normalization: deprecated alias: False is `scale_rewards="none"`; True keeps the seed's z-score
            (population std, no epsilon; TRL's `"group"` is it divided by `sqrt(G/(G-1)) + 1e-4/std`). Unset: on
            for MAGRPO, off for its siblings.
        beta: per agent. TRL's KL coefficient: `beta * k3(logp, logp_ref)` per token in the LOSS, the reference
            being the agent's initial weights (with PEFT, its base with the adapter disabled). 0 builds no
            reference. Refused with `reference_kl_enabled` (the seed's reward-side KL, a different estimator).
        epsilon, epsilon_high: per agent. The clip range `[1 - epsilon, 1 + epsilon_high]` of the importance ratio
            (`epsilon_high` None: `epsilon`; for `cispo` the absolute cap of the ratio).
        delta: per agent. INTELLECT-2's upper cap of the unclipped ratio (None: off).
        importance_sampling_level: per agent. `"token"` or `"sequence"` (GSPO: one ratio per completion).
        sapo_temperature_pos, sapo_temperature_neg: per agent. SAPO's gate temperatures (A > 0 / A <= 0).
        vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: per agent. VESPO's Gamma weight parameters.
        use_bias_correction_kl: per agent. Multiply the per-token KL by the importance ratio (TRL's default True).
        off_policy_mask_threshold: per agent. DeepSeek-V3.2's off-policy sequence mask (None: off).
        top_entropy_quantile: per agent. Only the top-rho quantile of the agent's tokens by entropy keep their policy
            term (1.0: all).
        entropy_coef: per agent. Weight of TRL's entropy bonus `- entropy_coef * mean token entropy` (0: off).
        mask_truncated_completions: per agent. A completion cut at the agent's `max_completion_length` (its last
            token is not EOS) is left out of that agent's loss.
        num_iterations: optimizer passes over each generation (TRL's mu); the rollout is generated ONCE and reused,
            the clipped ratio against the log-probs at generation correcting the drift.
        steps_per_generation: training steps taken on one rollout (TRL's; it must divide the generation batch,
            `rollout_buffer_size` task items: `train_batch_size = rollout_buffer_size / steps_per_generation`).
            None: `rollout_buffer_size / train_batch_size`. After construction it holds that value.
        generation_batch_size: TRL's: completions each agent samples per generation over all processes (first
            turn); sets `rollout_buffer_size = generation_batch_size / (num_generations x processes)`. None: from
            `rollout_buffer_size`. After construction it holds that value.
        min_p: per agent. Minimum token probability relative to the most likely token (None: off).
        repetition_penalty: per agent. transformers' / vLLM's repetition penalty (1.0: off).
        generation_kwargs: per agent (a dict, or a list of dicts). More keyword arguments of `GenerationConfig`
            (or vLLM's `SamplingParams` with `use_vllm`); they override the fields above. A JSON string from the
            command line. Refused when the config is built: a key the backend in use does not take (with
            `use_vllm="auto"`, a key of one backend only is a warning), `num_return_sequences` / `n` (that is
            `num_generations`), and `do_sample=False` with `num_generations > 1`
            (`trl_marl.generation.kwargs_checks.check_generation_kwargs`).
        multi_objective_aggregation: with a list of `reward_funcs`: `"sum_then_normalize"` (default: the weighted
            sum is the team reward) or `"normalize_then_sum"` (GDPO: each function's rewards are normalised in their
            group, summed with `reward_weights`, and the sum normalised over the agent's batch; needs
            `num_turns=1`).
        sync_ref_model: move each agent's reference toward it every `ref_model_sync_steps` optimizer steps,
            `ref = alpha * agent + (1 - alpha) * ref` (TR-DPO; TRL's `SyncRefModelCallback`). Needs `beta > 0` and
            no PEFT (the PEFT reference is the adapter-disabled base, not a model of its own).
        ref_model_mixup_alpha: that alpha.
        ref_model_sync_steps: that period.
        vllm_importance_sampling_correction: with `use_vllm` and `loss_type`: multiply each token's policy term by
            the ratio of the trainer's and vLLM's probabilities of the sampled tokens (TRL's default True).
        vllm_importance_sampling_mode: `"token_truncate"`, `"token_mask"`, `"sequence_truncate"` or
            `"sequence_mask"` (default).
        vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max: bounds of that ratio (None, 3.0).
        remax_baseline: `MAReMaxTrainer` only (the others refuse `"greedy"`): `"max"` — the group's best sample,
            `A_j = R_j - max(R)` (the reference library's meaning); `"greedy"` — ReMax proper,
            `A_j = R_j - R(greedy)`: every node is also decoded greedily by each agent (one more batched `generate`
            per agent) and that joint action is scored in the same reward call. `"greedy"` needs `num_turns=1`.
    """

    _per_agent_settings = True
    _per_agent_fields = PER_AGENT_FIELDS
    # the seed's scaling when `advantage_normalization` is unset: MAGRPO z-scores, its siblings do not
    _seed_normalization = True

    loss_type: str | None = field(
        default=None,
        metadata={
            "help": "TRL's GRPO loss (per agent): grpo, dapo, dr_grpo, bnpo, cispo, sapo, luspo, vespo; "
            "None keeps the seed loss."
        },
    )
    scale_rewards: str | None = field(
        default=None,
        metadata={"help": "Advantage scaling (per agent): group, batch or none; None keeps the seed's."},
    )
    advantage_normalization: bool | None = field(
        default=None,
        metadata={"help": "Deprecated: scale_rewards. True: the seed's z-score; False: scale_rewards='none'."},
    )
    beta: float = field(default=0.0, metadata={"help": "KL coefficient of TRL's loss-side k3 term (per agent)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip of the importance ratio (per agent)."})
    epsilon_high: float | None = field(
        default=None, metadata={"help": "Upper clip of the importance ratio (per agent); None: epsilon."}
    )
    delta: float | None = field(default=None, metadata={"help": "Cap of the unclipped ratio (per agent)."})
    importance_sampling_level: str = field(
        default="token",
        metadata={"help": "token, or sequence (GSPO), per agent.", "choices": list(IMPORTANCE_SAMPLING_LEVELS)},
    )
    sapo_temperature_pos: float = field(default=1.0, metadata={"help": "SAPO gate temperature for A > 0."})
    sapo_temperature_neg: float = field(default=1.05, metadata={"help": "SAPO gate temperature for A <= 0."})
    vespo_k_pos: float = field(default=2.0, metadata={"help": "VESPO k for A >= 0."})
    vespo_lambda_pos: float = field(default=3.0, metadata={"help": "VESPO lambda for A >= 0."})
    vespo_k_neg: float = field(default=3.0, metadata={"help": "VESPO k for A < 0."})
    vespo_lambda_neg: float = field(default=2.0, metadata={"help": "VESPO lambda for A < 0."})
    use_bias_correction_kl: bool = field(
        default=True, metadata={"help": "Multiply the per-token KL by the importance ratio (per agent)."}
    )
    off_policy_mask_threshold: float | None = field(
        default=None, metadata={"help": "Off-policy sequence mask threshold (per agent); None: off."}
    )
    top_entropy_quantile: float = field(
        default=1.0, metadata={"help": "Keep the top-rho quantile of tokens by entropy (per agent)."}
    )
    entropy_coef: float = field(default=0.0, metadata={"help": "Entropy bonus weight (per agent)."})
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Leave completions cut at max_completion_length out of the loss."}
    )
    num_iterations: int = field(default=1, metadata={"help": "Optimizer passes over each generation."})
    steps_per_generation: int | None = field(
        default=None, metadata={"help": "Training steps per rollout (divides rollout_buffer_size)."}
    )
    generation_batch_size: int | None = field(
        default=None, metadata={"help": "Completions per agent per generation over all processes."}
    )
    min_p: float | None = field(default=None, metadata={"help": "Minimum relative token probability (per agent)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Repetition penalty (per agent); 1.0: off."})
    generation_kwargs: dict | str | None = field(
        default=None, metadata={"help": "More GenerationConfig / SamplingParams keyword arguments (JSON)."}
    )
    multi_objective_aggregation: str = field(
        default="sum_then_normalize",
        metadata={
            "help": "sum_then_normalize or normalize_then_sum (GDPO).",
            "choices": list(MULTI_OBJECTIVE_AGGREGATIONS),
        },
    )
    sync_ref_model: bool = field(default=False, metadata={"help": "Move the references toward the agents (TR-DPO)."})
    ref_model_mixup_alpha: float = field(default=0.6, metadata={"help": "TR-DPO's alpha."})
    ref_model_sync_steps: int = field(default=512, metadata={"help": "TR-DPO's sync period in optimizer steps."})
    vllm_importance_sampling_correction: bool = field(
        default=True, metadata={"help": "With use_vllm and loss_type: correct for vLLM's sampling probabilities."}
    )
    vllm_importance_sampling_mode: str = field(
        default="sequence_mask",
        metadata={
            "help": "token_truncate, token_mask, sequence_truncate or sequence_mask.",
            "choices": list(VLLM_IMPORTANCE_SAMPLING_MODES),
        },
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None, metadata={"help": "Lower bound of the vLLM IS ratio (None: none)."}
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0, metadata={"help": "Upper bound of the vLLM IS ratio (None: none)."}
    )
    remax_baseline: str = field(
        default="max",
        metadata={
            "help": "MAReMax only: max (the group's best sample) or greedy (the greedy joint action's reward).",
            "choices": ["max", "greedy"],
        },
    )

    def __post_init__(self):
        if isinstance(self.generation_kwargs, str):  # from the command line, as in TRL
            self.generation_kwargs = parse_json_field(
                "generation_kwargs",
                self.generation_kwargs,
                "a JSON object such as '{\"no_repeat_ngram_size\": 2}', or a list of them (one per agent)",
            )
        self.scale_rewards = _trl_scale_rewards(self.scale_rewards)
        self._resolve_advantage_normalization()
        self._resolve_generation_batch()
        super().__post_init__()
        self.steps_per_generation = self.steps_per_rollout
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.generation_batch_size = self.rollout_buffer_size * self.num_generations * world

    def _resolve_advantage_normalization(self) -> None:
        """`advantage_normalization` (deprecated) onto `scale_rewards`: False is `"none"`; True, with `scale_rewards`
        unset, keeps the seed's z-score (`seed_zscore`)."""
        alias = self.advantage_normalization
        if alias is not None:
            warn_deprecated(
                "`advantage_normalization` is deprecated; use `scale_rewards` (TRL's name): 'none' for False, 'group' "
                "for TRL's group scaling (the Bessel std + 1e-4; True keeps the seed's population-std z-score, "
                "sqrt(G/(G-1)) larger)",
                stacklevel=4,
            )
            scaled = {s != "none" for s in _as_list(self.scale_rewards) if s is not None}
            if scaled and scaled != {bool(alias)}:
                raise ValueError(
                    f"advantage_normalization={alias!r} and scale_rewards={self.scale_rewards!r} disagree: "
                    "advantage_normalization is a deprecated alias of scale_rewards; set only scale_rewards"
                )
            if self.scale_rewards is None and not alias:
                self.scale_rewards = "none"

    def _resolve_generation_batch(self) -> None:
        """TRL's `generation_batch_size` / `steps_per_generation` onto `rollout_buffer_size` / `train_batch_size`
        (each process rolls out `rollout_buffer_size` items, split into `steps_per_generation` training steps)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if self.generation_batch_size is not None:
            per = self.num_generations * world
            if self.generation_batch_size < 1 or self.generation_batch_size % per:
                raise ValueError(
                    f"generation_batch_size ({self.generation_batch_size}) must be a positive multiple of "
                    f"num_generations x processes ({self.num_generations} x {world} = {per}): it counts the "
                    "completions each agent samples per generation over all processes"
                )
            self.rollout_buffer_size = self.generation_batch_size // per
        spg = self.steps_per_generation
        if spg is None:
            return
        if spg < 1 or self.rollout_buffer_size % spg:
            raise ValueError(
                f"steps_per_generation ({spg}) must be >= 1 and divide the generation batch (rollout_buffer_size="
                f"{self.rollout_buffer_size} task items per process): each training step takes "
                "rollout_buffer_size / steps_per_generation items"
            )
        per_step = self.rollout_buffer_size // spg
        if self.train_batch_size not in (None, per_step):
            raise ValueError(
                f"train_batch_size ({self.train_batch_size}) disagrees with steps_per_generation ({spg}): a "
                f"generation batch of {self.rollout_buffer_size} items makes {spg} steps of {per_step}; set one of them"
            )
        self.train_batch_size = per_step

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        n = self.num_agents
        check_per_agent(self, PER_AGENT_FIELDS, n)

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        if self.remax_baseline not in ("max", "greedy"):
            raise ValueError(f"remax_baseline must be one of ['max', 'greedy'], got {self.remax_baseline!r}")
        if self.remax_baseline == "greedy" and self.num_turns != 1:
            raise ValueError(
                "remax_baseline='greedy' needs num_turns=1 (the greedy joint action is a one-turn baseline)"
            )
        for value in agent_values(self.scale_rewards, n):
            need(
                value is None or value in SCALE_REWARDS,
                f"scale_rewards must be one of {list(SCALE_REWARDS)}, got {value!r}",
            )
        need(
            self.multi_objective_aggregation in MULTI_OBJECTIVE_AGGREGATIONS,
            f"multi_objective_aggregation must be one of {list(MULTI_OBJECTIVE_AGGREGATIONS)}, got "
            f"{self.multi_objective_aggregation!r}",
        )
        need(
            self.multi_objective_aggregation == "sum_then_normalize" or self.num_turns == 1,
            "multi_objective_aggregation='normalize_then_sum' needs num_turns=1 (it normalises each reward "
            "function's rewards of one completion; multi-turn returns add up a tree of turns)",
        )
        need(self.num_iterations >= 1, f"num_iterations must be >= 1, got {self.num_iterations}")
        sampling = ("min_p", "repetition_penalty", "generation_kwargs")
        for mp, rp, kw in zip(*(agent_values(getattr(self, name), n) for name in sampling)):
            need(mp is None or 0.0 <= mp <= 1.0, f"min_p must be None or in [0, 1], got {mp!r}")
            need(rp > 0, f"repetition_penalty must be > 0, got {rp!r}")
            need(kw is None or isinstance(kw, dict), f"generation_kwargs must be a dict or None, got {kw!r}")
        # each agent's keys against the backend in use (one dict for the team, or a list with one per agent)
        kwargs = self.generation_kwargs
        entries = list(enumerate(kwargs)) if isinstance(kwargs, (list, tuple)) else [(None, kwargs)]
        for i, kw in entries:
            if kw:
                label = "generation_kwargs" if i is None else f"generation_kwargs[{i}]"
                check_generation_kwargs(kw, label, self.use_vllm, self.num_generations)
        self._validate_loss()
        self._validate_reference()
        self._validate_vllm_correction()

    def _validate_loss(self) -> None:
        """Each agent's `GRPOLossSettings` (the field and its allowed values named on bad input), or the seed loss,
        which refuses TRL's loss-only fields."""
        n = self.num_agents
        types = agent_values(self.loss_type, n)
        if self.loss_type is None:
            defaults = {f.name: f.default for f in fields(MAGRPOConfig)}
            for name in _TRL_LOSS_ONLY:
                value = getattr(self, name)
                if value != defaults[name]:
                    raise ValueError(
                        f"{name}={value!r} is a setting of TRL's GRPO loss family; set loss_type too (one of "
                        f"{list(LOSS_TYPES)}; GRPOConfig's default is 'dapo'). loss_type=None keeps trl_marl's seed "
                        "loss, which is on-policy and has no ratio, clip or loss-side KL"
                    )
            return
        if None in types:
            raise ValueError(
                f"loss_type must be one of {list(LOSS_TYPES)} for every agent (or None for the whole team: the seed "
                f"loss), got {self.loss_type!r}"
            )
        seen: set[str] = set()
        per_agent = any(isinstance(getattr(self, name), (list, tuple)) for name in LOSS_SETTING_FIELDS)
        for i in range(n):
            try:
                settings = self.loss_settings(i)
            except ValueError as err:
                raise ValueError(f"agent {i + 1}: {err}" if per_agent else str(err)) from None
            for message in settings.warnings():
                if message not in seen:
                    seen.add(message)
                    warnings.warn(message, UserWarning, stacklevel=5)

    def _validate_reference(self) -> None:
        betas = agent_values(self.beta, self.num_agents)
        if self.reference_kl_enabled and any(b for b in betas):
            raise ValueError(
                f"beta={self.beta!r} and reference_kl_enabled=True are two KL estimators to the same reference: "
                "beta puts TRL's k3 per token in the LOSS, reference_kl_enabled subtracts reference_kl_coef x the "
                "summed k3 from the REWARD before the baseline. Choose one"
            )
        if self.sync_ref_model and not any(b for b in betas):
            raise ValueError(
                "sync_ref_model=True with beta=0: no reference model is built, so there is nothing to sync; set "
                "beta > 0 or sync_ref_model=False"
            )
        if not 0.0 <= self.ref_model_mixup_alpha <= 1.0:
            raise ValueError(f"ref_model_mixup_alpha must be in [0, 1], got {self.ref_model_mixup_alpha!r}")
        if self.ref_model_sync_steps < 1:
            raise ValueError(f"ref_model_sync_steps must be >= 1, got {self.ref_model_sync_steps!r}")

    def _validate_vllm_correction(self) -> None:
        lo, hi = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        mode = self.vllm_importance_sampling_mode
        if mode not in VLLM_IMPORTANCE_SAMPLING_MODES:
            raise ValueError(
                f"vllm_importance_sampling_mode must be one of {list(VLLM_IMPORTANCE_SAMPLING_MODES)}, got {mode!r}"
            )
        if lo is not None and hi is not None and lo >= hi:
            raise ValueError(
                f"vllm_importance_sampling_clip_min ({lo}) must be less than vllm_importance_sampling_clip_max ({hi})"
            )
        if mode.endswith("_truncate") and lo is None and hi is None:
            raise ValueError(
                "vllm_importance_sampling_clip_min or vllm_importance_sampling_clip_max must be set for a *_truncate "
                "vllm_importance_sampling_mode"
            )
        if self.use_vllm and self.vllm_importance_sampling_correction and self.loss_type is not None:
            for i in range(self.num_agents):
                if agent_value(self.loss_type, i) == "vespo" and not mode.startswith("token"):
                    raise ValueError(
                        "loss_type='vespo' with the vLLM importance-sampling correction needs a token-level ratio: "
                        "vllm_importance_sampling_mode must be one of ['token_truncate', 'token_mask']"
                    )

    # ------------------------------------------------------------------ what the trainer reads
    @property
    def uses_trl_loss(self) -> bool:
        """Whether the agents train with TRL's loss family (`loss_type` set) instead of the seed loss."""
        return self.loss_type is not None

    @property
    def seed_zscore(self) -> bool:
        """Whether advantages get the seed's z-score (`scale_rewards` unset and `advantage_normalization` on, or
        unset on MAGRPO)."""
        if self.scale_rewards is not None:
            return False
        alias = self.advantage_normalization
        return self._seed_normalization if alias is None else bool(alias)

    def loss_settings(self, i: int) -> GRPOLossSettings:
        """Agent i's `GRPOLossSettings` (its values of the per-agent loss fields and its `max_completion_length`)."""
        values = {name: agent_value(getattr(self, name), i) for name in LOSS_SETTING_FIELDS}
        return GRPOLossSettings(**values, max_completion_length=agent_value(self.max_completion_length, i))


def _trl_scale_rewards(value):
    """TRL also takes True / False for `scale_rewards` ("group" / "none")."""
    mapping = {True: "group", False: "none"}
    if isinstance(value, (list, tuple)):
        return [mapping.get(v, v) if isinstance(v, bool) else v for v in value]
    return mapping.get(value, value) if isinstance(value, bool) else value


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    r"""Configuration of `MAREINFORCETrainer`: no baseline (`A_j = R_j`). The seed's scaling is off (with the seed's
    z-score the trainer would be identical to MAGRPO)."""

    _seed_normalization = False


@dataclass
class MARLOOConfig(MAGRPOConfig):
    r"""Configuration of `MARLOOTrainer`: leave-one-out baseline. The seed's scaling is off (with the seed's z-score
    the trainer would be identical to MAGRPO)."""

    _seed_normalization = False


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    r"""Configuration of `MAReMaxTrainer`. The seed's scaling is off (with the seed's z-score the trainer would be
    identical to MAGRPO). `remax_baseline` (`"max"` or `"greedy"`) is a `MAGRPOConfig` field, so a plain
    `MAGRPOConfig` (the recipe's) sets it too.
    """

    _seed_normalization = False
