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

from trl_marl import MAACConfig, MAACTrainer
from trl_marl.scripts import CriticRecipeArguments, critic_source, parse_recipe_args, run_recipe


def main(argv=None):
    script_args, config = parse_recipe_args(
        MAACConfig, defaults={"output_dir": "outputs/maac"}, argv=argv, script_args_cls=CriticRecipeArguments
    )
    critic = critic_source(script_args)
    return run_recipe(MAACTrainer, script_args, config, extra_trainer_kwargs=lambda task: {"critic_model": critic})


if __name__ == "__main__":
    main()
