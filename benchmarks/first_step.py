"""The first optimizer step against a steady one: what a run pays once, and what warming at construction saves.

    python benchmarks/first_step.py [--steps 6]     # writes benchmarks/results/first_step.json (or --output PATH)
    python benchmarks/first_step.py --steps 3 --shapes tiny --output /tmp/first_step.json   # smallest: a smoke run

A 2-agent MAGRPO team (8 prompts x G=4, 16 new tokens, one thread) of the tiny reference model and of the
model-shaped one (hidden 512, 8 layers), each run in its own process. The first step is timed from the start of
`train()` (`on_train_begin`: after the optimizer and the dataloader exist) to the end of step 1; a steady step is the
median of steps 3..N (step 2 is left out: it is the first to reuse the allocator's freed pages). `--no_warm_up` runs
without the trainer's warm-up at construction (`trl_marl.trainers.warmup`), for the comparison.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import _common

_common.set_offline_env()

SHAPES = {
    "tiny (h64, 2 layers)": {},
    "model-shaped (h512, 8 layers)": dict(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8
    ),
}
SHAPE_KEYS = {name.split(" (")[0]: name for name in SHAPES}  # `--shapes tiny model-shaped`


def child(shape_name: str, steps: int, warm: bool) -> dict:
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import TrainerCallback

    import trl_marl.trainers.warmup as warmup
    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.testing import tiny_model_path

    if not warm:
        warmup.warm_up = lambda trainer: None
    marks: list[float] = []

    class Marks(TrainerCallback):
        def on_train_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            marks.append(time.perf_counter())

    args = MAGRPOConfig(
        output_dir=_common.scratch_dir("first-step"),
        num_agents=2,
        num_generations=4,
        max_completion_length=16,
        rollout_buffer_size=8,
        max_steps=steps,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    start = time.perf_counter()
    trainer = MAGRPOTrainer(
        model=tiny_model_path(**SHAPES[shape_name]),
        reward_funcs=_common.team_letters_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in _common.story_prompts(8 * steps)]),
        callbacks=[Marks()],
    )
    built = time.perf_counter() - start
    trainer.train()
    durations = [b - a for a, b in zip(marks, marks[1:])]
    steady = statistics.median(durations[2:])
    return {"construction_s": built, "first_s": durations[0], "steady_s": steady, "ratio": durations[0] / steady}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run (>= 3: the steady median is of 3..N)")
    p.add_argument("--shapes", nargs="+", choices=list(SHAPE_KEYS), default=list(SHAPE_KEYS), help="teams to run")
    p.add_argument("--output", type=Path, default=_common.RESULTS / "first_step.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--no_warm_up", action="store_true", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.steps < 3:
        p.error(f"--steps must be >= 3 (the steady step is the median of steps 3..N), got {opts.steps}")
    if opts.child:
        _common.emit_result(child(opts.child, opts.steps, not opts.no_warm_up))
        return {}
    report = {"machine": _common.machine()}
    for name in (SHAPE_KEYS[key] for key in opts.shapes):
        for warm in (False, True):
            flags = ["--child", name, "--steps", str(opts.steps)] + ([] if warm else ["--no_warm_up"])
            result = _common.run_child(__file__, flags)
            report[f"{name}, {'warm-up' if warm else 'no warm-up'}"] = result
            print(
                f"{name} {'warm-up' if warm else 'no warm-up'}: first {result['first_s']:.3f} s, steady "
                f"{result['steady_s']:.3f} s, x{result['ratio']:.2f} (construction {result['construction_s']:.2f} s)",
                flush=True,
            )
    _common.write_json(opts.output, report)
    return report


if __name__ == "__main__":
    main()
