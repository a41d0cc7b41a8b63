"""Train a team with MAPPO (PPO with a centralized value function) on a built-in task.

    accelerate launch recipes/mappo.py                                   # tiny local model, coordination task, CPU
    accelerate launch recipes/mappo.py --shared_critic false             # one critic per agent on the joint history
    accelerate launch recipes/mappo.py --ratio_level sequence --ppo_epochs 2 --popart true
    accelerate launch recipes/mappo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --critic_model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --learning_rate 1e-6 --critic_learning_rate 1e-5 \
        --max_completion_length 128 --bf16 true --output_dir outputs/mappo-qwen

Every field of `MAPPOConfig` (and of `transformers.TrainingArguments`) is a flag. The critic(s) default to the
agents' model (the tiny local model when no model is given); with `--shared_critic false` it is loaded once per
agent (independent critics).
"""

from trl_marl.cli.recipes import run_command


def main(argv=None):
    return run_command("mappo", argv, description=__doc__)


if __name__ == "__main__":
    main()
