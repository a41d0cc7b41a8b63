"""Train a team with MAGRPO (or a sibling baseline) on a built-in task.

    accelerate launch recipes/magrpo.py                                  # tiny local model, coordination task, CPU
    accelerate launch recipes/magrpo.py --task length_ratio --max_steps 200
    accelerate launch recipes/magrpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --learning_rate 5e-6 \
        --num_generations 8 --max_completion_length 128 --bf16 true --output_dir outputs/magrpo-qwen
    accelerate launch recipes/magrpo.py --config my_run.yaml             # every config field is a YAML key
    accelerate launch recipes/magrpo.py --baseline loo                   # MARLOO (also: raw, max)
    accelerate launch recipes/magrpo.py --baseline max --remax_baseline greedy   # ReMax proper (greedy baseline)

Every field of `MAGRPOConfig` (and of `transformers.TrainingArguments`) is a flag.
"""

from trl_marl.cli.recipes import run_command


def main(argv=None):
    return run_command("magrpo", argv, description=__doc__)


if __name__ == "__main__":
    main()
