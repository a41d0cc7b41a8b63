"""Train a team with MARLHF: preference pairs -> joint reward model -> RL on its scores.

    accelerate launch recipes/marlhf.py                                  # tiny local model, CPU
    accelerate launch recipes/marlhf.py --rl_algorithm marloo --reward_num_train_epochs 2
    accelerate launch recipes/marlhf.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --reward_model_name Qwen/Qwen2.5-0.5B-Instruct --learning_rate 5e-6 --bf16 true
    accelerate launch recipes/marlhf.py --config my_run.yaml

Every field of `MARLHFConfig` is a flag. Evaluation (before / after) always uses the TASK reward.
"""

from trl_marl import MARLHFConfig, MARLHFTrainer
from trl_marl.scripts import parse_recipe_args, run_recipe

MARLHF_TINY_DEFAULTS = {
    "preference_num_candidates": 8,
    "pair_selection": "all",
    "preference_pairs_per_sample": None,
    "reward_learning_rate": 1e-3,
    "reward_num_train_epochs": 2,
    "reward_max_length": 40,
    "rollout_buffer_size": 8,
}


def main(argv=None):
    script_args, config = parse_recipe_args(
        MARLHFConfig, defaults={"output_dir": "outputs/marlhf"}, argv=argv, tiny_defaults=MARLHF_TINY_DEFAULTS
    )
    return run_recipe(MARLHFTrainer, script_args, config)


if __name__ == "__main__":
    main()
