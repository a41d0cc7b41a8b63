"""The returns of a rollout, as tensors: what each joint action and each sample earned along the tree.

A trainer computes them in its own step (after any reference-KL penalty is set on the samples) and derives its
advantages from them (`trl_marl.algorithms.advantages`); nothing is written back on the rollout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trl_marl.algorithms.advantages import cross_sample_returns, tree_returns
from trl_marl.data_types.rollout import Rollout, _shared

__all__ = ["RolloutReturns", "rollout_returns"]


@dataclass
class RolloutReturns:
    """The returns of one rollout (`rollout_returns`).

    Attributes:
        joint: per node (indexed by node id), the `(J, n)` per-agent returns of its joint actions.
        team_to_go: per node, the `(J,)` undiscounted team reward-to-go (raw team rewards, no penalty; what
            `turn_k/expected_return` reports).
        joint_mode: the rollout's (`"aligned"` or `"cross"`): how a sample's return follows from its joint actions'.
        num_generations: G, the samples per agent of each node.
    """

    joint: list[torch.Tensor]
    team_to_go: list[torch.Tensor]
    joint_mode: str = "aligned"
    num_generations: int = 1

    def of_node(self, node: int, agent: int) -> torch.Tensor:
        """The `(G,)` returns of `agent`'s samples at node `node`: the return of each sample's joint action
        (aligned), or the mean over the joint actions that contain it (cross, `cross_sample_returns`)."""
        per_agent = self.joint[node][:, agent]
        if self.joint_mode == "aligned":
            return per_agent
        n = self.joint[node].shape[1]
        return cross_sample_returns(per_agent.reshape((self.num_generations,) * n), agent=agent)

    def of_agent(self, agent: int) -> torch.Tensor:
        """The float32 returns of all of `agent`'s samples, in the order of `Rollout.samples_of_agent`."""
        return torch.cat([self.of_node(k, agent) for k in range(len(self.joint))]).to(torch.float32)


def rollout_returns(rollout: Rollout, discount: float = 1.0) -> RolloutReturns:
    """The returns of every node of `rollout`.

    Per agent i, the reward of joint action j is `r_ij = r_j - penalty_i(sample of i in j)` (`r_j` shared, or the
    per-agent reward). Returns follow the tree, `R_ij = r_ij + discount * mean(R_i of child j)` (`tree_returns`). The
    undiscounted team reward-to-go follows the tree the same way with `discount = 1` on the team reward (the mean over
    agents of per-agent rewards).
    """
    n = rollout.num_agents
    joint: list[torch.Tensor | None] = [None] * len(rollout.nodes)
    to_go: list[torch.Tensor | None] = [None] * len(rollout.nodes)
    for node in sorted(rollout.nodes, key=lambda x: -x.turn):  # children before their parents
        J = len(node.joint)
        rewards = node.rewards if node.rewards.ndim == 2 else node.rewards.unsqueeze(1).expand(J, n)
        penalties = torch.tensor(
            [[rollout.samples[node.samples[i][k]].penalty for i, k in enumerate(ks)] for ks in node.joint],
            dtype=torch.float32,
        )
        children = [node.children.get(j) for j in range(J)]
        joint[node.id] = tree_returns(
            rewards - penalties, [None if c is None else joint[c] for c in children], discount
        )
        to_go[node.id] = tree_returns(_shared(node.rewards), [None if c is None else to_go[c] for c in children], 1.0)
    return RolloutReturns(joint, to_go, rollout.joint_mode, rollout.num_generations)
