"""The joint rollout: from task items to a rollout tree (`engine.JointRollout`), its returns as tensors (`returns`),
prompts from items (`prompts`), and the single-model adapter of centralized training (`centralized`). The tree's
types live in `trl_marl.data_types.rollout`."""

from __future__ import annotations

import importlib

from trl_marl.rollout.engine import JOINT_MODES, JointRollout, tree_size
from trl_marl.rollout.returns import RolloutReturns, rollout_returns
from trl_marl.utils.deprecation import TrlMarlDeprecationWarning, warn_deprecated

__all__ = ["JOINT_MODES", "JointRollout", "RolloutReturns", "rollout_returns", "tree_size"]

# names this module had before the rollout's data types moved to trl_marl.data_types.rollout (one release)
_MOVED = {name: "trl_marl.data_types.rollout" for name in ("GenerationOutput", "Sample", "Node", "Rollout")}
_MOVED["formatter_failure"] = "trl_marl.rollout.prompts"


def __getattr__(name: str):
    if name in _MOVED:
        warn_deprecated(
            f"trl_marl.rollout.{name} moved to {_MOVED[name]}.{name}; the old path goes in the next release",
            TrlMarlDeprecationWarning,
        )
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'trl_marl.rollout' has no attribute {name!r}")
