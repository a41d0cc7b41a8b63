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
    "k3_kl",
]


def policy_gradient_loss(logprob_sums: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """REINFORCE loss, averaged per sample:

        loss = - mean_j( logprob_sum(a_j) * A_j )

    `logprob_sums` are sequence log-probabilities (sum over completion tokens) and carry the gradient; advantages
    are constants (detached here).
    """
    return -(logprob_sums * advantages.detach().to(logprob_sums.dtype)).mean()


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
