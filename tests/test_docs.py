"""Docs promises: every config field is documented in its class docstring and on its trainer's page."""

import dataclasses
from pathlib import Path

import pytest
from transformers import TrainingArguments

DOCS = Path(__file__).resolve().parents[1] / "docs"
INHERITED = {f.name for f in dataclasses.fields(TrainingArguments)}


def own_fields(cls):
    # fields we add or whose default we change on purpose
    changed = {"learning_rate", "gradient_checkpointing", "logging_steps"}
    return [f.name for f in dataclasses.fields(cls) if f.name not in INHERITED or f.name in changed]


def pages():
    from trl_marl import MAGRPOConfig

    yield MAGRPOConfig, "magrpo.md"


@pytest.mark.parametrize("cls, page", list(pages()))
def test_every_config_field_is_documented(cls, page):
    text = (DOCS / page).read_text()
    doc = "".join(c.__doc__ or "" for c in cls.__mro__)
    for name in own_fields(cls):
        if name == "remove_unused_columns":
            continue
        assert f"`{name}`" in text, f"{name} missing from docs/{page}"
        assert name in doc or name in {"learning_rate", "gradient_checkpointing", "logging_steps"}, (
            f"{name} missing from the {cls.__name__} docstring"
        )
