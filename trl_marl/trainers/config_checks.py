"""What every trainer config checks of its values before anything else (`check_field_values`, called first in
`MultiAgentConfig.__post_init__`, so for every subclass and every field, TrainingArguments' included).

- **Types, against the field's annotation.** A field annotated with booleans or numbers only (`bf16: bool | None`,
  `learning_rate: float`, `agent_learning_rate: list[float] | None`) takes those from Python: a string is refused
  with the value to write instead (`bf16="false"` would be truthy; `learning_rate="1e-3"` would fail later, far from
  the cause). The command line and `--config` YAML files are unaffected: `TrlParser` converts their strings to the
  annotated types before the config is built. A bool is not taken as a number (`num_agents=True`), nor a float as an
  integer (`max_steps=1e3`). Fields whose annotation admits a string (`report_to`, `lr_scheduler_type`) are left to
  their own checks.
- **Finite floats.** Every float (each entry of a list of per-agent values too) must be finite: `inf` and `nan`
  reach the loss as NaN weights or as a zero gradient, never as an error. `INFINITE_ALLOWED` lists the fields where
  `inf` is a meaningful setting.

Each config's ranges (`temperature` in [0.01, 100], `beta > 0`, ...) are its own `_validate_multi_agent`'s;
`check_device` is theirs for a field naming one device (MARLHF's `reward_model_device`), `check_devices` for a list
of them (`agent_devices`, `reference_devices`, `critic_devices`, a comparator's `devices`), `check_mp_only` for a
list read in `parallel_training="mp"` only (`agent_devices`, `critic_devices`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import types
import typing
from typing import Any

__all__ = [
    "INFINITE_ALLOWED",
    "check_device",
    "check_devices",
    "check_field_values",
    "check_mp_only",
    "check_step_intervals",
    "parse_json_field",
]

# Fields where `inf` means something: no clipping threshold that is ever reached / no early termination.
INFINITE_ALLOWED = frozenset({"max_grad_norm", "early_termination_threshold"})

_KINDS = (bool, int, float)
# list-annotated fields that take one value for every agent from Python too
_SCALAR_FOR_LIST = frozenset({"agent_learning_rate"})
_KIND_NAMES = {bool: "True or False", int: "an integer", float: "a number"}


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


@functools.cache
def _checked_fields(cls: type) -> tuple[tuple[str, type, bool, bool], ...]:
    """`(name, kind, a list is accepted, a scalar is accepted)` of each field of `cls` annotated with one of bool /
    int / float (or a list of it) and nothing that admits a string or another type."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 -- an annotation that does not resolve: nothing to check against
        return ()
    out = []
    for f in dataclasses.fields(cls):
        scalars, lists = set(), set()
        for member in _members(hints.get(f.name)):
            if member in _KINDS:
                scalars.add(member)
            elif (
                typing.get_origin(member) is list and typing.get_args(member) and typing.get_args(member)[0] in _KINDS
            ):
                lists.add(typing.get_args(member)[0])
            else:
                break  # admits a string, a dict, an enum...: not this check's
        else:
            kinds = scalars | lists
            kind = float if kinds == {int, float} else (kinds.pop() if len(kinds) == 1 else None)
            if kind is not None:
                out.append((f.name, kind, bool(lists), bool(scalars) or f.name in _SCALAR_FOR_LIST))
    return tuple(out)


def _kind_error(name: str, value: Any, kind: type) -> str | None:
    """Why `value` is not a `kind` (None when it is one)."""
    if kind is bool:
        ok = isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's bool too
    elif isinstance(value, bool):
        ok = False
    elif kind is int:
        ok = isinstance(value, numbers.Integral)
    else:
        ok = isinstance(value, numbers.Real)
    if ok:
        return None
    expected = _KIND_NAMES[kind]
    if isinstance(value, str):
        return (
            f"{name}={value!r} is a string; {name} takes {expected}{_suggestion(value, kind)}. Strings are converted "
            "only on the command line and in --config YAML files, never from Python"
        )
    return f"{name}={value!r} is a {type(value).__name__}; {name} takes {expected}"


def _suggestion(text: str, kind: type) -> str:
    word = text.strip().lower()
    if kind is bool and word in ("true", "false", "yes", "no", "1", "0"):
        return f" (write {word in ('true', 'yes', '1')} without quotes)"
    try:
        number = kind(text) if kind is not bool else None
    except ValueError:
        return ""
    return f" (write {number!r} without quotes)" if number is not None else ""


def check_field_values(config: Any, per_agent: frozenset[str] | set[str] = frozenset()) -> None:
    """Refuse a value of the wrong type for its field's annotation (TypeError), or a non-finite float (ValueError),
    naming the field (and the entry of a list) and what it takes. See the module docstring. The fields in `per_agent`
    (`trl_marl.trainers.per_agent`: annotated with one value, the command line's form) take a list too, checked entry
    by entry; whether the config takes a list for them, and of which length, is `check_per_agent`'s."""
    for name, kind, accepts_list, accepts_scalar in _checked_fields(type(config)):
        value = getattr(config, name)
        if value is None:
            continue
        if isinstance(value, (list, tuple)) and (accepts_list or name in per_agent):
            # a per-agent entry may be None where the field takes None (top_k: no limit for that agent)
            entries = [(f"{name}[{i}]", v) for i, v in enumerate(value) if v is not None or name not in per_agent]
        elif accepts_scalar:
            entries = [(name, value)]
        else:
            raise TypeError(f"{name}={value!r} is a {type(value).__name__}; {name} takes a list of {kind.__name__}")
        for label, v in entries:
            problem = _kind_error(label, v, kind)
            if problem is not None:
                raise TypeError(problem)
            if kind is float and not math.isfinite(v) and not (name in INFINITE_ALLOWED and math.isinf(v)):
                raise ValueError(
                    f"{label}={v} is not a finite number: inf and nan are refused (they train on NaN weights or a "
                    "zero gradient without an error)"
                )


# TrainingArguments' step intervals: (field, the strategy field that reads it, what None means where it is allowed)
_STEP_INTERVALS = (
    ("logging_steps", "logging_strategy", None),
    ("eval_steps", "eval_strategy", "every logging_steps steps, transformers' fallback"),
    ("save_steps", "save_strategy", None),
)


def check_step_intervals(config: Any) -> None:
    """Refuse a `logging_steps` / `eval_steps` / `save_steps` that transformers accepts under its `"steps"` strategy
    but cannot honour (a ValueError naming the field and the allowed values): below 1 it is a fraction of the run's
    training steps, so 0 or a negative value never fires (`save_steps=0` never saved a checkpoint, a negative
    `eval_steps` evaluated at multiples of the run's length only); above 1 it must be a whole number. transformers
    reads `eval_steps=0` as unset: write None for that. Under another strategy the field is not read (as in
    transformers) and not checked."""
    for name, strategy_name, none_means in _STEP_INTERVALS:
        strategy = getattr(config, strategy_name, None)
        if str(getattr(strategy, "value", strategy)) != "steps":
            continue
        value = getattr(config, name)
        if value is None and none_means is not None:
            continue
        if value is not None and (0 < value < 1 or (value >= 1 and value == int(value))):
            continue
        allowed = "an integer >= 1 (every that many training steps) or a float in (0, 1) (that fraction of the run's "
        allowed += "training steps)"
        if none_means is not None:
            allowed += f", or None ({none_means})"
        allowed += f"; or set {strategy_name}='no'"
        if value == 0 and none_means is not None:
            why = f" (transformers reads {name}=0 as unset: write None for that)"
        elif value is not None and value <= 0:
            why = " (transformers takes a value below 1 as a fraction of the run's steps: 0 or less is no interval)"
        else:
            why = ""
        raise ValueError(f"{name}={value!r} with {strategy_name}='steps': {name} must be {allowed}{why}")


def _device_backend(kind: str) -> Any:
    """torch's module of an accelerator type (`torch.cuda`, `torch.xpu`, `torch.mps`, ...): None when torch has none."""
    import torch

    backend = getattr(torch, kind, None)
    return backend if hasattr(backend, "is_available") else None


def _devices_here() -> list[str]:
    """The devices of this machine, as a device field names them."""
    here = ["cpu"]
    for kind in ("cuda", "xpu", "mps"):
        backend = _device_backend(kind)
        if backend is not None and backend.is_available():
            count = backend.device_count() if hasattr(backend, "device_count") else 1
            here += [kind] if kind == "mps" else [f"{kind}:{i}" for i in range(count)]
    return here


def check_device(name: str, value: Any, unset: str = "the trainer's device", *, entry_of: str | None = None) -> None:
    """Refuse a device that this machine does not have (a ValueError naming the field, the value, why, and the
    devices it has): an unknown device type (`"gpu"`), an accelerator torch does not see (`"cuda:0"` on a CPU-only
    machine), or an index past its device count (`"cuda:3"` with 2 GPUs). Otherwise the value is only used after
    the costly phases before it (MARLHF: pair collection and the reward model's fit; the agents' placement after
    they load). None is accepted, except for an entry of the list field `entry_of` (`check_devices`)."""
    if entry_of is not None:
        instead = f"use one of {_devices_here()} (or {entry_of}=None: {unset})"
        if value is None:
            raise ValueError(f"{name}=None is not a device; {instead}")
    elif value is None:
        return
    else:
        instead = f"use None ({unset}) or one of {_devices_here()}"
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"{name}={value!r} is not a device ({err}); {instead}") from None
    if device.type == "cpu":
        return
    backend = _device_backend(device.type)
    if backend is None:
        raise ValueError(f"{name}={value!r}: torch has no {device.type!r} devices to place a model on here; {instead}")
    if not backend.is_available():
        raise ValueError(
            f"{name}={value!r}: this machine has no {device.type} device (torch.{device.type}.is_available() is "
            f"False); {instead}"
        )
    count = backend.device_count() if hasattr(backend, "device_count") else None
    if device.index is not None and count is not None and device.index >= count:
        raise ValueError(f"{name}={value!r}: this machine has {count} {device.type} device(s); {instead}")


def check_devices(name: str, values: Any, unset: str) -> None:
    """`check_device` for each entry of a device-list field (`agent_devices`, `critic_devices`, ...), the entry named
    `name[i]`; None (`unset` says what it means) is accepted. A bare string is refused: it is no list (a list of one
    device places everything there)."""
    if values is None:
        return
    if isinstance(values, str):
        raise ValueError(
            f"{name}={values!r} is a string; {name} takes a list of devices: [{values!r}] for one device for all, or "
            f"one per entry (or {name}=None: {unset})"
        )
    for i, value in enumerate(values):
        check_device(f"{name}[{i}]", value, unset, entry_of=name)


def check_mp_only(name: str, value: Any, parallel_training: str, placed: str) -> None:
    """Refuse a device-list field that only `parallel_training="mp"` reads (`agent_devices`, `critic_devices`) set
    in another mode, where accelerate places the models (`placed` says what it places) and nothing reads the field:
    a ValueError naming the field, `parallel_training="mp"` and the fix. None is accepted."""
    if value is None or parallel_training == "mp":
        return
    raise ValueError(
        f"{name}={value!r} is read in parallel_training='mp' only; with parallel_training={parallel_training!r} "
        f"accelerate places {placed} (one device per process) and nothing reads {name}: set parallel_training='mp' "
        f"to place them on explicit devices, or leave {name} unset"
    )


def parse_json_field(name: str, text: str, expected: str) -> Any:
    """A dict field given as a JSON string (the command line's form, as in TRL): its value, or a ValueError naming
    the field, the parser's complaint and what to write (`expected`), instead of a bare JSONDecodeError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{name}={text!r} is not valid JSON ({err}); write {expected}") from None
