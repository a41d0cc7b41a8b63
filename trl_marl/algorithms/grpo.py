"""TRL 1.16's `GRPOTrainer` loss family as small pure torch functions (tensors in, tensors out).

Everything here reproduces `trl/trainer/grpo_trainer.py` of TRL 1.16.0 to the operation, so that a team trainer can
call it per agent, on that agent's tokens, and train with factor 1 what `GRPOTrainer` trains:

| TRL 1.16 (`grpo_trainer.py`) | here |
|---|---|
| advantages in `_generate_and_score_completions` (lines ~2765-2815) | in `trl_marl.algorithms.grpo_advantages` |
| `mask_truncated_completions` (lines ~2465-2474) | `truncated_completions`, `mask_truncated_completions` |
| vLLM importance-sampling correction (lines ~2649-2690, metrics ~2860-2895) | `vllm_importance_sampling_ratio`, `vllm_importance_sampling_metrics` |
| `get_high_entropy_mask` (line 1380) | `high_entropy_mask` |
| `get_off_policy_mask` (line 2945) | `off_policy_sequence_mask` |
| `get_gamma_weights` (line 2972) | `vespo_gamma_weights` |
| `_compute_loss` (line 3020) | `grpo_loss` (and its parts `log_importance_weights`, `k3_kl_per_token`, `per_token_policy_loss`, `aggregate_loss`, `entropy_bonus`, `grpo_metrics`) |

Shapes: `B` sequences, `T` completion positions (right-padded); `mask` is `(B, T)` with 1 on scored tokens. Per-token
log-probabilities are those of the completion tokens at the SAMPLING temperature (TRL divides the logits by
`temperature` before the softmax for the policy, the old policy and the reference alike). Values at masked positions
must be finite (TRL multiplies by the mask; its fused head returns 0 there).

Nothing here knows about models, tokenizers, Trainers or configs; the trainer builds a `GRPOLossSettings` per agent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from trl_marl.algorithms.grpo_advantages import check_choice

__all__ = [
    "LOSS_TYPES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "VLLM_IMPORTANCE_SAMPLING_MODES",
    "GRPOLossSettings",
    "BatchTotals",
    "truncated_completions",
    "mask_truncated_completions",
    "high_entropy_mask",
    "log_importance_weights",
    "k3_kl_per_token",
    "off_policy_sequence_mask",
    "vespo_gamma_weights",
    "per_token_policy_loss",
    "dapo_normalizer",
    "aggregate_loss",
    "entropy_bonus",
    "adaptive_entropy_coef",
    "masked_mean",
    "masked_sequence_mean",
    "grpo_metrics",
    "grpo_loss",
    "vllm_importance_sampling_ratio",
    "vllm_importance_sampling_metrics",
    "SeedLossMapping",
    "seed_loss_mapping",
]

LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
VLLM_IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

# loss types whose ratio is clipped PPO-style (and whose clip_ratio/* metrics TRL logs)
_CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# loss types normalised by a token count spanning the generation batch (TRL's `num_items_in_batch`)
_TOKEN_NORMALISED = ("cispo", "dapo", "vespo")


# ---------------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class GRPOLossSettings:
    """The loss settings of one agent, with `GRPOConfig`'s field names, meanings and defaults (TRL 1.16).

    Attributes:
        loss_type: one of `LOSS_TYPES` (TRL's default `"dapo"`); formulas in `per_token_policy_loss` and
            `aggregate_loss`.
        beta: weight of the per-token k3 KL to the reference added to the LOSS (`k3_kl_per_token`); 0 = no reference.
        epsilon: lower clip `eps_low`: the ratio is clipped to `[1 - eps_low, 1 + eps_high]`.
        epsilon_high: upper clip `eps_high` (None = `epsilon`); for `cispo` the absolute cap of the ratio (eps_max).
        delta: two-sided clipping (INTELLECT-2): the unclipped ratio is also capped at `delta` (None = off).
        importance_sampling_level: `"token"` (one ratio per token) or `"sequence"` (GSPO: one ratio per sequence,
            the exponential of the mean token log-ratio).
        sapo_temperature_pos / sapo_temperature_neg: SAPO's gate temperatures for A > 0 / A <= 0.
        vespo_k_pos / vespo_lambda_pos / vespo_k_neg / vespo_lambda_neg: VESPO's Gamma weight parameters for A >= 0 /
            A < 0.
        use_bias_correction_kl: multiply the per-token KL by the importance weight (TRL's default True).
        off_policy_mask_threshold: DeepSeek-V3.2 off-policy sequence masking threshold (None = off).
        top_entropy_quantile: keep only the top-rho quantile of tokens by entropy in the policy term (1 = all).
        max_completion_length: the `dr_grpo` constant (required for it; unused otherwise).
        entropy_coef: weight of the entropy bonus `- coef * mean_token_entropy` (0 = off).
    """

    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    use_bias_correction_kl: bool = True
    off_policy_mask_threshold: float | None = None
    top_entropy_quantile: float = 1.0
    max_completion_length: int | None = None
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        check_choice("loss_type", self.loss_type, LOSS_TYPES)
        check_choice("importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        for name in ("beta", "epsilon", "epsilon_high", "vespo_k_pos", "vespo_k_neg"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("delta", "sapo_temperature_pos", "sapo_temperature_neg", "vespo_lambda_pos", "vespo_lambda_neg"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.off_policy_mask_threshold is not None and not self.off_policy_mask_threshold >= 0:
            raise ValueError(f"off_policy_mask_threshold must be >= 0 or None, got {self.off_policy_mask_threshold!r}")
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in [0, 1], got {self.top_entropy_quantile!r}")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {self.max_completion_length!r}")
        if self.loss_type == "dr_grpo" and self.max_completion_length is None:
            raise ValueError(
                "loss_type='dr_grpo' needs max_completion_length (its normaliser is B * max_completion_length)"
            )
        if not math.isfinite(self.entropy_coef):
            raise ValueError(f"entropy_coef must be finite, got {self.entropy_coef!r}")

    @property
    def epsilon_low(self) -> float:
        """`eps_low = epsilon`."""
        return self.epsilon

    @property
    def resolved_epsilon_high(self) -> float:
        """`eps_high = epsilon_high if set, else epsilon` (TRL's `self.epsilon_high`)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def warnings(self) -> list[str]:
        """The combinations TRL 1.16 warns about at construction (valid, but probably not what the user meant)."""
        out = []
        if self.loss_type == "luspo" and self.importance_sampling_level != "sequence":
            out.append("loss_type='luspo' should use importance_sampling_level='sequence' (the paper's setup)")
        if self.loss_type == "vespo" and self.importance_sampling_level != "token":
            out.append(
                "loss_type='vespo' computes sequence-level weights itself: use importance_sampling_level='token'"
            )
        if self.importance_sampling_level == "sequence" and self.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
            out.append(
                f"importance_sampling_level='sequence' with loss_type={self.loss_type!r} sums per-token terms, which "
                "weights each sequence by its length; GSPO's setup is loss_type='grpo'"
            )
        return out


# ---------------------------------------------------------------------------------------------------- masks
def truncated_completions(
    completion_ids: torch.Tensor, completion_mask: torch.Tensor, eos_token_ids: int | Iterable[int], pad_token_id: int
) -> torch.Tensor:
    """`(B,)` bool: a completion is truncated when its LAST generated token (the last position with mask 1) is
    neither an EOS token nor the pad token (TRL: `ids[-1] not in [*eos_token_ids, pad_token_id]`). An empty
    completion counts as not truncated. The mask may have holes (tool-result tokens of an agentic turn, 0 between
    generated tokens): the last 1 is what counts."""
    stop = torch.as_tensor(
        [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids), device=completion_ids.device
    )
    stop = torch.cat([stop, torch.as_tensor([pad_token_id], device=completion_ids.device)])
    m = completion_mask.bool()
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last_index = torch.where(m, positions, torch.full_like(positions, -1)).max(dim=1).values
    last = completion_ids.gather(1, last_index.clamp(min=0).unsqueeze(1)).squeeze(1)
    return (last_index >= 0) & ~torch.isin(last, stop)


def mask_truncated_completions(completion_mask: torch.Tensor, is_truncated: torch.Tensor) -> torch.Tensor:
    """`mask_truncated_completions=True`: `mask_bt = mask_bt * (1 - truncated_b)`. TRL applies it to the
    `completion_mask` itself, so the truncated rows are also left out of the attention mask of every later forward
    pass (policy, old policy, reference)."""
    return completion_mask * (~is_truncated.bool()).unsqueeze(1).to(completion_mask.dtype)


def high_entropy_mask(
    entropies: torch.Tensor, mask: torch.Tensor, top_entropy_quantile: float, pool: torch.Tensor | None = None
) -> torch.Tensor:
    """`top_entropy_quantile = rho`: keep the tokens whose entropy is in the top rho quantile (bool `(B, T)`).

        tau  = quantile(pool, 1 - rho)             (torch.quantile, linear interpolation)
        keep = (H_bt * mask_bt >= tau) & mask_bt

    `pool` is the entropies of every scored token the quantile is taken over: TRL gathers them from ALL processes;
    default: this batch's `entropies[mask]`. An empty pool keeps nothing.
    """
    if not 0.0 <= top_entropy_quantile <= 1.0:
        raise ValueError(f"top_entropy_quantile must be in [0, 1], got {top_entropy_quantile!r}")
    pool = entropies[mask.bool()].float() if pool is None else pool.float()
    if pool.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    threshold = torch.quantile(pool, 1 - top_entropy_quantile)
    return ((entropies * mask.float()) >= threshold) & mask.bool()


# ---------------------------------------------------------------------------------------------------- ratios, KL
def log_importance_weights(
    logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, importance_sampling_level: str = "token"
) -> torch.Tensor:
    """Log importance weights `log w` (differentiable in `logps`):

    token    : log w_bt = logp_bt - logp_old_bt                                  (B, T)
    sequence : log w_b  = sum_t mask_bt (logp_bt - logp_old_bt) / max(|o_b|, 1)  (B, 1)   (GSPO)
    """
    check_choice("importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
    log_ratio = logps - old_logps
    if importance_sampling_level == "token":
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


def k3_kl_per_token(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token, TRL's form (differentiable in `logps`):

    kl_bt = exp(logp_ref - logp) - (logp_ref - logp) - 1   (>= 0)
    """
    d = ref_logps - logps
    return torch.exp(d) - d - 1


def off_policy_sequence_mask(
    advantages: torch.Tensor,
    logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2 off-policy sequence mask `(B, 1)` (`off_policy_mask_threshold = delta`), no gradient:

    d_bt = nan_to_num(logp_sampling_bt - sg(logp_bt), nan=0)
    kl_b = sum_t mask_bt d_bt / max(|o_b|, 1)
    keep_b = (A_b >= 0) or (kl_b <= delta)
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    kl_div = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    avg = (kl_div * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((adv >= 0) | (avg <= threshold)).to(dtype=mask.dtype)


@torch.no_grad()
def vespo_gamma_weights(
    advantages: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    importance_sampling_ratio: torch.Tensor | None = None,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> torch.Tensor:
    """VESPO's Gamma weight `phi(w)` per sequence `(B, 1)`, a constant (no gradient):

        log w = clamp( sum_t mask_bt clamp(logp - logp_old, -20, 20) [+ sum_t clamp(log rho_IS_bt, log 1e-8, 20)],
                       log 1e-8, 20 )
        (k, lam) = (k_pos, lambda_pos) if A >= 0 else (k_neg, lambda_neg);  lam <- max(lam, 1e-4)
        phi(w) = exp(lam + k log w - lam w)   (= e^lam w^k e^{-lam w}, phi(1) = 1; NaN/inf -> 0)

    `importance_sampling_ratio` is the vLLM token-level IS ratio `(B, T)` when that correction is on.
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    lower = math.log(1e-8)
    seq_log_ratio = torch.sum(torch.clamp(log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
    if importance_sampling_ratio is not None:
        seq_log_ratio += torch.sum(
            torch.clamp(torch.log(importance_sampling_ratio), lower, 20.0), dim=-1, keepdim=True
        )
    log_w = torch.clamp(seq_log_ratio, lower, 20.0)
    w = torch.exp(log_w)
    nonneg = adv >= 0
    k = torch.where(nonneg, k_pos, k_neg)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * w).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def per_token_policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: GRPOLossSettings,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The policy term per token (before masks, IS correction and KL), with w = exp(`log_importance_weights`):

        grpo, bnpo, dr_grpo, dapo, luspo:  l = - min(w' A, clip(w, 1 - eps_low, 1 + eps_high) A),
                                           w' = min(w, delta) if delta is set else w
        cispo:                             l = - sg(min(w, eps_high)) A logp
        sapo:                              l = - (4 / tau) sigmoid(tau (w - 1)) A,   tau = tau_pos if A > 0 else tau_neg
        vespo:                             l = - phi(w_seq) A logp                    (`vespo_gamma_weights`)

    Returns `(l, w, phi)`: `l` is `(B, T)` or `(B, 1)` (sequence-level w), `w` the importance weights (before the
    delta cap) and `phi` the VESPO weights (None for the other loss types).
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_w = log_importance_weights(logps, old_logps, mask, settings.importance_sampling_level)
    coef_1 = torch.exp(log_w)
    eps_low, eps_high = settings.epsilon_low, settings.resolved_epsilon_high
    phi = None
    if settings.loss_type == "cispo":
        per_token = -torch.clamp(coef_1, max=eps_high).detach() * adv * logps
    elif settings.loss_type in _CLIPPED:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        capped = torch.clamp(coef_1, max=settings.delta) if settings.delta is not None else coef_1
        per_token = -torch.min(capped * adv, coef_2 * adv)
    elif settings.loss_type == "sapo":
        tau = torch.where(adv > 0, settings.sapo_temperature_pos, settings.sapo_temperature_neg)
        per_token = -(torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau) * adv
    else:  # vespo
        phi = vespo_gamma_weights(
            adv,
            logps - old_logps,
            mask,
            importance_sampling_ratio,
            settings.vespo_k_pos,
            settings.vespo_lambda_pos,
            settings.vespo_k_neg,
            settings.vespo_lambda_neg,
        )
        per_token = -phi * adv * logps
    return per_token, coef_1, phi


def dapo_normalizer(
    num_items_in_batch: float | torch.Tensor,
    num_processes: int = 1,
    gradient_accumulation_steps: int = 1,
    steps_per_generation: int = 1,
) -> torch.Tensor:
    """The token normaliser of `dapo`, `cispo` and `vespo` in training (TRL's `_compute_loss`):

        N = max(num_items_in_batch, 1) / num_processes * gradient_accumulation_steps / steps_per_generation

    `num_items_in_batch` is the number of scored tokens of the whole GENERATION batch summed over all processes;
    N is then the mean token count of one accumulation window per process. (In evaluation TRL uses
    `max(num_items_in_batch, 1) / num_processes`: pass `gradient_accumulation_steps = steps_per_generation = 1`.)
    """
    n = torch.as_tensor(num_items_in_batch, dtype=torch.float32).clamp(min=1.0) / num_processes
    return n * gradient_accumulation_steps / steps_per_generation


@dataclass(frozen=True)
class BatchTotals:
    """The sizes of a whole batch when a loss is computed on a part of its rows: `rows` (B) and `tokens`, its scored
    token count `sum_bt m_bt`. Every GRPO loss type but the entropy quantile's is a sum over rows divided by a
    normaliser of the batch (`aggregate_loss`); computed with the batch's normalisers, the losses of the parts of a
    batch add up to the batch's loss (a trainer can then backpropagate each part right after its forward)."""

    rows: int
    tokens: float


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    settings: GRPOLossSettings,
    token_normalizer: float | torch.Tensor | None = None,
    gradient_accumulation_steps: int = 1,
    totals: BatchTotals | None = None,
) -> torch.Tensor:
    """Reduce the per-token loss `l` (`(B, T)` or `(B, 1)`, broadcast over the mask) to the scalar TRL backpropagates:

        grpo, sapo : mean_b( sum_t m_bt l_bt / max(|o_b|, 1) ) / GA
        bnpo       : sum_bt m_bt l_bt / max(sum_bt m_bt, 1) / GA
        dr_grpo    : sum_bt m_bt l_bt / (B * max_completion_length) / GA
        luspo      : mean_b( sum_t m_bt l_bt ) / GA
        dapo, cispo, vespo : sum_bt m_bt l_bt / N

    GA = `gradient_accumulation_steps` (1 in evaluation). N = `token_normalizer`, TRL's `dapo_normalizer(...)`;
    default: this batch's token count `max(sum m, 1)` (TRL's value for one process with
    `gradient_accumulation_steps == steps_per_generation`, the default). With `totals`, the rows given are part of a
    batch: B (the mean's count) and `sum_bt m_bt` (bnpo's, and N's default) are the batch's (`BatchTotals`).
    """
    masked = per_token_loss * mask
    lt = settings.loss_type
    rows = mask.size(0) if totals is None else totals.rows
    if lt in ("grpo", "sapo"):
        per_row = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
        loss = per_row.mean() if totals is None else per_row.sum() / rows
    elif lt == "bnpo":
        loss = masked.sum() / _token_count(mask, totals)
    elif lt == "dr_grpo":
        loss = masked.sum() / (rows * settings.max_completion_length)
    elif lt == "luspo":
        loss = masked.sum(-1).mean() if totals is None else masked.sum() / rows
    else:  # dapo, cispo, vespo
        n = _token_count(mask, totals) if token_normalizer is None else token_normalizer
        return masked.sum() / n
    return loss / gradient_accumulation_steps


def _token_count(mask: torch.Tensor, totals: BatchTotals | None) -> torch.Tensor | float:
    """`max(sum_bt m_bt, 1)`: of `mask`, or of the whole batch that `totals` describes."""
    return mask.sum().clamp(min=1.0) if totals is None else max(float(totals.tokens), 1.0)


def entropy_bonus(
    entropies: torch.Tensor,
    mask: torch.Tensor,
    entropy_mask: torch.Tensor | None = None,
    gradient_accumulation_steps: int = 1,
    totals: BatchTotals | None = None,
) -> torch.Tensor:
    """TRL's entropy term `H` (the loss is `L_policy - entropy_coef * H`): the mean entropy over the tokens the
    policy term acts on, scaled for gradient accumulation only (never by the loss type's normaliser):

        m' = mask * entropy_mask (if top_entropy_quantile < 1) else mask
        H  = sum_bt m'_bt H_bt / max(sum m', 1) / GA

    With `totals` (rows of a larger batch, no entropy mask) `sum m'` is the batch's token count.
    """
    if totals is not None and entropy_mask is not None:
        raise ValueError("the entropy quantile's mask needs the whole batch: no BatchTotals with an entropy_mask")
    eff = mask if entropy_mask is None else mask * entropy_mask
    count = eff.sum().clamp(min=1.0) if totals is None else max(float(totals.tokens), 1.0)
    return (entropies * eff).sum() / count / gradient_accumulation_steps


def adaptive_entropy_coef(
    coef: float,
    world_entropy: float,
    entropy_target: float,
    entropy_coef_delta: float,
    entropy_coef_min: float,
    entropy_coef_max: float,
) -> tuple[float, float]:
    """One optimizer step of TRL's adaptive entropy control (`use_adaptive_entropy`, Skywork-OR1).

        next = min(coef + delta, coef_max) if H_world <= target else max(coef - delta, coef_min)

    Returns `(next_coef, coef_to_apply_next_step)`, where TRL applies `next_coef` only while the measured entropy is
    at or below the target (`0.0` otherwise). `world_entropy` is the token-weighted mean entropy of the whole
    accumulation window over all processes.
    """
    if world_entropy <= entropy_target:
        nxt = min(coef + entropy_coef_delta, entropy_coef_max)
    else:
        nxt = max(coef - entropy_coef_delta, entropy_coef_min)
    return nxt, (nxt if world_entropy <= entropy_target else 0.0)


# ---------------------------------------------------------------------------------------------------- metrics
def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's `global_masked_mean` on one process: `sum_bt m x / max(sum m, 1)` for `(B, T)` values; the plain mean
    over sequences for `(B, 1)` values (sequence-level importance sampling). Across processes reduce the numerator
    and the denominator separately."""
    if x.shape[1] == 1:
        return x.sum() / max(float(x.shape[0]), 1.0)
    return (x * mask).sum() / mask.sum().float().clamp(min=1.0)


def masked_sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(B,)`: `sum_t m_bt x_bt / sum_t m_bt` (NaN for an empty row, as TRL's `masked_seq_mean`); `x[:, 0]` for
    `(B, 1)` values."""
    if x.shape[1] == 1:
        return x.squeeze(1)
    return (x * mask).sum(-1) / mask.sum(-1)


def grpo_metrics(
    coef_1: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: GRPOLossSettings,
    entropies: torch.Tensor | None = None,
    per_token_kl: torch.Tensor | None = None,
    phi: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """TRL's `_compute_loss` metrics for one process (detached scalars), named as TRL logs them:

    kl                     = masked_mean(kl_bt)             (beta > 0; kl after the bias correction)
    entropy                = masked_mean(H_bt)              (when `entropies` is given)
    clip_ratio/low_mean    = masked_mean[(w < 1 - eps_low) & (A < 0)]        (clipped loss types)
                                 (w = min(w, delta) when delta is set, as TRL measures it)
    clip_ratio/high_mean   = masked_mean[(w > 1 + eps_high) & (A > 0)]
    clip_ratio/region_mean = masked_mean[low | high]
    clip_ratio/low_min     = nanmin_b masked_sequence_mean(low)    (TRL: over the sequences of all processes)
    clip_ratio/high_max    = nanmax_b masked_sequence_mean(high)
    cispo_clip_ratio       = masked_mean[(w > eps_high) & (A > 0)]             (cispo)
    vespo/phi_seq_mean     = masked_mean(phi)                                  (vespo)
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        if per_token_kl is not None:
            out["kl"] = masked_mean(per_token_kl, mask)
        if entropies is not None:
            out["entropy"] = masked_mean(entropies, mask)
        eps_low, eps_high = settings.epsilon_low, settings.resolved_epsilon_high
        if settings.loss_type in _CLIPPED:
            if settings.delta is not None:  # TRL measures the clipping on the delta-capped ratio
                coef_1 = torch.clamp(coef_1, max=settings.delta)
            low = ((coef_1 < 1 - eps_low) & (adv < 0)).float()
            high = ((coef_1 > 1 + eps_high) & (adv > 0)).float()
            out["clip_ratio/low_mean"] = masked_mean(low, mask)
            out["clip_ratio/high_mean"] = masked_mean(high, mask)
            out["clip_ratio/region_mean"] = masked_mean(torch.maximum(low, high), mask)
            out["clip_ratio/low_min"] = _nan_reduce(masked_sequence_mean(low, mask), torch.min)
            out["clip_ratio/high_max"] = _nan_reduce(masked_sequence_mean(high, mask), torch.max)
        elif settings.loss_type == "cispo":
            out["cispo_clip_ratio"] = masked_mean(((coef_1 > eps_high) & (adv > 0)).float(), mask)
        elif settings.loss_type == "vespo" and phi is not None:
            out["vespo/phi_seq_mean"] = masked_mean(phi, mask)
    return out


def _nan_reduce(x: torch.Tensor, op) -> torch.Tensor:
    """TRL's `nanmin` / `nanmax`: the min / max over the non-NaN values, NaN when there are none."""
    x = x[~torch.isnan(x)]
    return op(x) if x.numel() else torch.tensor(float("nan"))


# ---------------------------------------------------------------------------------------------------- the loss
def grpo_loss(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: GRPOLossSettings,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    importance_sampling_ratio: torch.Tensor | None = None,
    sampling_logps: torch.Tensor | None = None,
    token_normalizer: float | torch.Tensor | None = None,
    gradient_accumulation_steps: int = 1,
    entropy_pool: torch.Tensor | None = None,
    totals: BatchTotals | None = None,
    with_metrics: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TRL 1.16's `GRPOTrainer._compute_loss` for one agent's tokens: `(loss to backpropagate, metrics)`.

        w        = exp(log_importance_weights(logp, logp_old))          (logp_old = sg(logp) when not given)
        l        = per_token_policy_loss(...)                            (per loss_type, see there)
        l        = l * keep_b                                           (off_policy_mask_threshold set)
        l        = l * high_entropy_mask                                (top_entropy_quantile < 1)
        l        = l * rho_IS                                           (vLLM IS ratio given; not for vespo,
                                                                         which puts it in phi)
        l        = l + beta * kl_bt,   kl_bt = k3(logp, logp_ref) [* w if use_bias_correction_kl]   (beta > 0)
        loss     = aggregate_loss(l, mask, ...) - entropy_coef * entropy_bonus(...)

    Args:
        logps: `(B, T)` per-token log-probs of the current policy (carry the gradient).
        advantages: `(B,)` or `(B, T)` advantages (constants).
        mask: `(B, T)` scored tokens (TRL: `completion_mask`, times its `tool_mask` if any).
        settings: the agent's `GRPOLossSettings`.
        old_logps: log-probs at generation (`num_iterations > 1`, `steps_per_generation > GA`, or vLLM).
        ref_logps: reference log-probs (required when `beta > 0`).
        entropies: `(B, T)` token entropies at the sampling temperature (required for `top_entropy_quantile < 1`
            and `entropy_coef != 0`, where they must carry the gradient; also give the `entropy` metric).
        importance_sampling_ratio: the vLLM IS ratio (`vllm_importance_sampling_ratio`), `(B, T)` or `(B, 1)`.
        sampling_logps: the sampler's log-probs, for `off_policy_mask_threshold` (default `old_logps`).
        token_normalizer: `dapo`/`cispo`/`vespo`'s N (`dapo_normalizer`); default this batch's token count.
        gradient_accumulation_steps: GA of the other loss types and of the entropy bonus (1 in evaluation).
        entropy_pool: entropies of every scored token of all processes, for the quantile (default: this batch).
        totals: the rows given are part of a batch of these sizes: the loss is their share of the batch's, with the
            batch's normalisers (`BatchTotals`; not with `top_entropy_quantile < 1`, whose mask needs every row).
            The metrics are this part's.
        with_metrics: compute the metrics (False: `{}`, for a part whose batch's metrics are computed once from all
            its parts' outputs).
    """
    if (
        settings.loss_type == "vespo"
        and importance_sampling_ratio is not None
        and importance_sampling_ratio.shape[-1] == 1
        and mask.shape[-1] > 1
    ):
        raise ValueError(
            "loss_type='vespo' needs a token-level vLLM importance-sampling ratio: vllm_importance_sampling_mode must "
            "be one of ['token_truncate', 'token_mask']"
        )
    if settings.beta != 0.0 and ref_logps is None:
        raise ValueError("beta > 0 needs ref_logps (the reference model's per-token log-probs)")
    if entropies is None and (settings.top_entropy_quantile < 1.0 or settings.entropy_coef != 0.0):
        raise ValueError("top_entropy_quantile < 1 and entropy_coef != 0 need the token entropies")
    if totals is not None and settings.top_entropy_quantile < 1.0:
        raise ValueError("top_entropy_quantile < 1 takes its quantile over the whole batch: no BatchTotals with it")
    mask = mask.to(logps.dtype)
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    adv = adv.to(logps.dtype)
    old = logps.detach() if old_logps is None else old_logps
    per_token, coef_1, phi = per_token_policy_loss(logps, old, adv, mask, settings, importance_sampling_ratio)
    per_token_kl = None
    if settings.beta != 0.0:
        per_token_kl = k3_kl_per_token(logps, ref_logps)
        if settings.use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
    if settings.off_policy_mask_threshold is not None:
        sampling = old if sampling_logps is None else sampling_logps
        per_token = per_token * off_policy_sequence_mask(
            adv, logps, sampling, mask, settings.off_policy_mask_threshold
        )
    entropy_mask = None
    if settings.top_entropy_quantile < 1.0:
        entropy_mask = high_entropy_mask(entropies, mask, settings.top_entropy_quantile, entropy_pool)
        per_token = per_token * entropy_mask
    if importance_sampling_ratio is not None and settings.loss_type != "vespo":
        per_token = per_token * importance_sampling_ratio
    if per_token_kl is not None:
        per_token = per_token + settings.beta * per_token_kl
    loss = aggregate_loss(per_token, mask, settings, token_normalizer, gradient_accumulation_steps, totals)
    metrics = grpo_metrics(coef_1, adv, mask, settings, entropies, per_token_kl, phi) if with_metrics else {}
    if settings.entropy_coef != 0.0:
        if with_metrics:
            scale = 1 if settings.loss_type in _TOKEN_NORMALISED else gradient_accumulation_steps
            metrics["policy_loss"] = loss.detach() * scale
        bonus = entropy_bonus(entropies, mask, entropy_mask, gradient_accumulation_steps, totals)
        loss = loss - settings.entropy_coef * bonus
    return loss, metrics


# ---------------------------------------------------------------------------------------------------- vLLM IS
def vllm_importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """The vLLM importance-sampling correction (`vllm_importance_sampling_correction`), a constant:

        d_bt  = nan_to_num((logp_old_bt - logp_vllm_bt) * mask_bt, nan=0)     (trainer vs sampler, same weights)
        rho   = exp(d_bt)  (token_*: (B, T))   or   exp(sum_t d_bt)  (sequence_*: (B, 1))
        *_truncate : rho <- clamp(rho, clip_min, clip_max)
        *_mask     : rho <- 0 where rho < clip_min or rho > clip_max  (a missing bound is -inf / +inf)

    `mode` = `vllm_importance_sampling_mode`, `clip_min` / `clip_max` = `vllm_importance_sampling_clip_min` /
    `_clip_max` (TRL's defaults: `"sequence_mask"`, None, 3.0). The loss multiplies each token's policy term by rho.
    """
    check_choice("vllm_importance_sampling_mode", mode, VLLM_IMPORTANCE_SAMPLING_MODES)
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise ValueError(
            f"vllm_importance_sampling_clip_min ({clip_min}) must be less than vllm_importance_sampling_clip_max "
            f"({clip_max})"
        )
    if mode.endswith("_truncate") and clip_min is None and clip_max is None:
        raise ValueError(
            "vllm_importance_sampling_clip_min or vllm_importance_sampling_clip_max must be set for a *_truncate mode"
        )
    with torch.no_grad():
        diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
        if mode.startswith("sequence"):
            diff = diff.sum(dim=-1, keepdim=True)
        ratio = torch.exp(diff)
        if mode.endswith("_truncate"):
            return torch.clamp(ratio, min=clip_min, max=clip_max)
        lo = -math.inf if clip_min is None else clip_min
        hi = math.inf if clip_max is None else clip_max
        return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)


def vllm_importance_sampling_metrics(
    old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, ratio: torch.Tensor
) -> dict[str, torch.Tensor]:
    """TRL's sampling metrics for one process (it then averages means and takes min / max over processes):

        sampling/sampling_logp_difference/mean|max = mean|max of |logp_old - logp_vllm| over scored, non-NaN tokens
        sampling/importance_sampling_ratio/min|mean|max = over the scored tokens (token modes) or the sequences
    (0 when there is nothing to reduce)."""
    m = mask.bool()
    with torch.no_grad():
        delta = torch.abs(old_logps - sampling_logps)
        delta = delta[m & ~torch.isnan(delta)]
        flat = ratio.flatten() if ratio.shape[1] == 1 else ratio[m]
        zero = torch.tensor(0.0, device=ratio.device)

        def red(x: torch.Tensor, op) -> torch.Tensor:
            return op(x) if x.numel() else zero

        return {
            "sampling/sampling_logp_difference/mean": red(delta, torch.mean),
            "sampling/sampling_logp_difference/max": red(delta, torch.max),
            "sampling/importance_sampling_ratio/min": red(flat, torch.min),
            "sampling/importance_sampling_ratio/mean": red(flat, torch.mean),
            "sampling/importance_sampling_ratio/max": red(flat, torch.max),
        }


# ---------------------------------------------------------------------------------------------------- the seed
@dataclass(frozen=True)
class SeedLossMapping:
    """What trl_marl's seed loss (`policy_gradient_loss` + `group_advantages`) is in TRL terms.

    Attributes:
        settings: the TRL loss settings whose GRADIENT the seed's is proportional to (`dr_grpo`, beta 0, token
            level, no clipping in effect because the seed is on-policy: w = 1).
        scale_rewards: the nearest TRL `scale_rewards`.
        gradient_factor: `grad(seed) = gradient_factor * grad(TRL)` with the same advantages
            (= `max_completion_length`).
        exact_advantages: whether the seed's advantages equal TRL's for `scale_rewards` (False with
            `advantage_normalization`: population std and no epsilon vs Bessel std + 1e-4).
        note: the difference in words.
    """

    settings: GRPOLossSettings
    scale_rewards: str
    gradient_factor: float
    exact_advantages: bool
    note: str


def seed_loss_mapping(advantage_normalization: bool, max_completion_length: int) -> SeedLossMapping:
    """Map the seed's loss onto TRL's `GRPOTrainer` settings.

    The seed (trl_marl before issue 27; `MAGRPOTrainer` and its siblings) minimises, per agent,

        L_seed = - (1/B) sum_b A_b sum_t m_bt logp_bt                           (`policy_gradient_loss`)

    on-policy (one update per rollout, no importance ratio), with `A = group_advantages(R, "mean", normalize)`:
    `R_b - mean_g(R)`, and with `advantage_normalization` divided by the group's POPULATION std (a group with
    std < 1e-6 gets 0).

    TRL `loss_type="dr_grpo"`, beta 0, one iteration (w = exp(logp - sg(logp)) = 1, value 1, gradient grad logp):

        L_dr = - (1 / (B L)) sum_bt m_bt w_bt A_b      =>   grad L_seed = L * grad L_dr,   L = max_completion_length

    so the seed's GRADIENT equals `dr_grpo`'s times `max_completion_length` (the loss VALUES differ: the seed's is
    `-mean_b A_b logp_b`, TRL's the surrogate `-sum A_b |o_b| / (B L)`). With the same gradient for `dapo` / `bnpo`
    the factor would be the batch's token count / B, which changes from batch to batch; `grpo` weights each sequence
    by 1 / |o_b| and has no constant factor.

    Advantages: `advantage_normalization=False` is exactly `scale_rewards="none"` (group-mean baseline, no scaling).
    `advantage_normalization=True` is NOT exactly `scale_rewards="group"`: TRL divides by the Bessel std + 1e-4,

        A_seed / A_TRL = (s_bessel + 1e-4) / s_pop = sqrt(G / (G - 1)) + 1e-4 / s_pop   (per group)

    (1.1547 at G=4 for spreads large against 1e-4), and a group of equal rewards gives 0 in both. The seed's
    reference KL is subtracted from the REWARD before the baseline (`reward_j - coef * sum_t k3_t`), a different
    estimator from TRL's `beta` (k3 per token in the LOSS); neither maps onto the other.
    """
    if max_completion_length < 1:
        raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length!r}")
    settings = GRPOLossSettings(loss_type="dr_grpo", beta=0.0, max_completion_length=max_completion_length)
    if advantage_normalization:
        note = (
            "gradient = max_completion_length x TRL dr_grpo's; advantages = TRL scale_rewards='group' x "
            "(sqrt(G/(G-1)) + 1e-4/std_pop) per group (population std, no epsilon, vs Bessel std + 1e-4)"
        )
        return SeedLossMapping(settings, "group", float(max_completion_length), False, note)
    note = "gradient = max_completion_length x TRL dr_grpo's with scale_rewards='none', beta=0, num_iterations=1"
    return SeedLossMapping(settings, "none", float(max_completion_length), True, note)
