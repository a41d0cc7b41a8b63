"""`AgenticRollout`: the joint rollout of an agentic team (tools, a shared environment, turn order), as a rollout tree.

The tree is the one `JointRollout` builds (`trl_marl.data_types.rollout`), so every trainer's returns, advantages and
losses apply unchanged; only how a node's samples are produced differs:

- a node is a state of ONE episode (`trl_marl.environments.Branch`: the environment shared by the agents, one
  conversation per agent). At the root, the item's environment is reset once (`reset(**item)`);
- the node's G joint actions are G branches of that state: the state itself and `G - 1` copies (`Branch.fork`:
  the environment's `clone()`, else `copy.deepcopy`, else rebuilt with its factory and its calls replayed), so
  every branch has its own environment state and all G start from the same one;
- in each branch the agents play one turn in `turn_order` (`TurnPlayer`: one `generate` per agent position per
  tool round over every live branch of every node of the turn); agent i's sample k is its whole turn in branch k
  (its generations and the masked tool results between them; one masked EOS where it did not act);
- joint action k's reward is the reward functions on the agents' messages plus, on the turn its episode ends, the
  environment's `get_reward()` (`RewardSources`); ONE reward call per turn covers every node;
- a branch whose episode goes on (neither the environment nor `max_turns` ended it) becomes the child node of its
  joint action, and branches again at the next turn (a multi-turn tree, as `JointRollout`'s with
  `external_transition`).

The environments taken for a rollout come from the registry's pool and go back to it at the end (their copies are
dropped). Per-agent episode metrics (tool calls, failures, timeouts, turns acted, environment reward, averaged over
the episodes: the leaves) are left in `Rollout.metrics`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trl_marl.data_types.rollout import Node, Rollout, Sample
from trl_marl.data_types.text import PromptText
from trl_marl.distributed.collective import any_over_processes
from trl_marl.environments import Branch, EnvironmentRegistry, EpisodeConfig, episode_metrics
from trl_marl.environments.tools import Tool
from trl_marl.generation.engine import prompt_token_ids
from trl_marl.models.loading import default_eos_token_id
from trl_marl.rewards.sources import EnvironmentReward, RewardSources
from trl_marl.rollout.agentic_turns import AgentTurn, GenerateFn, TurnPlayer
from trl_marl.rollout.engine import JointRollout
from trl_marl.rollout.prompts import PromptError, describe_item, format_item, prompt_problem, prompt_rule

__all__ = ["AgenticRollout"]


class AgenticRollout:
    """Runs agentic joint rollouts (see the module docstring).

    Args:
        formatters: one per agent, `formatter(item) -> str | chat messages`: each agent's opening prompt (the
            environment's `reset` text is appended to its last user message).
        player: plays one turn of many branches in tokens.
        reward: the reward functions and the environments' rewards.
        episode: turn order, turns per episode (`num_turns`) and tool rounds per agent turn.
        num_generations: G branches per node.
        tools: per agent, its standalone tools (`trl_marl.environments.per_agent_tools`).
        registry: the environments (`environment_factory`), or None.
        synced: keep the processes in step (collective generation): every process plays a turn while any has a
            branch left.
    """

    greedy_baseline = False  # ReMax's greedy joint action has no meaning for an episode with tools: never drawn

    def __init__(
        self,
        formatters: Sequence[Callable[[dict], Any]],
        player: TurnPlayer,
        reward: RewardSources,
        episode: EpisodeConfig,
        num_generations: int,
        tools: Sequence[Sequence[Tool]],
        registry: EnvironmentRegistry | None = None,
        synced: bool = False,
    ):
        self.formatters = list(formatters)
        self.player = player
        self.reward = reward
        self.episode = episode
        self.num_generations = num_generations
        self.tools = [list(t) for t in tools]
        self.registry = registry
        self.synced = synced
        eos = zip(player.tokenizers, player.eos_ids)
        self._eos = [default_eos_token_id(tok, sorted(ids)) for tok, ids in eos]  # what a non-acting sample holds

    @property
    def num_agents(self) -> int:
        return self.episode.num_agents

    @property
    def num_turns(self) -> int:
        return self.episode.max_turns

    # --- the rollout ---
    def run(
        self,
        items: Sequence[dict],
        generate_fn: GenerateFn,
        num_generations: int | None = None,
        greedy_baseline: bool | None = None,
    ) -> Rollout:
        """Roll out `items`; `num_generations` overrides G (evaluation uses 1). `greedy_baseline` must be falsy."""
        if greedy_baseline:
            raise ValueError("an agentic rollout has no greedy baseline (MAReMax remax_baseline='greedy')")
        G = num_generations or self.num_generations
        rollout = Rollout(list(items), [], [], self.num_agents, G, "aligned")
        taken: list[tuple[str | None, Any]] = []  # environments from the pool, returned at the end
        try:
            frontier = []
            for b, item in enumerate(rollout.items):
                state = self._start(item, taken)
                frontier.append((self._node(rollout, b, None, state), state))
            leaves: list[Branch] = []
            for _ in range(self.num_turns):
                if not (any_over_processes(bool(frontier)) if self.synced else frontier):
                    break
                groups = [[state] + state.fork(G - 1) for _, state in frontier]
                turns = self.player.play([b for g in groups for b in g], generate_fn)
                self._add_samples(rollout, frontier, groups, turns)
                self._score(rollout, frontier, groups, turns)
                nxt = []
                for (node, _), group in zip(frontier, groups):
                    for j, b in enumerate(group):
                        if b.done:
                            leaves.append(b)
                            continue
                        child = self._node(rollout, node.item, (node, j, self._messages(b, turns)), b)
                        node.children[j] = child.id
                        nxt.append((child, b))
                frontier = nxt
            rollout.metrics = episode_metrics(leaves + [b for _, b in frontier])
        finally:
            for name, env in taken:
                self.registry.release(name, env)
        return rollout

    def _start(self, item: dict, taken: list) -> Branch:
        """The episode of `item`: each agent's formatted prompt, the item's environment reset with it."""
        prompts = [format_item(self.formatters, i, item) for i in range(self.num_agents)]
        for i, prompt in enumerate(prompts):  # empty is fine: the environment's reset() may add the task
            problem = prompt_problem(prompt, allow_empty=True)
            if problem is not None:
                raise PromptError(
                    f"{describe_item(item)}: agent {i + 1}'s prompt {problem}; {prompt_rule(allow_empty=True)}"
                )
        env = spec = None
        kwargs = dict(item)
        if self.registry is not None:
            name, kwargs = self.registry.route(item)
            env, spec = self.registry.acquire(name), self.registry.specs[name]
            taken.append((name, env))
        return Branch.start(self.episode, prompts, env, spec, kwargs, self.tools, self.player.executor)

    def _node(self, rollout: Rollout, item: int, parent: tuple[Node, int, list[str]] | None, state: Branch) -> Node:
        """A node for `state` (its prompts rendered for every agent), appended to the tree."""
        n = self.num_agents
        prompts = [self.player.render(i, state) for i in range(n)]
        if parent is None:
            node = Node(len(rollout.nodes), item, 0, None, prompts, [[] for _ in range(n)], [[] for _ in range(n)])
        else:
            up, j, messages = parent
            node = Node(
                len(rollout.nodes),
                item,
                up.turn + 1,
                (up.id, j),
                prompts,
                [h + [p] for h, p in zip(up.prompt_history, up.prompts)],
                [h + [m] for h, m in zip(up.response_history, messages)],
            )
        rollout.nodes.append(node)
        return node

    def _add_samples(
        self,
        rollout: Rollout,
        frontier: list[tuple[Node, Branch]],
        groups: list[list[Branch]],
        turns: dict[tuple[int, int], AgentTurn],
    ) -> None:
        """Sample (i, k) of each node: agent i's turn in branch k. Where agent i did not act (a turn-based game, an
        episode that ended earlier in the turn) the sample is one EOS, masked: nothing is trained, and the metrics
        see a finished, empty completion."""
        n = self.num_agents
        for (node, _), group in zip(frontier, groups):
            node.samples = [[] for _ in range(n)]
            for i in range(n):
                tok = self.player.tokenizers[i]
                idle_ids = None  # the node's prompt tokens, for the branches where agent i did not act
                for k, b in enumerate(group):
                    turn = turns.get((b.uid, i))
                    if turn is None:  # did not act here (turn-based game, episode over): one masked EOS, no action
                        if idle_ids is None:
                            idle_ids = prompt_token_ids(tok, [node.prompts[i]], None)[0]
                        turn = AgentTurn(PromptText(node.prompts[i]), list(idle_ids))
                        turn.extend([self._eos[i]], generated=False)
                    completion = torch.tensor(turn.completion_ids, dtype=torch.long)
                    sample = Sample(
                        i,
                        node.id,
                        k,
                        turn.prompt,
                        tok.decode(turn.completion_ids, skip_special_tokens=True),
                        torch.tensor(turn.prompt_ids, dtype=torch.long),
                        completion,
                        tool_mask=None if all(turn.tool_mask) else torch.tensor(turn.tool_mask, dtype=torch.long),
                        sampling_logprobs=_logprobs(turn),
                    )
                    node.samples[i].append(len(rollout.samples))
                    rollout.samples.append(sample)
            node.joint = [(k,) * n for k in range(len(group))]

    def _score(
        self,
        rollout: Rollout,
        frontier: list[tuple[Node, Branch]],
        groups: list[list[Branch]],
        turns: dict[tuple[int, int], AgentTurn],
    ) -> None:
        """ONE reward call for every joint action of the turn: the agents' messages and each ended episode's
        environment reward."""
        n = self.num_agents
        texts: list[list[str]] = [[] for _ in range(n)]
        prompts, items, env = [], [], []
        t0 = time.perf_counter()
        for (node, _), group in zip(frontier, groups):
            item = rollout.items[node.item]
            task = JointRollout.task_prompt(item, node.prompts)
            for b in group:
                for i, message in enumerate(self._messages(b, turns)):
                    texts[i].append(message)
                prompts.append(task)
                items.append(item)
                env.append(self._environment_reward(b))
        if not env:
            return
        processed, raw = self.reward(texts, prompts, items, env)
        rollout.reward_seconds += time.perf_counter() - t0
        rollout.env_steps += len(env)
        start = 0
        for node, _ in frontier:
            J = len(node.joint)
            node.rewards, node.raw_rewards = processed[start : start + J], raw[start : start + J]
            start += J

    def _messages(self, branch: Branch, turns: dict[tuple[int, int], AgentTurn]) -> list[str]:
        """Each agent's message of the turn in `branch` ("" for an agent that did not act)."""
        return [turns[(branch.uid, i)].message if (branch.uid, i) in turns else "" for i in range(self.num_agents)]

    @staticmethod
    def _environment_reward(branch: Branch) -> EnvironmentReward | None:
        """The environment's reward of a branch whose episode has ended (None before, or without `get_reward`)."""
        if not branch.done or branch.env is None or not branch.spec.has_reward:
            return None
        return EnvironmentReward(branch.reward(), bool(branch.joint_reward), branch.spec.cls.__name__)


def _logprobs(turn: AgentTurn) -> torch.Tensor | None:
    """The engine's log-probs of a turn's tokens (0.0 at the inserted ones), or None where it gave none."""
    return None if turn.sampling_logprobs is None else torch.tensor(turn.sampling_logprobs, dtype=torch.float32)
