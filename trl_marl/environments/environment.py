"""The team version of TRL 1.16's environment contract, and its validation.

TRL (`GRPOTrainer(environment_factory=...)`): a factory returns an environment; `reset(**row)` returns `None` or text
appended to the prompt's last user message; every public method other than `reset` / `get_reward` is a tool;
`get_reward()` (sync or async, no argument) makes the environment own a reward; a `dict` of factories routes each row
by its `environment` column, which is not passed to `reset`.

For a team, ONE environment serves a joint rollout branch and is shared by its agents:

- `reset(**item)` returns `None`, one `str` for every agent, or a list with one `str | None` per agent. The text is
  appended, as is (TRL concatenates without a separator), to the last user message of that agent's prompt.
- Public methods are tools. Names reserved by this contract are not tools: the methods `reset`, `get_reward`,
  `tools_for`, `is_done`, `clone`, `on_message`, `observe`, `active_agents`, and the attributes `done` and
  `share_messages`. Names starting with `_` are private.
- Per-agent tools, either way: `tools_for(agent_index) -> list[str | bound method]` names the tools that agent may
  call (asked at every prompt, so it may depend on the state), or a tool takes an `agent_index: int` argument that
  the runner fills in and hides from the schema.
- `get_reward()` returns a float (the team's joint reward) or a list with one float per agent; sync or async.
- Ending early: `is_done() -> bool` if defined, else a `done` attribute if present; checked after every tool
  round and every agent's turn. An environment with neither runs until the rollout's turn limit.
- Optional hooks: `on_message(agent_index, text)` receives each agent's final message of a turn (a game whose
  moves are plain text, e.g. TextArena); `observe(agent_index) -> str | None` gives an agent new text right before
  it acts (appended as a user message); `active_agents() -> list[int]` says who may act now (turn-based games;
  default: everyone); a class attribute `share_messages = False` hides the agents' messages from each other (the
  environment is then the only channel).
- Branch copies (G samples per node): `clone()` if the environment defines it, else `copy.deepcopy`, else (an
  environment that cannot be deep-copied) rebuild with the factory and replay the branch's log (reset, tool calls,
  hooks), which needs a deterministic environment. Queries (`get_reward`, `is_done`, `tools_for`,
  `active_agents`) are not replayed: they must not change the state.

Every violation raises an error that names the environment class, the method and the expected type.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_marl.environments.tools import Tool, make_tool

__all__ = [
    "RESERVED_ATTRIBUTES",
    "RESERVED_METHODS",
    "EnvironmentRegistry",
    "EnvironmentSpec",
    "check_active_agents",
    "check_done",
    "check_reset_output",
    "check_reward",
    "copy_environment",
    "replay_log",
]

RESERVED_METHODS = frozenset(
    {"reset", "get_reward", "tools_for", "is_done", "clone", "on_message", "observe", "active_agents"}
)
RESERVED_ATTRIBUTES = frozenset({"done", "share_messages"})
ENVIRONMENT_COLUMN = "environment"

EnvironmentFactory = Callable[[], Any]


@dataclass
class EnvironmentSpec:
    """What one environment class offers, read once from a probe instance (TRL probes one instance per factory too).

    `tools` are templates (schema built once per class); `bind(env)` gives the tools of an instance.
    """

    name: str | None
    factory: EnvironmentFactory
    cls: type
    tools: dict[str, Tool]
    has_reward: bool
    has_tools_for: bool
    has_is_done: bool
    has_clone: bool
    has_on_message: bool
    has_observe: bool
    has_active_agents: bool
    share_messages: bool

    @property
    def label(self) -> str:
        return self.cls.__name__ if self.name is None else f"{self.cls.__name__} (environment {self.name!r})"

    @classmethod
    def probe(cls, name: str | None, factory: EnvironmentFactory, instance: Any | None = None) -> EnvironmentSpec:
        """Inspect `instance` (or `factory()`). Raises `TypeError` when the factory is not callable, returns `None`,
        or the instance has no callable `reset`, and `ValueError` when a tool method cannot be described."""
        where = "environment_factory" if name is None else f"environment_factory[{name!r}]"
        if not callable(factory):
            raise TypeError(f"{where} must be a callable that returns an environment, got {type(factory).__name__}")
        env = factory() if instance is None else instance
        if env is None:
            raise TypeError(f"{where}() returned None; it must return an environment instance")
        env_cls = type(env)
        # On the class, as TRL does: getmembers on the instance would evaluate properties
        functions = dict(inspect.getmembers(env_cls, predicate=inspect.isfunction))
        if "reset" not in functions:
            raise TypeError(
                f"{env_cls.__name__} (from {where}) must define a callable `reset(**item)` returning None, a str, or "
                "a list with one str | None per agent"
            )
        tools = {}
        for member, _ in functions.items():
            if member.startswith("_") or member in RESERVED_METHODS or member in RESERVED_ATTRIBUTES:
                continue
            try:
                tools[member] = make_tool(getattr(env, member))
            except ValueError as e:
                raise ValueError(f"{env_cls.__name__}.{member} is a public method, hence a tool, but {e}") from e
        share = getattr(env_cls, "share_messages", True)
        if not isinstance(share, bool):
            raise TypeError(f"{env_cls.__name__}.share_messages must be a bool, got {type(share).__name__}")
        return cls(
            name=name,
            factory=factory,
            cls=env_cls,
            tools=tools,
            has_reward="get_reward" in functions,
            has_tools_for="tools_for" in functions,
            has_is_done="is_done" in functions,
            has_clone="clone" in functions,
            has_on_message="on_message" in functions,
            has_observe="observe" in functions,
            has_active_agents="active_agents" in functions,
            share_messages=share,
        )

    def bind(self, env: Any) -> dict[str, Tool]:
        """The tools of instance `env` (name -> Tool bound to it)."""
        return {n: dataclasses.replace(t, function=getattr(env, n)) for n, t in self.tools.items()}

    def tools_for(self, env: Any, agent_index: int) -> dict[str, Tool]:
        """The environment tools agent `agent_index` may call now (all of them without `tools_for`)."""
        bound = self.bind(env)
        if not self.has_tools_for:
            return bound
        allowed = env.tools_for(agent_index)
        if not isinstance(allowed, (list, tuple, set, frozenset)):
            raise TypeError(
                f"{self.cls.__name__}.tools_for({agent_index}) must return a list of tool names or bound methods, "
                f"got {type(allowed).__name__}"
            )
        out = {}
        for entry in allowed:
            key = entry if isinstance(entry, str) else getattr(entry, "__name__", None)
            if key not in bound:
                raise ValueError(
                    f"{self.cls.__name__}.tools_for({agent_index}) returned {entry!r}, which is not one of its tools "
                    f"{sorted(bound)}"
                )
            out[key] = bound[key]
        return out


def check_reset_output(value: Any, num_agents: int, label: str) -> list[str | None]:
    """Per-agent texts from `reset`'s return value (None, str, or a list of one str | None per agent)."""
    if value is None or isinstance(value, str):
        return [value] * num_agents
    if isinstance(value, (list, tuple)):
        if len(value) != num_agents:
            raise ValueError(
                f"{label}.reset() returned a list of {len(value)} entries; expected one str | None per agent "
                f"({num_agents})"
            )
        bad = [type(v).__name__ for v in value if v is not None and not isinstance(v, str)]
        if bad:
            raise TypeError(f"{label}.reset() returned a list containing {bad[0]}; expected str | None per agent")
        return list(value)
    raise TypeError(
        f"{label}.reset() returned {type(value).__name__}; expected None, a str, or a list with one str | None per "
        f"agent ({num_agents})"
    )


def _finite(v: Any, label: str, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{label}.get_reward() returned {where}{type(v).__name__}; expected a float")
    f = float(v)
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"{label}.get_reward() returned {where}{f}; expected a finite float")
    return f


def check_reward(value: Any, num_agents: int, label: str) -> tuple[list[float], bool]:
    """(one float per agent, joint?) from `get_reward`'s return value: a float (joint: the same for every agent) or
    a list / tuple / 1-D array with one float per agent. NaN, inf, bools and non-numbers are errors."""
    if hasattr(value, "tolist") and not isinstance(value, numbers.Real):  # numpy / torch
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if len(value) != num_agents:
            raise ValueError(
                f"{label}.get_reward() returned {len(value)} values; expected a float or one float per agent "
                f"({num_agents})"
            )
        return [_finite(v, label, f"[{i}] = ") for i, v in enumerate(value)], False
    return [_finite(value, label, "")] * num_agents, True


def check_done(value: Any, label: str, method: str) -> bool:
    """A bool from `is_done()` / `done` (numpy bools accepted)."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # numpy.bool_
        return bool(value)
    raise TypeError(f"{label}.{method} must be a bool, got {type(value).__name__}")


def check_active_agents(value: Any, num_agents: int, label: str) -> set[int]:
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError(f"{label}.active_agents() must return a list of agent indices, got {type(value).__name__}")
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < num_agents]
    if bad:
        raise ValueError(f"{label}.active_agents() returned {bad[0]!r}; expected agent indices in [0, {num_agents})")
    return set(value)


def copy_environment(env: Any, spec: EnvironmentSpec) -> Any | None:
    """A copy of `env` for a new branch: `env.clone()` if defined, else `copy.deepcopy(env)`; `None` when the
    environment cannot be deep-copied (the caller then rebuilds and replays)."""
    if spec.has_clone:
        clone = env.clone()
        if clone is None or type(clone) is not type(env):
            raise TypeError(f"{spec.label}.clone() must return a new {type(env).__name__}, got {type(clone).__name__}")
        if clone is env:
            raise ValueError(f"{spec.label}.clone() returned the same instance; it must return a copy")
        return clone
    try:
        return copy.deepcopy(env)
    except Exception:  # locks, sockets, generators, C handles...
        return None


class EnvironmentRegistry:
    """`environment_factory` normalised to `{name: EnvironmentSpec}` (a single callable is the unnamed `None`),
    with routing by the `environment` column and a pool of reusable instances, as TRL keeps one.

    Raises `TypeError` for a factory that is neither callable nor a dict of callables, and `ValueError` for an empty
    dict or a non-str name.
    """

    def __init__(self, environment_factory: EnvironmentFactory | Mapping[str, EnvironmentFactory]):
        self.multi = isinstance(environment_factory, Mapping)
        if self.multi:
            if not environment_factory:
                raise ValueError("environment_factory: the dict of factories is empty")
            for k in environment_factory:
                if not isinstance(k, str):
                    raise ValueError(f"environment_factory: names must be str, got {k!r}")
            factories = dict(environment_factory)
        elif callable(environment_factory):
            factories = {None: environment_factory}
        else:
            raise TypeError(
                "environment_factory must be a callable returning an environment or a dict name -> callable, got "
                f"{type(environment_factory).__name__}"
            )
        self._pool: dict[str | None, list[Any]] = {}
        self.specs: dict[str | None, EnvironmentSpec] = {}
        for name, factory in factories.items():
            if not callable(factory):
                where = "environment_factory" if name is None else f"environment_factory[{name!r}]"
                raise TypeError(f"{where} must be callable, got {type(factory).__name__}")
            instance = factory()
            self.specs[name] = EnvironmentSpec.probe(name, factory, instance)
            self._pool[name] = [instance]  # the probe is not wasted: it seeds the pool

    @property
    def names(self) -> list[str | None]:
        return list(self.specs)

    @property
    def has_reward(self) -> bool:
        return any(s.has_reward for s in self.specs.values())

    def route(self, item: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """(environment name, keyword arguments for `reset`) of a dataset row. With a dict of factories the row
        must have an `environment` column naming one of them; that column is not passed to `reset`."""
        if not isinstance(item, Mapping):
            raise TypeError(f"a dataset item must be a dict (passed to reset(**item)), got {type(item).__name__}")
        if not self.multi:
            return None, dict(item)
        if ENVIRONMENT_COLUMN not in item:
            raise KeyError(
                f"a dict environment_factory needs an {ENVIRONMENT_COLUMN!r} column in every item naming one of "
                f"{sorted(self.specs)}; this item has the columns {sorted(item)}"
            )
        name = item[ENVIRONMENT_COLUMN]
        if name not in self.specs:
            raise ValueError(
                f"item has {ENVIRONMENT_COLUMN}={name!r}, which is not among the environments passed to "
                f"environment_factory. Expected one of: {sorted(self.specs)}"
            )
        return name, {k: v for k, v in item.items() if k != ENVIRONMENT_COLUMN}

    def acquire(self, name: str | None) -> Any:
        """An instance of environment `name` (reused from the pool, else new). Call `reset` before use."""
        pool = self._pool[name]
        env = pool.pop() if pool else self.specs[name].factory()
        if env is None:
            raise TypeError(f"{self.specs[name].label}: the factory returned None")
        return env

    def release(self, name: str | None, env: Any) -> None:
        """Give `env` back to the pool (the next `acquire` resets it)."""
        self._pool[name].append(env)


def replay_log(env: Any, log: Sequence[tuple[str, tuple, dict]], run: Callable[..., Any] | None = None) -> None:
    """Re-apply a branch's recorded environment calls `(method, args, kwargs)` to a freshly built instance, in
    order. `run(fn, *args, **kwargs)` calls each method (default: a plain call; pass `ToolExecutor.call_soon` to
    await async methods). A call that raises is ignored, as it was during the episode (its error went to the model).
    """
    for method, args, kwargs in log:
        fn = getattr(env, method)
        try:
            out = run(fn, *args, **kwargs) if run is not None else fn(*args, **kwargs)
        except Exception:
            continue
        if inspect.isawaitable(out):
            out.close() if hasattr(out, "close") else None
            raise TypeError(f"{type(env).__name__}.{method} is async: pass run=ToolExecutor.call_soon to replay it")
