"""The recipes: flags, YAML configs, the embedded tiny defaults, and a real `accelerate launch`."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_recipe(name):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_magrpo_recipe_flags_and_defaults(tmp_path, tiny_path):
    recipe = load_recipe("magrpo")
    trainer = recipe.main(
        [
            "--output_dir",
            str(tmp_path / "run"),
            "--max_steps",
            "2",
            "--eval_num_samples",
            "2",
            "--disable_tqdm",
            "true",
            "--baseline",
            "loo",
        ]
    )
    assert type(trainer).__name__ == "MARLOOTrainer"
    # embedded tiny defaults fill what was not given; explicit flags win
    assert trainer.args.learning_rate == 3e-3 and trainer.args.max_steps == 2
    assert (tmp_path / "run" / "agent_2" / "config.json").exists()
    assert trainer.before_reward is not None and trainer.after_reward is not None


def test_magrpo_recipe_yaml_config(tmp_path, tiny_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"output_dir: {tmp_path / 'yaml_run'}\nmax_steps: 1\nlearning_rate: 0.01\nnum_generations: 2\n"
        "task: length_ratio\neval_num_samples: 2\ndisable_tqdm: true\n"
    )
    trainer = load_recipe("magrpo").main(["--config", str(cfg)])
    assert trainer.args.learning_rate == 0.01 and trainer.args.num_generations == 2
    assert trainer.args.max_completion_length == 16  # not in the YAML: the tiny default


def test_accelerate_launch_madpo_the_main_job(tmp_path, tiny_path):
    """The README's main command, shortened: `accelerate launch --config_file accelerate_configs/single.yaml
    recipes/madpo.py`. It prints only what a user needs: no warning (progress bars and results only)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONWARNINGS", None)
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "accelerate_configs" / "single.yaml"),
        str(ROOT / "recipes" / "madpo.py"),
        "--output_dir",
        str(tmp_path / "launch"),
        "--max_steps",
        "2",
        "--eval_num_samples",
        "2",
        "--preference_num_candidates",
        "2",
    ]
    readme = (ROOT / "README.md").read_text()
    assert "accelerate launch --config_file accelerate_configs/single.yaml recipes/madpo.py" in readme
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "eval reward before training" in proc.stdout and "eval reward after training" in proc.stdout
    assert (tmp_path / "launch" / "agent_1" / "model.safetensors").exists()
    output = (proc.stdout + proc.stderr).replace("\r", "\n").splitlines()
    warned = [line for line in output if "warn" in line.lower()]
    assert not warned, "\n".join(warned)


def test_the_marlhf_reward_model_stage_is_quiet(tmp_path, tiny_path, recwarn):
    """Every MARLHF round loads a reward model under a new head and fits it: it printed transformers' `score.weight
    MISSING` load report, the `gradient_checkpointing` FutureWarning and torch's `pin_memory` warning."""
    import logging
    from types import SimpleNamespace

    from trl_marl.trainers.preference.reward_model import JointRewardModel

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("transformers").addHandler(handler)
    try:
        rm = JointRewardModel.from_pretrained(tiny_path, seed=0)
        pair = SimpleNamespace(prompts=["a", "b"], winner_completions=["yes", "yes"], loser_completions=["no", "no"])
        rm.fit([pair] * 4, batch_size=2, output_dir=str(tmp_path / "rm"))
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert [r.getMessage()[:200] for r in records] == []
    assert [f"{w.category.__name__}: {w.message}" for w in recwarn] == []


def test_recipe_under_two_process_ddp(tmp_path, tiny_path):
    """`accelerate launch --config_file accelerate_configs/multi_cpu.yaml recipes/magrpo.py`: both ranks train,
    rank 0 alone prints and saves, and every rank exits cleanly (the recipe tears the process group down)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "accelerate_configs" / "multi_cpu.yaml"),
        str(ROOT / "recipes" / "magrpo.py"),
        *("--output_dir", str(tmp_path / "ddp"), "--max_steps", "2", "--eval_num_samples", "2"),
        *("--rollout_buffer_size", "2", "--num_generations", "2", "--disable_tqdm", "true"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("eval reward after training") == 1  # the main process only
    assert "terminate called" not in proc.stderr
    assert (tmp_path / "ddp" / "agent_2" / "model.safetensors").exists()


def test_madpo_and_marlhf_recipes(tmp_path, tiny_path):
    t = load_recipe("madpo").main(
        [
            "--output_dir",
            str(tmp_path / "madpo"),
            "--max_steps",
            "2",
            "--eval_num_samples",
            "2",
            "--disable_tqdm",
            "true",
        ]
    )
    assert type(t).__name__ == "MADPOTrainer" and t.args.num_train_epochs == 4 and t.args.rollout_buffer_size == 16
    assert (tmp_path / "madpo" / "agent_1" / "model.safetensors").exists()
    m = load_recipe("marlhf").main(
        [
            "--output_dir",
            str(tmp_path / "marlhf"),
            "--max_steps",
            "1",
            "--eval_num_samples",
            "2",
            "--disable_tqdm",
            "true",
            "--preference_num_candidates",
            "3",
            "--rl_algorithm",
            "marloo",
        ]
    )
    assert m.args.rl_algorithm == "marloo" and m.args.pair_selection == "all"
    assert (tmp_path / "marlhf" / "reward_model" / "config.json").exists()


@pytest.mark.parametrize("bad", [["--joint_mode", "diagonal"], ["--baseline", "median"]])
def test_recipe_rejects_bad_choices(tmp_path, bad):
    with pytest.raises(SystemExit):
        load_recipe("magrpo").main(["--output_dir", str(tmp_path), *bad])


def test_recipe_honours_resume_from_checkpoint(tmp_path, tiny_path):
    recipe = load_recipe("magrpo")
    common = ["--output_dir", str(tmp_path / "run"), "--eval_num_samples", "2", "--disable_tqdm", "true"]
    common += ["--save_strategy", "steps", "--save_steps", "1"]
    first = recipe.main([*common, "--max_steps", "2"])
    assert first.state.global_step == 2
    resumed = recipe.main([*common, "--max_steps", "3", "--resume_from_checkpoint", "true"])
    assert resumed._restored_from == str(tmp_path / "run" / "checkpoint-2")
    assert resumed.state.global_step == 3
    assert resumed.before_reward is None  # no evaluation "before training" of a resumed run


def test_the_marlhf_reward_model_stage_is_quiet_after_a_one_process_group(tmp_path):
    """MARLHF with colocated vLLM: the engine starts a one-process torch.distributed group in the trainer's process;
    building the reward stage's `RewardConfig` after it made transformers warn "process group is initialized, but
    parallel_mode != DISTRIBUTED". The quiet test above, in a process that holds such a group."""
    script = (
        "import socket, sys, torch, pytest\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
        "torch.distributed.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=1)\n"
        "sys.exit(pytest.main(['-q', '-p', 'no:randomly', '-p', 'no:cacheprovider', "
        f"'{__file__}::test_the_marlhf_reward_model_stage_is_quiet']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
