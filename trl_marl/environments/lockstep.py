"""Driving many branches in lock-step: one generation per agent position per tool round over all live branches.

`play` is the reference loop at the level of chat messages (a `generate` callback returns assistant messages).
A trainer runs the same loop at the level of tokens: it renders `branch.prompt(k)` with `render_prompt`, generates
once for all rows, parses with `parse_completion`, and after a tool round extends each row with
`tool_suffix_ids(tokenizer, tool_messages)` (masked) instead of re-rendering. The helpers below are the loop's
steps, so both share them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl_marl.environments.environment import EnvironmentRegistry
from trl_marl.environments.episode import Branch, EpisodeConfig, default_executor
from trl_marl.environments.tools import Tool, ToolExecutor

__all__ = ["GenerateFn", "begin_position", "play", "release_branches", "run_tool_round", "start_branches"]

# generate(agent, prompts, tools) -> one assistant message (or plain text) per prompt
GenerateFn = Callable[[int, list[list[dict]], list[list[Tool]]], Sequence[Mapping[str, Any] | str]]


def start_branches(
    config: EpisodeConfig,
    items: Sequence[Mapping[str, Any]],
    prompts: Callable[[Mapping[str, Any]], Sequence[Any]] | Sequence[Sequence[Any]],
    registry: EnvironmentRegistry | None = None,
    tools: Sequence[Sequence[Tool]] | None = None,
    num_generations: int = 1,
    executor: ToolExecutor | None = None,
) -> list[Branch]:
    """`num_generations` branches per item, item-major (item i's branches are `i*G .. i*G+G-1`), each with its own
    environment instance (from the registry's pool, routed by the item's `environment` column) reset with the
    item. `prompts` is `prompts(item) -> one prompt per agent`, or a list of those per item."""
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    if not callable(prompts) and len(prompts) != len(items):
        raise ValueError(f"prompts: one entry per item ({len(items)}), got {len(prompts)}")
    out = []
    for i, item in enumerate(items):
        agent_prompts = prompts(item) if callable(prompts) else prompts[i]
        for _ in range(num_generations):
            env = spec = None
            kwargs = dict(item)
            if registry is not None:
                name, kwargs = registry.route(item)
                env, spec = registry.acquire(name), registry.specs[name]
            out.append(Branch.start(config, agent_prompts, env, spec, kwargs, tools, executor))
    return out


def release_branches(registry: EnvironmentRegistry, branches: Sequence[Branch]) -> None:
    """Return the branches' environments to the registry's pool."""
    for b in branches:
        if b.env is not None:
            registry.release(b.spec.name, b.env)
            b.env = None


def begin_position(branches: Sequence[Branch], agent: int) -> list[Branch]:
    """The branches in which `agent` acts at its position of this turn, with the agent's turn begun in each."""
    batch = [b for b in branches if b.can_act(agent)]
    for b in batch:
        b.begin(agent)
    return batch


def run_tool_round(
    batch: Sequence[Branch], agent: int, messages: Sequence[Mapping[str, Any] | str], executor: ToolExecutor
) -> tuple[list[Branch], list[list[dict]]]:
    """Record `agent`'s generated `messages` (one per branch of `batch`), run every branch's tool calls in ONE
    executor call, append the results. Returns the branches that generate again and, for each, its new tool
    messages (what a trainer turns into masked suffix tokens)."""
    if len(messages) != len(batch):
        raise ValueError(f"run_tool_round: {len(messages)} messages for {len(batch)} branches")
    requests = []
    for b, m in zip(batch, messages):
        m = {"role": "assistant", "content": m} if isinstance(m, str) else m
        requests.append(b.add_completion(agent, m))
    flat = [r for rs in requests for r in rs]
    results = executor.run(flat)
    again, tool_messages, pos = [], [], 0
    for b, rs in zip(batch, requests):
        if not rs:
            continue
        msgs = b.add_tool_results(agent, results[pos : pos + len(rs)])
        pos += len(rs)
        if b.needs_generation(agent):
            again.append(b)
            tool_messages.append(msgs)
    return again, tool_messages


def play(branches: Sequence[Branch], generate: GenerateFn, executor: ToolExecutor | None = None) -> dict[str, int]:
    """Run `branches` to the end (done or `max_turns`), calling `generate` once per agent position per tool round
    with every branch that needs it. Returns counters: `generate_calls`, `rows` (prompts generated), `tool_calls`
    (executed in this call)."""
    executor = executor or default_executor()
    if not branches:
        return {"generate_calls": 0, "rows": 0, "tool_calls": 0}
    config = branches[0].config
    calls_before = sum(s.calls for b in branches for s in b.stats)
    counters = {"generate_calls": 0, "rows": 0}
    while True:
        live = [b for b in branches if not b.done]
        if not live:
            break
        for agent in range(config.num_agents):
            batch = begin_position(live, agent)
            acted = list(batch)
            while batch:
                out = generate(agent, [b.prompt(agent) for b in batch], [b.tools(agent) for b in batch])
                if len(out) != len(batch):
                    raise ValueError(f"generate returned {len(out)} messages for {len(batch)} prompts")
                counters["generate_calls"] += 1
                counters["rows"] += len(batch)
                batch, _ = run_tool_round(batch, agent, out, executor)
            for b in acted:
                b.finish(agent)
        for b in live:
            b.end_turn()
    counters["tool_calls"] = sum(s.calls for b in branches for s in b.stats) - calls_before
    return counters
