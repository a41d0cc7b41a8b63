"""Packaging promises: the TRL range we support, the public API, the plugin groups."""

import tomllib
from importlib.metadata import entry_points, version
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_installed_trl_is_inside_the_supported_range():
    spec = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("trl"))
    assert Version(version("trl")) in SpecifierSet(spec[len("trl") :])
    # the private base classes we subclass still exist where we import them from
    from trl.trainer.base_config import _BaseConfig
    from trl.trainer.base_trainer import _BaseTrainer
    from trl.trainer.utils import selective_log_softmax  # noqa: F401

    from trl_marl.trainers.base import MultiAgentTrainer
    from trl_marl.trainers.config import MultiAgentConfig

    assert issubclass(MultiAgentTrainer, _BaseTrainer) and issubclass(MultiAgentConfig, _BaseConfig)


def test_public_api_is_lazy_and_complete():
    import trl_marl

    for name in trl_marl.__all__:
        assert getattr(trl_marl, name) is not None, name


def test_plugin_groups_are_declared():
    from trl_marl.plugins.registry import GROUPS

    eps = PYPROJECT["project"]["entry-points"]
    assert set(GROUPS) == set(eps)  # comparators, replay modes and tasks
    installed = {ep.name for ep in entry_points(group="trl_marl.replay_modes")}
    assert {"current", "nearest_k", "all_history", "lambda_decay"} <= installed
