"""The algorithm registry: the built-ins, what reads it (the command line, MARLHF's backends), and a new algorithm
registered by a user."""

import subprocess
import sys
from dataclasses import dataclass

import pytest

from trl_marl import MAGRPOConfig, MAGRPOTrainer
from trl_marl.trainers import registry
from trl_marl.trainers.registry import algorithms, get_algorithm, register_algorithm


@pytest.fixture
def own_registry(monkeypatch):
    """A copy of the registry for the test to add to."""
    monkeypatch.setattr(registry, "_ALGORITHMS", dict(registry._ALGORITHMS))


def test_every_command_is_a_registered_algorithm():
    """One command per registered algorithm, in the registry's order; a command named otherwise (`agentic`: a team in
    an environment) trains a registered algorithm."""
    from trl_marl.cli.recipes import RECIPES

    names = [a.name for a in algorithms()]
    assert [name for name in RECIPES if RECIPES[name].algorithm is None] == names
    for recipe in RECIPES.values():
        assert recipe.algorithm_name in names
        assert recipe.trainer_class() is get_algorithm(recipe.algorithm_name).trainer_class


@pytest.mark.parametrize("algorithm", algorithms(), ids=lambda a: a.name)
def test_builtins_resolve_to_their_classes(algorithm):
    trainer, config = algorithm.trainer_class, algorithm.config_class
    assert trainer.config_class is config or issubclass(config, trainer.config_class)
    assert algorithm.resume_types == trainer.all_resume_types()


def test_baselines_and_resume_types_of_the_builtins():
    from trl_marl import MAACTrainer, MADPOTrainer, MARLOOTrainer, PreferencePair
    from trl_marl.data_types.critic import CriticData

    assert {a.baseline: a.name for a in algorithms() if a.baseline} == {
        "mean": "magrpo",
        "raw": "mareinforce",
        "loo": "marloo",
        "max": "maremax",
    }
    assert get_algorithm("marloo").trainer_class is MARLOOTrainer and MARLOOTrainer.baseline == "loo"
    assert CriticData in get_algorithm("maac").resume_types and get_algorithm("maac").trainer_class is MAACTrainer
    assert (
        PreferencePair in get_algorithm("madpo").resume_types and get_algorithm("madpo").trainer_class is MADPOTrainer
    )


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown algorithm 'grpo'; registered algorithms: magrpo, mareinforce, "):
        get_algorithm("grpo")


def test_readers_follow_the_registry():
    from trl_marl.cli.recipes import BASELINE_ALGORITHMS, MAGRPOScriptArguments
    from trl_marl.trainers.preference.marlhf import RL_ALGORITHMS, MARLHFConfig

    reinforce = {a.name: a.baseline for a in algorithms() if a.baseline}
    assert {b: name for name, b in reinforce.items()} == BASELINE_ALGORITHMS
    choices = MAGRPOScriptArguments.__dataclass_fields__["baseline"].metadata["choices"]
    assert choices == ["mean", "raw", "loo", "max"]
    assert {**reinforce, "maac": None, "iac": None} == RL_ALGORITHMS
    assert MARLHFConfig.__dataclass_fields__["rl_algorithm"].metadata["choices"] == list(RL_ALGORITHMS)


@dataclass
class MAMedianConfig(MAGRPOConfig):
    """A user's config."""


class MAMedianTrainer(MAGRPOTrainer):
    """A user's trainer, with the group-mean baseline under another name."""

    config_class = MAMedianConfig


def test_a_user_registers_an_algorithm(own_registry):
    algorithm = register_algorithm("mamedian", MAMedianTrainer, MAMedianConfig)
    assert get_algorithm("mamedian") is algorithm and algorithms()[-1] is algorithm
    assert algorithm.trainer_class is MAMedianTrainer and algorithm.config_class is MAMedianConfig
    assert algorithm.resume_types == MAGRPOTrainer.all_resume_types()
    by_path = register_algorithm("mamedian2", f"{__name__}:MAMedianTrainer", f"{__name__}:MAMedianConfig")
    assert by_path.trainer_class is MAMedianTrainer


def test_registration_refuses_bad_input(own_registry):
    with pytest.raises(ValueError, match="algorithm 'magrpo' is already registered"):
        register_algorithm("magrpo", MAMedianTrainer, MAMedianConfig)
    with pytest.raises(ValueError, match="baseline 'loo' is already computed by the algorithm 'marloo'"):
        register_algorithm("mamedian", MAMedianTrainer, MAMedianConfig, baseline="loo")
    with pytest.raises(TypeError, match="trainer must be a class or a 'module:attribute' string, got 'MAMedian'"):
        register_algorithm("mamedian", "MAMedian", MAMedianConfig)
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        register_algorithm("", MAMedianTrainer, MAMedianConfig)
    assert "mamedian" not in {a.name for a in algorithms()}


def test_a_baseline_the_trainer_does_not_compute_is_an_error(own_registry):
    algorithm = register_algorithm("mamedian", MAMedianTrainer, MAMedianConfig, baseline="median")
    with pytest.raises(TypeError, match="registered with baseline='median' but its trainer MAMedianTrainer computes "):
        _ = algorithm.trainer_class


def test_the_registry_and_the_command_line_load_without_torch():
    code = (
        "import sys\n"
        "import trl_marl.cli.recipes, trl_marl.trainers.registry\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
