"""Plugins: comparators (`trl_marl.comparators`) and replay modes (`trl_marl.replay_modes`), found through entry
points. See docs/plugins.md for writing one, and `registry` for discovery."""

from trl_marl.plugins.comparators_protocol import Comparator, JointCandidate, check_comparator_output
from trl_marl.plugins.registry import COMPARATOR_GROUP, GROUPS, REPLAY_GROUP, PluginLoadError, available, load_plugin
from trl_marl.plugins.replay import ReplayMode, make_replay_mode

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
