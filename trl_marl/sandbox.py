"""Deprecated alias of `trl_marl.tasks.sandbox` (the sandbox moved there); import from `trl_marl.tasks.sandbox`."""

from __future__ import annotations

import warnings

from .tasks.sandbox import *  # noqa: F403
from .tasks.sandbox import __all__  # noqa: F401

warnings.warn(
    "trl_marl.sandbox is deprecated: import from trl_marl.tasks.sandbox instead",
    DeprecationWarning,
    stacklevel=2,
)
