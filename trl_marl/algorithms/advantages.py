"""Baselines, advantages, returns, TD targets and GAE, as small pure torch functions.

Nothing here knows about models, tokenizers or Trainers: tensors in, tensors out. Shapes use `G` for the samples of
one group (the generations of one node), `T` for turns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = [
    "BASELINES",
    "group_advantages",
    "baseline_advantages",
    "normalize_in_groups",
    "cross_sample_returns",
    "tree_returns",
    "td_targets",
    "gae",
    "linked_gae",
    "RunningMeanStd",
    "popart_rescale",
]

BASELINES = ("mean", "raw", "loo", "max")

# A group whose rewards spread less than this is treated as all-equal: its advantage is exactly zero.
_STD_EPS = 1e-6


def group_advantages(returns: torch.Tensor, baseline: str = "mean", normalize: bool = False) -> torch.Tensor:
    """Group-relative advantages over the last dimension (one group = the G samples of one node).

    With R the returns of a group of size G:

    | baseline | A_j |
    |---|---|
    | `"mean"` (MAGRPO) | `R_j - mean(R)` |
    | `"raw"` (MAREINFORCE) | `R_j` |
    | `"loo"` (MARLOO) | `R_j - mean_{k != j} R_k = (G R_j - sum(R)) / (G - 1)` |
    | `"max"` (MAReMax) | `R_j - max(R)` |

    With `normalize=True` the advantage is then z-scored inside the group, `(A - mean(A)) / std(A)` with the
    population std. A group whose returns are all equal (std below 1e-6) gets exactly zero advantage, never noise
    divided by an epsilon. Note that with normalization every baseline gives the same result (each is a positive
    affine map of R), which is why the non-mean trainers default it off.

    Args:
        returns: `(..., G)` returns.
        baseline: one of `BASELINES`.
        normalize: z-score inside each group.
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    returns = returns.to(torch.float32)
    G = returns.shape[-1]
    if baseline == "mean":
        adv = returns - returns.mean(dim=-1, keepdim=True)
    elif baseline == "raw":
        adv = returns.clone()
    elif baseline == "loo":
        if G < 2:
            raise ValueError("the leave-one-out baseline needs at least 2 samples per group")
        adv = (G * returns - returns.sum(dim=-1, keepdim=True)) / (G - 1)
    else:  # max
        adv = returns - returns.max(dim=-1, keepdim=True).values
    if normalize:
        adv = _zscore(adv, dim=-1)
    return adv


def baseline_advantages(
    returns: torch.Tensor, baseline: torch.Tensor | float, normalize: bool = False
) -> torch.Tensor:
    """Advantages against an external baseline value (e.g. ReMax's greedy sample reward):

        A_j = R_j - b

    optionally z-scored inside the group (last dimension), with the same all-equal guard as `group_advantages`.
    """
    adv = returns.to(torch.float32) - torch.as_tensor(baseline, dtype=torch.float32)
    return _zscore(adv, dim=-1) if normalize else adv


def _zscore(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    std = x.std(dim=dim, keepdim=True, unbiased=False)
    centered = x - x.mean(dim=dim, keepdim=True)
    flat = std < _STD_EPS
    return torch.where(flat, torch.zeros_like(centered), centered / torch.where(flat, torch.ones_like(std), std))


def normalize_in_groups(
    values: torch.Tensor,
    group_ids: torch.Tensor,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Z-score `values` separately inside each group given by `group_ids` (same shape, 1-D, non-negative ints).

        z_i = (x_i - mu_g) / sigma_g,   mu_g = S1_g / n_g,   sigma_g^2 = S2_g / n_g - mu_g^2   (population std)

    with the moments n_g, S1_g = sum x, S2_g = sum x^2 of group g. Used by the actor-critic trainers to normalize TD
    errors per (agent, turn) group. A group of one sample, or one whose values are all equal, gets zero.

    `all_reduce_sum` (e.g. `lambda t: accelerator.reduce(t, "sum")`) sums a tensor over the processes of a
    data-parallel run: the moments are then those of the GLOBAL batch, so every process normalizes its share exactly
    as one process normalizing the whole batch would. It is called on every process (twice), whatever its batch.
    """
    values = values.to(torch.float32)
    group_ids = group_ids.to(torch.long)
    if all_reduce_sum is None:
        return _normalize_local(values, group_ids)
    # one moments table with the same shape on every process: the sum of the processes' group counts bounds every
    # group id (rows of absent groups stay empty)
    local_groups = torch.tensor([int(group_ids.max()) + 1 if group_ids.numel() else 0], dtype=torch.float64)
    num_groups = int(all_reduce_sum(local_groups).item())
    moments = torch.zeros(num_groups, 3, dtype=torch.float64)
    x = values.to(torch.float64)
    moments.index_add_(0, group_ids, torch.stack([torch.ones_like(x), x, x * x], dim=1))
    moments = all_reduce_sum(moments)
    n = moments[:, 0].clamp(min=1)
    mean = moments[:, 1] / n
    std = (moments[:, 2] / n - mean * mean).clamp(min=0).sqrt()
    flat = std < _STD_EPS
    z = (x - mean[group_ids]) / torch.where(flat, torch.ones_like(std), std)[group_ids]
    return torch.where(flat[group_ids], torch.zeros_like(z), z).to(torch.float32)


def _normalize_local(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(values)
    for g in torch.unique(group_ids):
        idx = group_ids == g
        out[idx] = _zscore(values[idx], dim=0)
    return out


def cross_sample_returns(joint_returns: torch.Tensor, agent: int) -> torch.Tensor:
    """Per-sample returns of one agent in `"cross"` joint mode.

    In cross mode the joint actions of a node are the Cartesian product of the agents' samples, laid out as a tensor
    of shape `(G,) * n` (agent i's sample index on axis i). Agent i's sample k appears in G^(n-1) joint actions; its
    return is the MEAN of their returns:

        R_i[k] = mean_{joint j : j_i = k} R_joint[j]

    Args:
        joint_returns: `(G,) * n` tensor of joint returns (or `(..., G^n)` flattened in row-major order with
            `agent` counted from the first of the trailing n axes; pass it reshaped).
        agent: the axis of the agent.
    """
    dims = [d for d in range(joint_returns.ndim) if d != agent]
    return joint_returns.mean(dim=dims) if dims else joint_returns


def tree_returns(rewards: torch.Tensor, child_returns: Sequence[torch.Tensor | None], discount: float = 1.0):
    """Returns of one node of a rollout tree.

    A leaf's return is its reward. An inner node's return for joint action j is

        R_j = r_j + discount * mean(R_child_j)

    where `R_child_j` are the returns of the joint actions of the child node that joint action j spawned
    (`None` for a joint action that spawned no child: a leaf, or a node that terminated early).

    Args:
        rewards: `(J,)` rewards of the node's J joint actions (or `(J, n)` per-agent rewards).
        child_returns: J entries, each a `(J_child,)` (or `(J_child, n)`) tensor or None.
        discount: gamma.
    """
    out = rewards.to(torch.float32).clone()
    if len(child_returns) != rewards.shape[0]:
        raise ValueError(f"expected {rewards.shape[0]} child entries, got {len(child_returns)}")
    for j, child in enumerate(child_returns):
        if child is not None:
            out[j] = out[j] + discount * child.to(torch.float32).mean(dim=0)
    return out


def td_targets(
    rewards: torch.Tensor, next_values: torch.Tensor, has_next: torch.Tensor, discount: float = 1.0
) -> torch.Tensor:
    """One-step TD targets.

        V_hat_t = r_t + discount * V(h_{t+1})   if turn t has a successor
        V_hat_t = r_t                           for the last collected turn (single turn, last turn, early end)

    `next_values` holds V(h_{t+1}) (or Q(h_{t+1}, a_{t+1}) with the sampled next action, in Q mode); entries where
    `has_next` is False are ignored.
    """
    rewards = rewards.to(torch.float32)
    bootstrap = torch.where(has_next.bool(), next_values.to(torch.float32), torch.zeros_like(rewards))
    return rewards + discount * bootstrap


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    has_next: torch.Tensor,
    discount: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation along the LAST dimension (turns) of one trajectory or a batch of them.

        delta_t = r_t + discount * V(h_{t+1}) * has_next_t - V(h_t)
        A_t     = delta_t + discount * lam * has_next_t * A_{t+1}
        V_hat_t = A_t + V(h_t)

    Returns `(advantages, value_targets)`. With `lam=0` this is the one-step TD error; with `lam=1` and no
    bootstrap at the end it is the Monte Carlo return minus the value.
    """
    rewards = rewards.to(torch.float32)
    values = values.to(torch.float32)
    mask = has_next.to(torch.float32)
    deltas = rewards + discount * next_values.to(torch.float32) * mask - values
    adv = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[..., 0])
    for t in reversed(range(deltas.shape[-1])):
        running = deltas[..., t] + discount * lam * mask[..., t] * running
        adv[..., t] = running
    return adv, adv + values


def linked_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_index: torch.Tensor,
    discount: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) over flattened steps that point to their successor (trajectories of different lengths).

    Step s has reward `r_s`, value `V_s` and successor `next_s` (`-1`: the last collected step of its trajectory,
    whether the last turn or an early end, which does not bootstrap):

        delta_s = r_s + discount * V_{next_s} * [next_s >= 0] - V_s
        A_s     = delta_s + discount * lam * [next_s >= 0] * A_{next_s}
        V_hat_s = A_s + V_s

    Returns `(advantages, value_targets)`, each `(S,)`. Successors must come later (`next_s > s`). With `lam=0`,
    `A_s` is the one-step TD error and `V_hat_s` the TD target of `td_targets`; on one trajectory laid out in turn
    order it equals `gae`.
    """
    rewards = rewards.to(torch.float32)
    values = values.to(torch.float32)
    next_index = next_index.to(torch.long)
    S = rewards.shape[0]
    if values.shape[0] != S or next_index.shape[0] != S:
        raise ValueError(
            f"rewards, values and next_index must have the same length, got {S}, {values.shape[0]}, "
            f"{next_index.shape[0]}"
        )
    positions = torch.arange(S)
    linked = next_index >= 0
    if bool((next_index[linked] <= positions[linked]).any()) or bool((next_index >= S).any()):
        raise ValueError("next_index must point to a later step (next_index[s] > s) or be -1")
    adv = torch.zeros(S, dtype=torch.float32)
    for s in reversed(range(S)):
        nxt = int(next_index[s])
        if nxt >= 0:
            adv[s] = rewards[s] + discount * values[nxt] - values[s] + discount * lam * adv[nxt]
        else:
            adv[s] = rewards[s] - values[s]
    return adv, adv + values


def popart_rescale(
    weight: torch.Tensor,
    bias: torch.Tensor,
    old_mean: float,
    old_std: float,
    new_mean: float,
    new_std: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PopArt's "preserving outputs precisely" (van Hasselt et al., 2016) for a value head's last linear layer.

    The layer predicts normalized values `y = w . x + b`, read out as `V = std * y + mean`. When the normalization
    statistics move from `(old_mean, old_std)` to `(new_mean, new_std)`,

        w' = w * old_std / new_std
        b' = (old_std * b + old_mean - new_mean) / new_std

    keeps every output unchanged: `new_std * (w' . x + b') + new_mean = old_std * (w . x + b) + old_mean`.
    Returns the new `(weight, bias)`.
    """
    if old_std <= 0 or new_std <= 0:
        raise ValueError(f"standard deviations must be > 0, got {old_std} and {new_std}")
    return weight * (old_std / new_std), (old_std * bias + old_mean - new_mean) / new_std


class RunningMeanStd:
    """Running mean and variance of value targets (Welford / parallel update), for value normalization.

    `normalize(x) = (x - mean) / sqrt(var + eps)` and `denormalize` its inverse; `update(batch)` folds a batch in.
    Its `state_dict` is saved with checkpoints.
    """

    def __init__(self, eps: float = 1e-5):
        self.mean = 0.0
        self.var = 1.0
        self.count = 0.0
        self.eps = eps

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().to(torch.float64).flatten()
        if x.numel() == 0:
            return
        b_mean, b_var, b_count = x.mean().item(), x.var(unbiased=False).item(), float(x.numel())
        if self.count == 0:
            self.mean, self.var, self.count = b_mean, b_var, b_count
            return
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean += delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var, self.count = m2 / total, total

    @property
    def std(self) -> float:
        """`sqrt(var + eps)`, the scale of `normalize`."""
        return (self.var + self.eps) ** 0.5

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / (self.var + self.eps) ** 0.5

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.var + self.eps) ** 0.5 + self.mean

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])
