"""Train a team with MAGRPO (or a sibling baseline) on a built-in task.

    accelerate launch recipes/magrpo.py                                  # tiny local model, coordination task, CPU
    accelerate launch recipes/magrpo.py --task length_ratio --max_steps 200
    accelerate launch recipes/magrpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --learning_rate 5e-6 \
        --num_generations 8 --max_new_tokens 128 --bf16 true --output_dir outputs/magrpo-qwen
    accelerate launch recipes/magrpo.py --config my_run.yaml             # every config field is a YAML key
    accelerate launch recipes/magrpo.py --baseline loo                   # MARLOO (also: raw, max)
    accelerate launch recipes/magrpo.py --baseline max --remax_baseline greedy   # ReMax proper (greedy baseline)

Every field of `MAGRPOConfig` (and of `transformers.TrainingArguments`) is a flag.
"""

from dataclasses import dataclass, field

from trl_marl import MAGRPOConfig, MAGRPOTrainer, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer
from trl_marl.scripts import RecipeArguments, explicit_flags, parse_recipe_args, run_recipe

TRAINERS = {"mean": MAGRPOTrainer, "raw": MAREINFORCETrainer, "loo": MARLOOTrainer, "max": MAReMaxTrainer}


@dataclass
class MAGRPOScriptArguments(RecipeArguments):
    baseline: str = field(
        default="mean",
        metadata={
            "help": "Group baseline: mean (MAGRPO), raw (MAREINFORCE), loo (MARLOO), max (MAReMax).",
            "choices": list(TRAINERS),
        },
    )


def main(argv=None):
    script_args, config = parse_recipe_args(
        MAGRPOConfig, defaults={"output_dir": "outputs/magrpo"}, argv=argv, script_args_cls=MAGRPOScriptArguments
    )
    trainer_cls = TRAINERS[script_args.baseline]
    if script_args.baseline != "mean" and "advantage_normalization" not in explicit_flags(argv):
        config.advantage_normalization = False  # with it on, every baseline is MAGRPO (see docs/magrpo.md)
    return run_recipe(trainer_cls, script_args, config)


if __name__ == "__main__":
    main()
