"""Import paths that moved in 0.2 keep working for one release, with a `DeprecationWarning` naming the new path
(`trl_marl.utils.deprecation.TrlMarlDeprecationWarning`).

A module that moved whole (`trl_marl.zero3` -> `trl_marl.distributed.zero3`) is the new module under its old name
(so `python -m trl_marl.memory`, `mock.patch("trl_marl.fsdp....")` and pickles naming the old path still work). A
module whose names went to several places (`trl_marl.team`) is a small module that forwards each name to its new
home, warning on first use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

from trl_marl.utils.deprecation import TrlMarlDeprecationWarning, warn_deprecated

__all__ = ["MOVED_MODULES", "SPLIT_MODULES", "install"]

# old path -> new path (the whole module moved)
MOVED_MODULES = {
    "trl_marl.adapters": "trl_marl.models.adapters",
    "trl_marl.centralized": "trl_marl.rollout.centralized",
    "trl_marl.checkpoint": "trl_marl.checkpointing.checkpoint",
    "trl_marl.state_files": "trl_marl.checkpointing.state_files",
    "trl_marl.collective": "trl_marl.distributed.collective",
    "trl_marl.fsdp": "trl_marl.distributed.fsdp",
    "trl_marl.zero3": "trl_marl.distributed.zero3",
    "trl_marl.memory": "trl_marl.distributed.memory",
    "trl_marl.config_secrets": "trl_marl.utils.secrets",
    "trl_marl.import_utils": "trl_marl.utils.import_utils",
    "trl_marl.progress": "trl_marl.utils.progress",
    "trl_marl.rng": "trl_marl.data_types.rng",
    "trl_marl.metrics": "trl_marl.trainers.metrics",
    "trl_marl.scripts": "trl_marl.cli.recipe_args",
    "trl_marl.cli.launching": "trl_marl.cli.launch",
    "trl_marl.sandbox": "trl_marl.tasks.sandbox",
}


def _names(module: str, names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), module)


# old path -> {name: new module} (the module was split)
SPLIT_MODULES = {
    "trl_marl.team": {
        **_names(
            "trl_marl.models.team", "TeamConfig TeamModel forward_completions masked_mean_entropy agent_token_logprobs"
        ),
        **_names("trl_marl.data_types.text", "PromptText UNKNOWN_EOS CompletionText"),
        **_names("trl_marl.data_types.batches", "AgentBatch collate_agent_batch"),
        **_names("trl_marl.rollout.prompts", "render_prompt default_formatter resolve_formatters"),
        **_names(
            "trl_marl.models.loading",
            "MODEL_CONFIG_KEYS loading_kwargs check_model_source load_agents load_tokenizers eos_token_ids "
            "default_eos_token_id completion_token_ids ended_with_eos",
        ),
    },
    "trl_marl.trainers.preference.iterative": {
        **_names(
            "trl_marl.trainers.preference.iterative_config",
            "IterativeConfigMixin MADPOIterConfig MARLHFIterConfig MARLHFIterMAACConfig MARLHFIterIACConfig "
            "PREFERENCE_SCORING",
        ),
        **_names(
            "trl_marl.trainers.preference.iterative_trainers",
            "MADPOIterTrainer MARLHFIterTrainer MARLHFIterMAACTrainer MARLHFIterIACTrainer",
        ),
        **_names("trl_marl.trainers.preference.round_files", "write_round_file read_round_file ROUND_RECORD_KEYS"),
        **_names("trl_marl.trainers.preference.rounds", "STATE_FILE"),
    },
}


def _warn(old: str, new: str) -> None:
    warn_deprecated(
        f"{old} moved to {new}; the old path goes in the next release", TrlMarlDeprecationWarning, stacklevel=3
    )


class _SplitModule(types.ModuleType):
    def __getattr__(self, name: str):
        where = SPLIT_MODULES[self.__name__].get(name)
        if where is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        _warn(f"{self.__name__}.{name}", f"{where}.{name}")
        return getattr(importlib.import_module(where), name)

    def __dir__(self):
        return sorted(SPLIT_MODULES[self.__name__])


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths: a moved module is returned as itself, a split one as a forwarding module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED_MODULES or fullname in SPLIT_MODULES:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        if spec.name in MOVED_MODULES:
            _warn(spec.name, MOVED_MODULES[spec.name])
            return importlib.import_module(MOVED_MODULES[spec.name])
        return _SplitModule(spec.name)

    def exec_module(self, module) -> None:
        pass

    def get_code(self, fullname):  # `python -m <old path>` runs the new module
        new = importlib.util.find_spec(MOVED_MODULES[fullname])
        return new.loader.get_code(new.name)


def install() -> None:
    """Put the finder on `sys.meta_path` once (called when `trl_marl` is imported)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())  # before path finders: an old file left on a path never wins
