"""The REINFORCE family: MAGRPO, MAREINFORCE, MARLOO, MAReMax.

No critic. For each task item every agent samples G completions; the joint actions are scored; each agent's
completion is weighted by an advantage built from the joint returns of its group (the G samples of one node), and
each agent gets its own policy-gradient step:

    loss_i = - mean_over_samples( logprob_sum(a_i) * A )

| trainer | baseline | A_j |
|---|---|---|
| MAGRPO | group mean | `R_j - mean(R)` |
| MAREINFORCE | none | `R_j` |
| MARLOO | leave-one-out mean | `(G R_j - sum R) / (G - 1)` |
| MAReMax | group max | `R_j - max(R)` |

With `advantage_normalization` all four give the same normalized advantage (each baseline is a positive affine map
of R), so it defaults on only for MAGRPO.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from trl_marl.algorithms.advantages import baseline_advantages, group_advantages
from trl_marl.algorithms.logprobs import sequence_logprobs
from trl_marl.algorithms.losses import policy_gradient_loss
from trl_marl.data_types.rollout import Rollout
from trl_marl.rollout.returns import RolloutReturns
from trl_marl.trainers.base import MultiAgentTrainer
from trl_marl.trainers.config import MultiAgentConfig
from trl_marl.trainers.data import Experience

__all__ = [
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "CentralizedMAGRPOTrainer",
]


@dataclass
class MAGRPOConfig(MultiAgentConfig):
    r"""Configuration of `MAGRPOTrainer` (multi-agent group-relative policy optimisation).

    All `MultiAgentConfig` fields, plus:

    Parameters:
        advantage_normalization: divide each group's advantages by the group's standard deviation (a group whose
            returns are all equal gets zero advantage, never amplified noise).
        remax_baseline: `MAReMaxTrainer` only (the others refuse `"greedy"`): `"max"` — the group's best sample,
            `A_j = R_j - max(R)` (the reference library's meaning); `"greedy"` — ReMax proper,
            `A_j = R_j - R(greedy)`: every node is also decoded greedily by each agent (one more batched `generate`
            per agent) and that joint action is scored in the same reward call. `"greedy"` needs `num_turns=1`.
    """

    advantage_normalization: bool = field(
        default=True, metadata={"help": "Z-score advantages inside each group of G samples."}
    )
    remax_baseline: str = field(
        default="max",
        metadata={
            "help": "MAReMax only: max (the group's best sample) or greedy (the greedy joint action's reward).",
            "choices": ["max", "greedy"],
        },
    )

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        if self.remax_baseline not in ("max", "greedy"):
            raise ValueError(f"remax_baseline must be one of ['max', 'greedy'], got {self.remax_baseline!r}")
        if self.remax_baseline == "greedy" and self.num_turns != 1:
            raise ValueError(
                "remax_baseline='greedy' needs num_turns=1 (the greedy joint action is a one-turn baseline)"
            )


class MAGRPOTrainer(MultiAgentTrainer):
    """Multi-agent GRPO: group-mean baseline over each node's G joint actions; plain on-policy policy gradient.

    See `MultiAgentTrainer` for the arguments. Example:

    ```python
    from trl_marl import MAGRPOConfig, MAGRPOTrainer

    trainer = MAGRPOTrainer(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        reward_funcs=lambda writer, editor: [...],
        formatters=[writer_prompt, editor_prompt],
        args=MAGRPOConfig(output_dir="out", num_agents=2, num_generations=4),
        train_dataset=dataset,
    )
    trainer.train()
    ```
    """

    _name = "MAGRPO"
    _tag_names = ["trl", "trl_marl", "multi-agent", "magrpo"]
    _paper = {
        "title": "LLM Collaboration With Multi-Agent Reinforcement Learning",
        "id": "2508.04652",
        "citation": (
            "@article{liu2025llmcollab,\n  title={LLM Collaboration With Multi-Agent Reinforcement Learning},\n"
            "  author={Liu, Shuo and Liang, Zeyu and Lyu, Xueguang and Amato, Christopher},\n"
            "  journal={arXiv preprint arXiv:2508.04652},\n  year={2025}\n}"
        ),
    }
    config_class = MAGRPOConfig
    args_class = MAGRPOConfig  # the siblings' configs only change defaults: any MAGRPOConfig works
    # the group baseline (`trl_marl.algorithms.advantages.BASELINES`), or "greedy": the greedy joint action's reward
    baseline = "mean"
    min_generations = 2

    def _check_config(self, args: MultiAgentConfig) -> None:
        if args.remax_baseline != "max" and not isinstance(self, MAReMaxTrainer):
            raise ValueError(
                f"remax_baseline={args.remax_baseline!r} only applies to MAReMaxTrainer; {type(self).__name__} "
                "uses its own baseline (leave remax_baseline='max', or use MAReMaxTrainer / recipes/magrpo.py "
                "--baseline max --remax_baseline greedy)"
            )
        self._check_baseline_survives(args)
        if args.num_generations < self.min_generations:
            raise ValueError(
                f"{type(self).__name__} needs num_generations >= {self.min_generations} (its baseline compares the "
                f"samples of a group), got {args.num_generations}"
            )

    def _check_baseline_survives(self, args: MultiAgentConfig) -> None:
        """Warn when `advantage_normalization` erases this trainer's baseline: z-scoring a group is invariant to
        subtracting any per-group constant (raw, leave-one-out, max, greedy), so every sibling becomes MAGRPO."""
        if self.baseline != "mean" and args.advantage_normalization:
            warnings.warn(
                f"{type(self).__name__} with advantage_normalization=True trains exactly as MAGRPOTrainer: z-scoring "
                "each group removes its baseline. Set advantage_normalization=False (the default of "
                f"{self.config_class.__name__}) to train with the {self.baseline!r} baseline.",
                UserWarning,
                stacklevel=3,
            )

    def _normalize_advantages(self) -> bool:
        """Whether each group's advantages are z-scored (`advantage_normalization`)."""
        return bool(self.args.advantage_normalization)

    def _experience(self, rollout: Rollout, returns: RolloutReturns) -> Experience:
        """Each agent's group-relative advantages, `(num_nodes, G)`: per node, its G samples' returns against the
        group's baseline (`group_advantages`), or against the greedy joint action's reward (`baseline_advantages`,
        ReMax); a group of one sample has no baseline to compare with (zero), except for the raw return."""
        normalize, G = self._normalize_advantages(), rollout.num_generations
        advantages = []
        for i in range(self.num_agents):
            rows = []
            for node in rollout.nodes:
                r = returns.of_node(node.id, i)
                if self.baseline == "greedy":
                    if node.greedy_reward is None:
                        raise RuntimeError("the greedy baseline needs the rollout's greedy joint actions")
                    rows.append(baseline_advantages(r, node.greedy_reward, normalize))
                elif G > 1 or self.baseline == "raw":
                    rows.append(group_advantages(r, self.baseline, normalize))
                else:
                    rows.append(torch.zeros(G))
            advantages.append(torch.stack(rows) if rows else torch.zeros(0, G))
        return Experience(advantages, {"advantages": advantages})

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Sum over agents of `policy_gradient_loss(logprob_sum(a_i), A_i)` on this step's items, `A_i` the
        advantages `_experience` computed for the rollout.

        One forward pass per agent over all its samples of the step (every turn of every item). Agents' parameters
        are disjoint, so the gradient of the sum on agent i is agent i's own policy gradient.
        """
        rollout, items = inputs["rollout"], inputs["items"]
        nodes = rollout.nodes_of_items(items)
        rows = torch.tensor([node.id for node in nodes], dtype=torch.long)
        batches = [self.agent_batch(i, rollout.samples_of_agent(i, nodes)) for i in range(self.num_agents)]
        advantages = [adv[rows].reshape(-1) for adv in inputs["advantages"]]  # samples_of_agent's order
        out = model(batches)
        losses = []
        m = self._metrics["train"]
        for i, (logp, batch, adv) in enumerate(zip(out["logprobs"], batches, advantages)):
            seq = sequence_logprobs(logp, batch.completion_mask.to(logp.device))
            loss_i = policy_gradient_loss(seq, adv.to(logp.device))
            losses.append(loss_i)
            m[f"agent_{i + 1}/loss"].append(loss_i.item())
            m[f"agent_{i + 1}/logprob_mean"].append(seq.detach().mean().item())
            m[f"agent_{i + 1}/advantage_std"].append(adv.std(unbiased=False).item())
        self._metrics.record_entropy(out["entropy"])
        device = losses[0].device
        return sum(loss.to(device) for loss in losses)


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    r"""Configuration of `MAREINFORCETrainer`: no baseline (`A_j = R_j`). Normalization defaults off (with it on,
    the trainer would be identical to MAGRPO)."""

    advantage_normalization: bool = field(
        default=False, metadata={"help": "Z-score advantages inside each group (makes it identical to MAGRPO)."}
    )


class MAREINFORCETrainer(MAGRPOTrainer):
    """Multi-agent REINFORCE: the raw joint return as the advantage. `num_generations` may be 1."""

    _name = "MAREINFORCE"
    _tag_names = ["trl", "trl_marl", "multi-agent", "mareinforce"]
    config_class = MAREINFORCEConfig
    baseline = "raw"
    min_generations = 1


@dataclass
class MARLOOConfig(MAGRPOConfig):
    r"""Configuration of `MARLOOTrainer`: leave-one-out baseline. Normalization defaults off (with it on, the trainer
    would be identical to MAGRPO)."""

    advantage_normalization: bool = field(
        default=False, metadata={"help": "Z-score advantages inside each group (makes it identical to MAGRPO)."}
    )


class MARLOOTrainer(MAGRPOTrainer):
    """Multi-agent RLOO: `A_j = R_j - mean_{k != j} R_k`."""

    _name = "MARLOO"
    _tag_names = ["trl", "trl_marl", "multi-agent", "marloo"]
    config_class = MARLOOConfig
    baseline = "loo"


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    r"""Configuration of `MAReMaxTrainer`. Normalization defaults off (with it on, the trainer would be identical to
    MAGRPO). `remax_baseline` (`"max"` or `"greedy"`) is a `MAGRPOConfig` field, so a plain `MAGRPOConfig` (the
    recipe's) sets it too.
    """

    advantage_normalization: bool = field(
        default=False, metadata={"help": "Z-score advantages inside each group (makes it identical to MAGRPO)."}
    )


class MAReMaxTrainer(MAGRPOTrainer):
    """Multi-agent ReMax: `A_j = R_j - max(R)` (the group's best sample, the reference library's meaning) or, with
    `remax_baseline="greedy"`, `A_j = R_j - R(greedy joint action)` (ReMax proper)."""

    _name = "MAReMax"
    _tag_names = ["trl", "trl_marl", "multi-agent", "maremax"]
    config_class = MAReMaxConfig
    baseline = "max"

    def __init__(
        self,
        model=None,
        reward_funcs=None,
        args: MAGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        **kwargs,
    ):
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, **kwargs)
        if self.args.remax_baseline == "greedy":
            self.baseline = "greedy"
            self.rollout_engine.greedy_baseline = True

    def _check_config(self, args) -> None:
        greedy = args.remax_baseline == "greedy"
        if not greedy:
            super()._check_config(args)  # the group max needs G >= 2; the greedy baseline does not
        else:
            self._check_baseline_survives(args)


class CentralizedMAGRPOTrainer(MAGRPOTrainer):
    """Centralized MAGRPO: ONE model writes all `args.num_agents` roles' outputs in one tagged completion
    (`<agent_1>...</agent_1><agent_2>...</agent_2>`, see `trl_marl.rollout.centralized`). The completion is parsed into
    role outputs only to call the task reward; a parse failure gives every role an empty string and is counted in the
    metric `centralized/parse_failure_rate`. It is the single-model baseline for a decentralized team.

    Takes the arguments of `MAGRPOTrainer` (with `model`, one model) plus `adapter` (default: the tagged adapter).
    `formatters` are the ROLES' formatters; the joint prompt is built from them.
    """

    _name = "CentralizedMAGRPO"
    _tag_names = ["trl", "trl_marl", "multi-agent", "magrpo", "centralized"]
    supports_agentic = False  # ONE model writes every role in one completion: no turns between agents

    def __init__(
        self,
        model=None,
        reward_funcs=None,
        args: MAGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        *,
        adapter=None,
        **kwargs,
    ):
        self.adapter = adapter  # the roles' adapter; `_setup_roles` resolves the default
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, **kwargs)

    def _setup_roles(self, model, args, reward_func, formatters):
        """ONE model for the roles of `args.num_agents`: a one-agent config, the joint reward (parsing the tagged
        completion into role outputs) and the joint prompt's formatter (`centralized_setup`)."""
        from trl_marl.rollout.centralized import centralized_setup

        if isinstance(model, (list, tuple)):
            raise ValueError("CentralizedMAGRPOTrainer trains ONE model: pass one model id / path, not a list")
        if reward_func is None:
            raise ValueError("reward_funcs is required: it scores the joint response of the roles")
        self.num_roles = args.num_agents
        one_model, joint_reward, formatter, self._centralized_reward, self.adapter = centralized_setup(
            args, reward_func, formatters, self.adapter
        )
        return one_model, joint_reward, formatter

    def _record_rollout_metrics(self, rollout, mode: str) -> None:
        super()._record_rollout_metrics(rollout, mode)
        r = self._centralized_reward
        if r.parsed:
            self._metrics[mode]["centralized/parse_failure_rate"].append(r.parse_failures / r.parsed)
            r.parse_failures = r.parsed = 0
