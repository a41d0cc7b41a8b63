"""The reward-function calling conventions, TRL's reward functions on a team, reward processors, and validation of
what rewards return.

A reward function scores JOINT actions, all of a rollout step's joint actions in ONE call. n is the number of
agents, J the number of joint actions.

**Keyword convention (TRL's, recommended).** A function that takes `agent_completions`, or is marked with
`@team_reward`, is called with keywords, as TRL calls its reward functions:

    f(prompts=[...J], completions=[[...J] per agent], agent_completions=[[...n] per joint action],
      batch_items=[row per joint action], **dataset_columns)  ->  list of J floats

`completions[i][j]` is agent i's completion in joint action j; `agent_completions[j]` is joint action j's
completion of each agent; every dataset column `c` is passed as `c=[value per joint action]` (TRL's convention).
Only the keywords the function accepts are passed (all of them with `**kwargs`).

**Positional convention (the reference library's), kept where it is unambiguous:**

| signature | call |
|---|---|
| n positional parameters (or `*args`) | `f(completions_agent_1, ..., completions_agent_n)` |
| n + 1 positional parameters | `f(prompts, completions_agent_1, ..., completions_agent_n)` |
| 1 positional parameter (n > 1) | `f([completions_agent_1, ..., completions_agent_n])` (= `completions` above) |

with `batch_items=` and `prompts=` passed by keyword when accepted. A signature that could mean two things is
refused with the accepted forms: a TRL-style `f(completions, solution, **kwargs)` on a team of 2 would otherwise
get agent 2's completions as `solution`. TRL's per-completion reward functions (`trl.rewards.*`,
`f(completions, **columns)`) are lifted to the team with `lift(func)` (each agent's completions, combined) or
`lift(func, agent=i)` (one agent's).

It returns one float per joint action (the shared team reward) or, where a trainer supports it, one tuple of n floats
per joint action (per-agent rewards, `[(r_agent_1, ..., r_agent_n), ...]`, e.g. `list(zip(r1, r2))`). A list of lists
(or a 2-D array) is read the same way when it cannot be read transposed; with as many joint actions as agents it can,
and only tuples are taken. NaN, inf, a reward beyond +-1e15 (`MAX_ABS_REWARD`) or a wrong length is an error naming
the function and the index. An exception the function itself raises is passed on as a `RewardFunctionError` naming
the function (the original is its `__cause__`); a trainer saves a checkpoint at the step boundary first. A signature is never guessed: `f(a, b)` on a team of one is refused (it could be
`f(prompts, completions)` or a 2-agent reward); the prompts-first form names its first parameter `prompts`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "RewardFunction",
    "RewardFunctionError",
    "apply_processor",
    "team_reward",
    "is_team_reward",
    "lift",
    "weighted_sum",
    "scale",
    "shift",
    "clip",
    "compose",
    "RewardProcessors",
]

# The largest |reward| accepted: advantages square rewards in float32 (largest value 3.4e38), summed over a batch.
MAX_ABS_REWARD = 1e15
# the keywords of the keyword convention (besides the dataset columns)
KEYWORD_ARGS = ("prompts", "completions", "agent_completions", "batch_items")
_TEAM_MARK = "_trl_marl_team_reward"


class RewardFunctionError(RuntimeError):
    """A reward function raised: the message names it and what it was called on; `__cause__` is its exception.
    A trainer writes the checkpoint of the last optimizer step before passing it on (`trl_marl.trainers.checkpoints`),
    so a run resumes after the function is fixed."""

    def __init__(self, name: str, num_joint: int, error: BaseException):
        self.reward_name, self.error = name, error
        super().__init__(
            f"reward function {name!r} raised {type(error).__name__} on {num_joint} joint action(s): {error}"
        )


def _not_a_model_id(value: Any) -> str:
    """For a string where a reward function belongs: TRL's GRPOTrainer loads a reward model from a model id there."""
    if not isinstance(value, str):
        return ""
    return (
        f" ({value!r}: TRL's GRPOTrainer loads a sequence-classification reward model from a model id here; a team's "
        "learned reward model is MARLHF's, MARLHFConfig(reward_model_path=...), or call your classifier inside a "
        "reward function)"
    )


def _accepted_forms(n: int) -> str:
    forms = [
        "f(*, prompts, completions, agent_completions, **dataset_columns) - TRL's keyword convention: take "
        "agent_completions or mark the function with @trl_marl.rewards.team_reward",
        f"f(completions_agent_1, ..., completions_agent_{n}) - one positional list per agent",
        f"f(prompts, completions_agent_1, ..., completions_agent_{n})",
    ]
    if n > 1:
        forms.append("f(completions) - one positional parameter: the list of the per-agent lists")
    forms.append(
        "a TRL per-completion reward f(completions, **columns) (e.g. trl.rewards.*) lifted to the team: "
        "trl_marl.rewards.lift(f) (each agent's completions, averaged) or lift(f, agent=i)"
    )
    return "accepted forms:" + "".join(f"\n  - {form}" for form in forms)


def team_reward(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark `func` as a team reward in the keyword convention (`completions` = one list per agent)."""
    setattr(func, _TEAM_MARK, True)
    return func


def _is_trl_per_completion(func: Callable) -> bool:
    module = getattr(func, "__module__", "") or ""
    return module == "trl.rewards" or module.startswith("trl.rewards.")


def is_team_reward(func: Callable[..., Any], num_agents: int) -> bool:
    """Whether `func` is a team reward in one of trl_marl's conventions (True) or a per-completion reward to `lift`
    (False: TRL's functions, and TRL-style `f(completions, **columns)` signatures)."""
    if getattr(func, _TEAM_MARK, False):
        return True
    if _is_trl_per_completion(func):
        return False
    try:
        RewardFunction(func, num_agents)
    except TypeError:
        return False
    return True


def _name(func: Callable) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__


class RewardFunction:
    """Wraps a user reward function: resolves its signature once, calls it batched, validates what it returns.

    Args:
        func: the user's reward function, or a `weighted_sum` of several.
        num_agents: team size n.
        processor: optional `float -> float` applied to every reward (see `scale`, `shift`, `compose`).
        allow_per_agent: accept one tuple of n floats per joint action (actor-critic trainers; see the module
            docstring for lists of lists).
        column_names: the dataset's columns, when known: a positional parameter named like a column is refused
            (it would receive an agent's completions), and a required keyword must be a column.

    After each call, `last_components` maps each component's name to its raw rewards (one entry for a single
    function; one per function of a `weighted_sum`), for the `rewards/<name>/mean` metrics.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        num_agents: int,
        processor: Callable[[float], float] | None = None,
        allow_per_agent: bool = False,
        column_names: Sequence[str] | None = None,
    ):
        if not callable(func):
            raise TypeError(f"reward_funcs must be callable, got {type(func).__name__}" + _not_a_model_id(func))
        if processor is not None and not callable(processor):
            raise TypeError(f"reward_processor must be callable (float -> float), got {type(processor).__name__}")
        self.func = func
        self.name = _name(func)
        self.num_agents = num_agents
        self.processor = processor
        self.allow_per_agent = allow_per_agent
        self.column_names = None if column_names is None else list(column_names)
        self.last_components: dict[str, torch.Tensor] = {}
        self._component_sums: dict[str, list[float]] = {}  # name -> [sum, count] since the last drain
        self._parts: list[tuple[str, float, RewardFunction]] | None = None
        if isinstance(func, WeightedReward):
            names = _unique_names([_name(f) for f in func.funcs])
            self._parts = [
                (nm, w, RewardFunction(f, num_agents, None, allow_per_agent, column_names))
                for nm, w, f in zip(names, func.weights, func.funcs)
            ]
            self._mode, self._pass_batch_items, self._pass_prompts = "weighted", False, False
            return
        self._mode, self._pass_batch_items, self._pass_prompts = self._resolve_signature()

    def _refuse(self, why: str) -> TypeError:
        return TypeError(f"reward function {self.name!r}: {why}.\n{_accepted_forms(self.num_agents)}")

    def _resolve_signature(self) -> tuple[str, bool, bool]:
        n = self.num_agents
        try:
            sig = inspect.signature(self.func)
        except (TypeError, ValueError):  # builtins, some C callables: assume the plain form
            return "per_agent_args", False, False
        params = list(sig.parameters.values())
        names = {p.name for p in params}
        has_varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
        has_varkw = any(p.kind == p.VAR_KEYWORD for p in params)
        if getattr(self.func, _TEAM_MARK, False) or "agent_completions" in names:
            self._keyword_params = params
            self._check_keyword_requirements(params)
            return "keywords", False, False
        if _is_trl_per_completion(self.func):
            raise self._refuse(
                "is one of TRL's per-completion rewards (one completion per call site, not a team); lift it to the "
                "team with trl_marl.rewards.lift(f)"
            )
        positional = [
            p
            for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name != "batch_items"
            and p.default is p.empty
        ]
        k = len(positional)
        named = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if (
            n > 1
            and "completions" in named
            and not (k == 1 and positional[0].name == "completions" and not has_varkw and not has_varargs)
        ):
            raise self._refuse(
                f"takes a parameter named 'completions' in a TRL-style signature {sig}; with num_agents={n} it is "
                "ambiguous (per-completion or per-team?)"
            )
        columns = set(self.column_names or ())
        clash = [p.name for p in positional if p.name in columns or p.name in ("agent_completions",)]
        if clash:
            raise self._refuse(
                f"positional parameter(s) {clash} are named like dataset columns but the positional convention "
                "would fill them with completions"
            )
        pass_batch_items = "batch_items" in names or has_varkw
        if has_varargs and k == 0 or k == n:
            mode = "per_agent_args"
        elif k == n + 1:
            if positional[0].name not in ("prompts", "prompt"):
                # f(a, b) on a team of 1 could be (prompts, completions) or a 2-agent reward given a team of 1
                raise self._refuse(
                    f"takes {k} positional arguments with num_agents={n}: that is the prompts-first form only when the "
                    f"first one is named 'prompts' (f(prompts, completions_agent_1, ...)); if it scores {k} agents, "
                    f"set num_agents={k}"
                )
            mode = "prompts_then_agents"
        elif k == 1 and n > 1:
            mode = "nested_list"
        else:
            raise self._refuse(f"takes {k} required positional argument(s), which fits no form for num_agents={n}")
        pass_prompts = mode != "prompts_then_agents" and ("prompts" in names or has_varkw)
        return mode, pass_batch_items, pass_prompts

    def _check_keyword_requirements(self, params: list) -> None:
        if self.column_names is None:
            return
        known = set(KEYWORD_ARGS) | set(self.column_names)
        missing = [
            p.name
            for p in params
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty and p.name not in known
        ]
        if missing:
            raise self._refuse(
                f"requires {missing}, which is neither a keyword of the convention {list(KEYWORD_ARGS)} nor a dataset "
                f"column {sorted(self.column_names)}"
            )

    def _keyword_arguments(
        self, lists: list[list], prompts: list, batch_items: Sequence[dict] | None
    ) -> dict[str, Any]:
        """The keywords the function is called with in the keyword convention (those it accepts)."""
        rows = list(batch_items) if batch_items is not None else []
        available: dict[str, Any] = {}
        if rows and isinstance(rows[0], dict):
            for key in rows[0]:
                if key not in KEYWORD_ARGS:
                    available[key] = [row.get(key) for row in rows]
        available.update(
            prompts=prompts,
            completions=lists,
            agent_completions=[list(joint) for joint in zip(*lists)],
            batch_items=rows,
        )
        params = self._keyword_params
        if any(p.kind == p.VAR_KEYWORD for p in params):
            kwargs = available
        else:
            accepted = {p.name for p in params if p.kind != p.VAR_POSITIONAL}
            kwargs = {k: v for k, v in available.items() if k in accepted}
        missing = [
            p.name
            for p in params
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty and p.name not in kwargs
        ]
        if missing:
            raise self._refuse(
                f"requires {missing}, which this batch does not provide (keywords: {sorted(available)})"
            )
        return kwargs

    def raw(
        self,
        completions_per_agent: Sequence[Sequence[str]],
        prompts: Sequence[str] | None = None,
        batch_items: Sequence[dict] | None = None,
    ) -> torch.Tensor:
        """Call the function once for all joint actions; return validated rewards BEFORE the processor.

        Returns a float tensor `(J,)`, or `(J, n)` for per-agent rewards.
        """
        if len(completions_per_agent) != self.num_agents:
            raise ValueError(f"expected completions for {self.num_agents} agents, got {len(completions_per_agent)}")
        num_joint = len(completions_per_agent[0])
        lists = [list(c) for c in completions_per_agent]
        prompts = list(prompts) if prompts is not None else [""] * num_joint
        if self._mode == "weighted":
            total = None
            self.last_components = {}
            for name, weight, part in self._parts:
                values = part.raw(lists, prompts, batch_items)
                self.last_components[name] = values
                total = weight * values if total is None else total + weight * values
                if total.shape != values.shape:
                    raise ValueError(f"reward function {name!r} returned a different shape than the others")
            self._accumulate()
            return total
        kwargs: dict[str, Any] = {}
        if self._pass_batch_items and batch_items is not None:
            kwargs["batch_items"] = list(batch_items)
        if self._pass_prompts:
            kwargs["prompts"] = prompts
        if self._mode == "keywords":
            kwargs = self._keyword_arguments(lists, prompts, batch_items)
        try:
            if self._mode == "keywords":
                out = self.func(**kwargs)
            elif self._mode == "per_agent_args":
                out = self.func(*lists, **kwargs)
            elif self._mode == "prompts_then_agents":
                out = self.func(prompts, *lists, **kwargs)
            else:
                out = self.func(lists, **kwargs)
        except RewardFunctionError:
            raise  # a reward that calls another: named where it was raised
        except Exception as exc:
            raise RewardFunctionError(self.name, num_joint, exc) from exc
        values = self._validate(out, num_joint)
        self.last_components = {self.name: values}
        self._accumulate()
        return values

    def _accumulate(self) -> None:
        for name, values in self.last_components.items():
            acc = self._component_sums.setdefault(name, [0.0, 0.0])
            acc[0] += float(values.float().sum())
            acc[1] += values.numel()

    def drain_component_means(self) -> dict[str, float]:
        """Each component's mean raw reward since the last drain (TRL's `rewards/<name>/mean`); resets the sums."""
        out = {name: total / count for name, (total, count) in self._component_sums.items() if count}
        self._component_sums = {}
        return out

    def __call__(
        self,
        completions_per_agent: Sequence[Sequence[str]],
        prompts: Sequence[str] | None = None,
        batch_items: Sequence[dict] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return `(processed, raw)` reward tensors for all joint actions (see `raw`)."""
        raw = self.raw(completions_per_agent, prompts, batch_items)
        return self.process(raw), raw

    def process(self, raw: torch.Tensor) -> torch.Tensor:
        """Apply the reward processor to every element and re-validate (`apply_processor`)."""
        return apply_processor(self.processor, raw, self.name)

    def _validate(self, out: Any, num_joint: int) -> torch.Tensor:
        if isinstance(out, torch.Tensor):
            out = out.detach().cpu().tolist()
        elif hasattr(out, "tolist"):  # numpy
            out = out.tolist()
        if isinstance(out, (int, float)):
            raise TypeError(
                f"reward function {self.name!r} returned a single number ({out!r}) for {num_joint} joint action(s); "
                "it must return a list with one reward per joint action"
            )
        if not isinstance(out, (list, tuple)):
            raise TypeError(
                f"reward function {self.name!r} must return a list of floats (one per joint action), got "
                f"{type(out).__name__}"
            )
        rows = [r for r in out if isinstance(r, (list, tuple))]
        n = self.num_agents
        # n lists of J (one per AGENT) where the form is J rows of n (one per joint action); when J == n >= 2 a list
        # of lists reads both ways: only tuples (a tuple is one joint action's rewards) are taken then
        per_agent_columns = rows and len(rows) == len(out) == n and all(len(r) == num_joint for r in rows)
        if (
            self.allow_per_agent
            and per_agent_columns
            and (len(out) != num_joint or (n >= 2 and not all(isinstance(r, tuple) for r in out)))
        ):
            raise ValueError(
                f"reward function {self.name!r} returned {len(out)} lists of {num_joint}: per-agent rewards are "
                f"one tuple of {self.num_agents} floats per joint action, [(r_agent_1, ..., r_agent_"
                f"{self.num_agents}), ...]"
                + (
                    f"; with {num_joint} joint actions and {self.num_agents} agents a list of lists reads both "
                    "ways, so only tuples are taken (a tuple is one joint action's rewards)"
                    if len(out) == num_joint
                    else " (this looks transposed: one list per agent)"
                )
            )
        if len(out) != num_joint:
            raise ValueError(
                f"reward function {self.name!r} returned {len(out)} rewards for {num_joint} joint actions; it must "
                "return exactly one reward per joint action"
            )
        per_agent = num_joint > 0 and isinstance(out[0], (list, tuple))
        if per_agent and not self.allow_per_agent:
            raise ValueError(
                f"reward function {self.name!r} returned a list per joint action (per-agent rewards) at index 0; "
                "this trainer needs one shared float per joint action"
            )
        values: list = []
        for j, r in enumerate(out):
            if per_agent:
                if not isinstance(r, (list, tuple)) or len(r) != self.num_agents:
                    raise ValueError(
                        f"reward function {self.name!r} returned {r!r} at index {j}; per-agent rewards need "
                        f"{self.num_agents} floats per joint action"
                    )
                row = [self._finite(v, j) for v in r]
                values.append(row)
            else:
                values.append(self._finite(r, j))
        return torch.tensor(values, dtype=torch.float32)

    def _finite(self, value: Any, index: int) -> float:
        if isinstance(value, (str, bytes)):  # float("1.0") would accept it silently
            raise TypeError(
                f"reward function {self.name!r} returned the string {value!r} at index {index}; rewards must be "
                "numbers (convert with float() inside the reward function if that is what you mean)"
            )
        if value is None:  # TRL's "does not apply": NaN, left out of its nansum over the reward functions
            raise TypeError(
                f"reward function {self.name!r} returned None at index {index}; rewards must be numbers (TRL reads "
                "None as 'this function does not apply' and leaves it out of its weighted sum, which adds 0 for it: "
                "return 0.0 there for the same sum)"
            )
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"reward function {self.name!r} returned {value!r} at index {index}; rewards must be numbers"
            ) from None
        if not math.isfinite(v):
            raise ValueError(
                f"reward function {self.name!r} returned {v} at index {index}; rewards must be finite (NaN and inf "
                "are never replaced silently)"
            )
        if abs(v) > MAX_ABS_REWARD:
            raise ValueError(
                f"reward function {self.name!r} returned {v:g} at index {index}; rewards must lie within "
                f"+-{MAX_ABS_REWARD:g} (the advantage math squares them in float32, whose largest value is 3.4e38: "
                "scale the reward down, e.g. with reward_processor=trl_marl.rewards.scale(...))"
            )
        return v


def apply_processor(processor: Callable[[float], float] | None, raw: torch.Tensor, name: str) -> torch.Tensor:
    """`processor` applied to every element of `raw` (unchanged without one); a non-finite or too large result is
    an error naming the reward `name` and the index."""
    if processor is None:
        return raw
    flat = [float(processor(float(v))) for v in raw.flatten().tolist()]
    for idx, v in enumerate(flat):
        if not math.isfinite(v) or abs(v) > MAX_ABS_REWARD:
            raise ValueError(
                f"reward_processor turned the reward of {name!r} at index {idx} into {v:g}; rewards must be "
                f"finite and within +-{MAX_ABS_REWARD:g}"
            )
    return torch.tensor(flat, dtype=torch.float32).reshape(raw.shape)


def _unique_names(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for nm in names:
        seen[nm] = seen.get(nm, 0) + 1
        out.append(nm if seen[nm] == 1 else f"{nm}_{seen[nm]}")
    return out


class WeightedReward:
    """Several reward functions summed with weights (`weighted_sum`); each may use any convention."""

    def __init__(self, funcs: Sequence[Callable[..., Any]], weights: Sequence[float] | None = None):
        funcs = list(funcs)
        if not funcs:
            raise ValueError("reward_funcs is an empty list")
        for f in funcs:
            if not callable(f):
                raise TypeError(f"every reward function must be callable, got {type(f).__name__}" + _not_a_model_id(f))
        if weights is None:
            weights = [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError(f"reward_weights has {len(weights)} entries for {len(funcs)} reward functions")
        self.funcs, self.weights = funcs, [float(w) for w in weights]
        self.__qualname__ = "weighted_sum(" + ", ".join(_name(f) for f in funcs) + ")"

    def __call__(self, *args, **kwargs):  # called through RewardFunction, which calls each part itself
        raise TypeError("a weighted_sum is evaluated by trl_marl.rewards.RewardFunction")


def weighted_sum(funcs: Sequence[Callable[..., Any]], weights: Sequence[float] | None = None) -> WeightedReward:
    """The team reward `sum_k w_k f_k` (TRL's `reward_funcs` + `reward_weights`); each `f_k` is logged as
    `rewards/<name>/mean`."""
    return WeightedReward(funcs, weights)


_COMBINE = {
    "mean": lambda values: sum(values) / len(values),
    "sum": sum,
    "min": min,
    "max": max,
}


def lift(
    func: Callable[..., Any],
    agent: int | None = None,
    combine: str | Callable[[list[float]], float] = "mean",
    conversational: bool | None = None,
) -> Callable[..., list[float]]:
    """Lift a per-completion reward (TRL's `f(completions, **dataset_columns) -> list[float]`, e.g. `trl.rewards.*`)
    to a team reward.

    Args:
        func: the per-completion reward.
        agent: score only this agent's completions (0-based); `None`: score every agent's and `combine` them.
        combine: `"mean"`, `"sum"`, `"min"`, `"max"` or a callable on the agents' rewards of one joint action.
        conversational: pass each completion as TRL's conversational form `[{"role": "assistant", "content": text}]`
            (what `trl.rewards` expects); `None`: only for functions from `trl.rewards`.

    The lifted function follows the keyword convention: it gets `prompts` and the dataset columns and passes them on.
    """
    if combine not in _COMBINE and not callable(combine):
        raise ValueError(f"combine must be one of {list(_COMBINE)} or a callable, got {combine!r}")
    if agent is not None and agent < 0:
        raise ValueError(f"agent must be >= 0, got {agent}")
    reduce = _COMBINE[combine] if isinstance(combine, str) else combine
    chat = _is_trl_per_completion(func) if conversational is None else conversational
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        params = []
    varkw = not params or any(p.kind == p.VAR_KEYWORD for p in params)
    accepted = {p.name for p in params}
    if params and "completions" not in accepted and not any(p.kind == p.VAR_POSITIONAL for p in params):
        raise TypeError(
            f"lift: {_name(func)!r} has no 'completions' parameter; TRL's form is f(completions, **kwargs)"
        )

    def lifted(*, prompts, completions, **columns):
        n = len(completions)
        if agent is not None and agent >= n:
            raise ValueError(f"lift(agent={agent}) but the team has {n} agents")
        scored = []
        for i in range(n) if agent is None else [agent]:
            comps = [[{"role": "assistant", "content": c}] for c in completions[i]] if chat else list(completions[i])
            kwargs = {"prompts": prompts, **{k: v for k, v in columns.items() if k not in ("agent_completions",)}}
            if not varkw:
                kwargs = {k: v for k, v in kwargs.items() if k in accepted}
            out = func(completions=comps, **kwargs)
            out = out.tolist() if hasattr(out, "tolist") else list(out)
            if len(out) != len(comps):
                raise ValueError(f"{_name(func)!r} returned {len(out)} rewards for {len(comps)} completions")
            scored.append([float("nan") if v is None else float(v) for v in out])
        return [float(reduce(list(values))) for values in zip(*scored)]

    lifted.__name__ = lifted.__qualname__ = _name(func) if agent is None else f"{_name(func)}/agent_{agent}"
    setattr(lifted, _TEAM_MARK, True)
    lifted.lifted_from = func
    return lifted


def scale(factor: float) -> Callable[[float], float]:
    """Reward processor `r -> factor * r`."""

    def _scale(r: float) -> float:
        return factor * r

    _scale.__qualname__ = f"scale({factor})"
    return _scale


def shift(value: float) -> Callable[[float], float]:
    """Reward processor `r -> r + value`."""

    def _shift(r: float) -> float:
        return r + value

    _shift.__qualname__ = f"shift({value})"
    return _shift


def clip(low: float, high: float) -> Callable[[float], float]:
    """Reward processor `r -> min(max(r, low), high)`."""

    def _clip(r: float) -> float:
        return min(max(r, low), high)

    _clip.__qualname__ = f"clip({low}, {high})"
    return _clip


def compose(*processors: Callable[[float], float]) -> Callable[[float], float]:
    """Apply processors left to right: `compose(scale(2), shift(-1))(r) == 2 * r - 1`."""

    def _composed(r: float) -> float:
        for p in processors:
            r = p(r)
        return r

    _composed.__qualname__ = "compose(" + ", ".join(_name(p) for p in processors) + ")"
    return _composed


class RewardProcessors:
    """The reference library's names for the processors: `RewardProcessors.scale(f)`, `.shift(v)`."""

    scale = staticmethod(scale)
    shift = staticmethod(shift)
    clip = staticmethod(clip)
    compose = staticmethod(compose)
