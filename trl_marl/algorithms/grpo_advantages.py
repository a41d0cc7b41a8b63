"""TRL 1.16's GRPO advantages as small pure torch functions: `_generate_and_score_completions` of
`trl/trainer/grpo_trainer.py` (lines ~2765-2815) reproduced to the operation: rewards summed with `reward_weights`
(NaN for a reward function that does not score a sample), centred on the group mean and scaled by `scale_rewards`
(`"group"`, `"batch"` or `"none"`), or each reward normalised first (`multi_objective_aggregation`). The loss that
consumes them is `trl_marl.algorithms.grpo`.

Shapes: `n` samples in groups of `G` (contiguous) or with explicit group ids; `(n, k)` rewards for `k` functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "SCALE_REWARDS",
    "MULTI_OBJECTIVE_AGGREGATIONS",
    "ADVANTAGE_STD_EPS",
    "check_choice",
    "group_ids",
    "group_reward_stats",
    "scale_advantages",
    "scale_baseline_advantages",
    "frac_reward_zero_std",
    "weighted_reward_sum",
    "multi_objective_advantages",
]

SCALE_REWARDS = ("group", "batch", "none")
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
# TRL adds this to the reward std before dividing (`advantages / (std_rewards + 1e-4)`)
ADVANTAGE_STD_EPS = 1e-4


def check_choice(name: str, value: object, allowed: Sequence[str]) -> None:
    """Raise a ValueError naming `name` and the allowed values when `value` is not one of them."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def group_ids(groups: int | torch.Tensor, n: int) -> torch.Tensor:
    """Group id of each of `n` samples: `groups` is either a group size `G` (contiguous groups, TRL's
    `rewards.view(-1, num_generations)`: id_j = j // G) or already a `(n,)` tensor of ids."""
    if isinstance(groups, int):
        if groups < 1 or n % groups != 0:
            raise ValueError(f"group size must be >= 1 and divide the number of samples {n}, got {groups}")
        return torch.arange(n) // groups
    ids = torch.as_tensor(groups).to(torch.long).flatten()
    if ids.numel() != n:
        raise ValueError(f"group ids must have one entry per sample ({n}), got {ids.numel()}")
    return ids


def _nan_moments(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (nanmean, Bessel nanstd, group size) of the sample's group. nanstd = sqrt(nanmean((x - m)^2) *
    c / (c - 1)) with c the group's count of non-NaN values (NaN when c <= 1), as `trl.trainer.utils.nanstd`."""
    _, inverse = torch.unique(ids.to(x.device), return_inverse=True)
    k = int(inverse.max()) + 1 if inverse.numel() else 0
    valid = ~torch.isnan(x)
    zero = torch.zeros(k, dtype=x.dtype, device=x.device)
    count = zero.index_add(0, inverse, valid.to(x.dtype))
    size = zero.index_add(0, inverse, torch.ones_like(x))
    mean = zero.index_add(0, inverse, torch.where(valid, x, 0.0)) / count
    sq = torch.where(valid, (x - mean[inverse]) ** 2, 0.0)
    var = zero.index_add(0, inverse, sq) / count
    var = var * torch.where(count > 1, count / (count - 1), torch.full_like(count, float("nan")))
    return mean[inverse], torch.sqrt(var)[inverse], size[inverse]


def group_reward_stats(
    rewards: torch.Tensor, groups: int | torch.Tensor, scale_rewards: str = "group"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample baseline and scale of TRL's advantages: `(mean_g, std)` with NaN rewards ignored.

        mean_g = nanmean of the sample's group                                    (every scale_rewards)
        std    = nanstd of the sample's group   (scale_rewards "group" or "none")
                 nanstd of the whole batch      (scale_rewards "batch")

    nanstd is Bessel-corrected (`/ (n - 1)`); a group (batch) of one sample has std 0, as in TRL.
    """
    check_choice("scale_rewards", scale_rewards, SCALE_REWARDS)
    rewards = rewards.to(torch.float32).flatten()
    ids = group_ids(groups, rewards.numel())
    mean, std, size = _nan_moments(rewards, ids)
    if scale_rewards == "batch":
        _, std, size = _nan_moments(rewards, torch.zeros_like(ids))
    std = torch.where(size > 1, std, torch.zeros_like(std))
    return mean, std


def scale_advantages(rewards: torch.Tensor, groups: int | torch.Tensor, scale_rewards: str = "group") -> torch.Tensor:
    """TRL's advantages from one (already aggregated) reward per sample:

        A_j = r_j - mean_g                          (scale_rewards="none")
        A_j = (r_j - mean_g) / (std + 1e-4)         ("group": std of the group; "batch": std of the batch)

    with `mean_g, std = group_reward_stats(...)`; a NaN reward (unscorable) or a NaN std gets A_j = 0.
    Note the baseline is the GROUP mean even for "batch" (PPO-Lite: local mean, global std). `rewards` is the whole
    generation batch (TRL gathers it from every process first, then each process keeps its slice).
    """
    mean, std = group_reward_stats(rewards, groups, scale_rewards)
    adv = rewards.to(torch.float32).flatten() - mean
    if scale_rewards != "none":
        adv = adv / (std + ADVANTAGE_STD_EPS)
    return torch.nan_to_num(adv, nan=0.0)


def scale_baseline_advantages(
    advantages: torch.Tensor,
    rewards: torch.Tensor,
    groups: int | torch.Tensor,
    scale_rewards: str = "group",
    batch_std: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """TRL's `scale_rewards` on advantages built with any baseline b (trl_marl's REINFORCE family):

        A'_j = A_j                                  (scale_rewards="none")
        A'_j = A_j / (std + 1e-4)                   ("group": std of r in the group; "batch": std of the batch)

    with `std` as in `group_reward_stats` (Bessel-corrected, NaN-ignoring; a group of one has std 0). With the group
    mean as the baseline, `A_j = r_j - mean_g`, this is exactly `scale_advantages`. `batch_std` replaces the batch's
    std when the batch spans several processes (the std of the whole generation batch, as TRL gathers it).
    """
    check_choice("scale_rewards", scale_rewards, SCALE_REWARDS)
    adv = advantages.to(torch.float32).flatten()
    if scale_rewards == "none":
        return torch.nan_to_num(adv, nan=0.0)
    _, std = group_reward_stats(rewards, groups, scale_rewards)
    if scale_rewards == "batch" and batch_std is not None:
        std = torch.full_like(std, float(batch_std))
    return torch.nan_to_num(adv / (std + ADVANTAGE_STD_EPS), nan=0.0)


def frac_reward_zero_std(
    rewards: torch.Tensor, groups: int | torch.Tensor, scale_rewards: str = "group"
) -> torch.Tensor:
    """TRL's `frac_reward_zero_std` metric: the fraction of samples whose `std` (as in `group_reward_stats`) is 0."""
    _, std = group_reward_stats(rewards, groups, scale_rewards)
    return torch.isclose(std, torch.zeros_like(std)).float().mean()


def weighted_reward_sum(
    rewards_per_func: torch.Tensor, reward_weights: Sequence[float] | torch.Tensor | None = None
) -> torch.Tensor:
    """`r_j = nansum_k w_k * r_jk` of a `(N, K)` table (`w` = `reward_weights`, default all 1); NaN when every reward
    function returned None (NaN) for sample j (TRL's unscorable completion)."""
    x = rewards_per_func.to(torch.float32)
    out = (x * _weights(reward_weights, x.shape[1], x.device).unsqueeze(0)).nansum(dim=1)
    return _unscorable_to_nan(out, x)


def _unscorable_to_nan(summed: torch.Tensor, rewards_per_func: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(rewards_per_func).all(dim=1), torch.full_like(summed, float("nan")), summed)


def _weights(reward_weights: Sequence[float] | torch.Tensor | None, k: int, device: torch.device) -> torch.Tensor:
    if reward_weights is None:
        return torch.ones(k, device=device)
    w = torch.as_tensor(reward_weights, dtype=torch.float32, device=device).flatten()
    if w.numel() != k:
        raise ValueError(f"reward_weights must have one weight per reward function ({k}), got {w.numel()}")
    return w


def multi_objective_advantages(
    rewards_per_func: torch.Tensor,
    groups: int | torch.Tensor,
    reward_weights: Sequence[float] | torch.Tensor | None = None,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
) -> torch.Tensor:
    """TRL's advantages from a `(N, K)` table of K reward functions (NaN = the function returned None).

    `"sum_then_normalize"` (default): `A = scale_advantages(weighted_reward_sum(R, w), groups, scale_rewards)`.

    `"normalize_then_sum"` (GDPO): each function is normalised in its group, summed with the weights, and the sum is
    normalised over the BATCH; `scale_rewards` is not used (TRL ignores it in this mode):

        z_jk = (r_jk - nanmean_g(r_k)) / (nanstd_g(r_k) + 1e-4)       (nanstd_g = 0 for groups of one sample)
        s_j  = nansum_k w_k z_jk   (NaN if every r_jk is NaN)
        A_j  = (s_j - nanmean(s)) / (nanstd(s) + 1e-4)                (NaN -> 0)
    """
    check_choice("multi_objective_aggregation", multi_objective_aggregation, MULTI_OBJECTIVE_AGGREGATIONS)
    check_choice("scale_rewards", scale_rewards, SCALE_REWARDS)
    x = rewards_per_func.to(torch.float32)
    if x.ndim != 2:
        raise ValueError(f"rewards_per_func must be (N, K), got shape {tuple(x.shape)}")
    if multi_objective_aggregation == "sum_then_normalize":
        return scale_advantages(weighted_reward_sum(x, reward_weights), groups, scale_rewards)
    ids = group_ids(groups, x.shape[0])
    cols = []
    for k in range(x.shape[1]):
        mean, std, size = _nan_moments(x[:, k], ids)
        std = torch.where(size > 1, std, torch.zeros_like(std))
        cols.append((x[:, k] - mean) / (std + ADVANTAGE_STD_EPS))
    # nansum of the z's (a z is NaN where its reward is, or where its group's std is); NaN only where EVERY raw
    # reward of the sample is NaN
    z = torch.stack(cols, dim=1)
    summed = _unscorable_to_nan((z * _weights(reward_weights, x.shape[1], x.device).unsqueeze(0)).nansum(dim=1), x)
    mean, std, size = _nan_moments(summed, torch.zeros_like(ids))
    std = torch.where(size > 1, std, torch.zeros_like(std))
    return torch.nan_to_num((summed - mean) / (std + ADVANTAGE_STD_EPS), nan=0.0)
