"""Every setting a TRL user brings from `GRPOConfig`, `RLOOConfig`, `DPOConfig`, `RewardConfig` or the trainers' `__init__` either
works under TRL's name or is refused with a pointer (trl_marl/trainers/trl_settings.py). The walk is over TRL's OWN
field lists, so a field TRL adds fails here until it is answered."""

from __future__ import annotations

import dataclasses

import pytest
import trl
from transformers import TrainingArguments

import trl_marl
from trl_marl.trainers.trl_settings import TRL_CONFIG_SETTINGS

OUR_CONFIGS = [name for name in trl_marl.__all__ if name.endswith("Config")]
TRAINING_ARGUMENTS = {f.name for f in dataclasses.fields(TrainingArguments)}
TRL_FIELDS = sorted(
    {
        f.name
        for cls in (trl.GRPOConfig, trl.RLOOConfig, trl.DPOConfig, trl.RewardConfig)
        for f in dataclasses.fields(cls)
        if f.name not in TRAINING_ARGUMENTS
    }
)


@pytest.mark.parametrize("config_name", OUR_CONFIGS)
def test_every_trl_config_field_works_or_points_the_way(config_name, tmp_path):
    config_cls = getattr(trl_marl, config_name)
    ours = {f.name for f in dataclasses.fields(config_cls)}
    for name in TRL_FIELDS:
        if name in ours:
            continue
        with pytest.raises(TypeError) as err:
            config_cls(output_dir=str(tmp_path), **{name: None})
        message = str(err.value)
        assert f"{config_name} got {name!r}, a TRL setting it does not take: " in message, message
        assert TRL_CONFIG_SETTINGS[name] in message


def test_a_misspelled_field_gets_the_closest_names(tmp_path):
    with pytest.raises(
        TypeError,
        match=r"MAGRPOConfig got an unexpected keyword argument 'num_generation'; did you mean "
        r"'num_generations'",
    ):
        trl_marl.MAGRPOConfig(output_dir=str(tmp_path), num_generation=4)


def test_the_table_answers_only_trl_settings():
    """No stale entries: every entry is a field of one of TRL's configs."""
    assert set(TRL_CONFIG_SETTINGS) <= set(TRL_FIELDS)


def test_trl_trainer_habits_get_a_pointer(tmp_path, tiny_path):
    """What a TRL user passes to a trainer out of habit: PPOTrainer's `value_model` / `reward_model`, a reward model
    id as `reward_funcs` (GRPOTrainer loads one), a TRL config as `args`. Each used to get a bare message (or "did you
    mean 'model'?" for value_model)."""
    from conftest import cpu_args, letters_reward

    args = cpu_args(trl_marl.MAPPOConfig, tmp_path)
    items = [{"prompt": "a"}] * 4
    with pytest.raises(
        TypeError, match=r"'value_model', a TRL setting it does not take: the actor-critic.*critic_model="
    ):
        trl_marl.MAPPOTrainer(
            model=tiny_path, reward_funcs=letters_reward, args=args, critic_model=tiny_path, value_model=tiny_path
        )
    with pytest.raises(TypeError, match=r"'reward_model', a TRL setting it does not take:.*reward_model_path"):
        trl_marl.MAPPOTrainer(
            model=tiny_path, reward_funcs=letters_reward, args=args, critic_model=tiny_path, reward_model=tiny_path
        )
    magrpo = cpu_args(trl_marl.MAGRPOConfig, tmp_path)
    with pytest.raises(TypeError, match=r"must be callable, got str \('my/reward-model': TRL's GRPOTrainer loads"):
        trl_marl.MAGRPOTrainer(model=tiny_path, reward_funcs="my/reward-model", args=magrpo, train_dataset=items)
    with pytest.raises(TypeError, match=r"must be callable, got str \('my/rm': TRL's GRPOTrainer loads"):
        trl_marl.MAGRPOTrainer(
            model=tiny_path, reward_funcs=[letters_reward, "my/rm"], args=magrpo, train_dataset=items
        )
    grpo = trl.GRPOConfig(output_dir=str(tmp_path / "grpo"), bf16=False, report_to="none")
    with pytest.raises(TypeError, match=r"got GRPOConfig; MAGRPOConfig takes TRL's field names"):
        trl_marl.MAGRPOTrainer(model=tiny_path, reward_funcs=letters_reward, args=grpo, train_dataset=items)


@pytest.mark.parametrize("config_name", [n for n in OUR_CONFIGS if n != "MultiAgentConfig"])
def test_remove_unused_columns_true_is_refused_saying_items_reach_formatters_and_rewards_whole(config_name, tmp_path):
    """TRL's GRPOTrainer with True keeps only the "prompt" column (its DPOConfig defaults to True); no trainer here
    drops columns: on the old code True was accepted and ignored (a reward function still got the whole items)."""
    config_cls = getattr(trl_marl, config_name)
    with pytest.raises(
        ValueError,
        match=r"remove_unused_columns=True is not supported: .*whole to the formatters, the reward functions "
        r"\(batch_items=\).*dataset.remove_columns",
    ):
        config_cls(output_dir=str(tmp_path), report_to="none", remove_unused_columns=True)
    assert config_cls(output_dir=str(tmp_path), report_to="none").remove_unused_columns is False
