"""The reward-function calling convention, reward processors, and validation of what rewards return.

A reward function scores JOINT actions, all of a rollout step's joint actions in ONE call. Its signature decides how
it is called (the convention users of the reference library expect), with n the number of agents:

| signature | call |
|---|---|
| n positional parameters (or `*args`) | `f(completions_agent_1, ..., completions_agent_n)` |
| n + 1 positional parameters | `f(prompts, completions_agent_1, ..., completions_agent_n)` |
| 1 positional parameter (n > 1) | `f([completions_agent_1, ..., completions_agent_n])` |

Each `completions_agent_i` is a list of strings with one element per joint action. `prompts` holds the task prompt
of each joint action (the item's `"prompt"` field, or agent 1's prompt when the item has none). Keyword arguments
`batch_items=` (the dataset row of each joint action) and `prompts=` are passed when the function accepts them (by
name or through `**kwargs`).

It returns one float per joint action (the shared team reward) or, where a trainer supports it, one list of n floats
per joint action (per-agent rewards). NaN, inf or a wrong length is an error naming the function and the index.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["RewardFunction", "scale", "shift", "clip", "compose", "RewardProcessors"]


def _name(func: Callable) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__


class RewardFunction:
    """Wraps a user reward function: resolves its signature once, calls it batched, validates what it returns.

    Args:
        func: the user's reward function.
        num_agents: team size n.
        processor: optional `float -> float` applied to every reward (see `scale`, `shift`, `compose`).
        allow_per_agent: accept one list of n floats per joint action (actor-critic trainers).
    """

    def __init__(
        self,
        func: Callable[..., Any],
        num_agents: int,
        processor: Callable[[float], float] | None = None,
        allow_per_agent: bool = False,
    ):
        if not callable(func):
            raise TypeError(f"reward_func must be callable, got {type(func).__name__}")
        if processor is not None and not callable(processor):
            raise TypeError(f"reward_processor must be callable (float -> float), got {type(processor).__name__}")
        self.func = func
        self.name = _name(func)
        self.num_agents = num_agents
        self.processor = processor
        self.allow_per_agent = allow_per_agent
        self._mode, self._pass_batch_items, self._pass_prompts = self._resolve_signature()

    def _resolve_signature(self) -> tuple[str, bool, bool]:
        n = self.num_agents
        try:
            sig = inspect.signature(self.func)
        except (TypeError, ValueError):  # builtins, some C callables: assume the plain form
            return "per_agent_args", False, False
        params = list(sig.parameters.values())
        positional = [
            p
            for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name != "batch_items"
            and p.default is p.empty
        ]
        has_varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
        has_varkw = any(p.kind == p.VAR_KEYWORD for p in params)
        names = {p.name for p in params}
        pass_batch_items = "batch_items" in names or has_varkw
        k = len(positional)
        if has_varargs and k == 0 or k == n:
            mode = "per_agent_args"
        elif k == n + 1:
            mode = "prompts_then_agents"
        elif k == 1 and n > 1:
            mode = "nested_list"
        else:
            forms = [f"{n} (one list of completions per agent)", f"{n + 1} (prompts, then one list per agent)"]
            if n > 1:
                forms.append("1 (a list of the per-agent lists)")
            raise TypeError(
                f"reward function {self.name!r} takes {k} required positional argument(s); with num_agents={n} it "
                f"must take {' or '.join(forms)}. Keyword arguments batch_items= and prompts= are passed when accepted."
            )
        pass_prompts = mode != "prompts_then_agents" and ("prompts" in names or has_varkw)
        return mode, pass_batch_items, pass_prompts

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
        kwargs: dict[str, Any] = {}
        if self._pass_batch_items and batch_items is not None:
            kwargs["batch_items"] = list(batch_items)
        if self._pass_prompts:
            kwargs["prompts"] = prompts
        if self._mode == "per_agent_args":
            out = self.func(*lists, **kwargs)
        elif self._mode == "prompts_then_agents":
            out = self.func(prompts, *lists, **kwargs)
        else:
            out = self.func(lists, **kwargs)
        return self._validate(out, num_joint)

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
        """Apply the reward processor to every element and re-validate."""
        if self.processor is None:
            return raw
        flat = [float(self.processor(float(v))) for v in raw.flatten().tolist()]
        for idx, v in enumerate(flat):
            if not math.isfinite(v):
                raise ValueError(
                    f"reward_processor turned the reward of {self.name!r} at index {idx} into {v}; rewards must be "
                    "finite"
                )
        return torch.tensor(flat, dtype=torch.float32).reshape(raw.shape)

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
        return v


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
