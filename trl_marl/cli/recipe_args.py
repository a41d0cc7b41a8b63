"""What the recipes in `recipes/` share: their script arguments, building the team and task, and the run.

A recipe is `accelerate launch recipes/<algo>.py [--flag value ...] [--config x.yaml]`, or `trl-marl <algo> ...` from
an installed wheel (`trl_marl.cli`: both call `trl_marl.cli.recipes.run_command`). Every config field is a flag (and
a YAML key) through TRL's `TrlParser`, beside TRL's `ModelConfig` and `ScriptArguments` flags. With no model given,
the run uses the project's tiny local model and the recipe's embedded defaults, tuned so that it finishes in a few
minutes on a CPU and visibly learns.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl import ModelConfig, ScriptArguments

from trl_marl.tasks import TASKS, load_task

__all__ = [
    "RecipeArguments",
    "CriticRecipeArguments",
    "critic_source",
    "parse_recipe_args",
    "resume_argument",
    "run_recipe",
    "train_and_save",
    "explicit_flags",
    "import_object",
    "load_recipe_dataset",
    "recipe_formatters",
    "recipe_reward",
    "recipe_model_config",
    "TINY_DEFAULTS",
    "CONFIG_HELP",
    "HelpFormatter",
]

# `--config` is TrlParser's own flag: argparse does not list it, so every recipe's --help says it here.
CONFIG_HELP = (
    "--config FILE.yaml: read flags from a YAML file (keys are the flag names without '--', e.g. 'learning_rate: "
    "1e-5'); flags given on the command line override the file."
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """`--help` keeps the description's line breaks and shows each flag's default (transformers' parsers show it)."""


# Defaults for the no-argument run on the tiny local model (they are only applied to flags the user did not pass).
TINY_DEFAULTS: dict[str, Any] = {
    "learning_rate": 3e-3,
    "num_generations": 4,
    "max_completion_length": 16,
    "rollout_buffer_size": 8,
    "max_steps": 60,
    "logging_steps": 10,
    "eval_num_samples": 16,
    "save_strategy": "no",
    "report_to": "none",
}


@dataclass
class RecipeArguments(ScriptArguments, ModelConfig):
    """Arguments of a recipe / `trl-marl` command that are not trainer config fields.

    TRL's own script arguments come first, with their meaning in TRL: `ModelConfig` (`--model_name_or_path`,
    `--model_revision`, `--dtype`, `--attn_implementation`, `--use_peft`, `--lora_*`, `--load_in_4bit`, ...) and
    `ScriptArguments` (`--dataset_name`, `--dataset_config`, `--dataset_train_split`, `--dataset_test_split`).

    Parameters:
        task: a registered task (`trl_marl.tasks.TASKS`: the built-in `coordination`, `length_ratio`, `code`,
            `writing`, and those of installed packages), used when no `dataset_name` is given.
        agent_models: one model id / path per agent, for a heterogeneous team (overrides `model_name_or_path`).
        trust_remote_code: allow custom model code from the Hub when loading the agents.
        tiny_seed: seed of the tiny local model when no model is given.
        prompt_templates: with `dataset_name`: one `str.format` template per agent (or one for all), filled with the
            row's columns, e.g. `"{question} You write the plan."`. Default: the row's `prompt` column.
        formatters: with `dataset_name`: one import path `module:function` per agent (or one for all),
            `formatter(row) -> str | chat messages`. Exclusive with `prompt_templates`.
        reward_funcs: reward functions as import paths `module:function` (or `module.function`). A team reward in
            trl_marl's convention (see `trl_marl.rewards`) is used as is; a TRL per-completion reward
            (`f(completions, **columns)`, e.g. `trl.rewards:think_format_reward`) is lifted to the team
            (`trl_marl.rewards.lift`: applied to each agent's completions and averaged, or to `reward_agent` only).
            Several functions are summed with the config's `--reward_weights`. Replaces the task's reward.
        reward_agent: apply lifted per-completion rewards to this agent only (0-based); default: every agent, mean.
        critic_model_name_or_path: the critic's model id or path (actor-critic trainers, and `marlhf` / `marlhf-iter`
            with `--rl_algorithm maac|iac`); empty: the agents' model.
    """

    task: str = field(
        default="coordination",
        metadata={"help": "Registered task (used when --dataset_name is not given).", "choices": list(TASKS)},
    )
    agent_models: list[str] | None = field(
        default=None, metadata={"help": "One model id/path per agent (heterogeneous team)."}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow custom model code when loading."})
    tiny_seed: int = field(default=0, metadata={"help": "Seed of the tiny local model."})
    prompt_templates: list[str] | None = field(
        default=None,
        metadata={"help": "With --dataset_name: one str.format template per agent (or one), filled with the row."},
    )
    formatters: list[str] | None = field(
        default=None, metadata={"help": "With --dataset_name: one formatter import path module:function per agent."}
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward functions module:function (team rewards, or TRL per-completion rewards, lifted)."},
    )
    reward_agent: int | None = field(
        default=None, metadata={"help": "Apply lifted per-completion rewards to this agent only (0-based)."}
    )
    critic_model_name_or_path: str | None = field(
        default=None, metadata={"help": "The critic's model id or path (actor-critic); empty = the agents' model."}
    )
    # not a flag (init=False): the names the user set on the command line or in --config, filled by parse_recipe_args
    explicit: set[str] = field(init=False, default_factory=set, repr=False)


# Kept for scripts written against the earlier recipes: the critic flag now lives on `RecipeArguments`.
CriticRecipeArguments = RecipeArguments


def critic_source(recipe_args: RecipeArguments) -> str:
    """The critic's model: the one given, else the (first) agents' model, else the tiny local model."""
    if recipe_args.critic_model_name_or_path:
        return recipe_args.critic_model_name_or_path
    if recipe_args.agent_models:
        return recipe_args.agent_models[0]
    if recipe_args.model_name_or_path:
        return recipe_args.model_name_or_path
    from trl_marl.testing import tiny_model_path

    return tiny_model_path(seed=recipe_args.tiny_seed)


def resume_argument(value: str | bool | None) -> str | bool | None:
    """`--resume_from_checkpoint` as `Trainer.train` takes it: `true` / `latest` mean the latest complete checkpoint
    of `output_dir` (True), `false` or empty means a fresh start (None), anything else is a checkpoint folder."""
    if value is None or isinstance(value, bool):
        return value or None
    text = str(value).strip()
    if text.lower() in ("true", "latest", "last", "yes", "1"):
        return True
    if text.lower() in ("", "false", "no", "none", "0"):
        return None
    return text


def parse_recipe_args(
    config_cls: type,
    defaults: dict[str, Any] | None = None,
    argv: list[str] | None = None,
    script_args_cls: type = RecipeArguments,
    tiny_defaults: dict[str, Any] | None = None,
    prog: str | None = None,
    description: str | None = None,
):
    """Parse `(script arguments, config)` from the command line / `--config` YAML with TRL's `TrlParser`.

    `defaults` (always) and `TINY_DEFAULTS` updated with the recipe's `tiny_defaults` (when no model is given) fill
    only the fields the user did not set on the command line or in the YAML file, and only those the config class
    has. A tiny default that contradicts what the user set is dropped (with `--num_turns 2`, the actor-critic
    trainers need one generation per prompt: their own default). `--help` shows `description` (default: the calling
    recipe's module docstring) and how `--config` works.
    """
    from dataclasses import fields

    from trl import TrlParser

    from trl_marl.generation.choice import parse_use_vllm

    if description is None:  # the calling recipe's module docstring
        description = sys._getframe(1).f_globals.get("__doc__") or ""
    parser_kwargs = dict(
        description=description.rstrip() + "\n\n" + CONFIG_HELP,
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # a prefix of a flag is an unknown flag, never silently that flag
    )

    known = {f.name for f in fields(config_cls)}

    def parser():
        p = TrlParser((script_args_cls, config_cls), prog=prog, **parser_kwargs)
        for action in p._actions:  # transformers reads a `bool | str` field as a bool: take "auto" too
            if action.dest == "use_vllm":
                action.type = parse_use_vllm
        p.set_defaults(**{k: v for k, v in (defaults or {}).items() if k in known})  # as --help shows them
        return p

    recipe_args, config, config_remaining, cli_remaining = parser().parse_args_and_config(
        args=argv, return_remaining_strings=True, separate_remaining_strings=True
    )
    check_unknown_flags(prog or "trl-marl", parser(), config_remaining, cli_remaining, argv or sys.argv[1:])
    merged = dict(defaults or {})
    if recipe_args.model_name_or_path is None and recipe_args.agent_models is None:
        merged = {**TINY_DEFAULTS, **(tiny_defaults or {}), **merged}
    explicit = explicit_flags(argv)
    # a value given under a deprecated alias (`--max_new_tokens`) is the user's value of the primary name
    explicit |= {new for old, new in getattr(config_cls, "_deprecated_aliases", {}).items() if old in explicit}
    overrides = {k: v for k, v in merged.items() if k not in explicit and k in known}
    if config.num_turns > 1 and _field_default(config_cls, "num_generations") == 1:
        overrides.pop("num_generations", None)
    if overrides:
        p = parser()
        p.set_defaults(**overrides)
        recipe_args, config, *_ = p.parse_args_and_config(
            args=argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    recipe_args.explicit = explicit
    return recipe_args, config


def option_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The `--long` flags `parser` accepts."""
    return [opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")]


def check_unknown_flags(
    prog: str,
    parser: argparse.ArgumentParser,
    config_remaining: list[str],
    cli_remaining: list[str],
    argv: list[str],
    allowed: Sequence[str] = (),
) -> None:
    """Flags and `--config` YAML keys that `parser` does not know (and that are not in `allowed`, e.g. `accelerate
    launch`'s): exit with ONE line naming each and the closest known flags, instead of a traceback or accelerate's
    whole usage."""
    import difflib

    known = [f for f in (*option_flags(parser), *allowed) if "-" not in f[2:]]  # `--num_agents`, not `--num-agents`
    config_file = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"), None)
    problems = []
    for in_config, remaining in ((False, cli_remaining), (True, config_remaining)):
        for token in remaining:
            flag = token.split("=", 1)[0]
            if not flag.startswith("--") or flag in allowed:
                continue
            close = difflib.get_close_matches(flag.replace("-", "_"), known, n=3, cutoff=0.6)
            if in_config:
                close = [c[2:] for c in close]
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            where = f"key {flag[2:]!r} in --config {config_file}" if in_config else f"flag {flag}"
            problems.append(f"unknown {where}{hint}")
    if problems:
        raise SystemExit(
            f"{prog}: {'; '.join(problems)}. `{prog} --help` lists every flag; flags are never abbreviated"
        )


def _field_default(cls: type, name: str) -> Any:
    from dataclasses import MISSING, fields

    for f in fields(cls):
        if f.name == name:
            return f.default if f.default is not MISSING else None
    return None


def explicit_flags(argv: list[str] | None = None) -> set[str]:
    """Names of the config fields the user set, on the command line or in the `--config` YAML file."""
    import sys

    import yaml

    argv = sys.argv[1:] if argv is None else argv
    names = {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    if "config" in names:
        path = (
            argv[argv.index("--config") + 1]
            if "--config" in argv
            else next(a.split("=", 1)[1] for a in argv if a.startswith("--config="))
        )
        with open(path) as f:
            names |= set((yaml.safe_load(f) or {}).keys())
    return names


def import_object(path: str) -> Any:
    """`module:attr` or `module.attr` -> the object (the current directory is importable, as in TRL's scripts)."""
    import importlib
    import sys

    module_name, sep, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"{path!r} is not an import path; write module:function (e.g. trl.rewards:think_format_reward)"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"could not import {path!r}: {type(exc).__name__}: {exc}") from exc


def load_recipe_dataset(recipe_args: RecipeArguments) -> tuple[Any, Any]:
    """`(train, eval)` from `--dataset_name`: a Hub id, a dataset folder (`save_to_disk` or data files) or one data
    file (`.json`, `.jsonl`, `.csv`, `.parquet`), split by `--dataset_train_split` / `--dataset_test_split` (the eval
    split is None when the dataset has no such split)."""
    from datasets import DatasetDict, load_dataset, load_from_disk

    name = recipe_args.dataset_name
    if recipe_args.dataset_streaming:
        raise ValueError("dataset_streaming is not supported: the trainers draw task items by index (a map dataset)")
    if os.path.isdir(name) and (
        os.path.exists(os.path.join(name, "dataset_dict.json")) or os.path.exists(os.path.join(name, "state.json"))
    ):
        data = load_from_disk(name)
    elif os.path.isfile(name):
        ext = os.path.splitext(name)[1].lstrip(".")
        builder = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}.get(ext)
        if builder is None:
            raise ValueError(
                f"dataset_name {name!r}: unsupported file type {ext!r}; use .json, .jsonl, .csv, .parquet"
            )
        data = load_dataset(builder, data_files={recipe_args.dataset_train_split: name})
    else:
        if _looks_local(name):  # never a Hub id: say so now instead of waiting on the Hub and blaming it
            raise FileNotFoundError(
                f"dataset_name {name!r}: no such file or folder (a local dataset is a .json / .jsonl / .csv / "
                ".parquet file, a folder of them, or a `save_to_disk` folder; a Hub id has the form "
                "'namespace/name')"
            )
        data = load_dataset(name, name=recipe_args.dataset_config)
    if not isinstance(data, DatasetDict):
        data = DatasetDict({recipe_args.dataset_train_split: data})
    if recipe_args.dataset_train_split not in data:
        raise ValueError(
            f"dataset {name!r} has no split {recipe_args.dataset_train_split!r} (dataset_train_split); "
            f"splits: {sorted(data)}"
        )
    train = data[recipe_args.dataset_train_split]
    test = data.get(recipe_args.dataset_test_split)
    return train, test


def _looks_local(name: str) -> bool:
    """A name that can only mean a local path: absolute, `./`, `../`, `~`, more than one `/`, a backslash, or a data
    file's extension."""
    return (
        os.path.isabs(name)
        or name.startswith((".", "~"))
        or name.count("/") > 1
        or "\\" in name
        or name.endswith((".json", ".jsonl", ".csv", ".parquet", ".arrow"))
    )


def _template_formatter(template: str) -> Callable[[dict], str]:
    def formatter(item: dict) -> str:
        return template.format(**item)

    formatter.__qualname__ = f"template({template!r})"
    return formatter


def recipe_formatters(recipe_args: RecipeArguments, num_agents: int) -> list[Callable] | None:
    """Per-agent formatters from `--prompt_templates` or `--formatters` (None: the trainer's default)."""
    if recipe_args.prompt_templates and recipe_args.formatters:
        raise ValueError("pass either prompt_templates or formatters, not both")
    given = recipe_args.prompt_templates or recipe_args.formatters
    if not given:
        return None
    if len(given) not in (1, num_agents):
        flag = "prompt_templates" if recipe_args.prompt_templates else "formatters"
        raise ValueError(f"{flag} has {len(given)} entries; give 1 or num_agents={num_agents}")
    build = _template_formatter if recipe_args.prompt_templates else import_object
    made = [build(g) for g in given]
    return made * num_agents if len(made) == 1 else made


def recipe_reward(recipe_args: RecipeArguments, num_agents: int) -> list[Callable] | None:
    """The team rewards named by `--reward_funcs` / `--reward_agent` (None: the task's); the trainer sums a list with
    the config's `reward_weights`."""
    from trl_marl.rewards import is_team_reward, lift

    if not recipe_args.reward_funcs:
        return None
    funcs = []
    for path in recipe_args.reward_funcs:
        func = import_object(path)
        funcs.append(func if is_team_reward(func, num_agents) else lift(func, agent=recipe_args.reward_agent))
    return funcs


def recipe_model_config(recipe_args: RecipeArguments) -> dict[str, Any]:
    """`model_config=` for the trainer from TRL's `ModelConfig` flags (dtype, attention, revision, quantization)."""
    from trl import get_quantization_config

    cfg: dict[str, Any] = {
        "dtype": recipe_args.dtype,
        "attn_implementation": recipe_args.attn_implementation,
        "revision": recipe_args.model_revision if recipe_args.model_revision != "main" else None,
        "trust_remote_code": recipe_args.trust_remote_code or None,
    }
    quantization = get_quantization_config(recipe_args)  # TRL's: --load_in_4bit / --load_in_8bit
    if quantization is not None:
        cfg["model_kwargs"] = {"quantization_config": quantization}
    return {k: v for k, v in cfg.items() if v is not None}


def run_recipe(
    trainer_cls: type,
    recipe_args: RecipeArguments,
    config: Any,
    extra_trainer_kwargs: Callable[[Any], dict] | None = None,
) -> Any:
    """Build the data (built-in task or `--dataset_name`) and the team, train, print the final evaluation, save (and
    push). The evaluation before and after training uses the task reward (or `--reward_funcs`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from trl import get_peft_config

    from trl_marl.trainers.preference.madpo import PreferenceCollectionMixin
    from trl_marl.trainers.preference.preference_data import looks_like_preference_data

    if recipe_args.dataset_name:
        train, test = load_recipe_dataset(recipe_args)
        task_reward, task_formatters, transition, metrics_cb, data_name = None, None, None, None, None
    else:
        task = load_task(recipe_args.task)
        if task.num_agents != config.num_agents:
            if "num_agents" in recipe_args.explicit:
                raise ValueError(
                    f"--num_agents {config.num_agents} does not fit the task {task.name!r}, which is played "
                    f"by {task.num_agents} agents (roles: {', '.join(task.roles)}): pass --num_agents "
                    f"{task.num_agents} or leave it out"
                )
            config.num_agents = task.num_agents
        train, test = task.train_dataset, task.eval_dataset
        task_reward, task_formatters = task.reward_func, task.formatters
        transition, metrics_cb, data_name = task.external_transition, task.metrics_callback, task.name
    n = config.num_agents
    reward = recipe_reward(recipe_args, n) or task_reward
    # a dataset of preference pairs (TRL's columns per agent, docs/offline-preference.md) trains the preference
    # trainers on exactly its pairs, with no reward; evaluation needs a reward, so it runs only with --reward_funcs
    preference_data = bool(recipe_args.dataset_name) and looks_like_preference_data(train)
    if preference_data and not issubclass(trainer_cls, PreferenceCollectionMixin):
        raise ValueError(
            f"--dataset_name {recipe_args.dataset_name} holds preference pairs (prompt / chosen / rejected columns): "
            "train on them with `trl-marl madpo` or `trl-marl marlhf`; the RL commands need task items and "
            "--reward_funcs"
        )
    if reward is None and not preference_data:
        raise ValueError("--dataset_name needs --reward_funcs module:function (the team reward)")
    if reward is None:
        test = None  # no task reward to evaluate with
    team: dict[str, Any]
    if recipe_args.agent_models:
        team = {"agents": list(recipe_args.agent_models)}
    elif recipe_args.model_name_or_path:
        team = {"model": recipe_args.model_name_or_path}
    else:
        from trl_marl.testing import tiny_model_path

        team = {"model": tiny_model_path(seed=recipe_args.tiny_seed)}
    kwargs = dict(
        reward_funcs=reward,
        formatters=recipe_formatters(recipe_args, n) or task_formatters,
        external_transition=transition,
        metrics_callback=metrics_cb,
        train_dataset=train,
        eval_dataset=test,
        model_config=recipe_model_config(recipe_args) or None,
        peft_config=get_peft_config(recipe_args),  # TRL's: --use_peft --lora_r ...
        args=config,
        **team,
    )
    if extra_trainer_kwargs is not None:
        kwargs.update(extra_trainer_kwargs(recipe_args))
    trainer = trainer_cls(**kwargs)
    label = f"task={data_name}" if data_name else f"dataset={recipe_args.dataset_name}"
    return train_and_save(trainer, config, label, test is not None, recipe_args.dataset_name)


def train_and_save(trainer: Any, config: Any, label: str, evaluate: bool, dataset_name: str | None = None) -> Any:
    """What every recipe does with its trainer: the evaluation reward before (unless resuming) and after training
    (with an eval dataset), training (resuming from `config.resume_from_checkpoint`), saving the team to
    `output_dir` and pushing it with `push_to_hub`. Exits with status 1 when no training step was taken."""
    main = trainer.accelerator.is_main_process
    resume = resume_argument(config.resume_from_checkpoint)
    before = trainer.evaluate_reward()["eval_reward"] if evaluate and not resume else None
    if main and before is not None:
        print(f"[trl_marl] {label} eval reward before training: {before:.4f}")
    # SIGTERM / SIGUSR1 from the start of train() to the end of the save below: inside train() the trainer writes a
    # checkpoint at its next safe point; after it, the evaluation and the save finish, then the run exits with 75
    from trl_marl.trainers.checkpoints import preemption_covered

    saved = f"the trained team is saved in {config.output_dir}"
    with preemption_covered(trainer, saved):
        out = trainer.train(resume_from_checkpoint=resume)
        if trainer.state.global_step == 0:  # e.g. MADPO collected no preference pair: nothing was learnt
            if main:
                print(
                    f"[trl_marl] error: {trainer._name} took no training step (see the warning above); nothing was "
                    f"saved to {config.output_dir}",
                    file=sys.stderr,
                )
            _end_processes(trainer)
            raise SystemExit(1)
        after = (out.metrics or {}).get("eval_reward") if out is not None else None
        if after is None and evaluate:  # trainers that do not evaluate at the end of train()
            after = trainer.evaluate_reward()["eval_reward"]
        if main and after is not None:
            since = f" (before: {before:.4f})" if before is not None else ""
            print(f"[trl_marl] {label} eval reward after training:  {after:.4f}{since}")
        trainer.save_model(config.output_dir)
        if main:
            n = trainer.num_agents
            what = f"{n} agent models ({', '.join(f'agent_{i + 1}/' for i in range(n))})"
            if getattr(trainer, "num_roles", n) != n:  # centralized: ONE model writes every role
                what = f"1 centralized model (agent_1/) that writes all {trainer.num_roles} roles"
            print(f"[trl_marl] saved {what} and team.json to {config.output_dir}")
    if config.push_to_hub:
        # a Hub dataset only when the data came from one (a built-in task is no Hub dataset: the card names none)
        trainer.push_to_hub(dataset_name=dataset_name)
    trainer.before_reward, trainer.after_reward = before, after
    _end_processes(trainer)
    return trainer


def _end_processes(trainer: Any) -> None:
    if trainer.accelerator.num_processes > 1:
        # Tear the process group down before interpreter exit: a gloo group left to the C++ static destructors can
        # abort a rank at exit ("terminate called without an active exception") after the work is done.
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()
