"""Entry-point discovery for the plugin groups: comparators, replay modes and tasks.

A plugin is any object a package registers under one of the groups in its `pyproject.toml`:

    [project.entry-points."trl_marl.replay_modes"]
    my_mode = "my_package.replay:MyReplay"

trl_marl's own built-ins are registered in exactly the same way, in trl_marl's `pyproject.toml`; there is no
special path for them. Discovery goes through `importlib.metadata.entry_points(group=...)` on every call (no
cache: the scan is cheap, and a package installed or put on `sys.path` at run time is seen at once). When
`trl_marl` is imported from a source checkout, its own entry points are read from that checkout's `pyproject.toml`
instead of the installed metadata, which may predate the checkout (an editable install made before a group or a
built-in was added) or belong to another checkout.

Names are exact: no aliases, no case folding.
"""

from __future__ import annotations

import tomllib
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

__all__ = [
    "COMPARATOR_GROUP",
    "REPLAY_GROUP",
    "TASK_GROUP",
    "GROUPS",
    "PluginLoadError",
    "available",
    "load_plugin",
]

COMPARATOR_GROUP = "trl_marl.comparators"
REPLAY_GROUP = "trl_marl.replay_modes"
TASK_GROUP = "trl_marl.tasks"
GROUPS = (COMPARATOR_GROUP, REPLAY_GROUP, TASK_GROUP)

# What a group's plugins are called in error messages.
_KIND = {COMPARATOR_GROUP: "comparator", REPLAY_GROUP: "replay mode", TASK_GROUP: "task"}
_DIST = "trl-marl"


class PluginLoadError(ImportError):
    """A registered plugin was found but could not be imported (or its object does not exist)."""


def _check_group(group: str) -> None:
    if group not in GROUPS:
        raise ValueError(f"Unknown plugin group {group!r}; trl_marl plugin groups are {list(GROUPS)}")


def _source_checkout_entry_points(group: str) -> list[EntryPoint] | None:
    """trl_marl's own entry points of `group` as declared by the source checkout `trl_marl` is imported from, or
    None when it is not imported from one (an installed wheel: its metadata is the truth)."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not pyproject.is_file():
        return None
    project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    if project.get("name") != _DIST:
        return None
    return [EntryPoint(name, value, group) for name, value in project.get("entry-points", {}).get(group, {}).items()]


def _group_entry_points(group: str) -> dict[str, list[EntryPoint]]:
    """All entry points of `group`, by name. Several distributions may register the same name."""
    found: dict[str, list[EntryPoint]] = {}
    eps = list(entry_points(group=group))
    own = _source_checkout_entry_points(group)
    if own is not None:
        eps = [ep for ep in eps if _dist_name(ep).replace("_", "-").lower() != _DIST] + own
    for ep in eps:
        same_name = found.setdefault(ep.name, [])
        if all(other.value != ep.value for other in same_name):  # one package seen twice on sys.path is one plugin
            same_name.append(ep)
    return found


def _dist_name(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return f"{_DIST} (source checkout)" if ep.value.startswith("trl_marl.") else "<unknown distribution>"
    return dist.name


def available(group: str) -> list[str]:
    """The sorted names registered under `group` (one of `GROUPS`), by every installed distribution."""
    _check_group(group)
    return sorted(_group_entry_points(group))


def load_plugin(group: str, name: str) -> Any:
    """Import and return the object registered as `name` in `group` (usually a class).

    Raises:
        ValueError: `group` is not a trl_marl plugin group; `name` is not registered (the message lists the
            registered names); or two different objects are registered under `name`.
        PluginLoadError: the entry point exists but importing it failed. The message names the entry point, its
            value (`module:attr`), the distribution that registered it and the original error, which is also
            chained as `__cause__`.
    """
    _check_group(group)
    registered = _group_entry_points(group)
    kind = _KIND[group]
    if name not in registered:
        names = ", ".join(repr(n) for n in sorted(registered)) or "none"
        raise ValueError(
            f"Unknown {kind} {name!r}. Registered in entry-point group {group!r}: {names}. "
            f'A third-party {kind} must be installed from a package that declares it under [project.entry-points."{group}"].'
        )
    candidates = registered[name]
    if len(candidates) > 1:
        where = "; ".join(f"{ep.value!r} from {_dist_name(ep)!r}" for ep in candidates)
        raise ValueError(f"The {kind} name {name!r} is registered more than once in {group!r}: {where}")
    ep = candidates[0]
    try:
        return ep.load()
    except Exception as exc:
        raise PluginLoadError(
            f"Could not load the {kind} {name!r} (entry point {ep.name} = {ep.value!r} in group {group!r}, "
            f"registered by {_dist_name(ep)!r}): {type(exc).__name__}: {exc}"
        ) from exc
