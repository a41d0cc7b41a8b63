"""Train a team with IAC (independent actor-critic: one critic per agent over its own history) on a built-in task.

    accelerate launch recipes/iac.py                                     # tiny local model, coordination task, CPU
    accelerate launch recipes/iac.py --use_separate_critic false --value_clip_range 0.2    # value heads on the actors
    accelerate launch recipes/iac.py --critic_type q --max_steps 200
    accelerate launch recipes/iac.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --learning_rate 5e-6 \
        --max_completion_length 128 --bf16 true --output_dir outputs/iac-qwen

Every field of `IACConfig` (and of `transformers.TrainingArguments`) is a flag. With separate critics, each agent's
critic is `--critic_model_name_or_path` loaded once per agent (independent parameters), or by default a separately
loaded copy of the agent's own model.
"""

from trl_marl.cli.recipes import run_command


def main(argv=None):
    return run_command("iac", argv, description=__doc__)


if __name__ == "__main__":
    main()
