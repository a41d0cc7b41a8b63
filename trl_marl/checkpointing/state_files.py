"""Reading back the files trainers wrote (round files, iterative state, critic folders) with errors that name the
file, say what is wrong and what to do -- never a bare `JSONDecodeError`, `KeyError` or `IndexError`."""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["CorruptedStateError", "read_json_state", "require"]


class CorruptedStateError(ValueError):
    """A file written by a trainer is missing, truncated or inconsistent."""

    def __init__(self, path: str, problem: str, fix: str):
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"{path}: {problem}; {fix}")


def read_json_state(path: str, fix: str, kind: type = dict) -> Any:
    """The JSON content of `path`, which must be a `kind` (a clear `CorruptedStateError` otherwise; `fix` says
    what to do about it)."""
    if not os.path.isfile(path):
        raise CorruptedStateError(path, "the file is missing", fix)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        data = json.loads(text)
    except UnicodeDecodeError as exc:
        raise CorruptedStateError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})", fix) from exc
    except json.JSONDecodeError as exc:
        what = "truncated" if not text.rstrip().endswith(("}", "]")) else "not valid JSON"
        raise CorruptedStateError(path, f"{what} ({exc.msg} at line {exc.lineno}, column {exc.colno})", fix) from exc
    if not isinstance(data, kind):
        raise CorruptedStateError(path, f"expected a JSON {kind.__name__}, found {type(data).__name__}", fix)
    return data


def require(data: dict, key: str, kind: type | tuple[type, ...], path: str, fix: str) -> Any:
    """`data[key]`, checked to be a `kind`."""
    if key not in data:
        raise CorruptedStateError(path, f"the field {key!r} is missing", fix)
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise CorruptedStateError(path, f"the field {key!r} should be a {names}, found {value!r:.80}", fix)
    return value
