"""Built-in tasks: datasets shipped with the project, per-agent formatters and a joint reward.

`load_task(name, **options)` returns a `Task`; the recipes expose it as `--task NAME`.
"""

from __future__ import annotations

from collections.abc import Callable

from trl_marl.tasks.base import Task

__all__ = ["Task", "TASKS", "load_task"]


def _length_ratio(**kw) -> Task:
    from trl_marl.tasks.toy import length_ratio_task

    return length_ratio_task(**kw)


def _coordination(**kw) -> Task:
    from trl_marl.tasks.toy import coordination_task

    return coordination_task(**kw)


def _code(**kw) -> Task:
    from trl_marl.tasks.code import code_task

    return code_task(**kw)


def _writing(**kw) -> Task:
    from trl_marl.tasks.writing import writing_task

    return writing_task(**kw)


# name -> factory. Factories import lazily so that `import trl_marl.tasks` stays cheap.
TASKS: dict[str, Callable[..., Task]] = {
    "length_ratio": _length_ratio,
    "coordination": _coordination,
    "code": _code,
    "writing": _writing,
}


def load_task(name: str, **options) -> Task:
    """Build the built-in task `name` (see `TASKS`) with its options."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; built-in tasks: {sorted(TASKS)}")
    return TASKS[name](**options)
