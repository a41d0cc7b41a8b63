"""Train a team with MAAC (multi-agent actor-critic, one centralized critic) on a built-in task.

    accelerate launch recipes/maac.py                                    # tiny local model, coordination task, CPU
    accelerate launch recipes/maac.py --critic_type q --max_steps 200
    accelerate launch recipes/maac.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --critic_model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --learning_rate 5e-6 --critic_learning_rate 1e-5 \
        --max_new_tokens 128 --bf16 true --output_dir outputs/maac-qwen
    accelerate launch recipes/maac.py --config my_run.yaml               # every config field is a YAML key

Every field of `MAACConfig` (and of `transformers.TrainingArguments`) is a flag. The critic defaults to the agents'
model (the tiny local model when no model is given).
"""

from dataclasses import dataclass, field

from trl_marl import MAACConfig, MAACTrainer
from trl_marl.scripts import RecipeArguments, parse_recipe_args, run_recipe


@dataclass
class MAACScriptArguments(RecipeArguments):
    critic_model_name_or_path: str | None = field(
        default=None, metadata={"help": "The centralized critic's model id or path; empty = the agents' model."}
    )


def critic_source(script_args: MAACScriptArguments) -> str:
    """The critic's model: the one given, else the (first) agents' model, else the tiny local model."""
    if script_args.critic_model_name_or_path:
        return script_args.critic_model_name_or_path
    if script_args.agent_models:
        return script_args.agent_models[0]
    if script_args.model_name_or_path:
        return script_args.model_name_or_path
    from trl_marl.testing import tiny_model_path

    return tiny_model_path(seed=script_args.tiny_seed)


def main(argv=None):
    script_args, config = parse_recipe_args(
        MAACConfig, defaults={"output_dir": "outputs/maac"}, argv=argv, script_args_cls=MAACScriptArguments
    )
    critic = critic_source(script_args)
    return run_recipe(MAACTrainer, script_args, config, extra_trainer_kwargs=lambda task: {"critic_model": critic})


if __name__ == "__main__":
    main()
