"""Train a team with MARLHF: preference pairs -> joint reward model -> RL on its scores.

    accelerate launch recipes/marlhf.py                                  # tiny local model, CPU
    accelerate launch recipes/marlhf.py --rl_algorithm marloo --reward_num_train_epochs 2
    accelerate launch recipes/marlhf.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --reward_model_name Qwen/Qwen2.5-0.5B-Instruct --learning_rate 5e-6 --bf16 true
    accelerate launch recipes/marlhf.py --config my_run.yaml

Every field of `MARLHFConfig` is a flag. Evaluation (before / after) always uses the TASK reward.
"""

from trl_marl.cli.recipes import run_command


def main(argv=None):
    return run_command("marlhf", argv, description=__doc__)


if __name__ == "__main__":
    main()
