"""The `trl_marl.tasks` entry-point group: the built-ins are registered like any package's task, and a third-party
package (a fake distribution on `sys.path`, nothing installed) adds one without editing trl_marl."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

from trl_marl.plugins import PluginLoadError
from trl_marl.plugins.registry import TASK_GROUP, available
from trl_marl.tasks import TASKS, Task, load_task

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
BUILTINS = {"length_ratio", "coordination", "code", "writing"}

# A user's package: a relay task for any number of agents, whose options are the factory's keyword arguments.
RELAY_TASK = """
from datasets import Dataset

from trl_marl.tasks import Task


def relay_reward(*completions):
    return [float(len(set(joint))) for joint in zip(*completions)]


def relay_task(num_agents=2, size=4):
    items = Dataset.from_list([{"prompt": f"Pass on the word {i}."} for i in range(size)])
    formatters = [lambda item, i=i: f"Runner {i + 1}: {item['prompt']}" for i in range(num_agents)]
    return Task("relay", num_agents, items, None, formatters, relay_reward, roles=[f"runner_{i + 1}" for i in range(num_agents)])


def not_a_task():
    return {"prompt": "?"}
"""


def _relay(fake_dist) -> str:
    module = f"acme_relay_{uuid.uuid4().hex[:8]}"
    fake_dist(
        {TASK_GROUP: {"relay": f"{module}:relay_task", "broken_relay": f"{module}:not_a_task"}}, {module: RELAY_TASK}
    )
    return module


def test_pyproject_registers_the_builtin_tasks():
    table = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"][TASK_GROUP]
    assert set(table) == BUILTINS
    assert set(TASKS) >= BUILTINS and sorted(TASKS) == available(TASK_GROUP)
    task = load_task("coordination", seed=1)
    assert isinstance(task, Task) and task.name == "coordination"
    assert TASKS["length_ratio"]().name == "length_ratio"


def test_a_third_party_package_adds_a_task(fake_dist):
    module = _relay(fake_dist)
    assert "relay" in TASKS and "relay" in available(TASK_GROUP)
    assert TASKS["relay"].__module__ == module
    task = load_task("relay", num_agents=3, size=2)
    assert task.num_agents == 3 and len(task.train_dataset) == 2 and task.roles[2] == "runner_3"
    assert task.reward_func(["a", "b"], ["a", "c"], ["a", "b"]) == [1.0, 2.0]


def test_unknown_task_lists_the_registered_ones(fake_dist):
    _relay(fake_dist)
    with pytest.raises(
        ValueError, match="Unknown task 'rellay'. Registered in entry-point group 'trl_marl.tasks': "
    ) as err:
        load_task("rellay")
    assert "'relay'" in str(err.value) and "'coordination'" in str(err.value)
    with pytest.raises(KeyError, match="unknown task 'rellay'; registered tasks: .*coordination"):
        TASKS["rellay"]
    assert "rellay" not in TASKS


def test_a_factory_must_return_a_task(fake_dist):
    _relay(fake_dist)
    with pytest.raises(TypeError, match="'broken_relay' returned a dict; it must return a trl_marl.tasks.Task"):
        load_task("broken_relay")


def test_a_task_whose_import_fails_names_its_entry_point(fake_dist):
    fake_dist({TASK_GROUP: {"gone": "acme_missing_module_xyz:task"}})
    with pytest.raises(PluginLoadError, match="task 'gone' .*acme_missing_module_xyz:task"):
        load_task("gone")


def test_the_source_checkouts_tasks_win_over_stale_installed_metadata(fake_dist):
    """An editable install made before a task was added (or one of another checkout) still lists the old entry
    points: the checkout trl_marl is imported from is the truth for trl_marl's own."""
    fake_dist({TASK_GROUP: {"retired": "trl_marl.tasks.toy:coordination_task"}}, dist_name="trl-marl")
    assert "retired" not in TASKS and set(TASKS) >= BUILTINS


def test_the_command_line_offers_an_installed_task(fake_dist, tmp_path):
    module = _relay(fake_dist)
    root = next(p for p in sys.path if (Path(p) / f"{module}.py").exists())
    code = (
        "from trl_marl.cli import main\n"
        "from trl_marl.cli.recipe_args import RecipeArguments\n"
        "assert 'relay' in RecipeArguments.__dataclass_fields__['task'].metadata['choices']\n"
        "main(['--help'])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tasks (--task): broken_relay, code, coordination, length_ratio, relay, writing" in proc.stdout
