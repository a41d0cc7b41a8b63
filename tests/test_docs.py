"""Docs promises: every config field is documented in its class docstring and on its trainer's page."""

import dataclasses
from pathlib import Path

import pytest
from transformers import TrainingArguments

DOCS = Path(__file__).resolve().parents[1] / "docs"
# fields of TrainingArguments whose default we change on purpose: documented too
CHANGED = {"learning_rate", "gradient_checkpointing", "logging_steps", "num_train_epochs", "train_batch_size"}


def fields_beyond(cls, base):
    """Fields `cls` adds to `base`, or whose default it changes."""
    base_defaults = {f.name: f.default for f in dataclasses.fields(base)}
    return [
        f.name
        for f in dataclasses.fields(cls)
        if (f.name not in base_defaults or base_defaults[f.name] != f.default) and f.name != "remove_unused_columns"
    ]


def pages():
    from trl_marl import (
        MADPOConfig,
        MADPOIterConfig,
        MAGRPOConfig,
        MARLHFConfig,
        MARLHFIterConfig,
        MultiAgentConfig,
    )

    yield MAGRPOConfig, TrainingArguments, "magrpo.md"
    yield MADPOConfig, MultiAgentConfig, "madpo.md"
    yield MARLHFConfig, MultiAgentConfig, "marlhf.md"
    yield MADPOIterConfig, MADPOConfig, "iterative.md"
    yield MARLHFIterConfig, MARLHFConfig, "iterative.md"
    # actor-critic: every field beyond TrainingArguments (the shared ones too) is in the page's config table
    from trl_marl import IACConfig, MAACConfig, MAPPOConfig

    yield MAACConfig, TrainingArguments, "maac.md"
    yield IACConfig, TrainingArguments, "iac.md"
    yield MAPPOConfig, TrainingArguments, "mappo.md"


@pytest.mark.parametrize("cls, base, page", list(pages()), ids=lambda x: getattr(x, "__name__", str(x)))
def test_every_config_field_is_documented(cls, base, page):
    text = (DOCS / page).read_text()
    doc = "".join(c.__doc__ or "" for c in cls.__mro__)
    for name in fields_beyond(cls, base):
        assert f"`{name}`" in text, f"{name} missing from docs/{page}"
        assert name in doc or name in CHANGED, f"{name} missing from the {cls.__name__} docstring"
