"""Train a team with MAAC (multi-agent actor-critic, one centralized critic) on a built-in task.

    accelerate launch recipes/maac.py                                    # tiny local model, coordination task, CPU
    accelerate launch recipes/maac.py --critic_type q --max_steps 200
    accelerate launch recipes/maac.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --critic_model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --learning_rate 5e-6 --critic_learning_rate 1e-5 \
        --max_completion_length 128 --bf16 true --output_dir outputs/maac-qwen
    accelerate launch recipes/maac.py --config my_run.yaml               # every config field is a YAML key

Every field of `MAACConfig` (and of `transformers.TrainingArguments`) is a flag. The critic defaults to the agents'
model (the tiny local model when no model is given).
"""

from trl_marl.cli.recipes import run_command


def main(argv=None):
    return run_command("maac", argv, description=__doc__)


if __name__ == "__main__":
    main()
