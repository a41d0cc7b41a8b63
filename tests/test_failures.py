"""Bad input and faults a user meets: each is refused early with a message that names the thing and the fix
(docs/failures.md lists them with what to do)."""

from __future__ import annotations

import shutil
import time

import pytest
from conftest import cpu_args, letters_reward


def _magrpo(model, tmp_path, **kwargs):
    from trl_marl import MAGRPOConfig, MAGRPOTrainer

    return MAGRPOTrainer(
        model=model,
        reward_funcs=letters_reward,
        args=cpu_args(MAGRPOConfig, tmp_path),
        train_dataset=[{"prompt": "a"}] * 4,
        **kwargs,
    )


def test_a_peft_adapter_folder_as_model_names_its_base_and_the_two_fixes(tiny_path, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules="all-linear")).save_pretrained(adapter)
    with pytest.raises(ValueError, match=r"is a PEFT adapter folder \(adapter_config.json\), not a model") as err:
        _magrpo(str(adapter), tmp_path)
    assert f"model={tiny_path!r} with peft_config=LoraConfig" in str(err.value) and "is_trainable=True" in str(
        err.value
    )


def test_a_folder_without_config_or_weights_is_named(tiny_path, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"model folder '.*empty' has no config.json"):
        _magrpo(str(empty), tmp_path)
    no_weights = tmp_path / "no_weights"
    shutil.copytree(tiny_path, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(FileNotFoundError, match=r"has a config.json but no weights"):
        _magrpo(str(no_weights), tmp_path)


def test_a_model_folder_without_tokenizer_files_is_named_not_install_sentencepiece(tiny_path, tmp_path):
    folder = tmp_path / "model_only"
    shutil.copytree(tiny_path, folder, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json"))
    with pytest.raises(FileNotFoundError, match=r"tokenizer files missing in '.*model_only'.*processing_class="):
        _magrpo(str(folder), tmp_path)


@pytest.mark.parametrize("name", ["./missing.jsonl", "data/train.json", "/no/such/folder", "~/nothing.csv"])
def test_a_missing_local_dataset_fails_at_once_without_asking_the_hub(name):
    from trl_marl.cli.recipe_args import RecipeArguments, load_recipe_dataset

    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"no such file or folder"):
        load_recipe_dataset(RecipeArguments(dataset_name=name))
    assert time.perf_counter() - start < 2.0
