"""The rollout tree: what generating returns (`GenerationOutput`), one agent's sampled completion (`Sample`), a node of
the tree (`Node`) and a whole rollout (`Rollout`).

The tree holds what the rollout produced (prompts, token ids, texts, rewards) and the reward-side data a trainer adds
to it (the reference-KL penalty of each sample). Returns and advantages are not stored here: each algorithm computes
them as tensors in its own step (`trl_marl.rollout.returns`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["GenerationOutput", "Sample", "Node", "Rollout", "generated_tokens"]


@dataclass
class GenerationOutput:
    """What generating for one agent returns: one entry per row, rows ordered prompt-major (prompt p's G samples
    are rows p*G .. p*G+G-1)."""

    texts: list[str]
    prompt_ids: list[torch.Tensor]  # unpadded prompt token ids per row
    completion_ids: list[torch.Tensor]  # completion token ids per row, up to and including the first EOS
    # per row, the sampler's log-prob of each completion token, when the backend reports them (vLLM)
    sampling_logprobs: list[torch.Tensor] | None = None


@dataclass
class Sample:
    """One agent's completion at one node."""

    agent: int
    node: int
    index: int  # sample index k within the node (0..G-1)
    prompt: str
    completion: str
    prompt_ids: torch.Tensor
    completion_ids: torch.Tensor
    penalty: float = 0.0  # e.g. reference-KL penalty subtracted from this agent's reward
    # the sampler's log-prob of each completion token, when the engine reports them (vLLM; NaN: not scored)
    sampling_logprobs: torch.Tensor | None = None
    # per completion token, 1 where the agent generated it and 0 where it was inserted (a tool result between two
    # generations of an agentic turn, TRL's `tool_mask`): 0 tokens are masked out of the loss. None: all generated.
    tool_mask: torch.Tensor | None = None

    @property
    def num_generated_tokens(self) -> int:
        """The completion tokens the agent generated (`generated_tokens`)."""
        return generated_tokens(self)


def generated_tokens(sample: Sample) -> int:
    """The completion tokens an agent generated: inserted tokens (`tool_mask` 0) are not counted, as TRL counts
    completion lengths. Reads `completion_ids` and, when the sample has one, `tool_mask`."""
    mask = getattr(sample, "tool_mask", None)
    return int(sample.completion_ids.numel() if mask is None else mask.sum())


@dataclass
class Node:
    """One node of a rollout tree: one item, one turn, G samples per agent, J joint actions."""

    id: int
    item: int  # index of the task item in the rollout batch
    turn: int  # 0-based
    parent: tuple[int, int] | None  # (parent node id, parent joint index)
    prompts: list[str]  # per agent
    prompt_history: list[list[str]]  # per agent, earlier turns' prompts on this branch
    response_history: list[list[str]]  # per agent, earlier turns' completions on this branch
    samples: list[list[int]] = field(default_factory=list)  # per agent, G sample ids
    joint: list[tuple[int, ...]] = field(default_factory=list)  # per joint action, the sample index k per agent
    rewards: torch.Tensor | None = None  # (J,) or (J, n) processed rewards
    raw_rewards: torch.Tensor | None = None
    # each reward function's raw rewards of the J joint actions (name -> (J,)), TRL's `rewards_per_func`
    reward_components: dict[str, torch.Tensor] | None = None
    children: dict[int, int] = field(default_factory=dict)  # joint index -> child node id
    terminated: bool = False
    greedy_reward: float | None = None  # reward of the greedy joint action (ReMax's baseline), when sampled


@dataclass
class Rollout:
    """A rollout over a batch of items: every node and sample, plus counters."""

    items: list[dict]
    nodes: list[Node]
    samples: list[Sample]
    num_agents: int
    num_generations: int
    joint_mode: str
    env_steps: int = 0
    reward_seconds: float = 0.0  # wall time spent inside the reward function
    # what the rollout engine measured beside the tree (agentic rollouts: per-agent tool calls and failures, episode
    # length, environment reward), logged as is
    metrics: dict[str, float] = field(default_factory=dict)

    def nodes_of_items(self, items: Sequence[int]) -> list[Node]:
        keep = set(items)
        return [n for n in self.nodes if n.item in keep]

    def samples_of_agent(self, agent: int, nodes: Sequence[Node] | None = None) -> list[Sample]:
        nodes = self.nodes if nodes is None else nodes
        return [self.samples[s] for n in nodes for s in n.samples[agent]]

    def turn_metrics(self, team_to_go: Sequence[torch.Tensor] | None = None) -> dict[str, float]:
        """`turn_k/reward_mean`, `turn_k/reward_std` and, given each node's `(J,)` undiscounted team reward-to-go
        (`team_to_go[node.id]`, `trl_marl.rollout.returns.RolloutReturns`), `turn_k/expected_return`; k counts
        from 1."""
        out: dict[str, float] = {}
        turns = sorted({n.turn for n in self.nodes})
        for t in turns:
            nodes = [n for n in self.nodes if n.turn == t]
            rewards = torch.cat([_shared(n.rewards) for n in nodes])
            out[f"turn_{t + 1}/reward_mean"] = rewards.mean().item()
            out[f"turn_{t + 1}/reward_std"] = rewards.std(unbiased=False).item()
            if team_to_go is not None:
                out[f"turn_{t + 1}/expected_return"] = torch.cat([team_to_go[n.id] for n in nodes]).mean().item()
        return out

    def records(
        self, returns: Sequence[torch.Tensor] | None = None, advantages: Sequence[torch.Tensor] | None = None
    ) -> list[dict]:
        """One JSON-able record per joint action (for traces): prompts, completions and reward of every agent, and,
        when given, the joint action's per-agent returns (`returns[node.id]`, `(J, n)`) and each agent's advantage
        (`advantages[i]`, `(num_nodes, G)`; 0.0 where none is given)."""
        recs = []
        for n in self.nodes:
            for j, ks in enumerate(n.joint):
                samples = [self.samples[n.samples[i][k]] for i, k in enumerate(ks)]
                rew = n.rewards[j]
                recs.append(
                    {
                        "item": n.item,
                        "node": n.id,
                        "turn": n.turn + 1,
                        "joint": j,
                        "prompts": [s.prompt for s in samples],
                        "completions": [s.completion for s in samples],
                        "reward": rew.tolist(),
                        "raw_reward": n.raw_rewards[j].tolist(),
                        "returns": returns[n.id][j].tolist() if returns is not None else None,
                        "advantages": [
                            advantages[i][n.id, k].item() if advantages is not None else 0.0 for i, k in enumerate(ks)
                        ],
                    }
                )
        return recs


def _shared(rewards: torch.Tensor) -> torch.Tensor:
    """(J,) team rewards from (J,) or per-agent (J, n) rewards (mean over agents)."""
    return rewards if rewards.ndim == 1 else rewards.mean(dim=1)
