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
family on its own tokens (`trl_marl.trainers.grpo_step`); the configs are in `trl_marl.trainers.reinforce_config`.
"""

from __future__ import annotations

import warnings

import torch

import trl_marl.trainers.building as building
from trl_marl.algorithms.advantages import baseline_advantages, cross_sample_returns, group_advantages
from trl_marl.algorithms.grpo_advantages import multi_objective_advantages, scale_baseline_advantages
from trl_marl.algorithms.logprobs import sequence_logprobs
from trl_marl.algorithms.losses import policy_gradient_loss
from trl_marl.data_types.rollout import Rollout
from trl_marl.rollout.returns import RolloutReturns
from trl_marl.trainers.base import MultiAgentTrainer
from trl_marl.trainers.config import MultiAgentConfig
from trl_marl.trainers.data import Experience, rollout_dataloader
from trl_marl.trainers.grpo_step import AgentGeneration, GRPOLossStep, ReferenceSyncCallback
from trl_marl.trainers.per_agent import agent_value, agent_values
from trl_marl.trainers.reinforce_config import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig

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
    resume_types = (AgentGeneration,)

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
        if isinstance(checked, MAGRPOConfig):
            self._check_trl_fields(checked, kwargs)
        super().__init__(model, reward_funcs, checked, train_dataset, eval_dataset, processing_class, **kwargs)
        # TRL's loss family (`loss_type` set): its per-generation data and per-step loss
        self.grpo_step = GRPOLossStep(self) if self._trl_config and self.args.uses_trl_loss else None
        if self._trl_config and self.args.sync_ref_model:
            self.add_callback(ReferenceSyncCallback(lambda alpha: building.sync_reference_models(self, alpha)))

    @property
    def _trl_config(self) -> bool:
        """Whether the config carries TRL's GRPO fields (a MAGRPO-family config; MARLHF's RL step has its own)."""
        return isinstance(self.args, MAGRPOConfig)

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
        zscore = args.seed_zscore if isinstance(args, MAGRPOConfig) else args.advantage_normalization
        if self.baseline != "mean" and zscore:
            warnings.warn(
                f"{type(self).__name__} with advantage_normalization=True trains exactly as MAGRPOTrainer: z-scoring "
                "each group removes its baseline. Leave it unset (the default of "
                f"{self.config_class.__name__}), or set scale_rewards ('group' divides by the group's std and keeps "
                f"the baseline), to train with the {self.baseline!r} baseline.",
                UserWarning,
                stacklevel=3,
            )

    def _normalize_advantages(self) -> bool:
        """Whether each group's advantages get the seed's z-score (`MAGRPOConfig.seed_zscore`)."""
        return self.args.seed_zscore

    def _scale_rewards(self, i: int) -> str | None:
        """Agent i's TRL `scale_rewards`, or None: the seed's scaling (`_normalize_advantages`)."""
        return agent_value(self.args.scale_rewards, i) if self._trl_config else None

    # ------------------------------------------------------------------ generation reuse (num_iterations)
    def _num_iterations(self) -> int:
        return self.args.num_iterations if self._trl_config else 1

    def get_train_dataloader(self):
        """The rollout loader, each rollout batch repeated for every step taken on it (`steps_per_generation x
        num_iterations`, TRL's `RepeatSampler`)."""
        repeat = self.args.steps_per_rollout * self._num_iterations()
        return rollout_dataloader(self.train_dataset, self.args, self.accelerator, repeat)

    def _prepare_inputs(self, items: list[dict]) -> dict:
        """Roll out once every `steps_per_generation x num_iterations` steps (TRL's `generate_every`); each step
        takes its slice of the buffered generation, every slice `num_iterations` times."""
        if not isinstance(items, list):
            return items
        K = self.args.steps_per_rollout
        if self._step % (K * self._num_iterations()) == 0 or self._buffered is None:
            self._buffered = self._rollout_step(items)
        return self._buffered[self._step % K]

    # ------------------------------------------------------------------ the step
    def _experience(self, rollout: Rollout, returns: RolloutReturns) -> Experience:
        """Each agent's group-relative advantages, `(num_nodes, G)`: per node, its G samples' returns against the
        group's baseline (`group_advantages`), or against the greedy joint action's reward (`baseline_advantages`,
        ReMax); a group of one sample has no baseline to compare with (zero), except for the raw return. Then the
        scaling: the seed's z-score, or TRL's `scale_rewards` (`scale_baseline_advantages`), or GDPO's
        `multi_objective_aggregation="normalize_then_sum"`. With TRL's loss, also each agent's generation data
        (`GRPOLossStep.prepare`)."""
        G = rollout.num_generations
        advantages = []
        for i in range(self.num_agents):
            returns_i = torch.stack([returns.of_node(n.id, i) for n in rollout.nodes]) if rollout.nodes else None
            advantages.append(
                torch.zeros(0, G) if returns_i is None else self._agent_advantages(rollout, i, returns_i)
            )
        inputs = {"advantages": advantages}
        if self.grpo_step is not None:
            inputs["generations"] = self.grpo_step.prepare(rollout)
        return Experience(advantages, inputs)

    def _agent_advantages(self, rollout: Rollout, i: int, returns: torch.Tensor) -> torch.Tensor:
        """Agent i's `(num_nodes, G)` advantages from its `(num_nodes, G)` returns (see `_experience`)."""
        G, normalize, scale = returns.shape[1], self._normalize_advantages(), self._scale_rewards(i)
        if self._trl_config and self.args.multi_objective_aggregation == "normalize_then_sum":
            table = self._reward_table(rollout, i)
            weights = self.args.reward_weights
            return multi_objective_advantages(table, G, weights, scale or "group", "normalize_then_sum").view(-1, G)
        if self.baseline == "greedy":
            greedy = [n.greedy_reward for n in rollout.nodes]
            if any(g is None for g in greedy):
                raise RuntimeError("the greedy baseline needs the rollout's greedy joint actions")
            adv = baseline_advantages(returns, torch.tensor(greedy).unsqueeze(1), normalize)
        elif G > 1 or self.baseline == "raw":
            adv = group_advantages(returns, self.baseline, normalize)
        else:
            adv = torch.zeros_like(returns)
        if scale is None:
            return adv
        batch_std = self._batch_std(returns) if scale == "batch" else None
        return scale_baseline_advantages(adv, returns, G, scale, batch_std).view(-1, G)

    def _batch_std(self, returns: torch.Tensor) -> float | None:
        """The Bessel std of an agent's returns over the generation batch of every process (`scale_rewards="batch"`,
        as TRL gathers the rewards); None on one process (the batch's own std)."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return None
        x = returns.double().flatten()
        moments = torch.stack([torch.tensor(float(x.numel()), dtype=torch.float64), x.sum(), (x * x).sum()])
        count, total, squares = acc.reduce(moments.to(acc.device), reduction="sum").cpu().tolist()
        if count < 2:
            return 0.0
        return max((squares - total * total / count) / (count - 1), 0.0) ** 0.5

    def _reward_table(self, rollout: Rollout, i: int) -> torch.Tensor:
        """`(num_nodes * G, K)`: each reward function's raw reward of agent i's samples (the sample's joint action,
        or in `"cross"` mode the mean over the joint actions that contain it, as its return)."""
        n, G = self.num_agents, rollout.num_generations
        rows = []
        for node in rollout.nodes:
            cols = []
            for values in node.reward_components.values():
                v = values.float()
                cols.append(v if rollout.joint_mode == "aligned" else cross_sample_returns(v.reshape((G,) * n), i))
            rows.append(torch.stack(cols, dim=1))
        return torch.cat(rows)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Sum over agents of each agent's loss on this step's items: the seed's `policy_gradient_loss(logprob_sum(
        a_i), A_i)`, or with `loss_type` set TRL's `grpo_loss` (`GRPOLossStep.loss`), `A_i` the advantages
        `_experience` computed for the rollout.

        One forward pass per agent over all its samples of the step (every turn of every item). Agents' parameters
        are disjoint, so the gradient of the sum on agent i is agent i's own policy gradient.
        """
        rollout, items = inputs["rollout"], inputs["items"]
        nodes = rollout.nodes_of_items(items)
        rows = torch.tensor([node.id for node in nodes], dtype=torch.long)
        advantages = [adv[rows].reshape(-1) for adv in inputs["advantages"]]  # samples_of_agent's order
        if self.grpo_step is not None:
            return self.grpo_step.loss(model, rollout, nodes, advantages, inputs["generations"])
        batches = [self.agent_batch(i, rollout.samples_of_agent(i, nodes)) for i in range(self.num_agents)]
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
