"""The `trl-marl` command: subcommands, `--accelerate_config`, `env`, TRL's script flags, and the installed wheel."""

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_marl.cli import main as cli_main
from trl_marl.cli.launch import available_configs, resolve_accelerate_config
from trl_marl.cli.recipes import RECIPES, run_command
from trl_marl.trainers.registry import get_algorithm
from trl_marl.utils.deprecation import TrlMarlFutureWarning

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_CONFIGS = ROOT / "trl_marl" / "accelerate_configs"


def test_accelerate_configs_shipped_in_the_package_match_the_top_level_folder():
    """The wheel ships `trl_marl/accelerate_configs/`; the repository's `accelerate_configs/` must hold the same
    files (fix a failure with `cp accelerate_configs/*.yaml trl_marl/accelerate_configs/`)."""
    top = sorted(p.name for p in (ROOT / "accelerate_configs").glob("*.yaml"))
    ours = sorted(p.name for p in PACKAGE_CONFIGS.glob("*.yaml"))
    assert top == ours, f"accelerate_configs/ {top} != trl_marl/accelerate_configs/ {ours}"
    different = [
        n for n in top if not filecmp.cmp(ROOT / "accelerate_configs" / n, PACKAGE_CONFIGS / n, shallow=False)
    ]
    assert not different, f"differ between accelerate_configs/ and trl_marl/accelerate_configs/: {different}"


def test_accelerate_config_names_resolve_to_ours_then_trls(tmp_path):
    assert Path(resolve_accelerate_config("multi_cpu")) == PACKAGE_CONFIGS / "multi_cpu.yaml"
    assert Path(resolve_accelerate_config("zero1")).parent.name == "accelerate_configs"  # TRL's own
    assert "trl" in Path(resolve_accelerate_config("zero1")).parts[-3]
    own = tmp_path / "mine.yaml"
    own.write_text("distributed_type: 'NO'\n")
    assert resolve_accelerate_config(str(own)) == str(own)
    with pytest.raises(ValueError, match="neither a file nor a shipped config.*multi_cpu"):
        resolve_accelerate_config("zero9")
    assert {"single", "multi_cpu", "zero2", "zero3", "fsdp1"} <= set(available_configs())


def test_help_lists_commands_tasks_and_configs(capsys):
    assert cli_main([]) == 0
    out = capsys.readouterr().out
    for name in ["magrpo", "mareinforce", "marloo", "maremax", "maac", "iac", "mappo", "madpo", "marlhf"]:
        assert name in out
    assert "madpo-iter" in out and "marlhf-iter" in out and "env" in out
    assert "tasks (--task): code, coordination, length_ratio, writing" in out and "multi_cpu" in out


def test_subcommand_help_lists_trl_flags_and_choices(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["marlhf", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in [
        "--use_peft",
        "--lora_r",
        "--load_in_4bit",
        "--dtype",
        "--attn_implementation",
        "--model_revision",
        "--trust_remote_code",
        "--dataset_name",
        "--dataset_config",
        "--dataset_train_split",
        "--dataset_test_split",
        "--prompt_templates",
        "--reward_funcs",
        "--reward_weights",
        "--resume_from_checkpoint",
        "--push_to_hub",
        "--max_completion_length",
        "--critic_model_name_or_path",
    ]:
        assert flag in out, flag
    assert "{code,coordination,length_ratio,writing}" in out
    assert "{magrpo,mareinforce,marloo,maremax,maac,iac}" in out


def test_subcommand_help_shows_the_defaults_the_command_applies_and_its_two_unlisted_flags(capsys):
    """`trl-marl agentic --help` showed the config class's defaults (`simultaneous`, `None`, an `output_dir` of None)
    where the command runs with its own (`sequential`, 1, `outputs/agentic`), and no command's help named `--config`
    or `--accelerate_config`."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["agentic", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "i+1 sees agents 1..i's messages). (default: sequential)" in out
    assert "None: no limit. (default: 1)" in out
    assert "will be written. (default: outputs/agentic)" in out
    assert "--config FILE.yaml" in out and "--accelerate_config NAME|PATH" in out and "multi_cpu" in out


def test_env_prints_versions(capsys):
    assert cli_main(["env"]) == 0
    out = capsys.readouterr().out
    assert "- trl_marl: " in out and "- trl: " in out and "- transformers: " in out and "- torch: " in out


def test_estimate_command_prints_the_memory_model(tiny_path, capsys):
    """`trl-marl estimate` is `python -m trl_marl.distributed.memory` (its usage line promised the command)."""
    assert cli_main(["estimate", tiny_path, "--num_agents", "2", "--world_size", "2", "--engine", "zero3"]) == 0
    assert "engine=zero3 world_size=2" in capsys.readouterr().out


def test_accelerate_config_relaunches_through_accelerate(monkeypatch):
    """`--accelerate_config NAME` and accelerate's own flags go to `accelerate launch`; the rest to the script."""
    import trl_marl.cli.launch as acc

    seen = {}
    monkeypatch.setattr(acc, "launch", lambda command, launch_args, script_args: seen.update(locals()))
    argv = ["magrpo", "--max_steps", "2", "--accelerate_config", "multi_cpu", "--num_processes", "2", "--use_peft"]
    assert cli_main(argv) == 0
    assert seen["command"] == "magrpo"
    assert seen["launch_args"][:2] == ["--config_file", str(PACKAGE_CONFIGS / "multi_cpu.yaml")]
    assert seen["launch_args"][2:] == ["--num_processes", "2"]
    assert seen["script_args"] == ["--max_steps", "2", "--use_peft"]


def test_unknown_command_is_an_error(capsys):
    with pytest.raises(SystemExit):
        cli_main(["grpo"])
    assert "unknown command 'grpo'" in capsys.readouterr().err


def test_every_command_parses_its_config(tmp_path):
    from trl_marl.cli.recipe_args import parse_recipe_args

    for name, recipe in RECIPES.items():
        args, config = parse_recipe_args(
            recipe.config_class(),
            argv=["--output_dir", str(tmp_path)],
            script_args_cls=recipe.script_args,
            tiny_defaults=recipe.tiny_defaults,
        )
        assert type(config) is get_algorithm(recipe.algorithm_name).config_class, name
    _, config = parse_recipe_args(RECIPES["madpo-iter"].config_class(), argv=["--output_dir", str(tmp_path)],
                                  tiny_defaults=RECIPES["madpo-iter"].tiny_defaults)  # fmt: skip
    assert config.num_rounds == 2


@pytest.mark.parametrize("name", ["maac", "iac", "mappo"])
def test_actor_critic_commands_accept_num_turns_2(tmp_path, name):
    """The tiny run's `num_generations=4` is a recipe default: with `--num_turns 2` the actor-critic trainers keep
    their own default (1) instead of failing on a value the user never set."""
    from trl_marl.cli.recipe_args import parse_recipe_args

    recipe = RECIPES[name]
    _, config = parse_recipe_args(
        recipe.config_class(), argv=["--output_dir", str(tmp_path), "--num_turns", "2"], tiny_defaults={}
    )
    assert config.num_turns == 2 and config.num_generations == 1
    _, single = parse_recipe_args(recipe.config_class(), argv=["--output_dir", str(tmp_path)])
    assert single.num_generations == 4  # the tiny default still applies to the one-turn run


def test_marlhf_with_maac_gets_its_critic(tmp_path, tiny_path):
    from trl_marl.cli.recipe_args import parse_recipe_args
    from trl_marl.cli.recipes import _marlhf_kwargs

    args, config = parse_recipe_args(
        RECIPES["marlhf"].config_class(),
        argv=["--output_dir", str(tmp_path), "--rl_algorithm", "maac", "--critic_model_name_or_path", tiny_path],
    )
    assert _marlhf_kwargs(args, config) == {"critic_model": tiny_path}
    args, config = parse_recipe_args(
        RECIPES["marlhf"].config_class(), argv=["--output_dir", str(tmp_path), "--rl_algorithm", "maac"]
    )
    assert _marlhf_kwargs(args, config)["critic_model"]  # the agents' (tiny) model by default
    assert _marlhf_kwargs(*parse_recipe_args(RECIPES["marlhf"].config_class(), argv=["--output_dir", "x"])) == {}


def test_dataset_name_trl_reward_and_lora_from_the_command_line(tmp_path, tiny_path, capsys, monkeypatch):
    """A TRL user's run: a local JSONL dataset, a reward from `trl.rewards` (lifted to the team), per-agent prompt
    templates, LoRA agents from `--use_peft`, and a second reward from a module in the working directory."""
    rows = [{"prompt": f"Topic {i}:", "topic": f"t{i}"} for i in range(8)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "my_rewards.py").write_text(
        "def topic_mentioned(prompts, completions, agent_completions, topic):\n"
        "    return [float(any(t in c for c in joint)) for t, joint in zip(topic, agent_completions)]\n"
    )
    monkeypatch.chdir(tmp_path)
    trainer = run_command("magrpo", [
        "--model_name_or_path", tiny_path,
        "--dataset_name", str(tmp_path / "data.jsonl"),
        "--prompt_templates", "{prompt} You plan.", "{prompt} You answer {topic}.",
        "--reward_funcs", "trl.rewards:think_format_reward", "my_rewards:topic_mentioned",
        "--reward_weights", "1.0", "0.5",
        "--use_peft", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj",
        "--output_dir", str(tmp_path / "out"),
        "--max_steps", "1", "--num_generations", "2", "--rollout_buffer_size", "2",
        "--max_completion_length", "4", "--report_to", "none", "--disable_tqdm", "true",
    ])  # fmt: skip
    from peft import PeftModel

    assert all(isinstance(a, PeftModel) for a in trainer.team.agents)
    assert trainer.formatters[1]({"prompt": "P", "topic": "x"}) == "P You answer x."
    names = [name for name, _, _ in trainer.reward._parts]
    assert names == ["think_format_reward", "topic_mentioned"]
    assert (tmp_path / "out" / "agent_1").exists()


@pytest.mark.slow
def test_wheel_installs_and_trl_marl_madpo_runs_from_an_empty_directory(tmp_path, tiny_path):
    """Build the wheel from the checkout, install it (no deps: they come from the shared environment, the
    checkout is NOT on the path), and run `trl-marl madpo --max_steps 2` from an empty directory."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    dist = tmp_path / "dist"
    try:  # build offline with the installed setuptools when it is recent enough, else in pip's isolated build env
        isolation = [] if Version(version("setuptools")) < Version("77") else ["--no-build-isolation"]
    except PackageNotFoundError:
        isolation = []
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(dist), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = dist.glob("trl_marl-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    # the dependencies: the running environment's site-packages as a plain path entry (its .pth files, among them
    # the editable install of trl_marl, are not processed)
    deps = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "trl").is_dir())
    Path(site, "zz_shared_deps.pth").write_text(deps + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True, env=env, timeout=300
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run(
        [py, "-c", "import trl_marl; print(trl_marl.__file__)"], capture_output=True, text=True, env=env, cwd=empty
    ).stdout
    assert where.startswith(site), where
    proc = subprocess.run(
        [venv / "bin" / "trl-marl", "madpo", "--max_steps", "2", "--eval_num_samples", "2",
         "--preference_num_candidates", "2", "--disable_tqdm", "true"],
        capture_output=True, text=True, env=env, cwd=empty, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "eval reward after training" in proc.stdout
    assert (empty / "outputs" / "madpo" / "agent_1" / "model.safetensors").exists()
    listing = subprocess.run(
        [sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True
    ).stdout
    assert "trl_marl/accelerate_configs/multi_cpu.yaml" in listing and "trl_marl/cli/launch.py" in listing


def test_sdist_holds_what_its_tests_need(tmp_path):
    """The sdist ships the tests, so it ships what they read: recipes, accelerate configs, docs, mkdocs.yml."""
    import shutil
    import tarfile

    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", "*.egg-info", "outputs", "__pycache__", ".venv*", ".ci-venv*", "site", "dist", "build"
        ),
    )
    code = "from setuptools import build_meta; print(build_meta.build_sdist('dist'))"
    name = subprocess.run(
        [sys.executable, "-c", code], cwd=src, capture_output=True, text=True, check=True, timeout=300
    ).stdout.split()[-1]
    with tarfile.open(src / "dist" / name) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ["recipes/madpo.py", "accelerate_configs/multi_cpu.yaml", "docs/cli.md", "mkdocs.yml",
                   "tests/conftest.py", "tests/scripts/dist_run.py", "trl_marl/accelerate_configs/zero2.yaml"]:  # fmt: skip
        assert needed in names, needed


@pytest.mark.parametrize("task", ["coordination", "length_ratio", "writing"])
def test_builtin_tasks_fit_every_recipe_default(tmp_path, task):
    """No recipe's default run skips items of a built-in task ("not a multiple of one rollout batch")."""
    from trl_marl.cli.recipe_args import parse_recipe_args
    from trl_marl.tasks import load_task

    size = len(load_task(task).train_dataset)
    for name, recipe in RECIPES.items():
        _, config = parse_recipe_args(
            recipe.config_class(), argv=["--output_dir", str(tmp_path)], tiny_defaults=recipe.tiny_defaults
        )
        assert size % config.rollout_buffer_size == 0, (name, size, config.rollout_buffer_size)


def test_configs_do_not_emit_third_party_deprecations(tmp_path, recwarn):
    RECIPES["madpo"].config_class()(output_dir=str(tmp_path))
    assert not [str(w.message) for w in recwarn if "gradient_checkpointing` is deprecated" in str(w.message)]
    assert os.environ.get("DS_ACCELERATOR") == "cpu"  # DeepSpeed's "Setting accelerator to CPU" line is silenced


@pytest.mark.slow
def test_default_run_is_quiet(tmp_path, tiny_path, caplog, recwarn):
    """The built-in task and the recipe defaults fit each other (no "not a multiple of one rollout batch"
    warning), and the known-harmless third-party deprecation warnings are filtered."""
    import logging

    caplog.set_level(logging.WARNING)
    run_command("magrpo", ["--max_steps", "1", "--eval_num_samples", "2", "--output_dir", str(tmp_path)])
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("trl_marl") and r.levelno >= logging.WARNING]
    assert not ours, ours
    noisy = [str(w.message) for w in recwarn if "gradient_checkpointing` is deprecated" in str(w.message)]
    assert not noisy, noisy
    assert os.environ.get("DS_ACCELERATOR") == "cpu"  # DeepSpeed's "Setting accelerator to CPU" line is silenced


@pytest.mark.slow
def test_accelerate_config_multi_cpu_really_launches_two_ranks(tmp_path, tiny_path):
    """`trl-marl magrpo --accelerate_config multi_cpu`: the shipped config, `accelerate launch` of the packaged
    launcher, two ranks training, rank 0 alone printing and saving."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-c", "import sys; from trl_marl.cli import main; sys.exit(main())",
        "magrpo", "--accelerate_config", "multi_cpu", "--output_dir", str(tmp_path / "ddp"), "--max_steps", "1",
        "--eval_num_samples", "2", "--rollout_buffer_size", "2", "--num_generations", "2", "--disable_tqdm", "true",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("eval reward after training") == 1
    assert (tmp_path / "ddp" / "agent_2" / "model.safetensors").exists()


def test_task_choices_are_the_registered_tasks():
    from trl_marl.cli.recipe_args import RecipeArguments
    from trl_marl.tasks import TASKS

    assert RecipeArguments.__dataclass_fields__["task"].metadata["choices"] == list(TASKS)


def test_deprecated_flag_counts_as_the_users_value(tmp_path):
    """`--max_new_tokens 8` (the old name) wins over the tiny run's default `max_completion_length` (16)."""
    from trl_marl.cli.recipe_args import parse_recipe_args

    with pytest.warns(TrlMarlFutureWarning, match="max_new_tokens"):
        _, config = parse_recipe_args(
            RECIPES["magrpo"].config_class(), argv=["--output_dir", str(tmp_path), "--max_new_tokens", "8"]
        )
    assert config.max_completion_length == 8 and config.max_new_tokens == 8


def test_resume_and_push_flags_reach_the_trainer(tmp_path, tiny_path):
    """`--resume_from_checkpoint` goes to `train()`, `--push_to_hub` pushes without sending a task name as a Hub
    dataset, and TRL's names reach the trainer (`model=`, `reward_funcs=`, `peft_config=`)."""
    from types import SimpleNamespace as NS

    from trl_marl.checkpointing.checkpoint import PreemptionHandler
    from trl_marl.cli.recipe_args import parse_recipe_args, run_recipe

    class FakeTrainer:
        def __init__(self, **kwargs):
            self.kwargs, self.accelerator = kwargs, NS(is_main_process=True, num_processes=1)
            self.state, self.num_agents = NS(global_step=2), 2
            self._preemption = PreemptionHandler()  # the CLI handles SIGTERM around train() and the final save

        def evaluate_reward(self):
            return {"eval_reward": 0.25}

        def train(self, resume_from_checkpoint=None):
            self.resumed = resume_from_checkpoint
            return NS(metrics={"eval_reward": 0.75})

        def save_model(self, output_dir):
            self.saved = output_dir

        def push_to_hub(self, dataset_name=None):
            self.pushed = ("pushed", dataset_name)

    argv = ["--output_dir", str(tmp_path), "--model_name_or_path", tiny_path, "--resume_from_checkpoint",
            str(tmp_path / "checkpoint-2"), "--push_to_hub", "true", "--hub_model_id", "me/team"]  # fmt: skip
    recipe_args, config = parse_recipe_args(RECIPES["magrpo"].config_class(), argv=argv)
    t = run_recipe(FakeTrainer, recipe_args, config)
    assert t.resumed == str(tmp_path / "checkpoint-2") and t.pushed == ("pushed", None)
    assert t.before_reward is None and t.after_reward == 0.75  # no "before" on a resumed run; train()'s final eval
    assert t.kwargs["model"] == tiny_path and t.kwargs["peft_config"] is None and callable(t.kwargs["reward_funcs"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--some_unknown_flag", "1"], "unknown flag --some_unknown_flag."),
        (["--num_agent", "3"], "unknown flag --num_agent (did you mean --num_agents?)"),  # no prefix matching
        (["--critic_learning_rate", "1e-4"], "unknown flag --critic_learning_rate"),  # another command's flag
    ],
)
def test_unknown_or_abbreviated_flag_is_one_line_naming_the_closest_flags(argv, message, capsys):
    for run in (lambda: cli_main(["madpo", *argv]), lambda: run_command("madpo", argv)):  # the command and a recipe
        with pytest.raises(SystemExit) as exit_info:
            run()
        text = str(exit_info.value.code)
        assert text.startswith("trl-marl madpo: ") and message in text and "\n" not in text
        assert "usage:" not in capsys.readouterr().out  # not accelerate's (or argparse's) whole usage


def test_unknown_yaml_key_names_the_file_and_the_closest_field(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("num_agentz: 3\nlearning_rate: 0.1\n")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["magrpo", "--config", str(config)])
    assert f"unknown key 'num_agentz' in --config {config} (did you mean num_agents?)" in str(exit_info.value.code)


def test_a_preference_dataset_on_the_command_line_trains_madpo_without_a_reward(tmp_path):
    """`trl-marl madpo --dataset_name prefs.jsonl` with TRL's preference columns per agent trains on those pairs (no
    --reward_funcs, no evaluation); an RL command is pointed at madpo / marlhf instead."""
    from datasets import Dataset

    rows = [
        {"prompt_1": f"Q{i}: say hi", "chosen_1": " hi", "rejected_1": " no", "prompt_2": f"Q{i}: bye"}
        | {"chosen_2": " bye", "rejected_2": " what"}
        for i in range(4)
    ]
    data = tmp_path / "prefs.jsonl"
    Dataset.from_list(rows).to_json(str(data))
    out = tmp_path / "out"
    run_command("madpo", ["--dataset_name", str(data), "--max_steps", "1", "--output_dir", str(out)])
    assert (out / "agent_2" / "model.safetensors").exists()
    with pytest.raises(ValueError, match=r"holds preference pairs .*train on them with `trl-marl madpo`"):
        run_command("magrpo", ["--dataset_name", str(data), "--max_steps", "1", "--output_dir", str(tmp_path / "x")])
