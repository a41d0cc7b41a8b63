"""Turn order and the state of one joint rollout branch, built to be driven in lock-step over many branches.

Turn order (pure logic, `sees_same_turn`): within a turn the agents act in index order, one position at a time.

- `"simultaneous"`: no agent sees another's message of the same turn; the turn's messages are delivered (and given
  to the environment's `on_message`) when the turn ends.
- `"sequential"`: agent i+1 sees the messages of agents 1..i of the same branch and turn: each message is delivered
  (and given to `on_message`) as soon as its agent's turn ends.

Another agent's message reaches an agent as a user message `"{name}: {text}"` (`EpisodeConfig.message_template`),
after the agent's own messages of earlier positions; consecutive user messages are merged in `Branch.prompt` (some
chat templates require alternating roles). An environment with `share_messages = False` delivers nothing: it is the
only channel (board games whose observations already report the moves).

A `Branch` is one joint rollout: one environment shared by the agents, one chat history per agent, done flags,
tool counters, the environment's reward. A rollout engine drives a list of branches with one generation per agent
position per tool round (see `lockstep.play` for the reference loop):

    for turn in range(max_turns):
        for k in range(num_agents):
            batch = [b for b in live if b.can_act(k)]; for b in batch: b.begin(k)
            while batch:
                messages = generate_for_agent_k([b.prompt(k) for b in batch], [b.tools(k) for b in batch])
                requests = [b.add_completion(k, m) for b, m in zip(batch, messages)]
                results = executor.run(all requests, flattened)              # every branch at once
                for b, rs in ...: b.add_tool_results(k, rs)
                batch = [b for b in batch if b.needs_generation(k)]
            for b: b.finish(k)
        for b in live: b.end_turn()
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_marl.environments.environment import (
    EnvironmentSpec,
    check_active_agents,
    check_done,
    check_reset_output,
    check_reward,
    copy_environment,
    replay_log,
)
from trl_marl.environments.tools import Tool, ToolCallRequest, ToolExecutor, ToolResult, ToolStats, as_tools

__all__ = [
    "TURN_ORDERS",
    "Branch",
    "EpisodeConfig",
    "Segment",
    "default_executor",
    "episode_metrics",
    "merge_user_messages",
    "per_agent_tools",
    "sees_same_turn",
]

TURN_ORDERS = ("simultaneous", "sequential")
_uids = itertools.count()
_DEFAULT_EXECUTOR: ToolExecutor | None = None


def default_executor() -> ToolExecutor:
    """A process-wide `ToolExecutor` (30 s timeout) used when a branch is given none."""
    global _DEFAULT_EXECUTOR
    if _DEFAULT_EXECUTOR is None:
        _DEFAULT_EXECUTOR = ToolExecutor()
    return _DEFAULT_EXECUTOR


def sees_same_turn(agent: int, num_agents: int, turn_order: str) -> list[int]:
    """The agents whose message of the current turn `agent` (0-based) sees before it acts: `[0, ..., agent-1]` in
    sequential order, `[]` in simultaneous order."""
    if turn_order not in TURN_ORDERS:
        raise ValueError(f"turn_order must be one of {TURN_ORDERS}, got {turn_order!r}")
    if not 0 <= agent < num_agents:
        raise ValueError(f"agent must be in [0, {num_agents}), got {agent}")
    return list(range(agent)) if turn_order == "sequential" else []


def per_agent_tools(tools: Sequence[Any] | None, num_agents: int) -> list[list[Tool]]:
    """`tools=` as the trainers take it, one list for all agents or a list per agent, as one `Tool` list per agent.
    A list whose entries are all lists (or None) is per agent and must have `num_agents` entries."""
    if not tools:
        return [[] for _ in range(num_agents)]
    if all(isinstance(t, (list, tuple)) or t is None for t in tools):
        if len(tools) != num_agents:
            raise ValueError(
                f"tools: a list per agent must have one entry per agent ({num_agents}), got {len(tools)}; pass one "
                "flat list of callables to give every agent the same tools"
            )
        return [as_tools(t) for t in tools]
    shared = as_tools(tools)
    return [list(shared) for _ in range(num_agents)]


def merge_user_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Copy of `messages` without empty user messages and with runs of consecutive plain-text user messages joined
    by a blank line."""
    out: list[dict] = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "user" and m.get("content") == "":
            continue  # an empty prompt before the environment's text
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.get("role") == m.get("role") == "user"
            and isinstance(prev.get("content"), str)
            and isinstance(m.get("content"), str)
        ):
            prev["content"] = f"{prev['content']}\n\n{m['content']}"
        else:
            out.append(m)
    return out


@dataclass(frozen=True)
class EpisodeConfig:
    """How episodes run: `num_agents`; `turn_order`; `max_turns` (turns per episode; every agent position once per
    turn); `max_tool_calling_iterations` (tool rounds per agent turn, `None` = unbounded as TRL's default);
    `agent_names` (how others' messages are labelled, default "Agent 1", ...); `message_template`;
    `environment_timeout` (seconds for any environment method other than a tool call, `None` = no limit: a hook
    past it ends its branch with `done_reason="environment_timeout"`; `reset` or `get_reward` past it raise
    `TimeoutError`). Tool calls have the `ToolExecutor`'s timeout."""

    num_agents: int
    turn_order: str = "sequential"
    max_turns: int = 1
    max_tool_calling_iterations: int | None = None
    agent_names: tuple[str, ...] | None = None
    message_template: str = "{name}: {text}"
    environment_timeout: float | None = 60.0

    def __post_init__(self):
        if not isinstance(self.num_agents, int) or self.num_agents < 1:
            raise ValueError(f"EpisodeConfig.num_agents must be an int >= 1, got {self.num_agents!r}")
        if self.turn_order not in TURN_ORDERS:
            raise ValueError(f"EpisodeConfig.turn_order must be one of {TURN_ORDERS}, got {self.turn_order!r}")
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"EpisodeConfig.max_turns must be an int >= 1, got {self.max_turns!r}")
        m = self.max_tool_calling_iterations
        if m is not None and (not isinstance(m, int) or m < 0):
            raise ValueError(f"EpisodeConfig.max_tool_calling_iterations must be an int >= 0 or None, got {m!r}")
        t = self.environment_timeout
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0):
            raise ValueError(f"EpisodeConfig.environment_timeout must be a positive number or None, got {t!r}")
        if self.agent_names is not None and len(self.agent_names) != self.num_agents:
            raise ValueError(
                f"EpisodeConfig.agent_names must name every agent ({self.num_agents}), got {len(self.agent_names)}"
            )

    def name(self, agent: int) -> str:
        return self.agent_names[agent] if self.agent_names else f"Agent {agent + 1}"


@dataclass
class Segment:
    """A piece of an agent's turn: `"model"` (generated text, trained on) or `"tool"` (a tool result, masked)."""

    kind: str
    text: str


def _as_messages(prompt: Any, agent: int) -> list[dict]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) and "role" in m for m in prompt):
        return [dict(m) for m in prompt]
    raise TypeError(
        f"prompts[{agent}] must be a str or a list of chat messages ({{'role', 'content'}} dicts), got "
        f"{type(prompt).__name__}"
    )


def _append_text(messages: list[dict], text: str) -> None:
    """Append `text` to the last user message (TRL: `content + observation`), or add a user message."""
    if messages and messages[-1].get("role") == "user" and isinstance(messages[-1].get("content"), str):
        messages[-1] = {**messages[-1], "content": messages[-1]["content"] + text}
    else:
        messages.append({"role": "user", "content": text})


@dataclass
class Branch:
    """One joint rollout branch. Build it with `Branch.start`; see the module docstring for the driving loop."""

    config: EpisodeConfig
    histories: list[list[dict]]  # per agent: the chat messages it has seen and written, in order
    standalone: list[dict[str, Tool]]
    env: Any = None
    spec: EnvironmentSpec | None = None
    item: dict | None = None
    executor: ToolExecutor | None = None
    turn: int = 0
    done: bool = False
    done_reason: str | None = None
    stats: list[ToolStats] = field(default_factory=list)
    turns_acted: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    acting: list[bool] = field(default_factory=list)
    segments: list[list[Segment]] = field(default_factory=list)  # per agent, its current (or last) turn
    transcript: list[tuple[int, int, str]] = field(default_factory=list)  # (turn, agent, final text)
    env_log: list[tuple[str, tuple, dict]] = field(default_factory=list)  # replayable environment calls
    uid: int = field(default_factory=lambda: next(_uids))
    _pending: list[tuple[int, str]] = field(default_factory=list)  # simultaneous: messages to deliver at turn end
    _turn_start: list[int] = field(default_factory=list)  # per agent, history length when its turn began
    environment_timeouts: int = 0
    _reward: tuple[list[float], bool] | None = None

    # ------------------------------------------------------------------------------------------------ creation
    @classmethod
    def start(
        cls,
        config: EpisodeConfig,
        prompts: Sequence[Any],
        env: Any = None,
        spec: EnvironmentSpec | None = None,
        item: Mapping[str, Any] | None = None,
        tools: Sequence[Sequence[Tool]] | None = None,
        executor: ToolExecutor | None = None,
    ) -> Branch:
        """A new branch: per-agent `prompts` (str or chat messages), an optional environment instance `env` with its
        `spec` (from `EnvironmentRegistry`), reset here with `**item` (the row without the routing column), and
        per-agent standalone `tools` (`per_agent_tools`)."""
        n = config.num_agents
        if len(prompts) != n:
            raise ValueError(f"Branch.start: prompts must have one entry per agent ({n}), got {len(prompts)}")
        if (env is None) != (spec is None):
            raise ValueError("Branch.start: pass both env and spec (EnvironmentRegistry.specs[name]) or neither")
        tools = tools if tools is not None else [[] for _ in range(n)]
        if len(tools) != n:
            raise ValueError(f"Branch.start: tools must have one list per agent ({n}), got {len(tools)}")
        standalone = [{t.name: t for t in ts} for ts in tools]
        if spec is not None:
            clash = sorted({name for ts in standalone for name in ts} & set(spec.tools))
            if clash:
                raise ValueError(f"tools {clash} are both standalone tools and methods of {spec.label}")
        b = cls(
            config=config,
            histories=[_as_messages(p, i) for i, p in enumerate(prompts)],
            standalone=standalone,
            env=env,
            spec=spec,
            item=dict(item or {}),
            executor=executor,
            stats=[ToolStats() for _ in range(n)],
            turns_acted=[0] * n,
            rounds=[0] * n,
            acting=[False] * n,
            segments=[[] for _ in range(n)],
            _turn_start=[0] * n,
        )
        if env is not None:
            texts = check_reset_output(b._call("reset", (), b.item), n, spec.label)
            for i, text in enumerate(texts):
                if text:
                    _append_text(b.histories[i], text)
            b._check_done()
        return b

    def _call(self, method: str, args: tuple = (), kwargs: Mapping[str, Any] | None = None, log: bool = True):
        """Call an environment method (awaiting it when async) within `config.environment_timeout`, and record it
        for replay. Past the timeout the call is stopped (async) or abandoned (sync) and `TimeoutError` raised."""
        kwargs = dict(kwargs or {})
        executor = self.executor or default_executor()
        fn, limit = getattr(self.env, method), self.config.environment_timeout
        try:
            out = (
                executor.call_soon(fn, *args, **kwargs)
                if limit is None
                else executor.call_with_timeout(fn, limit, *args, **kwargs)
            )
        except TimeoutError as e:
            self.environment_timeouts += 1
            raise TimeoutError(f"{self.spec.label}.{method}() did not return within {limit:g} s") from e
        if log:
            self.env_log.append((method, args, kwargs))
        return out

    def _hook(self, method: str, args: tuple = (), log: bool = True, default: Any = None) -> Any:
        """`_call` for a hook whose timeout ends the branch (reason `"environment_timeout"`) instead of the run."""
        try:
            return self._call(method, args, log=log)
        except TimeoutError:
            self.done, self.done_reason = True, "environment_timeout"
            return default

    # ------------------------------------------------------------------------------------------ turn protocol
    def _check_done(self) -> None:
        if self.done or self.env is None:
            return
        if self.spec.has_is_done:
            flag = check_done(self._hook("is_done", log=False, default=True), self.spec.label, "is_done()")
        else:
            value = getattr(self.env, "done", None)  # read each time: it may appear only after reset()
            if value is None:
                return
            flag = check_done(value, self.spec.label, "done")
        if flag:
            self.done, self.done_reason = True, "environment"

    def can_act(self, agent: int) -> bool:
        """Whether `agent` acts at its position of the current turn: the branch is live and the environment (if it
        defines `active_agents()`) lists the agent."""
        if self.done:
            return False
        if self.env is not None and self.spec.has_active_agents:
            active = self._hook("active_agents", log=False, default=[])
            return not self.done and agent in check_active_agents(active, self.config.num_agents, self.spec.label)
        return True

    def begin(self, agent: int) -> None:
        """Start `agent`'s turn: the environment's `observe(agent)` text (if any) joins its history."""
        if self.done:
            raise RuntimeError(f"Branch.begin({agent}): the branch is done ({self.done_reason})")
        if self.acting[agent]:
            raise RuntimeError(f"Branch.begin({agent}): the agent's turn has already begun")
        if self.env is not None and self.spec.has_observe:
            text = self._hook("observe", (agent,))
            if text is not None and not isinstance(text, str):
                raise TypeError(
                    f"{self.spec.label}.observe({agent}) must return a str or None, got {type(text).__name__}"
                )
            if text:
                self.histories[agent].append({"role": "user", "content": text})
        self.acting[agent] = True
        self.rounds[agent] = 0
        self.segments[agent] = []
        self._turn_start[agent] = len(self.histories[agent])

    def prompt(self, agent: int) -> list[dict]:
        """The conversation to render for `agent` now (consecutive user messages merged); with `tools(agent)` it is
        what `render_prompt` takes. During a tool round it ends with the tool messages."""
        return merge_user_messages(self.histories[agent])

    def tools(self, agent: int) -> list[Tool]:
        """The tools `agent` may call now: its standalone tools, then the environment's (`tools_for` applied)."""
        out = list(self.standalone[agent].values())
        if self.env is not None:
            out += list(self.spec.tools_for(self.env, agent).values())
        return out

    def add_completion(self, agent: int, message: Mapping[str, Any], text: str | None = None) -> list[ToolCallRequest]:
        """Record `agent`'s generated assistant message (as `parse_completion` returns it; `text` is the raw
        completion text for the segment record) and return the tool calls to run now: none when the message has no
        call, the branch is done, or `max_tool_calling_iterations` rounds have run this turn (as in TRL, the calls
        of the last allowed completion are then left unexecuted)."""
        if not self.acting[agent]:
            raise RuntimeError(f"Branch.add_completion({agent}): call begin({agent}) first")
        if not isinstance(message, Mapping) or message.get("role", "assistant") != "assistant":
            raise TypeError(f"Branch.add_completion({agent}): expected an assistant message dict, got {message!r}")
        content = message.get("content") or ""
        msg = {"role": "assistant", "content": content}
        calls = message.get("tool_calls") or []
        if calls:
            msg["tool_calls"] = list(calls)
        self.histories[agent].append(msg)
        self.segments[agent].append(Segment("model", text if text is not None else content))
        limit = self.config.max_tool_calling_iterations
        if not calls or self.done or (limit is not None and self.rounds[agent] >= limit):
            return []
        self.rounds[agent] += 1
        available = {t.name: t for t in self.tools(agent)}
        return [
            ToolCallRequest(call, available, agent, group=(self.uid, agent), index=i) for i, call in enumerate(calls)
        ]

    def add_tool_results(self, agent: int, results: Sequence[ToolResult]) -> list[dict]:
        """Append the results of the calls `add_completion` returned (same order) as tool messages; counts them,
        logs the environment calls for replay, checks whether the environment ended. Returns the tool messages (a
        trainer renders them with `tool_suffix_ids` and masks those tokens)."""
        messages = []
        for r in results:
            self.stats[agent].add(r)
            m = r.message()
            self.histories[agent].append(m)
            self.segments[agent].append(Segment("tool", m["content"] if isinstance(m["content"], str) else str(m)))
            messages.append(m)
            if self.spec is not None and r.name in self.spec.tools and r.arguments is not None and not r.timed_out:
                self.env_log.append((r.name, (), dict(r.arguments)))
        self._check_done()
        return messages

    def needs_generation(self, agent: int) -> bool:
        """Whether `agent` generates again in this turn: its last message is a tool result and the branch is live."""
        h = self.histories[agent]
        return self.acting[agent] and not self.done and bool(h) and h[-1].get("role") == "tool"

    def finish(self, agent: int) -> str:
        """End `agent`'s turn; returns its message (the text of its assistant messages of this turn, tool calls
        excluded), which goes to `on_message` and the other agents now (sequential) or at `end_turn`
        (simultaneous)."""
        if not self.acting[agent]:
            raise RuntimeError(f"Branch.finish({agent}): the agent's turn has not begun")
        self.acting[agent] = False
        self.turns_acted[agent] += 1
        mine = self.histories[agent][self._turn_start[agent] :]
        text = "\n".join(m["content"] for m in mine if m["role"] == "assistant" and m.get("content")).strip()
        self.transcript.append((self.turn, agent, text))
        if self.config.turn_order == "sequential":
            self._deliver(agent, text)
        else:
            self._pending.append((agent, text))
        return text

    def _deliver(self, agent: int, text: str) -> None:
        if self.env is not None and self.spec.has_on_message and not self.done:
            self._hook("on_message", (agent, text))
        if text and (self.spec is None or self.spec.share_messages):
            content = self.config.message_template.format(name=self.config.name(agent), text=text)
            for i in range(self.config.num_agents):
                if i != agent:
                    self.histories[i].append({"role": "user", "content": content})
        self._check_done()

    def end_turn(self) -> None:
        """Close the turn: deliver simultaneous messages, advance `turn`, end the branch at `max_turns`."""
        for agent, text in self._pending:
            self._deliver(agent, text)
        self._pending = []
        self.turn += 1
        self._check_done()
        if not self.done and self.turn >= self.config.max_turns:
            self.done, self.done_reason = True, "max_turns"

    # ------------------------------------------------------------------------------------------- reward, copy
    def reward(self) -> list[float] | None:
        """One float per agent from the environment's `get_reward()` (a joint float repeated), validated; `None`
        without an environment or a `get_reward`. Cached once the branch is done."""
        if self.env is None or not self.spec.has_reward:
            return None
        if self._reward is None or not self.done:  # cached once the episode is over
            self._reward = check_reward(self._call("get_reward", log=False), self.config.num_agents, self.spec.label)
        return list(self._reward[0])

    @property
    def joint_reward(self) -> bool | None:
        """Whether `get_reward` returned one joint float (after `reward()`)."""
        return None if self._reward is None else self._reward[1]

    def fork(self, n: int) -> list[Branch]:
        """`n` independent copies (G samples per node): the environment through `clone()`, else `copy.deepcopy`,
        else rebuilt with its factory and replayed from `env_log` (the environment must then be deterministic)."""
        if self.acting.count(True):
            raise RuntimeError("Branch.fork: an agent's turn is open; fork between agent turns")
        out = []
        for _ in range(n):
            env = None
            if self.env is not None:
                env = copy_environment(self.env, self.spec)
                if env is None:
                    env = self.spec.factory()
                    replay_log(env, self.env_log, run=(self.executor or default_executor()).call_soon)
            child = copy.copy(self)
            child.env = env
            child.uid = next(_uids)
            child._reward = None
            for name in ("histories", "segments", "transcript", "env_log", "_pending", "item"):
                setattr(child, name, copy.deepcopy(getattr(self, name)))
            for name in ("stats", "turns_acted", "rounds", "acting", "_turn_start"):
                setattr(child, name, copy.deepcopy(getattr(self, name)))
            out.append(child)
        return out

    def metrics(self) -> dict[str, float]:
        """Per-agent counters of this branch: `agent_i/tools/calls`, `/tools/failures`, `/tools/timeouts`,
        `agent_i/episode_length` (turns it acted), `agent_i/env_reward` (when the environment has a reward)."""
        out: dict[str, float] = {}
        rewards = self.reward()
        for i in range(self.config.num_agents):
            p = f"agent_{i + 1}/"
            out[p + "tools/calls"] = float(self.stats[i].calls)
            out[p + "tools/failures"] = float(self.stats[i].failures)
            out[p + "tools/timeouts"] = float(self.stats[i].timeouts)
            out[p + "episode_length"] = float(self.turns_acted[i])
            if rewards is not None:
                out[p + "env_reward"] = rewards[i]
        return out


def episode_metrics(branches: Sequence[Branch]) -> dict[str, float]:
    """Means over `branches` of `Branch.metrics()` (TRL's `tools/call_frequency` is `agent_i/tools/calls` here,
    calls per episode), plus `episodes/turns`, `episodes/ended_by_environment` (fraction) and
    `episodes/environment_timeouts` (per episode)."""
    if not branches:
        return {}
    per = [b.metrics() for b in branches]
    keys = sorted({k for m in per for k in m})
    out = {k: sum(m[k] for m in per if k in m) / sum(k in m for m in per) for k in keys}
    out["episodes/turns"] = sum(b.turn for b in branches) / len(branches)
    out["episodes/ended_by_environment"] = sum(b.done_reason == "environment" for b in branches) / len(branches)
    out["episodes/environment_timeouts"] = sum(b.environment_timeouts for b in branches) / len(branches)
    return out
