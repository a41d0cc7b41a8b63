"""Rewards: the joint reward's calling conventions (`RewardFunction`), combining reward functions (`weighted_sum`,
`lift`) and reward processors (`scale`, `shift`, `clip`, `compose`). See `trl_marl.rewards.functions` for the
conventions in full."""

from trl_marl.rewards.functions import (
    RewardFunction,
    RewardFunctionError,
    RewardProcessors,
    clip,
    compose,
    is_team_reward,
    lift,
    scale,
    shift,
    team_reward,
    weighted_sum,
)

__all__ = [
    "RewardFunction",
    "RewardFunctionError",
    "team_reward",
    "is_team_reward",
    "lift",
    "weighted_sum",
    "scale",
    "shift",
    "clip",
    "compose",
    "RewardProcessors",
]
