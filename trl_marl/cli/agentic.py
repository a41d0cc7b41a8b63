"""`trl-marl agentic` (and `recipes/agentic.py`): a team trained in an environment, with tools.

    trl-marl agentic                                     # the signalling game, tiny local model, CPU, a few minutes
    trl-marl agentic --environment textarena:TicTacToe-v0 --num_turns 5 --baseline raw --num_generations 1
    trl-marl agentic --environment my_envs:make_env --dataset_name tasks.jsonl --model_name_or_path Qwen/Qwen3-0.6B

`--environment` is `signal` (the built-in cooperative game, `trl_marl.environments.SignalGame`: agent 1 sees a
secret and signals it, agent 2 answers through a `submit` tool; the environment owns the reward), `textarena:GAME`
(a TextArena game, the agents as its players), or an import path `module:factory` to an environment factory (TRL's
`environment_factory`). The algorithm is the MAGRPO family (`--baseline`, as `trl-marl magrpo`), found in the
algorithm registry. With no model given, the tiny local model plays with a short tool-capable ChatML template
(`use_compact_tool_template`).
"""

from __future__ import annotations

from typing import Any

from trl_marl.cli.recipe_args import (
    import_object,
    load_recipe_dataset,
    recipe_model_config,
    recipe_reward,
    train_and_save,
)

__all__ = ["AGENTIC_DEFAULTS", "AGENTIC_TINY_DEFAULTS", "run_agentic"]

# every run: agents that see each other's message of the turn, one tool round per turn
AGENTIC_DEFAULTS = {"turn_order": "sequential", "max_tool_calling_iterations": 1}
# the tiny model's no-argument run on the signalling game (docs/agentic.md has its learning curve)
AGENTIC_TINY_DEFAULTS = {
    "num_generations": 4,
    "rollout_buffer_size": 8,
    "max_completion_length": 8,
    "learning_rate": 3e-3,
    "lr_scheduler_type": "constant",
    "max_steps": 100,
    "logging_steps": 10,
}


def _environment(script_args: Any, seed: int) -> tuple[Any, Any, Any, str]:
    """`(environment_factory, train items, eval items, label)` of `--environment`."""
    spec, n = script_args.environment, script_args.num_items
    if n < 1:
        raise ValueError(f"num_items must be >= 1, got {n}")
    if spec == "signal":
        from trl_marl.environments import SignalGame, signal_game_dataset

        return SignalGame, signal_game_dataset(n, seed), signal_game_dataset(16, seed + 1), "environment=signal"
    if spec.startswith("textarena:"):
        from datasets import Dataset

        from trl_marl.environments import textarena_factory

        game = spec.split(":", 1)[1]
        train = Dataset.from_list([{"prompt": "", "seed": seed * 100_003 + i} for i in range(n)])
        test = Dataset.from_list([{"prompt": "", "seed": (seed + 1) * 100_003 + i} for i in range(16)])
        return textarena_factory(game), train, test, f"environment={spec}"
    if ":" not in spec:
        raise ValueError(
            f"--environment {spec!r}: expected 'signal', 'textarena:GAME' (e.g. textarena:TicTacToe-v0) or an import "
            "path module:factory"
        )
    return import_object(spec), None, None, f"environment={spec}"


def run_agentic(trainer_cls: type, script_args: Any, config: Any) -> Any:
    """Build the environment, its items and the team, then train, evaluate and save (`train_and_save`)."""
    from trl import get_peft_config

    factory, train, test, label = _environment(script_args, config.seed)
    if script_args.dataset_name:
        train, test = load_recipe_dataset(script_args)
    team: dict[str, Any]
    tokenizer = None
    if script_args.agent_models:
        team = {"model": list(script_args.agent_models)}
    elif script_args.model_name_or_path:
        team = {"model": script_args.model_name_or_path}
    else:
        from transformers import AutoTokenizer

        from trl_marl.environments import use_compact_tool_template
        from trl_marl.testing import tiny_model_path

        path = tiny_model_path(seed=script_args.tiny_seed)
        tokenizer = use_compact_tool_template(AutoTokenizer.from_pretrained(path))
        tokenizer.eos_token = "<|im_end|>"  # the template closes every turn with it
        team = {"model": path}
    trainer = trainer_cls(
        reward_funcs=recipe_reward(script_args, config.num_agents),
        args=config,
        train_dataset=train,
        eval_dataset=test,
        processing_class=tokenizer,
        environment_factory=factory,
        model_config=recipe_model_config(script_args) or None,
        peft_config=get_peft_config(script_args),
        **team,
    )
    return train_and_save(trainer, config, label, test is not None, script_args.dataset_name)
