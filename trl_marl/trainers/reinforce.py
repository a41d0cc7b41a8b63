"""The REINFORCE family: MAGRPO, MAREINFORCE, MARLOO, MAReMax.

No critic. For each task item every agent samples G completions; the joint actions are scored; each agent's
completion is weighted by an advantage built from the joint returns of its group (the G samples of one node), and
each agent gets its own policy-gradient step. The seed's loss (the default, `loss_type=None`):

    loss_i = - mean_over_samples( logprob_sum(a_i) * A )

| trainer | baseline | A_j |
|---|---|---|
| MAGRPO | group mean | `R_j - mean(R)` |
| MAREINFORCE | none | `R_j` |
| MARLOO | leave-one-out mean | `(G R_j - sum R) / (G - 1)` |
| MAReMax | group max | `R_j - max(R)` |

With the seed's z-score (`advantage_normalization`) all four give the same normalized advantage (each baseline is a
positive affine map of R), so it defaults on only for MAGRPO. TRL's `scale_rewards` divides the advantage by the
group's (or batch's) std instead, keeping each baseline. With `loss_type` set, each agent trains with TRL's GRPO loss
family on its own tokens (`trl_marl.trainers.grpo_step`). The advantages and the loss are the trainers' RL step,
`GroupBaselineStep` (`trl_marl.trainers.group_baseline`, shared with MARLHF); the configs are in
`trl_marl.trainers.reinforce_config`.
"""

from __future__ import annotations

import warnings

from trl_marl.trainers.config import MultiAgentConfig
from trl_marl.trainers.data import rollout_dataloader
from trl_marl.trainers.group_baseline import GroupBaselineStep
from trl_marl.trainers.per_agent import agent_values
from trl_marl.trainers.reinforce_config import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig
from trl_marl.trainers.rl_step import RLStepTrainer

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


class MAGRPOTrainer(RLStepTrainer):
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
    resume_types = GroupBaselineStep.resume_types

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
        checked = self._checked_args(args)
        self._check_trl_fields(checked, kwargs)
        # the algorithm's step (`trainers/group_baseline.py`): this trainer's baseline and the seed's z-score
        self.rl_step = GroupBaselineStep(self, self.baseline, checked.seed_zscore)
        super().__init__(model, reward_funcs, checked, train_dataset, eval_dataset, processing_class, **kwargs)

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

    def _check_trl_fields(self, args: MAGRPOConfig, kwargs: dict) -> None:
        """TRL's fields against this trainer and its arguments, before anything loads."""
        name = type(self).__name__
        if args.sync_ref_model and kwargs.get("peft_config") is not None:
            raise ValueError(
                "sync_ref_model=True with a peft_config: with PEFT each agent's reference is its base with the "
                "adapter disabled (no model of its own), so there is no reference to move toward the agent (TRL "
                "refuses it too). Use sync_ref_model=False, or full fine-tuning"
            )
        if args.num_generations < 2 and "group" in agent_values(args.scale_rewards, args.num_agents):
            raise ValueError(
                "scale_rewards='group' needs num_generations >= 2: a group of one sample has std 0 (TRL requires "
                "num_generations >= 2); use 'batch' or 'none'"
            )
        if args.multi_objective_aggregation == "normalize_then_sum":
            if self.baseline != "mean":
                raise ValueError(
                    f"multi_objective_aggregation='normalize_then_sum' is GDPO's group-mean form; {name} has the "
                    f"{self.baseline!r} baseline (use MAGRPOTrainer, or 'sum_then_normalize')"
                )
            if args.reference_kl_enabled or kwargs.get("reward_processor") is not None:
                raise ValueError(
                    "multi_objective_aggregation='normalize_then_sum' normalises each reward function's RAW rewards "
                    "(TRL's); reference_kl_enabled and reward_processor change the reward and are not applied there: "
                    "use 'sum_then_normalize' with them"
                )

    def _check_baseline_survives(self, args: MultiAgentConfig) -> None:
        """Warn when the seed's z-score (`advantage_normalization`) erases this trainer's baseline: z-scoring a group
        is invariant to subtracting any per-group constant (raw, leave-one-out, max, greedy), so every sibling
        becomes MAGRPO. (TRL's `scale_rewards` only divides by the std: the baseline stays.)"""
        if self.baseline != "mean" and args.seed_zscore:
            warnings.warn(
                f"{type(self).__name__} with advantage_normalization=True trains exactly as MAGRPOTrainer: z-scoring "
                "each group removes its baseline. Leave it unset (the default of "
                f"{self.config_class.__name__}), or set scale_rewards ('group' divides by the group's std and keeps "
                f"the baseline), to train with the {self.baseline!r} baseline.",
                UserWarning,
                stacklevel=3,
            )

    # ------------------------------------------------------------------ generation reuse (num_iterations)
    def get_train_dataloader(self):
        """The rollout loader, each rollout batch repeated for every step taken on it (`steps_per_generation x
        num_iterations`, TRL's `RepeatSampler`)."""
        repeat = self.args.steps_per_rollout * self.args.num_iterations
        return rollout_dataloader(self.train_dataset, self.args, self.accelerator, repeat)

    def _prepare_inputs(self, items: list[dict]) -> dict:
        """Roll out once every `steps_per_generation x num_iterations` steps (TRL's `generate_every`); each step
        takes its slice of the buffered generation, every slice `num_iterations` times."""
        if not isinstance(items, list):
            return items
        K = self.args.steps_per_rollout
        if self._step % (K * self.args.num_iterations) == 0 or self._buffered is None:
            self._buffered = self._rollout_step(items)
        return self._buffered[self._step % K]


class MAREINFORCETrainer(MAGRPOTrainer):
    """Multi-agent REINFORCE: the raw joint return as the advantage. `num_generations` may be 1."""

    _name = "MAREINFORCE"
    _tag_names = ["trl", "trl_marl", "multi-agent", "mareinforce"]
    config_class = MAREINFORCEConfig
    baseline = "raw"
    min_generations = 1


class MARLOOTrainer(MAGRPOTrainer):
    """Multi-agent RLOO: `A_j = R_j - mean_{k != j} R_k`."""

    _name = "MARLOO"
    _tag_names = ["trl", "trl_marl", "multi-agent", "marloo"]
    config_class = MARLOOConfig
    baseline = "loo"


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
            self.baseline = self.rl_step.baseline = "greedy"
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
