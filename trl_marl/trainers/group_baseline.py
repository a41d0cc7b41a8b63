"""`GroupBaselineStep`: the RL step of the REINFORCE family (MAGRPO, MAREINFORCE, MARLOO, MAReMax), and of MARLHF
with one of those backends.

No critic. Each agent's completion is weighted by an advantage built from the joint returns of its group (the G
samples of one node), and each agent gets its own policy-gradient step. The seed's loss (`loss_type=None`):

    loss_i = - mean_over_samples( logprob_sum(a_i) * A )

with `A_j = R_j - b(R)`, `b` the group's baseline (`trl_marl.algorithms.advantages.group_advantages`: mean, raw,
leave-one-out, max) or the greedy joint action's reward (ReMax proper). With a MAGRPO-family config (TRL's GRPO
fields), TRL's `scale_rewards`, GDPO's `multi_objective_aggregation` and TRL's GRPO loss family
(`trl_marl.trainers.grpo_step`) apply.
"""

from __future__ import annotations

import torch

import trl_marl.trainers.building as building
from trl_marl.algorithms.advantages import baseline_advantages, cross_sample_returns, group_advantages
from trl_marl.algorithms.grpo_advantages import multi_objective_advantages, scale_baseline_advantages
from trl_marl.algorithms.logprobs import sequence_logprobs
from trl_marl.algorithms.losses import policy_gradient_loss
from trl_marl.data_types.rollout import Rollout
from trl_marl.rollout.returns import RolloutReturns
from trl_marl.trainers.agent_losses import sum_of_agent_losses
from trl_marl.trainers.base import MultiAgentTrainer
from trl_marl.trainers.data import Experience
from trl_marl.trainers.grpo_step import AgentGeneration, GRPOLossStep, ReferenceSyncCallback
from trl_marl.trainers.per_agent import agent_value
from trl_marl.trainers.reinforce_config import MAGRPOConfig
from trl_marl.trainers.rl_step import RLStep

__all__ = ["GroupBaselineStep"]


class GroupBaselineStep(RLStep):
    """The REINFORCE family's step: group-relative advantages and the seed's (or TRL's) policy-gradient loss.

    Args:
        trainer: the trainer that holds the step.
        baseline: the group baseline (`"mean"`, `"raw"`, `"loo"`, `"max"`, see `group_advantages`), or `"greedy"`:
            the greedy joint action's reward (the rollout must sample it).
        normalize: whether each group's advantages get the seed's z-score (`MAGRPOConfig.seed_zscore`, MARLHF's
            `advantage_normalization`).

    TRL's GRPO fields (`scale_rewards`, `multi_objective_aggregation`, `loss_type`, `sync_ref_model`) are read when
    the trainer's config is a `MAGRPOConfig`; MARLHF's config has none of them.
    """

    resume_types = (AgentGeneration,)

    def __init__(self, trainer: MultiAgentTrainer, baseline: str, normalize: bool):
        super().__init__(trainer)
        self.baseline = baseline
        self.normalize = normalize
        self.grpo_step: GRPOLossStep | None = None  # TRL's loss family (`loss_type` set), built in `attach`

    @property
    def trl_fields(self) -> bool:
        """Whether the trainer's config carries TRL's GRPO fields (a MAGRPO-family config)."""
        return isinstance(self.trainer.args, MAGRPOConfig)

    def attach(self) -> None:
        t = self.trainer
        if self.trl_fields and t.args.uses_trl_loss:
            self.grpo_step = GRPOLossStep(t)
        if self.trl_fields and t.args.sync_ref_model:
            t.add_callback(ReferenceSyncCallback(lambda alpha: building.sync_reference_models(t, alpha)))

    def scale_rewards(self, i: int) -> str | None:
        """Agent i's TRL `scale_rewards`, or None: the seed's scaling (`normalize`)."""
        return agent_value(self.trainer.args.scale_rewards, i) if self.trl_fields else None

    # ------------------------------------------------------------------ the rollout's advantages
    def experience(self, rollout: Rollout, returns: RolloutReturns) -> Experience:
        """Each agent's group-relative advantages, `(num_nodes, G)`: per node, its G samples' returns against the
        group's baseline (`group_advantages`), or against the greedy joint action's reward (`baseline_advantages`,
        ReMax); a group of one sample has no baseline to compare with (zero), except for the raw return. Then the
        scaling: the seed's z-score, or TRL's `scale_rewards` (`scale_baseline_advantages`), or GDPO's
        `multi_objective_aggregation="normalize_then_sum"`. With TRL's loss, also each agent's generation data
        (`GRPOLossStep.prepare`)."""
        G = rollout.num_generations
        advantages = []
        for i in range(self.trainer.num_agents):
            returns_i = torch.stack([returns.of_node(n.id, i) for n in rollout.nodes]) if rollout.nodes else None
            advantages.append(torch.zeros(0, G) if returns_i is None else self.agent_advantages(rollout, i, returns_i))
        inputs = {"advantages": advantages}
        if self.grpo_step is not None:
            inputs["generations"] = self.grpo_step.prepare(rollout)
        return Experience(advantages, inputs)

    def agent_advantages(self, rollout: Rollout, i: int, returns: torch.Tensor) -> torch.Tensor:
        """Agent i's `(num_nodes, G)` advantages from its `(num_nodes, G)` returns (see `experience`)."""
        G, normalize, scale = returns.shape[1], self.normalize, self.scale_rewards(i)
        args = self.trainer.args
        if self.trl_fields and args.multi_objective_aggregation == "normalize_then_sum":
            table = self._reward_table(rollout, i)
            return multi_objective_advantages(
                table, G, args.reward_weights, scale or "group", "normalize_then_sum"
            ).view(-1, G)
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
        acc = self.trainer.accelerator
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
        n, G = self.trainer.num_agents, rollout.num_generations
        rows = []
        for node in rollout.nodes:
            cols = []
            for values in node.reward_components.values():
                v = values.float()
                cols.append(v if rollout.joint_mode == "aligned" else cross_sample_returns(v.reshape((G,) * n), i))
            rows.append(torch.stack(cols, dim=1))
        return torch.cat(rows)

    # ------------------------------------------------------------------ the loss
    def compute_loss(self, model: torch.nn.Module, inputs: dict) -> torch.Tensor:
        """Sum over agents of each agent's loss on this step's items: the seed's `policy_gradient_loss(logprob_sum(
        a_i), A_i)`, or with `loss_type` set TRL's `grpo_loss` (`GRPOLossStep.loss`), `A_i` the advantages
        `experience` computed for the rollout.

        One forward pass per agent over all its samples of the step (every turn of every item). Agents' parameters
        are disjoint, so the gradient of the sum on agent i is agent i's own policy gradient; on one process each
        agent's term is backpropagated before the next agent's forward (`trl_marl.trainers.agent_losses`).
        """
        t = self.trainer
        rollout, items = inputs["rollout"], inputs["items"]
        nodes = rollout.nodes_of_items(items)
        rows = torch.tensor([node.id for node in nodes], dtype=torch.long)
        advantages = [adv[rows].reshape(-1) for adv in inputs["advantages"]]  # samples_of_agent's order
        if self.grpo_step is not None:
            return self.grpo_step.loss(model, rollout, nodes, advantages, inputs["generations"])
        batches = [t.agent_batch(i, rollout.samples_of_agent(i, nodes)) for i in range(t.num_agents)]

        def agent_loss(i: int, out: dict[str, list], rows: slice) -> torch.Tensor:
            logp = out["logprobs"][i]
            mask = batches[i].completion_mask[rows, : logp.shape[1]].to(logp.device)
            seq = sequence_logprobs(logp, mask)
            part = rows != slice(None)  # a part of the rows: its share of the agent's loss
            num_samples = len(advantages[i]) if part else None
            return policy_gradient_loss(seq, advantages[i][rows].to(logp.device), num_samples)

        loss, out, losses = sum_of_agent_losses(t, model, batches, agent_loss)
        m = t._metrics["train"]
        for i, loss_i in enumerate(losses):
            if loss_i is None:
                continue
            logp = out["logprobs"][i]
            seq = sequence_logprobs(logp.detach(), batches[i].completion_mask.to(logp.device))
            m[f"agent_{i + 1}/loss"].append(loss_i.item())
            m[f"agent_{i + 1}/logprob_mean"].append(seq.mean().item())
            m[f"agent_{i + 1}/advantage_std"].append(advantages[i].std(unbiased=False).item())
        t._metrics.record_entropy(out["entropy"])
        return loss
