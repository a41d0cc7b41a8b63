"""Every setting a TRL user brings from `GRPOConfig`, `DPOConfig`, `RewardConfig` or the trainers' `__init__` either
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
        for cls in (trl.GRPOConfig, trl.DPOConfig, trl.RewardConfig)
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
