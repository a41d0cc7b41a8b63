"""`JointRollout`: task items in, a rollout tree out.

For each item every agent formats its prompt; each turn, every agent samples G completions per node in ONE batched
call of the generation engine; the completions combine into joint actions (`joint_mode`: aligned or cross) that ONE
reward call scores; with `num_turns > 1` the external transition builds each next turn's prompts per joint action.
The result is a `Rollout` (`trl_marl.data_types.rollout`); returns and advantages are the trainer's
(`trl_marl.rollout.returns`).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from trl_marl.data_types.rollout import GenerationOutput, Node, Rollout, Sample, _shared
from trl_marl.data_types.text import PromptText
from trl_marl.distributed.collective import any_over_processes
from trl_marl.rewards import RewardFunction
from trl_marl.rollout.prompts import PromptError, describe_item, format_item, one_kind_rule, prompt_kind

__all__ = ["logger", "JOINT_MODES", "TREE_WARN_SIZE", "GenerateFn", "tree_size", "JointRollout"]


logger = logging.getLogger(__name__)


JOINT_MODES = ("aligned", "cross")


# A rollout tree with more joint actions per item than this is almost surely a configuration mistake.
TREE_WARN_SIZE = 4096


# generate_fn(prompts_per_agent, num_generations, greedy=False) -> one GenerationOutput per agent
GenerateFn = Callable[[list[list[PromptText]], int], list[GenerationOutput]]


def tree_size(num_generations: int, num_agents: int, num_turns: int, joint_mode: str) -> int:
    """Joint actions per item in a full tree: sum_{t=1..T} J^t with J = G (aligned) or G^n (cross)."""
    J = num_generations if joint_mode == "aligned" else num_generations**num_agents
    return sum(J**t for t in range(1, num_turns + 1))


class JointRollout:
    """Runs joint rollouts for a team (see the module docstring).

    Args:
        num_agents: n.
        formatters: one callable per agent, `formatter(item) -> str | chat messages`.
        render: `render(agent, formatted) -> PromptText` (applies the agent's chat template to messages).
        reward: the wrapped joint reward.
        num_generations: G samples per agent per node.
        joint_mode: `"aligned"` or `"cross"`.
        num_turns: T.
        external_transition: called after each non-final turn per joint action, returns one prompt per agent.
        external_prompt_passthrough: use the transition's prompts verbatim instead of formatting them.
        early_termination_threshold: a node stops expanding when its mean processed reward exceeds this.
        synced: keep the processes in step (`trl_marl.distributed.collective`): set when generating or scoring is a collective
            (ZeRO-3, FSDP2). A process whose branches all ended (or that has no items) keeps taking part in every
            turn another process still runs, calling `generate_fn` with no prompts (the reward is not called: a
            learned, sharded reward model scores single-turn rollouts only, MARLHF).
        greedy_baseline: also decode every node greedily (one more batched `generate` per agent) and score that
            joint action in the same reward call; its reward is `node.greedy_reward` (ReMax's baseline).
    """

    def __init__(
        self,
        num_agents: int,
        formatters: Sequence[Callable],
        render: Callable[[int, Any], PromptText],
        reward: RewardFunction,
        num_generations: int,
        joint_mode: str = "aligned",
        num_turns: int = 1,
        external_transition: Callable | None = None,
        external_prompt_passthrough: bool = False,
        early_termination_threshold: float | None = None,
        greedy_baseline: bool = False,
        synced: bool = False,
    ):
        if joint_mode not in JOINT_MODES:
            raise ValueError(f"joint_mode must be one of {JOINT_MODES}, got {joint_mode!r}")
        if num_turns > 1 and external_transition is None:
            raise ValueError("num_turns > 1 needs an external_transition that builds the next turn's prompts")
        self.num_agents = num_agents
        self.formatters = list(formatters)
        self.render = render
        self.reward = reward
        self.num_generations = num_generations
        self.joint_mode = joint_mode
        self.num_turns = num_turns
        self.external_transition = external_transition
        self.external_prompt_passthrough = external_prompt_passthrough
        self.early_termination_threshold = early_termination_threshold
        self.greedy_baseline = greedy_baseline
        self.synced = synced
        self._transition_kwargs = _accepted_kwargs(external_transition) if external_transition else set()
        self._first_kinds: dict[int, tuple[str, str]] = {}  # agent -> (prompt kind, the item first met in)
        size = tree_size(num_generations, num_agents, num_turns, joint_mode)
        if size > TREE_WARN_SIZE:
            warnings.warn(
                f"the rollout tree has up to {size} joint actions per task item (G={num_generations}, "
                f"n={num_agents}, T={num_turns}, joint_mode={joint_mode!r}); that many reward calls and samples per "
                "item is rarely intended — lower num_generations or num_turns, or use joint_mode='aligned'",
                stacklevel=2,
            )

    @classmethod
    def from_config(
        cls,
        args: Any,
        formatters: Sequence[Callable],
        render: Callable[[int, Any], PromptText],
        reward: RewardFunction,
        external_transition: Callable | None = None,
        synced: bool = False,
    ) -> JointRollout:
        """The rollout of a trainer config (`num_agents`, `num_generations`, `joint_mode`, `num_turns`,
        `external_prompt_passthrough`, `early_termination_threshold`)."""
        return cls(
            num_agents=args.num_agents,
            formatters=formatters,
            render=render,
            reward=reward,
            num_generations=args.num_generations,
            joint_mode=args.joint_mode,
            num_turns=args.num_turns,
            external_transition=external_transition,
            external_prompt_passthrough=args.external_prompt_passthrough,
            early_termination_threshold=args.early_termination_threshold,
            synced=synced,
        )

    # --- prompts ---
    @staticmethod
    def task_prompt(item: dict, agent_prompts: Sequence[str]) -> str:
        """The prompt passed as `prompts` to rewards and as `prompt` to transitions."""
        p = item.get("prompt") if isinstance(item, dict) else None
        return p if isinstance(p, str) else agent_prompts[0]

    def first_prompts(self, item: dict) -> list[PromptText]:
        """Every agent's rendered prompt for `item`; a prompt that cannot be generated from raises `PromptError`
        naming the item and the agent, and so does one of another kind than the agent's first (`one_kind`)."""
        return [self._rendered(i, self.one_kind(i, self.format(i, item), item), item) for i in range(self.num_agents)]

    def one_kind(self, i: int, formatted: Any, item: dict) -> Any:
        """`formatted`, agent i's formatter's output for `item`, when it is of the kind (`prompt_kind`) of the first
        one this rollout met; else `PromptError`, naming both items: the trainer keeps one chat setting per agent
        (`PromptRenderer.chat`, with which preference pairs are re-tokenized). A custom formatter's output is seen
        only here (a default formatter's column is checked at construction: `check_prompt_column`); a transition's
        later-turn prompts may be of another kind (each prompt is tokenized as its kind: `prompt_token_ids`)."""
        kind, first = prompt_kind(formatted), self._first_kinds.get(i)
        if first is None and kind != "no prompt":
            self._first_kinds[i] = (kind, describe_item(item))
        elif first is not None and kind not in (first[0], "no prompt"):
            raise PromptError(
                f"{describe_item(item)}: the prompt that agent {i + 1}'s formatter returns is {kind}, but for "
                f"{first[1]} it returned {first[0]}; {one_kind_rule()}, or drop the items of the other kind"
            )
        return formatted

    def _rendered(self, i: int, formatted: Any, item: dict, turn: int | None = None) -> PromptText:
        """`render(i, formatted)`; its `PromptError` names `item` (and the transition's `turn`, for its prompts)."""
        try:
            return self.render(i, formatted)
        except PromptError as exc:
            where = describe_item(item)
            if turn is not None:
                where = f"the external_transition's turn-{turn} prompts for {where}"
            raise PromptError(f"{where}: {exc}; fix or drop the item") from exc

    def format(self, i: int, item: dict):
        """Agent i's formatter on `item`, a failure naming the agent, the formatter and the columns (`format_item`)."""
        return format_item(self.formatters, i, item)

    def next_prompts(self, item: dict, node: Node, joint_texts: list[str]) -> list[PromptText]:
        kwargs = {
            "prompt": self.task_prompt(item, node.prompts),
            "agent_completions": list(joint_texts),
            "num_agents": self.num_agents,
            "prompt_history_per_agent": [h + [p] for h, p in zip(node.prompt_history, node.prompts)],
            "response_history_per_agent": [h + [c] for h, c in zip(node.response_history, joint_texts)],
            "batch_item": item,
            "turn": node.turn + 1,
        }
        accepted = self._transition_kwargs
        if "*" not in accepted:
            kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        out = self.external_transition(**kwargs)
        if isinstance(out, str) or len(out) != self.num_agents:
            raise ValueError(
                f"external_transition must return a list of {self.num_agents} prompts (one per agent), got {out!r}"
            )
        prompts = []
        for i, p in enumerate(out):
            if self.external_prompt_passthrough:
                prompts.append(self._rendered(i, p, item, node.turn + 2))
            else:
                prompts.append(self._rendered(i, self.format(i, {**item, "prompt": p}), item, node.turn + 2))
        return prompts

    # --- the rollout ---
    def run(
        self,
        items: Sequence[dict],
        generate_fn: GenerateFn,
        num_generations: int | None = None,
        greedy_baseline: bool | None = None,
    ) -> Rollout:
        """Roll out `items`; `num_generations` overrides G (evaluation uses 1), `greedy_baseline` overrides the
        engine's setting (evaluation never needs it)."""
        G = num_generations or self.num_generations
        greedy = self.greedy_baseline if greedy_baseline is None else greedy_baseline
        rollout = Rollout(list(items), [], [], self.num_agents, G, self.joint_mode)
        frontier: list[Node] = []
        for b, item in enumerate(rollout.items):
            prompts = self.first_prompts(item)
            node = Node(len(rollout.nodes), b, 0, None, list(prompts), [[] for _ in prompts], [[] for _ in prompts])
            node._rendered = prompts  # type: ignore[attr-defined]
            rollout.nodes.append(node)
            frontier.append(node)
        for turn in range(self.num_turns):
            # synced: every process runs a turn while any process has a branch left (collective generation)
            if not (any_over_processes(bool(frontier)) if self.synced else frontier):
                break
            self._expand_turn(rollout, frontier, generate_fn, G, greedy)
            if turn == self.num_turns - 1:
                break
            nxt = []
            for node in frontier:
                if node.terminated:
                    continue
                item = rollout.items[node.item]
                for j, ks in enumerate(node.joint):
                    texts = [rollout.samples[node.samples[i][k]].completion for i, k in enumerate(ks)]
                    prompts = self.next_prompts(item, node, texts)
                    child = Node(
                        len(rollout.nodes),
                        node.item,
                        turn + 1,
                        (node.id, j),
                        list(prompts),
                        [h + [p] for h, p in zip(node.prompt_history, node.prompts)],
                        [h + [c] for h, c in zip(node.response_history, texts)],
                    )
                    child._rendered = prompts  # type: ignore[attr-defined]
                    node.children[j] = child.id
                    rollout.nodes.append(child)
                    nxt.append(child)
            frontier = nxt
        for node in rollout.nodes:
            node.__dict__.pop("_rendered", None)
        return rollout

    def _expand_turn(
        self, rollout: Rollout, nodes: list[Node], generate_fn: GenerateFn, G: int, greedy: bool = False
    ) -> None:
        n = self.num_agents
        if not nodes:  # a synced process with nothing left this turn: take part in the collectives only
            generate_fn([[] for _ in range(n)], G)
            if greedy:
                generate_fn([[] for _ in range(n)], 1, greedy=True)
            return
        prompts_per_agent = [[node._rendered[i] for node in nodes] for i in range(n)]  # type: ignore[attr-defined]
        outputs = generate_fn(prompts_per_agent, G)
        for i, out in enumerate(outputs):
            if len(out.texts) != len(nodes) * G:
                raise RuntimeError(
                    f"generation for agent {i + 1} returned {len(out.texts)} rows, expected {len(nodes) * G}"
                )
        # samples
        logps = [out.sampling_logprobs for out in outputs]
        for m, node in enumerate(nodes):
            node.samples = []
            for i in range(n):
                ids = []
                for k in range(G):
                    r = m * G + k
                    s = Sample(
                        i,
                        node.id,
                        k,
                        node.prompts[i],
                        outputs[i].texts[r],
                        outputs[i].prompt_ids[r],
                        outputs[i].completion_ids[r],
                        sampling_logprobs=None if logps[i] is None else logps[i][r],
                    )
                    ids.append(len(rollout.samples))
                    rollout.samples.append(s)
                node.samples.append(ids)
            if self.joint_mode == "aligned":
                node.joint = [tuple([k] * n) for k in range(G)]
            else:
                node.joint = list(itertools.product(range(G), repeat=n))
        # ONE reward call for every joint action of this turn (and the greedy joint actions, if any)
        comps: list[list[str]] = [[] for _ in range(n)]
        task_prompts, batch_items = [], []
        for node in nodes:
            item = rollout.items[node.item]
            tp = self.task_prompt(item, node.prompts)
            for ks in node.joint:
                for i, k in enumerate(ks):
                    comps[i].append(rollout.samples[node.samples[i][k]].completion)
                task_prompts.append(tp)
                batch_items.append(item)
        if greedy:
            outs = generate_fn(prompts_per_agent, 1, greedy=True)
            for m, node in enumerate(nodes):
                for i in range(n):
                    comps[i].append(outs[i].texts[m])
                task_prompts.append(self.task_prompt(rollout.items[node.item], node.prompts))
                batch_items.append(rollout.items[node.item])
        t0 = time.perf_counter()
        processed, raw = self.reward(comps, task_prompts, batch_items)
        rollout.reward_seconds += time.perf_counter() - t0
        rollout.env_steps += len(task_prompts)
        components = self.reward.last_components
        start = 0
        for node in nodes:
            J = len(node.joint)
            node.rewards, node.raw_rewards = processed[start : start + J], raw[start : start + J]
            node.reward_components = {name: v[start : start + J] for name, v in components.items()}
            start += J
        if greedy:
            for m, node in enumerate(nodes):
                node.greedy_reward = float(_shared(processed[start + m : start + m + 1])[0])
        for node in nodes:
            thr = self.early_termination_threshold
            node.terminated = thr is not None and _shared(node.rewards).mean().item() > thr


def _accepted_kwargs(func: Callable) -> set[str]:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return {"*"}
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return {"*"}
    return {p.name for p in params}
