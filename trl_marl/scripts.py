"""What the recipes in `recipes/` share: their script arguments, building the team and task, and the run.

A recipe is `accelerate launch recipes/<algo>.py [--flag value ...] [--config x.yaml]`. Every config field is a flag
(and a YAML key) through TRL's `TrlParser`. With no model given, the run uses the project's tiny local model and the
recipe's embedded defaults, tuned so that it finishes in a few minutes on a CPU and visibly learns.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RecipeArguments",
    "CriticRecipeArguments",
    "critic_source",
    "parse_recipe_args",
    "resume_argument",
    "run_recipe",
    "explicit_flags",
    "TINY_DEFAULTS",
]

# `--config` is TrlParser's own flag: argparse does not list it, so every recipe's --help says it here.
CONFIG_HELP = (
    "--config FILE.yaml: read flags from a YAML file (keys are the flag names without '--', e.g. 'learning_rate: "
    "1e-5'); flags given on the command line override the file."
)

# Defaults for the no-argument run on the tiny local model (they are only applied to flags the user did not pass).
TINY_DEFAULTS: dict[str, Any] = {
    "learning_rate": 3e-3,
    "num_generations": 4,
    "max_new_tokens": 16,
    "rollout_buffer_size": 8,
    "max_steps": 60,
    "logging_steps": 10,
    "eval_num_samples": 16,
    "save_strategy": "no",
    "report_to": "none",
}


@dataclass
class RecipeArguments:
    """Arguments of a recipe that are not trainer config fields.

    Parameters:
        task: built-in task (`trl_marl.tasks.TASKS`): `coordination`, `length_ratio`, `code`, `writing`, ...
        model_name_or_path: Hub id or local path of the agents' model (a homogeneous team: loaded once per agent).
            Empty: the project's tiny local model (built offline on first use).
        agent_models: one model id / path per agent, for a heterogeneous team (overrides `model_name_or_path`).
        dtype: weights dtype when loading (`auto`, `bfloat16`, `float16`, `float32`).
        attn_implementation: attention implementation (`sdpa`, `eager`, `flash_attention_2`, ...).
        tiny_seed: seed of the tiny local model when no model is given.
    """

    task: str = field(default="coordination", metadata={"help": "Built-in task name."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Agents' model id or path; empty = the tiny local model."}
    )
    agent_models: list[str] | None = field(
        default=None, metadata={"help": "One model id/path per agent (heterogeneous team)."}
    )
    dtype: str | None = field(default=None, metadata={"help": "Weights dtype: auto, bfloat16, float16, float32."})
    attn_implementation: str | None = field(default=None, metadata={"help": "Attention implementation."})
    tiny_seed: int = field(default=0, metadata={"help": "Seed of the tiny local model."})
    # not a flag (init=False): the names the user set on the command line or in --config, filled by parse_recipe_args
    explicit: set[str] = field(init=False, default_factory=set, repr=False)


@dataclass
class CriticRecipeArguments(RecipeArguments):
    """`RecipeArguments` plus the critic's model, for the actor-critic recipes.

    Parameters:
        critic_model_name_or_path: the critic's model id or path. Empty: the agents' model (`critic_source`), or for
            IAC with separate critics a copy of each agent's model.
    """

    critic_model_name_or_path: str | None = field(
        default=None, metadata={"help": "The critic's model id or path; empty = the agents' model."}
    )


def critic_source(recipe_args: CriticRecipeArguments) -> str:
    """The critic's model: the one given, else the (first) agents' model, else the tiny local model."""
    if recipe_args.critic_model_name_or_path:
        return recipe_args.critic_model_name_or_path
    if recipe_args.agent_models:
        return recipe_args.agent_models[0]
    if recipe_args.model_name_or_path:
        return recipe_args.model_name_or_path
    from .testing import tiny_model_path

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
    description: str | None = None,
):
    """Parse `(script arguments, config)` from the command line / `--config` YAML.

    `--help` shows `description` (default: the calling recipe's module docstring) and how `--config` works.

    `defaults` (always) and `TINY_DEFAULTS` updated with the recipe's `tiny_defaults` (when no model is given) fill
    only the fields the user did not set on the command line or in the YAML file.
    """
    import argparse

    from trl import TrlParser

    if description is None:  # the calling recipe's module docstring
        description = sys._getframe(1).f_globals.get("__doc__") or ""
    parser_kwargs = dict(
        description=description.rstrip() + "\n\n" + CONFIG_HELP, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser = TrlParser((script_args_cls, config_cls), **parser_kwargs)
    recipe_args, config = parser.parse_args_and_config(args=argv)
    merged = dict(defaults or {})
    if recipe_args.model_name_or_path is None and recipe_args.agent_models is None:
        merged = {**TINY_DEFAULTS, **(tiny_defaults or {}), **merged}
    explicit = explicit_flags(argv)
    overrides = {k: v for k, v in merged.items() if k not in explicit}
    if overrides:
        parser = TrlParser((script_args_cls, config_cls), **parser_kwargs)
        parser.set_defaults(**overrides)
        recipe_args, config = parser.parse_args_and_config(args=argv)
    recipe_args.explicit = explicit
    return recipe_args, config


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


def run_recipe(
    trainer_cls: type,
    recipe_args: RecipeArguments,
    config: Any,
    extra_trainer_kwargs: Callable[[Any], dict] | None = None,
) -> Any:
    """Build the task and the team, print the eval reward, train, print it again, save (and push)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from .tasks import load_task

    task = load_task(recipe_args.task)
    if task.num_agents != config.num_agents:
        if "num_agents" in recipe_args.explicit:
            raise ValueError(
                f"--num_agents {config.num_agents} does not fit the built-in task {task.name!r}, which is played by "
                f"{task.num_agents} agents (roles: {', '.join(task.roles)}): pass --num_agents {task.num_agents} or "
                "leave it out"
            )
        config.num_agents = task.num_agents
    model_config = {
        k: v
        for k, v in {"dtype": recipe_args.dtype, "attn_implementation": recipe_args.attn_implementation}.items()
        if v
    }
    team: dict[str, Any]
    if recipe_args.agent_models:
        team = {"agents": list(recipe_args.agent_models)}
    elif recipe_args.model_name_or_path:
        team = {"agent_model": recipe_args.model_name_or_path}
    else:
        from .testing import tiny_model_path

        team = {"agent_model": tiny_model_path(seed=recipe_args.tiny_seed)}
    kwargs = dict(
        reward_func=task.reward_func,
        formatters=task.formatters,
        external_transition=task.external_transition,
        metrics_callback=task.metrics_callback,
        train_dataset=task.train_dataset,
        eval_dataset=task.eval_dataset,
        model_config=model_config or None,
        args=config,
        **team,
    )
    if extra_trainer_kwargs is not None:
        kwargs.update(extra_trainer_kwargs(task))
    trainer = trainer_cls(**kwargs)
    main = trainer.accelerator.is_main_process
    resume = resume_argument(config.resume_from_checkpoint)
    before = trainer.evaluate_reward()["eval_reward"] if task.eval_dataset is not None and not resume else None
    if main and before is not None:
        print(f"[trl_marl] task={task.name} eval reward before training: {before:.4f}")
    trainer.train(resume_from_checkpoint=resume)
    if trainer.state.global_step == 0:  # e.g. MADPO collected no preference pair: nothing was learnt
        if main:
            print(
                f"[trl_marl] error: {trainer._name} took no training step (see the warning above); nothing was "
                f"saved to {config.output_dir}",
                file=sys.stderr,
            )
        _end_processes(trainer)
        raise SystemExit(1)
    after = trainer.evaluate_reward()["eval_reward"] if task.eval_dataset is not None else None
    if main and after is not None:
        since = f"before: {before:.4f}" if before is not None else "resumed run"
        print(f"[trl_marl] task={task.name} eval reward after training:  {after:.4f} ({since})")
    trainer.save_model(config.output_dir)
    if main:
        n = trainer.num_agents
        what = f"{n} agent models ({', '.join(f'agent_{i + 1}/' for i in range(n))})"
        if getattr(trainer, "num_roles", n) != n:  # centralized: ONE model writes every role
            what = f"1 centralized model (agent_1/) that writes all {trainer.num_roles} roles"
        print(f"[trl_marl] saved {what} and team.json to {config.output_dir}")
    if config.push_to_hub:
        trainer.push_to_hub()  # a built-in task is no Hub dataset: the card names none
    trainer.before_reward, trainer.after_reward = before, after
    _end_processes(trainer)
    return trainer


def _end_processes(trainer: Any) -> None:
    if trainer.accelerator.num_processes > 1:
        # Tear the process group down before interpreter exit: a gloo group left to the C++ static destructors can
        # abort a rank at exit ("terminate called without an active exception") after the work is done.
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()
