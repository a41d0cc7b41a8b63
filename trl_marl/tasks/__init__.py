"""Tasks: datasets, per-agent formatters and a joint reward (`Task`), found by name through entry points.

`load_task(name, **options)` builds the task registered as `name` in the `trl_marl.tasks` entry-point group; the
recipes expose it as `--task NAME`. trl_marl registers its built-ins (`length_ratio`, `coordination`, `code`,
`writing`) in its own `pyproject.toml` exactly as another package adds a task, without editing trl_marl:

    [project.entry-points."trl_marl.tasks"]
    my_task = "my_package.tasks:my_task"      # a callable(**options) -> trl_marl.tasks.Task

Discovery is `trl_marl.plugins.registry`'s (a package installed at run time is seen at once; names are exact).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from trl_marl.plugins.registry import TASK_GROUP, available, load_plugin
from trl_marl.tasks.base import Task

__all__ = ["Task", "TASKS", "TASK_GROUP", "load_task"]


class _RegisteredTasks(Mapping[str, Callable[..., Task]]):
    """The registered task factories by name: a live, read-only view of the `trl_marl.tasks` entry points. A factory
    is imported when it is looked up, so listing the names stays cheap."""

    def __getitem__(self, name: str) -> Callable[..., Task]:
        if name not in self:
            raise KeyError(f"unknown task {name!r}; registered tasks: {', '.join(self)}")
        return load_plugin(TASK_GROUP, name)

    def __contains__(self, name: object) -> bool:
        return name in available(TASK_GROUP)

    def __iter__(self) -> Iterator[str]:
        return iter(available(TASK_GROUP))

    def __len__(self) -> int:
        return len(available(TASK_GROUP))

    def __repr__(self) -> str:
        return f"TASKS({', '.join(self)})"


TASKS: Mapping[str, Callable[..., Task]] = _RegisteredTasks()


def load_task(name: str, **options) -> Task:
    """Build the task registered as `name` (see `TASKS`), with `options` as the factory's keyword arguments.

    Raises:
        ValueError: no task is registered as `name` (the message lists the registered ones).
        trl_marl.plugins.PluginLoadError: the task's entry point is registered but its import failed.
        TypeError: the factory returned something other than a `Task`.
    """
    task = load_plugin(TASK_GROUP, name)(**options)
    if not isinstance(task, Task):
        raise TypeError(
            f"the task factory registered as {name!r} returned a {type(task).__name__}; it must return a "
            "trl_marl.tasks.Task"
        )
    return task
