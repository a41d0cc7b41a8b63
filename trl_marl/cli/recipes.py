"""The training commands of `trl-marl` (and of `recipes/*.py`): one `Recipe` per subcommand.

Each recipe is a registered algorithm (`trl_marl.trainers.registry`, which names its trainer and config and imports
them lazily, so `trl-marl --help` is fast) with the recipe's own defaults and the defaults of the no-model run on the
tiny local model. `run_command(name, argv)` parses the flags with TRL's
`TrlParser` (every config field is a flag and a `--config` YAML key) and runs `trl_marl.cli.recipe_args.run_recipe`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trl_marl.cli.agentic import AGENTIC_DEFAULTS, AGENTIC_TINY_DEFAULTS, run_agentic
from trl_marl.cli.recipe_args import (
    CONFIG_HELP,
    HelpFormatter,
    RecipeArguments,
    critic_source,
    explicit_flags,
    parse_recipe_args,
    run_recipe,
)
from trl_marl.trainers.registry import algorithms, get_algorithm

__all__ = ["Recipe", "RECIPES", "MAGRPOScriptArguments", "AgenticScriptArguments", "make_parser", "run_command"]

# the tiny model's no-argument MADPO run: ~256 pairs from 64 items, 4 epochs
MADPO_TINY_DEFAULTS = {
    "rollout_buffer_size": 16,
    "preference_num_candidates": 4,
    "preference_pairs_per_sample": 4,
    "train_batch_size": 8,
    "num_train_epochs": 4,
    "max_steps": -1,
}
MARLHF_TINY_DEFAULTS = {
    "preference_num_candidates": 8,
    "pair_selection": "all",
    "preference_pairs_per_sample": None,
    "reward_learning_rate": 1e-3,
    "reward_num_train_epochs": 2,
    "reward_max_length": 40,
    "rollout_buffer_size": 8,
}
ITER_TINY_DEFAULTS = {"num_rounds": 2, "max_steps": -1}

# group baseline -> the REINFORCE-family algorithm that computes it (`trl-marl magrpo --baseline`)
BASELINE_ALGORITHMS = {a.baseline: a.name for a in algorithms() if a.baseline is not None}


@dataclass
class MAGRPOScriptArguments(RecipeArguments):
    """`RecipeArguments` plus `--baseline`, which picks the REINFORCE-family trainer of `trl-marl magrpo`."""

    baseline: str = field(
        default="mean",
        metadata={
            "help": "Group baseline: " + ", ".join(f"{b} ({name})" for b, name in BASELINE_ALGORITHMS.items()) + ".",
            "choices": list(BASELINE_ALGORITHMS),
        },
    )


@dataclass
class AgenticScriptArguments(MAGRPOScriptArguments):
    """`MAGRPOScriptArguments` plus the environment of `trl-marl agentic` (`trl_marl.cli.agentic`).

    Parameters:
        environment: `signal` (the built-in signalling game), `textarena:GAME` (e.g. `textarena:TicTacToe-v0`), or
            an import path `module:factory` to an environment factory (TRL's `environment_factory`).
        num_items: training items of the built-in game (or seeds of a TextArena game); evaluation has 16 more,
            drawn with another seed.
    """

    environment: str = field(
        default="signal", metadata={"help": "signal, textarena:GAME, or module:factory (an environment_factory)."}
    )
    num_items: int = field(default=64, metadata={"help": "Training items of the built-in game, or TextArena seeds."})


def _critic_kwargs(recipe_args: RecipeArguments) -> dict[str, Any]:
    return {"critic_model": critic_source(recipe_args)}


def _iac_critic_kwargs(recipe_args: RecipeArguments) -> dict[str, Any]:
    # IAC's critics default to a copy of each agent's own model; an explicit critic model is broadcast.
    return {"critic_model": recipe_args.critic_model_name_or_path} if recipe_args.critic_model_name_or_path else {}


@dataclass(frozen=True)
class Recipe:
    """One training command.

    Attributes:
        name: the subcommand (`trl-marl <name>`) and the default `output_dir` (`outputs/<name>`); also the registered
            algorithm (`trl_marl.trainers.registry`) it trains unless `algorithm` names another.
        help: one line for `trl-marl --help`.
        tiny_defaults: defaults of the no-model run on the tiny local model (flags the user sets win).
        script_args: the script-arguments dataclass.
        trainer_kwargs: extra trainer keyword arguments from the script arguments and config (critics).
        algorithm: the registered algorithm it trains, when not `name` (`agentic` trains the MAGRPO family).
        defaults: defaults of every run of the command (flags the user sets win).
        run: `run(trainer_cls, script_args, config)` builds and trains instead of `run_recipe` (a command that is not
            a task or dataset run).
    """

    name: str
    help: str
    tiny_defaults: dict[str, Any] = field(default_factory=dict)
    script_args: type = RecipeArguments
    trainer_kwargs: Callable[[RecipeArguments, Any], dict[str, Any]] | None = None
    algorithm: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    run: Callable[[type, Any, Any], Any] | None = None

    @property
    def algorithm_name(self) -> str:
        return self.algorithm or self.name

    def config_class(self) -> type:
        return get_algorithm(self.algorithm_name).config_class

    def trainer_class(self) -> type:
        return get_algorithm(self.algorithm_name).trainer_class


def _marlhf_kwargs(recipe_args: RecipeArguments, config: Any) -> dict[str, Any]:
    # `--rl_algorithm maac|iac`: the actor-critic backend trains critics (the same defaults as `maac` / `iac`).
    if config.rl_algorithm == "maac":
        return _critic_kwargs(recipe_args)
    if config.rl_algorithm == "iac":
        return _iac_critic_kwargs(recipe_args)
    return {}


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("magrpo", "MAGRPO (group-mean baseline)", script_args=MAGRPOScriptArguments),
        Recipe("mareinforce", "MAREINFORCE (no baseline)"),
        Recipe("marloo", "MARLOO (leave-one-out baseline)"),
        Recipe("maremax", "MAReMax (greedy / max baseline)"),
        Recipe("maac", "MAAC (one centralized critic)", trainer_kwargs=lambda a, c: _critic_kwargs(a)),
        Recipe(
            "iac", "IAC (independent critics)",
            trainer_kwargs=lambda a, c: _iac_critic_kwargs(a) if c.use_separate_critic else {},
        ),
        Recipe("mappo", "MAPPO (clipped PPO, centralized critic)", trainer_kwargs=lambda a, c: _critic_kwargs(a)),
        Recipe("madpo", "MADPO (multi-agent DPO)", tiny_defaults=MADPO_TINY_DEFAULTS),
        Recipe(
            "marlhf", "MARLHF (joint reward model, then RL)",
            tiny_defaults=MARLHF_TINY_DEFAULTS, trainer_kwargs=_marlhf_kwargs,
        ),
        Recipe(
            "madpo-iter", "iterative MADPO (rounds, comparator, replay)",
            tiny_defaults={**MADPO_TINY_DEFAULTS, "num_train_epochs": 1, **ITER_TINY_DEFAULTS},
        ),
        Recipe(
            "marlhf-iter", "iterative MARLHF (rounds, comparator, replay)",
            tiny_defaults={**MARLHF_TINY_DEFAULTS, **ITER_TINY_DEFAULTS}, trainer_kwargs=_marlhf_kwargs,
        ),
        Recipe(
            "agentic", "agentic teams (tools, a shared environment: the signalling game, TextArena; MAGRPO family)",
            tiny_defaults=AGENTIC_TINY_DEFAULTS, script_args=AgenticScriptArguments, algorithm="magrpo",
            defaults=AGENTIC_DEFAULTS, run=run_agentic,
        ),
    )
}  # fmt: skip


def make_parser(name: str, prog: str | None = None, more_help: str = ""):
    """TRL's `TrlParser` over the recipe's script arguments and config (the `--help` of `trl-marl <name>`), with the
    defaults `run_command` applies (`outputs/<name>`, the recipe's own), so that `--help` shows them, and `--config`
    (TrlParser's flag, which argparse does not list); `more_help` ends the description (`trl_marl.cli.main` adds its
    own `--accelerate_config`)."""
    from trl import TrlParser

    recipe = RECIPES[name]
    parser = TrlParser(
        (recipe.script_args, recipe.config_class()),
        prog=prog or f"trl-marl {name}",
        description=f"trl-marl {name}: {recipe.help}.\n\n{CONFIG_HELP}" + (f"\n{more_help}" if more_help else ""),
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # `--num_agent 3` must not be taken as `--num_agents 3` (a prefix is an unknown flag)
    )
    parser.set_defaults(output_dir=f"outputs/{name}", **recipe.defaults)
    return parser


def run_command(name: str, argv: list[str] | None = None, description: str | None = None) -> Any:
    """Parse `argv` (default: `sys.argv[1:]`) for the recipe `name`, then train; returns the trainer. `description`
    heads `--help` (a recipe script passes its own docstring; default: the command's one-line help)."""
    if name not in RECIPES:
        raise ValueError(f"unknown command {name!r}; commands: {sorted(RECIPES)}")
    recipe = RECIPES[name]
    script_args, config = parse_recipe_args(
        recipe.config_class(),
        defaults={"output_dir": f"outputs/{name}", **recipe.defaults},
        argv=argv,
        script_args_cls=recipe.script_args,
        tiny_defaults=recipe.tiny_defaults,
        prog=f"trl-marl {name}",
        description=description or f"trl-marl {name}: {recipe.help}.",
    )
    trainer_cls = recipe.trainer_class()
    baseline = getattr(script_args, "baseline", "mean")
    if baseline != "mean":
        trainer_cls = get_algorithm(BASELINE_ALGORITHMS[baseline]).trainer_class
        if "advantage_normalization" not in explicit_flags(argv):
            config.advantage_normalization = False  # with it on, every baseline is MAGRPO (see docs/magrpo.md)
    if recipe.run is not None:
        return recipe.run(trainer_cls, script_args, config)
    extra = recipe.trainer_kwargs
    return run_recipe(
        trainer_cls, script_args, config, extra_trainer_kwargs=None if extra is None else lambda a: extra(a, config)
    )
