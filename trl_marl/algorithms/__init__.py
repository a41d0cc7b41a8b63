"""The math of every trainer, as small pure torch functions (tensors in, tensors out, formula in the docstring)."""

from trl_marl.algorithms.advantages import (
    BASELINES,
    RunningMeanStd,
    baseline_advantages,
    cross_sample_returns,
    gae,
    group_advantages,
    linked_gae,
    normalize_in_groups,
    popart_rescale,
    td_targets,
    tree_returns,
)
from trl_marl.algorithms.grpo import GRPOLossSettings, grpo_loss
from trl_marl.algorithms.grpo_advantages import multi_objective_advantages, scale_advantages
from trl_marl.algorithms.logprobs import completion_mask, sequence_logprobs, token_entropies, token_logprobs
from trl_marl.algorithms.losses import (
    DPO_LOSS_TYPES,
    bradley_terry_loss,
    dpo_pair_loss,
    joint_dpo_loss,
    k3_kl,
    madpo_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    value_loss,
)

__all__ = [
    "BASELINES",
    "baseline_advantages",
    "RunningMeanStd",
    "bradley_terry_loss",
    "completion_mask",
    "cross_sample_returns",
    "gae",
    "GRPOLossSettings",
    "grpo_loss",
    "group_advantages",
    "k3_kl",
    "linked_gae",
    "madpo_loss",
    "multi_objective_advantages",
    "DPO_LOSS_TYPES",
    "dpo_pair_loss",
    "joint_dpo_loss",
    "normalize_in_groups",
    "policy_gradient_loss",
    "popart_rescale",
    "ppo_clip_loss",
    "scale_advantages",
    "sequence_logprobs",
    "td_targets",
    "token_entropies",
    "token_logprobs",
    "tree_returns",
    "value_loss",
]
