"""Train a team with MADPO (multi-agent DPO) on preferences collected from a built-in task.

    accelerate launch recipes/madpo.py                                   # tiny local model, coordination task, CPU
    accelerate launch recipes/madpo.py --task length_ratio --preference_num_candidates 8
    accelerate launch recipes/madpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --learning_rate 5e-7 \
        --max_new_tokens 128 --bf16 true --output_dir outputs/madpo-qwen
    accelerate launch recipes/madpo.py --collaboration_mode centralized  # one model writes every role
    accelerate launch recipes/madpo.py --config my_run.yaml

The trainer samples `preference_num_candidates` joint responses per item with the initial agents, scores them with the
task reward, keeps pairs (`pair_selection`), then trains `num_train_epochs` over them. Every field of `MADPOConfig`
is a flag.
"""

from trl_marl import MADPOConfig, MADPOTrainer
from trl_marl.scripts import parse_recipe_args, run_recipe

# the tiny model's no-argument run: ~250 pairs from 62 items, 4 epochs
MADPO_TINY_DEFAULTS = {
    "rollout_buffer_size": 16,
    "preference_num_candidates": 4,
    "preference_pairs_per_sample": 4,
    "train_batch_size": 8,
    "num_train_epochs": 4,
    "max_steps": -1,
}


def main(argv=None):
    script_args, config = parse_recipe_args(
        MADPOConfig, defaults={"output_dir": "outputs/madpo"}, argv=argv, tiny_defaults=MADPO_TINY_DEFAULTS
    )
    return run_recipe(MADPOTrainer, script_args, config)


if __name__ == "__main__":
    main()
