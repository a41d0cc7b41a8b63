"""What actor-critic trainers keep between a rollout and its update: the transitions of a value stream, the streams themselves, and the frozen critic data."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trl_marl.data_types.rollout import Rollout

__all__ = ["Transitions", "build_transitions", "ValueStream", "CriticData"]


# ==================================================================================================== transitions
@dataclass
class Transitions:
    """The steps of a rollout seen by one value stream: one step per joint action `(node, j)`, in node order.

    Every stream of a rollout has the same steps in the same order (so agent i's samples, listed node by node,
    line up with them); streams differ only in their rewards. A step's successor is the joint action of the next
    turn on the same trajectory (`next_index > index`), or -1 for the last collected turn.
    """

    node: list[int]
    joint: list[int]
    item: list[int]
    turn: list[int]
    rewards: torch.Tensor  # (S,) reward minus reference-KL penalty
    next_index: torch.Tensor  # (S,) long; -1: no successor, no bootstrap

    def __len__(self) -> int:
        return len(self.node)

    @property
    def has_next(self) -> torch.Tensor:
        return self.next_index >= 0


def build_transitions(rollout: Rollout, agent: int | None = None) -> Transitions:
    """Turn a rollout into the transitions of one value stream.

    The reward of step `(node, j)` is

        r = r_{j,i} - penalty_i                     for the stream of agent i (`agent=i`)
        r = mean_i ( r_{j,i} - penalty_i )          for the team stream (`agent=None`)

    where `r_{j,i}` is the processed reward of joint action j (the shared reward, or agent i's entry of per-agent
    rewards) and `penalty_i` the reference-KL penalty of agent i's sample in it. The successor is the first joint
    action of the child node that joint action j spawned (one trajectory per item: the child has one joint action).
    """
    n = rollout.num_agents
    index: dict[tuple[int, int], int] = {}
    nodes, joints, items, turns, rewards = [], [], [], [], []
    for node in rollout.nodes:
        J = len(node.joint)
        r = node.rewards if node.rewards.ndim == 2 else node.rewards.unsqueeze(1).expand(J, n)
        for j, ks in enumerate(node.joint):
            pens = torch.tensor([rollout.samples[node.samples[a][k]].penalty for a, k in enumerate(ks)])
            shaped = r[j].to(torch.float32) - pens
            index[(node.id, j)] = len(nodes)
            nodes.append(node.id)
            joints.append(j)
            items.append(node.item)
            turns.append(node.turn)
            rewards.append(shaped.mean() if agent is None else shaped[agent])
    next_index = torch.full((len(nodes),), -1, dtype=torch.long)
    for s, (nid, j) in enumerate(zip(nodes, joints)):
        child = rollout.nodes[nid].children.get(j)
        if child is not None:
            if len(rollout.nodes[child].joint) != 1:
                raise ValueError("actor-critic transitions need one joint action per node after the first turn")
            next_index[s] = index[(child, 0)]
    return Transitions(nodes, joints, items, turns, torch.stack(rewards) if rewards else torch.zeros(0), next_index)


@dataclass
class ValueStream:
    """One critic's value estimates and the agents whose advantages they give.

    `module` indexes `team.critics` (a separate critic) or is None (the value head on agent `agents[0]`).
    `reward_agent` is None for the team reward. `joint` critics read the joint text, the others the agent's own
    tokens.
    """

    name: str
    agents: list[int]
    reward_agent: int | None
    joint: bool
    module: int | None


@dataclass
class CriticData:
    """What a rollout leaves for its update, frozen: per stream, the critic inputs, rollout-time predictions and
    targets (in the critic's output space); per agent, the (normalized) advantages and, for PPO, the rollout-time
    token log-probs. Indexed by step (see `Transitions`)."""

    items: list[int]
    targets: list[torch.Tensor]
    old_values: list[torch.Tensor]
    critic_inputs: list[list[torch.Tensor] | None]
    advantages: list[torch.Tensor]
    old_logprobs: list[list[torch.Tensor]] | None = None
