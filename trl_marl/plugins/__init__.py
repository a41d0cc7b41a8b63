"""Plugins: comparators (`trl_marl.comparators`) and replay modes (`trl_marl.replay_modes`), found through entry
points. See docs/plugins.md for writing one, and `registry` for discovery."""

from .comparators_protocol import Comparator, JointCandidate, check_comparator_output
from .registry import COMPARATOR_GROUP, GROUPS, REPLAY_GROUP, PluginLoadError, available, load_plugin
from .replay import ReplayMode, make_replay_mode

__all__ = [
    "COMPARATOR_GROUP",
    "REPLAY_GROUP",
    "GROUPS",
    "PluginLoadError",
    "available",
    "load_plugin",
    "Comparator",
    "JointCandidate",
    "check_comparator_output",
    "ReplayMode",
    "make_replay_mode",
]
