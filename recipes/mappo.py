"""Train a team with MAPPO (PPO with a centralized value function) on a built-in task.

    accelerate launch recipes/mappo.py                                   # tiny local model, coordination task, CPU
    accelerate launch recipes/mappo.py --shared_critic false             # one critic per agent on the joint history
    accelerate launch recipes/mappo.py --ratio_level sequence --ppo_epochs 2 --popart true
    accelerate launch recipes/mappo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --critic_model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --learning_rate 1e-6 --critic_learning_rate 1e-5 \
        --max_new_tokens 128 --bf16 true --output_dir outputs/mappo-qwen

Every field of `MAPPOConfig` (and of `transformers.TrainingArguments`) is a flag. The critic(s) default to the
agents' model (the tiny local model when no model is given); with `--shared_critic false` it is loaded once per
agent (independent critics).
"""

from dataclasses import dataclass, field

from trl_marl import MAPPOConfig, MAPPOTrainer
from trl_marl.scripts import RecipeArguments, parse_recipe_args, run_recipe


@dataclass
class MAPPOScriptArguments(RecipeArguments):
    critic_model_name_or_path: str | None = field(
        default=None, metadata={"help": "The critic's model id or path; empty = the agents' model."}
    )


def critic_source(script_args: MAPPOScriptArguments) -> str:
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
        MAPPOConfig, defaults={"output_dir": "outputs/mappo"}, argv=argv, script_args_cls=MAPPOScriptArguments
    )
    critic = critic_source(script_args)
    return run_recipe(MAPPOTrainer, script_args, config, extra_trainer_kwargs=lambda task: {"critic_model": critic})


if __name__ == "__main__":
    main()
