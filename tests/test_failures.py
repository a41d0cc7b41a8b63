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


# ------------------------------------------------------------------------------------- files are verified, not trusted
def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only a content checksum can tell
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory, tiny_path):
    """A 2-step MAGRPO run with a checkpoint at each step, and its saved team."""
    from trl_marl import MAGRPOConfig, MAGRPOTrainer

    out = tmp_path_factory.mktemp("run") / "out"
    args = cpu_args(MAGRPOConfig, out.parent, output_dir=str(out), max_steps=2, save_strategy="steps", save_steps=1)
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=[{"prompt": "a"}] * 4)
    t.train()
    t.save_model()
    return out


def _copy(src, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def test_a_checkpoint_with_flipped_bytes_is_refused_naming_the_file_and_the_intact_one(checkpointed_run, tmp_path):
    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.checkpointing.checkpoint import CheckpointError

    out = _copy(checkpointed_run, tmp_path)
    _flip_a_byte(out / "checkpoint-2" / "agent_1" / "model.safetensors")
    args = cpu_args(MAGRPOConfig, tmp_path, output_dir=str(out), max_steps=3)
    t = MAGRPOTrainer(model=_tiny(), reward_funcs=letters_reward, args=args, train_dataset=[{"prompt": "a"}] * 4)
    with pytest.raises(CheckpointError) as err:
        t.train(resume_from_checkpoint=True)
    message = str(err.value)
    assert "agent_1/model.safetensors (its bytes changed after it was written" in message
    assert f"resume from {out / 'checkpoint-1'} (the latest intact one before it)" in message


def test_a_saved_team_with_flipped_bytes_does_not_load(checkpointed_run, tmp_path):
    from trl_marl import AgentTeam
    from trl_marl.checkpointing.state_files import CorruptedStateError

    team = _copy(checkpointed_run, tmp_path)
    AgentTeam.from_pretrained(str(team))  # intact: loads
    _flip_a_byte(team / "agent_2" / "model.safetensors")
    with pytest.raises(CorruptedStateError, match=r"damaged file\(s\): agent_2/model.safetensors \(its bytes changed"):
        AgentTeam.from_pretrained(str(team))
    with pytest.raises(CorruptedStateError, match=r"agent_2/model.safetensors .*save it again"):
        _magrpo([str(team / "agent_1"), str(team / "agent_2")], tmp_path)


@pytest.mark.parametrize("other", ["trainer", "team"])
def test_a_valid_checkpoint_of_another_trainer_or_team_is_refused_as_such(checkpointed_run, tmp_path, other):
    from trl_marl import MAGRPOConfig, MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer
    from trl_marl.checkpointing.checkpoint import CheckpointError

    out = _copy(checkpointed_run, tmp_path)
    if other == "trainer":
        cls, args = MAREINFORCETrainer, cpu_args(MAREINFORCEConfig, tmp_path, output_dir=str(out), max_steps=3)
        expected = "this run is MAREINFORCETrainer"
    else:
        cls, args = MAGRPOTrainer, cpu_args(MAGRPOConfig, tmp_path, output_dir=str(out), max_steps=3, num_agents=3)
        expected = "with 3 agent(s)"

    def reward(*completions):
        return [0.0] * len(completions[0])

    t = cls(model=_tiny(), reward_funcs=reward, args=args, train_dataset=[{"prompt": "a"}] * 4)
    with pytest.raises(CheckpointError) as err:
        t.train(resume_from_checkpoint=True)
    message = str(err.value)
    assert "it was written by MAGRPOTrainer" in message and expected in message
    assert "the checkpoint is intact" in message and "delete" not in message


def test_resuming_from_a_folder_that_does_not_exist_says_check_the_path(tmp_path):
    from trl_marl.checkpointing.checkpoint import CheckpointError, resolve_resume_checkpoint

    with pytest.raises(CheckpointError, match=r"no such folder; check the path") as err:
        resolve_resume_checkpoint(str(tmp_path / "checkpoint-7"), str(tmp_path))
    assert "delete" not in str(err.value)


def _tiny():
    from trl_marl.testing import tiny_model_path

    return tiny_model_path()


# --------------------------------------------------------------------------------- values checked for meaning
@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        # strings are never taken as booleans or numbers from Python (bf16="false" was truthy: bf16 on)
        (dict(bf16="false"), TypeError, r"bf16='false' is a string; bf16 takes True or False \(write False"),
        (dict(learning_rate="1e-3"), TypeError, r"learning_rate='1e-3' is a string; .*\(write 0.001 without quotes\)"),
        (dict(agent_learning_rate=[1e-3, "2e-3"]), TypeError, r"agent_learning_rate\[1\]='2e-3' is a string"),
        (dict(num_agents=True), TypeError, "num_agents=True is a bool; num_agents takes an integer"),
        (dict(max_steps=1e3), TypeError, "max_steps=1000.0 is a float; max_steps takes an integer"),
        # non-finite and absurd floats (inf trained NaN weights; 1e-30 a zero gradient)
        (dict(learning_rate=float("inf")), ValueError, "learning_rate=inf is not a finite number"),
        (dict(reference_kl_coef=float("inf")), ValueError, "reference_kl_coef=inf is not a finite number"),
        (dict(agent_learning_rate=[1e-3, float("nan")]), ValueError, r"agent_learning_rate\[1\]=nan is not a finite"),
        (dict(temperature=float("inf")), ValueError, "temperature=inf is not a finite number"),
        (dict(temperature=1e-30), ValueError, r"temperature must be in \[0.01, 100\], got 1e-30"),
        (dict(temperature=0.0), ValueError, r"temperature must be in \[0.01, 100\], got 0.0"),
        (dict(max_grad_norm=-1.0), ValueError, r"max_grad_norm must be >= 0 \(0: no clipping\)"),
        (dict(max_steps=0), ValueError, "max_steps must be >= 1, or -1 to train num_train_epochs epochs; got 0"),
        # per-agent lists (trl_marl.trainers.per_agent), entry by entry; None where the field takes None
        (dict(num_agents=2, temperature=[0.7, "1.0"]), TypeError, r"temperature\[1\]='1.0' is a string"),
        (dict(num_agents=2, loss_type="dapo", beta=[0.0, float("nan")]), ValueError, r"beta\[1\]=nan is not a"),
        (dict(num_agents=2, top_k=[None, 0]), ValueError, r"top_k must be None or >= 1, got 0"),
    ],
)
def test_config_values_are_checked_for_meaning(tmp_path, kwargs, error, message):
    from trl_marl import MAGRPOConfig

    with pytest.raises(error, match=message):
        MAGRPOConfig(output_dir=str(tmp_path), **kwargs)


@pytest.mark.parametrize(
    "config, kwargs, message",
    [
        ("MADPOConfig", dict(beta=float("inf")), "beta=inf is not a finite number"),
        ("MAACConfig", dict(value_loss_coef=float("nan")), "value_loss_coef=nan is not a finite number"),
        ("MARLHFConfig", dict(reward_learning_rate=float("inf")), "reward_learning_rate=inf is not a finite number"),
    ],
)
def test_every_trainer_config_refuses_non_finite_coefficients(tmp_path, config, kwargs, message):
    import trl_marl

    with pytest.raises(ValueError, match=message):
        getattr(trl_marl, config)(output_dir=str(tmp_path), **kwargs)


def test_the_command_line_and_yaml_still_convert_strings(tmp_path):
    """Only Python values are checked against the annotations: TrlParser converts the strings of the command line
    and of a --config YAML file (`learning_rate: 1e-3` is a string to PyYAML) before the config is built."""
    from trl_marl import MAGRPOConfig
    from trl_marl.cli.recipe_args import parse_recipe_args

    cfg = tmp_path / "run.yaml"
    cfg.write_text("learning_rate: 1e-3\nbf16: false\n")
    _, config = parse_recipe_args(MAGRPOConfig, argv=["--config", str(cfg), "--temperature", "0.5"])
    assert config.learning_rate == 1e-3 and config.bf16 is False and config.temperature == 0.5
    assert MAGRPOConfig(output_dir=str(tmp_path), max_grad_norm=float("inf")).max_grad_norm == float("inf")


def test_a_task_value_given_in_yaml_is_refused_not_reset(tmp_path, tiny_path):
    """`num_agents: 3` in a --config file, with the 2-agent built-in task: refused (it used to be reset to 2)."""
    from trl_marl.cli.recipes import run_command

    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"num_agents: 3\noutput_dir: {tmp_path / 'run'}\n")
    with pytest.raises(ValueError, match=r"--num_agents 3 does not fit the task 'coordination'.*pass --num_agents 2"):
        run_command("magrpo", ["--config", str(cfg)])


def test_a_reward_function_that_raises_is_named_the_last_step_checkpointed_and_the_resumed_run_loses_nothing(
    tmp_path, tiny_path
):
    """A reward function that raises at the third rollout (save_strategy="no"): the error names the function, keeps
    its exception as the cause, and says where the run is; checkpoint-2 was written first. With the function fixed,
    the resumed run ends with the weights of a run whose reward never raised (an exception leaves the rollout's
    random stream where the step began)."""
    import json

    import torch

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.rewards import RewardFunctionError

    calls = {"n": 0, "broken": True}

    def parsed_reward(c1, c2):
        calls["n"] += 1
        if calls["broken"] and calls["n"] == 3:
            json.loads(c1[0] + "{")  # a reward that parses the completion and meets one it cannot
        return letters_reward(c1, c2)

    def trainer(out):
        args = cpu_args(MAGRPOConfig, tmp_path, output_dir=str(tmp_path / out), max_steps=3)
        items = [{"prompt": p} for p in ("the cat", "a dog", "sing", "rain", "the sea", "home")]
        return MAGRPOTrainer(model=tiny_path, reward_funcs=parsed_reward, args=args, train_dataset=items)

    def weights(t):
        return torch.cat([p.detach().flatten() for p in t.team.parameters()])

    calls["broken"] = False
    reference = trainer("reference")
    reference.train()

    calls.update(n=0, broken=True)
    run = trainer("run")
    with pytest.raises(
        RewardFunctionError, match=r"reward function '[^']*parsed_reward' raised JSONDecodeError on 4 joint action"
    ) as err:
        run.train()
    assert isinstance(err.value.__cause__, json.JSONDecodeError)
    checkpoint = tmp_path / "run" / "checkpoint-2"
    note = " ".join(err.value.__notes__)
    assert f"the run stopped after step 2: {checkpoint} holds it" in note and "fix the reward function" in note
    assert checkpoint.is_dir()

    calls["broken"] = False
    resumed = trainer("run")
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3
    assert torch.allclose(weights(resumed), weights(reference), atol=1e-6)
    assert not torch.allclose(weights(resumed), weights(run))  # step 3 did happen after the resume
