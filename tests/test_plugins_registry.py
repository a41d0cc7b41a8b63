"""Entry-point discovery: a fake distribution (a `.dist-info` folder on `sys.path`) registers plugins, exactly as an
installed third-party package would; nothing is installed."""

from __future__ import annotations

import tomllib
import uuid
from pathlib import Path

import numpy as np
import pytest

from trl_marl.plugins import registry
from trl_marl.plugins.registry import COMPARATOR_GROUP, REPLAY_GROUP, PluginLoadError, available, load_plugin
from trl_marl.plugins.replay import (
    AllHistoryReplay,
    CurrentReplay,
    LambdaDecayReplay,
    NearestKReplay,
    ReplayMode,
    make_replay_mode,
)

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

CUSTOM_REPLAY = '''
import numpy as np


class OldestFirstReplay:
    """A custom replay mode: the oldest non-empty round, all of it."""

    name = "oldest_first"

    def __init__(self, *, k=None, lam=None, sample_size=None):
        if lam is not None:
            raise ValueError("preference_replay_lambda is not used by preference_replay_mode='oldest_first'")
        self.sample_size = sample_size

    def select(self, rounds, rng: np.random.Generator):
        for pairs in rounds:
            if len(pairs):
                return [pairs[i] for i in range(len(pairs))][: self.sample_size]
        return []
'''


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_custom_replay_mode_is_discovered_and_loaded_by_name(fake_dist):
    module = unique("acme_replay")
    fake_dist({REPLAY_GROUP: {"oldest_first": f"{module}:OldestFirstReplay"}}, {module: CUSTOM_REPLAY})
    assert "oldest_first" in available(REPLAY_GROUP)
    assert "oldest_first" not in available(COMPARATOR_GROUP)
    cls = load_plugin(REPLAY_GROUP, "oldest_first")
    assert cls.__name__ == "OldestFirstReplay" and cls.__module__ == module

    mode = make_replay_mode("oldest_first", sample_size=2)
    assert isinstance(mode, ReplayMode)
    rounds = [[], [{"id": 1}, {"id": 2}, {"id": 3}], [{"id": 4}]]
    assert mode.select(rounds, np.random.default_rng(0)) == [{"id": 1}, {"id": 2}]
    with pytest.raises(ValueError, match="preference_replay_lambda is not used"):
        make_replay_mode("oldest_first", lam=0.5)


def test_plugin_disappears_with_its_path_entry(fake_dist, monkeypatch):
    module = unique("acme_replay")
    fake_dist({REPLAY_GROUP: {"gone_soon": f"{module}:OldestFirstReplay"}}, {module: CUSTOM_REPLAY})
    assert "gone_soon" in available(REPLAY_GROUP)
    monkeypatch.undo()  # removes the fixture's sys.path entry; the next call rescans
    assert "gone_soon" not in available(REPLAY_GROUP)


def test_unknown_name_lists_the_registered_ones(fake_dist):
    module = unique("acme_replay")
    fake_dist({REPLAY_GROUP: {"oldest_first": f"{module}:OldestFirstReplay"}}, {module: CUSTOM_REPLAY})
    with pytest.raises(ValueError) as err:
        load_plugin(REPLAY_GROUP, "oldest-first")
    message = str(err.value)
    assert "Unknown replay mode 'oldest-first'" in message
    assert "'trl_marl.replay_modes'" in message and "'oldest_first'" in message
    with pytest.raises(ValueError, match="Unknown comparator 'nope'"):
        load_plugin(COMPARATOR_GROUP, "nope")


def test_names_are_exact(fake_dist):
    module = unique("acme_replay")
    fake_dist({REPLAY_GROUP: {"oldest_first": f"{module}:OldestFirstReplay"}}, {module: CUSTOM_REPLAY})
    for alias in ("Oldest_First", "oldest_first ", "oldest"):
        with pytest.raises(ValueError, match="Unknown replay mode"):
            load_plugin(REPLAY_GROUP, alias)


def test_import_failure_names_entry_point_value_and_error(fake_dist):
    module = unique("acme_broken")
    fake_dist(
        {COMPARATOR_GROUP: {"broken": f"{module}:BrokenComparator"}},
        {module: "import trl_marl_missing_dependency_xyz\n\nclass BrokenComparator: ...\n"},
    )
    assert "broken" in available(COMPARATOR_GROUP)
    with pytest.raises(PluginLoadError) as err:
        load_plugin(COMPARATOR_GROUP, "broken")
    message = str(err.value)
    assert "comparator 'broken'" in message
    assert f"'{module}:BrokenComparator'" in message
    assert "ModuleNotFoundError" in message and "trl_marl_missing_dependency_xyz" in message
    assert isinstance(err.value.__cause__, ModuleNotFoundError)
    assert isinstance(err.value, ImportError)


def test_missing_attribute_is_a_load_error(fake_dist):
    module = unique("acme_replay")
    fake_dist({REPLAY_GROUP: {"typo": f"{module}:OldestFirstReplayy"}}, {module: CUSTOM_REPLAY})
    with pytest.raises(PluginLoadError, match=r"replay mode 'typo'.*OldestFirstReplayy.*AttributeError"):
        load_plugin(REPLAY_GROUP, "typo")


def test_same_name_from_two_distributions_is_ambiguous(fake_dist):
    first, second = unique("acme_a"), unique("acme_b")
    fake_dist({REPLAY_GROUP: {"clash": f"{first}:OldestFirstReplay"}}, {first: CUSTOM_REPLAY})
    fake_dist({REPLAY_GROUP: {"clash": f"{second}:OldestFirstReplay"}}, {second: CUSTOM_REPLAY})
    assert available(REPLAY_GROUP).count("clash") == 1
    with pytest.raises(ValueError, match="'clash' is registered more than once") as err:
        load_plugin(REPLAY_GROUP, "clash")
    assert f"{first}:OldestFirstReplay" in str(err.value) and f"{second}:OldestFirstReplay" in str(err.value)


def test_same_entry_point_seen_twice_is_one_plugin(fake_dist):
    module = unique("acme_replay")
    value = f"{module}:OldestFirstReplay"
    fake_dist({REPLAY_GROUP: {"twice": value}}, {module: CUSTOM_REPLAY})
    fake_dist({REPLAY_GROUP: {"twice": value}})
    assert load_plugin(REPLAY_GROUP, "twice").__name__ == "OldestFirstReplay"


def test_make_replay_mode_rejects_objects_without_select(fake_dist):
    module = unique("acme_bad")
    fake_dist(
        {REPLAY_GROUP: {"no_select": f"{module}:NoSelect"}},
        {module: "class NoSelect:\n    def __init__(self, **kw): ...\n"},
    )
    with pytest.raises(TypeError, match="'no_select'.*has no select"):
        make_replay_mode("no_select")


def test_unknown_group():
    with pytest.raises(ValueError, match="Unknown plugin group 'trl_marl.replay'"):
        available("trl_marl.replay")
    with pytest.raises(ValueError, match="Unknown plugin group"):
        load_plugin("trl_marl.comparator", "current")


def test_no_cache_between_calls(fake_dist, monkeypatch):
    calls = []
    real = registry.entry_points

    def counting(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(registry, "entry_points", counting)
    available(REPLAY_GROUP)
    available(REPLAY_GROUP)
    assert calls == [{"group": REPLAY_GROUP}] * 2


def test_pyproject_registers_the_builtin_replay_modes(fake_dist):
    """The built-ins are registered through trl_marl's own entry points, like any plugin: this reads the table from
    pyproject.toml, serves it from a dist-info (so it works without installing trl_marl) and loads every entry."""
    table = tomllib.loads(PYPROJECT.read_text())["project"].get("entry-points", {}).get(REPLAY_GROUP, {})
    expected = {
        "current": CurrentReplay,
        "nearest_k": NearestKReplay,
        "all_history": AllHistoryReplay,
        "lambda_decay": LambdaDecayReplay,
    }
    assert set(table) == set(expected), f'pyproject.toml [project.entry-points."{REPLAY_GROUP}"] is {table}'
    fake_dist({REPLAY_GROUP: table})
    for name, cls in expected.items():
        assert load_plugin(REPLAY_GROUP, name) is cls
        assert cls.name == name
    mode = make_replay_mode("lambda_decay", lam=0.8, sample_size=4)
    assert isinstance(mode, LambdaDecayReplay) and mode.sample_size == 4
