"""Entry-point discovery for the two plugin groups: comparators and replay modes.

A plugin is any object a package registers under one of the groups in its `pyproject.toml`:

    [project.entry-points."trl_marl.replay_modes"]
    my_mode = "my_package.replay:MyReplay"

trl_marl's own built-ins are registered in exactly the same way, in trl_marl's `pyproject.toml`; there is no
special path for them. Discovery goes through `importlib.metadata.entry_points(group=...)` on every call (no
cache: the scan is cheap, and a package installed or put on `sys.path` at run time is seen at once).

Names are exact: no aliases, no case folding.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

__all__ = ["COMPARATOR_GROUP", "REPLAY_GROUP", "GROUPS", "PluginLoadError", "available", "load_plugin"]

COMPARATOR_GROUP = "trl_marl.comparators"
REPLAY_GROUP = "trl_marl.replay_modes"
GROUPS = (COMPARATOR_GROUP, REPLAY_GROUP)

# What a group's plugins are called in error messages.
_KIND = {COMPARATOR_GROUP: "comparator", REPLAY_GROUP: "replay mode"}


class PluginLoadError(ImportError):
    """A registered plugin was found but could not be imported (or its object does not exist)."""


def _check_group(group: str) -> None:
    if group not in GROUPS:
        raise ValueError(f"Unknown plugin group {group!r}; trl_marl plugin groups are {list(GROUPS)}")


def _group_entry_points(group: str) -> dict[str, list[EntryPoint]]:
    """All entry points of `group`, by name. Several distributions may register the same name."""
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=group):
        same_name = found.setdefault(ep.name, [])
        if all(other.value != ep.value for other in same_name):  # one package seen twice on sys.path is one plugin
            same_name.append(ep)
    return found


def _dist_name(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else "<unknown distribution>"


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
