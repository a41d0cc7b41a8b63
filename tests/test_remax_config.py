"""Greedy ReMax: configs, docs and recipe agree; normalization that erases a baseline is flagged (issue 13)."""

import warnings

import pytest

from trl_marl import MAGRPOConfig, MAGRPOTrainer, MAReMaxTrainer, MARLOOTrainer


def length_reward(c1, c2):
    return [float(len(a) - len(b)) / 10 for a, b in zip(c1, c2)]


def test_a_plain_magrpo_config_sets_the_greedy_baseline(make_args, items, tiny_path):
    args = make_args(MAGRPOConfig, remax_baseline="greedy", scale_rewards="none")
    t = MAReMaxTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)
    assert t.baseline == "greedy" and t.rollout_engine.greedy_baseline
    with pytest.raises(ValueError, match="remax_baseline='greedy' only applies to MAReMaxTrainer"):
        MAGRPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)
    with pytest.raises(ValueError, match="remax_baseline must be one of"):
        make_args(MAGRPOConfig, remax_baseline="mean")


@pytest.mark.parametrize("trainer_cls", [MARLOOTrainer, MAReMaxTrainer])
def test_normalization_that_erases_the_baseline_warns(make_args, items, tiny_path, trainer_cls):
    with pytest.warns(UserWarning, match="trains exactly as MAGRPOTrainer"):
        trainer_cls(model=tiny_path, reward_funcs=length_reward, args=make_args(), train_dataset=items)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        args = make_args(scale_rewards="none")
        trainer_cls(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)


def test_recipe_sets_the_greedy_baseline(monkeypatch, tmp_path):
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location(
        "magrpo_recipe", os.path.join(os.path.dirname(__file__), "..", "recipes", "magrpo.py")
    )
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    built = {}
    import trl_marl.cli.recipes  # the recipe script is a thin call into the `trl-marl` command's code

    monkeypatch.setattr(
        trl_marl.cli.recipes,
        "run_recipe",
        lambda cls, script_args, config, extra_trainer_kwargs=None: built.update(cls=cls, config=config),
    )
    recipe.main(["--baseline", "max", "--remax_baseline", "greedy", "--output_dir", str(tmp_path)])
    assert built["cls"] is MAReMaxTrainer and built["config"].remax_baseline == "greedy"
    assert built["config"].advantage_normalization is False
