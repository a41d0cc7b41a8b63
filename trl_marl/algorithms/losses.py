"""Losses as small pure torch functions: policy gradient, PPO clip, value loss, Bradley-Terry, MADPO, KL.

Each function takes tensors and returns a scalar loss (or per-sample values); the formula is in the docstring.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "policy_gradient_loss",
    "ppo_clip_loss",
    "value_loss",
    "bradley_terry_loss",
    "madpo_loss",
    "DPO_LOSS_TYPES",
    "DPO_BATCH_LOSS_TYPES",
    "dpo_pair_loss",
    "joint_dpo_loss",
    "k3_kl",
]

# Every loss type of TRL 1.16's `DPOTrainer`, applied to the JOINT response (`joint_dpo_loss`). Most are a function
# of one pair's chosen / rejected log-ratios (and completion lengths); `aot` / `aot_unpaired` sort them across the
# batch and `sft` is the chosen responses' token-mean NLL (`DPO_BATCH_LOSS_TYPES`).
DPO_LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
# the ones that are not a per-pair function: they couple the pairs of the batch (sorting, a token mean)
DPO_BATCH_LOSS_TYPES = ("aot", "aot_unpaired", "sft")


def policy_gradient_loss(
    logprob_sums: torch.Tensor, advantages: torch.Tensor, num_samples: int | None = None
) -> torch.Tensor:
    """REINFORCE loss, averaged per sample:

        loss = - mean_j( logprob_sum(a_j) * A_j )

    `logprob_sums` are sequence log-probabilities (sum over completion tokens) and carry the gradient; advantages
    are constants (detached here). With `num_samples` (N), the samples given are some of a batch of N and the loss is
    their share of the batch's, `- sum_j( logprob_sum(a_j) * A_j ) / N`: the shares of the parts of a batch add up to
    its loss.
    """
    terms = logprob_sums * advantages.detach().to(logprob_sums.dtype)
    return -terms.mean() if num_samples is None else -terms.sum() / num_samples


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float = 0.2,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate (to minimise):

        rho = exp(logp - logp_old)
        loss = - mean( min(rho * A, clip(rho, 1 - eps, 1 + eps) * A) )

    Works on sequence-level log-probs (`(B,)`, one ratio per completion) or token-level ones (`(B, T)` with a
    `mask`, advantages broadcast over tokens, averaged over valid tokens). Returns `(loss, clip_fraction)`.
    """
    adv = advantages.detach().to(logprobs.dtype)
    if adv.ndim < logprobs.ndim:
        adv = adv.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs.detach())
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * adv
    per = -torch.min(unclipped, clipped)
    is_clipped = (unclipped != clipped).to(per.dtype)
    if mask is None:
        return per.mean(), is_clipped.mean().detach()
    m = mask.to(per.dtype)
    denom = m.sum().clamp(min=1.0)
    return (per * m).sum() / denom, ((is_clipped * m).sum() / denom).detach()


def value_loss(
    values: torch.Tensor,
    targets: torch.Tensor,
    old_values: torch.Tensor | None = None,
    clip_range: float | None = None,
) -> torch.Tensor:
    """Squared-error value loss, optionally PPO-clipped, averaged over the batch.

    Unclipped (`clip_range=None`):  `mean( (V - V_hat)^2 )`

    Clipped:
        V_clip = V_old + clip(V - V_old, -eps, eps)
        loss   = mean( max( (V - V_hat)^2, (V_clip - V_hat)^2 ) )
    """
    targets = targets.detach().to(values.dtype)
    err = (values - targets) ** 2
    if clip_range is None:
        return err.mean()
    if old_values is None:
        raise ValueError("value clipping needs old_values")
    old = old_values.detach().to(values.dtype)
    v_clip = old + torch.clamp(values - old, -clip_range, clip_range)
    return torch.max(err, (v_clip - targets) ** 2).mean()


def bradley_terry_loss(
    chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """Bradley-Terry preference loss: `- mean( log sigmoid( s_w - s_l [- margin] ) )` (as in TRL's RewardTrainer)."""
    diff = chosen_scores - rejected_scores
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff).mean()


def madpo_loss(margins: torch.Tensor, beta: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-agent DPO loss on per-agent margins.

        m_i   = log pi_i(a_i^w | h_i^w) - log pi_i(a_i^l | h_i^l)      (shape (n, P): agents x pairs)
        Delta = sum_i m_i
        L     = - mean_p log sigmoid(beta * Delta)
        grad_theta_i L = - beta * sigmoid(-beta * Delta) * grad m_i

    Agent i's gradient must flow through its OWN margin only, with the others detached. The returned
    `backward_loss` is `sum_i mean_p -log sigmoid(beta * (m_i + sum_{j != i} sg(m_j)))`: each term has the value of
    L and the gradient above with respect to agent i's parameters. The second return value is L itself (detached),
    for logging.
    """
    detached = margins.detach()
    total = detached.sum(dim=0)  # (P,)
    per_agent = []
    for i in range(margins.shape[0]):
        delta_i = margins[i] + (total - detached[i])
        per_agent.append(-F.logsigmoid(beta * delta_i).mean())
    backward_loss = torch.stack(per_agent).sum()
    return backward_loss, -F.logsigmoid(beta * total).mean()


def dpo_pair_loss(
    loss_type: str,
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
    discopop_tau: float = 0.05,
    ref_chosen: torch.Tensor | None = None,
    ref_rejected: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-pair DPO loss `(P,)` of TRL 1.16's `DPOTrainer` (reverse-KL f-divergence), same names and formulas.

    `chosen` = log pi(y_w|x) - log pi_ref(y_w|x), `rejected` likewise for y_l (reference-free: the log-probs
    themselves); `d = chosen - rejected`; `Lw`, `Ll` = completion token counts; `eps` = `label_smoothing`;
    `ref_chosen`, `ref_rejected` = the reference log-probs `log pi_ref(y_w|x)`, `log pi_ref(y_l|x)` (`None`: 0,
    reference-free), needed only where TRL uses the policy's log-probs themselves (`aot`, `sft`):

        sigmoid       -log s(beta d)
        hinge         relu(1 - beta d)
        ipo           (chosen/Lw - rejected/Ll - 1/(2 beta))^2
        exo_pair      s(beta d)(log s(beta d) - log(1-eps)) + s(-beta d)(log s(-beta d) - log eps)
        nca_pair      -log s(beta chosen) - 1/2 log s(-beta chosen) - 1/2 log s(-beta rejected)
        robust        (-(1-eps) log s(beta d) + eps log s(-beta d)) / (1 - 2 eps)
        bco_pair      -log s(beta chosen) - log s(-beta rejected)
        sppo_hard     (chosen - 1/(2 beta))^2 + (rejected + 1/(2 beta))^2
        apo_zero      1 - s(beta chosen) + s(beta rejected)
        apo_down      s(beta chosen) + 1 - s(beta d)
        discopop      z = beta d, m = s(z/tau):  -log s(z)(1 - m) + exp(-z) m
        sigmoid_norm  -log s(beta (chosen/Lw - rejected/Ll))

    and three that couple the pairs of the batch (entry j of the result is then rank j, or the batch value):

        aot           delta = sort_p(d + RC - RR) - sort_p(RC - RR)   (sorted policy log-ratio minus sorted reference
                      log-ratio, RC / RR = ref_chosen / ref_rejected), loss -(1-eps) log s(beta delta)
                      - eps log s(-beta delta)
        aot_unpaired  delta = sort_p(chosen) - sort_p(rejected), same loss as aot
        sft           - sum_p (chosen_p + RC_p) / sum_p Lw_p  (token-mean NLL of the chosen responses; every entry)

    (`s` is the logistic sigmoid.)
    """
    d = chosen - rejected
    if loss_type in ("aot", "aot_unpaired"):
        if loss_type == "aot":
            ref_d = _ref_or_zero(ref_chosen, d) - _ref_or_zero(ref_rejected, d)
            delta = torch.sort(d + ref_d, dim=0)[0] - torch.sort(ref_d, dim=0)[0]
        else:
            delta = torch.sort(chosen, dim=0)[0] - torch.sort(rejected, dim=0)[0]
        eps = label_smoothing
        return -F.logsigmoid(beta * delta) * (1 - eps) - F.logsigmoid(-beta * delta) * eps
    if loss_type == "sft":
        if chosen_lengths is None:
            raise ValueError("loss_type='sft' needs the completion lengths")
        nll = -(chosen + _ref_or_zero(ref_chosen, chosen)).sum() / chosen_lengths.sum().clamp(min=1)
        return nll.expand(chosen.shape[0])
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * d)
    if loss_type == "hinge":
        return torch.relu(1 - beta * d)
    if loss_type in ("ipo", "sigmoid_norm"):
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError(f"loss_type={loss_type!r} needs the completion lengths")
        avg = chosen / chosen_lengths.clamp(min=1) - rejected / rejected_lengths.clamp(min=1)
        return (avg - 1 / (2 * beta)) ** 2 if loss_type == "ipo" else -F.logsigmoid(beta * avg)
    if loss_type == "exo_pair":
        eps = torch.tensor(label_smoothing, dtype=d.dtype, device=d.device)
        z = beta * d
        return torch.sigmoid(z) * (F.logsigmoid(z) - torch.log1p(-eps)) + torch.sigmoid(-z) * (
            F.logsigmoid(-z) - torch.log(eps)
        )
    if loss_type == "nca_pair":
        return -F.logsigmoid(beta * chosen) - 0.5 * F.logsigmoid(-beta * chosen) - 0.5 * F.logsigmoid(-beta * rejected)
    if loss_type == "robust":
        eps = label_smoothing
        return (-(1 - eps) * F.logsigmoid(beta * d) + eps * F.logsigmoid(-beta * d)) / (1 - 2 * eps)
    if loss_type == "bco_pair":
        return -F.logsigmoid(beta * chosen) - F.logsigmoid(-beta * rejected)
    if loss_type == "sppo_hard":
        return (chosen - 0.5 / beta) ** 2 + (rejected + 0.5 / beta) ** 2
    if loss_type == "apo_zero":
        return 1 - torch.sigmoid(beta * chosen) + torch.sigmoid(beta * rejected)
    if loss_type == "apo_down":
        return torch.sigmoid(beta * chosen) + 1 - torch.sigmoid(beta * d)
    if loss_type == "discopop":
        z = beta * d
        mix = torch.sigmoid(z / discopop_tau)
        return -F.logsigmoid(z) * (1 - mix) + torch.exp(-z) * mix
    raise ValueError(f"loss_type must be one of {list(DPO_LOSS_TYPES)}, got {loss_type!r}")


def _ref_or_zero(ref: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if ref is None else ref.detach().to(like.dtype)


def joint_dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    beta: float,
    loss_type: str | list[str] = "sigmoid",
    loss_weights: list[float] | None = None,
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
    discopop_tau: float = 0.05,
    ref_chosen: torch.Tensor | None = None,
    ref_rejected: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A DPO loss of TRL's family on the JOINT response, each agent's gradient through its own terms only (MADPO).

    Inputs are per agent `(n, P)`: `chosen[i]` = agent i's winner log-ratio (log pi_i - log pi_ref,i; the log-prob
    when reference-free), `rejected[i]` the loser's, lengths its completion token counts, `ref_chosen[i]` /
    `ref_rejected[i]` its reference log-probs (constants; `None`: reference-free). The joint response's log-ratios,
    lengths and reference log-probs are the sums over agents (`C = sum_i chosen_i`, so `C - R = Delta`, the joint
    margin; the joint policy is the product of the agents' policies, so its log-probs add):

        L = sum_k w_k mean_p loss_k(C, R, Lw, Ll)                     (`dpo_pair_loss`, weights `loss_weights`)

    What "joint" means for the loss types that couple the pairs of a batch:
      * `aot`: TRL sorts, across the batch, the policy log-ratios `log pi(y_w) - log pi(y_l)` and, separately, the
        reference's. Here both are the JOINT ones (`Delta + RC - RR` and `RC - RR`, summed over agents): ONE
        sort over the batch's pairs by the joint values (agents are never sorted separately), then TRL's
        `-(1-eps) log s(beta delta) - eps log s(-beta delta)` on the rank-aligned differences.
      * `aot_unpaired`: the joint chosen log-ratios `C` and the joint rejected ones `R` sorted separately.
      * `sft`: the token-mean NLL of the joint chosen responses, `- sum_p sum_i log pi_i(y_w,i) / sum_p sum_i Lw_i`
        (= `sum_i (N_i / N) NLL_i`, agent i's own chosen NLL weighted by its share of the chosen tokens).

    Agent i's term evaluates L at `chosen_i + sg(sum_{j != i} chosen_j)` (likewise for rejected), the other agents'
    values detached, so its gradient is `dL/dC grad chosen_i + dL/dR grad rejected_i` at the joint values (for
    the sorting losses: through the permutation of the joint values; for `sft`: agent i's own chosen NLL over N).
    Returns `(backward_loss, L)`: `backward_loss` = the sum of the agents' terms (backward through it), `L`
    detached, for logging. With `"sigmoid"` and no reference this is `madpo_loss(chosen - rejected, beta)`.
    """
    types = [loss_type] if isinstance(loss_type, str) else list(loss_type)
    weights = [1.0] * len(types) if loss_weights is None else list(loss_weights)
    if len(weights) != len(types):
        raise ValueError(f"loss_weights needs one weight per loss_type ({len(types)}), got {len(weights)}")
    lw = None if chosen_lengths is None else chosen_lengths.sum(dim=0).to(chosen.dtype)
    ll = None if rejected_lengths is None else rejected_lengths.sum(dim=0).to(chosen.dtype)

    bad = [t for t in types if t not in DPO_LOSS_TYPES]
    if bad:
        raise ValueError(f"loss_type must be one of {list(DPO_LOSS_TYPES)}, got {loss_type!r}")
    ref_c = None if ref_chosen is None else ref_chosen.detach().sum(dim=0).to(chosen.dtype)
    ref_r = None if ref_rejected is None else ref_rejected.detach().sum(dim=0).to(chosen.dtype)

    def total(c: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        out = 0.0
        for t, w in zip(types, weights):
            per = dpo_pair_loss(t, c, r, beta, label_smoothing, lw, ll, discopop_tau, ref_c, ref_r)
            out = out + w * per.mean()
        return out

    cd, rd = chosen.detach(), rejected.detach()
    c_tot, r_tot = cd.sum(dim=0), rd.sum(dim=0)
    terms = [total(chosen[i] + (c_tot - cd[i]), rejected[i] + (r_tot - rd[i])) for i in range(chosen.shape[0])]
    return torch.stack(terms).sum(), total(c_tot, r_tot).detach()


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref), summed over completion tokens per sequence:

        r = logp_ref - logp,   kl_token = exp(r) - 1 - r  (>= 0),   KL_seq = sum_t mask_t * kl_token_t

    Inputs are per-token `(B, T)`; returns `(B,)`.
    """
    r = ref_logprobs - logprobs
    kl = torch.exp(r) - 1.0 - r
    if mask is not None:
        kl = kl * mask.to(kl.dtype)
    return kl.sum(dim=-1)
