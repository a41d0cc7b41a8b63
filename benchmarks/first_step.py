"""The first optimizer step against a steady one: what a run pays once, and what warming at construction saves.

    python benchmarks/first_step.py [--steps 6]     # writes benchmarks/results/first_step.json (or --output PATH)
    python benchmarks/first_step.py --steps 3 --shapes tiny --output /tmp/first_step.json   # smallest: a smoke run
    python benchmarks/first_step.py --device cuda --shapes qwen0.5b --output benchmarks/results/first_step_cuda.json

A 2-agent MAGRPO team (8 prompts x G=4, 16 new tokens, one thread) of the tiny reference model and of the
model-shaped one (hidden 512, 8 layers), each run in its own process. The first step is timed from the start of
`train()` (`on_train_begin`: after the optimizer and the dataloader exist) to the end of step 1; a steady step is the
median of steps 3..N (step 2 is left out: it is the first to reuse the allocator's freed pages). `--no_warm_up` runs
without the trainer's warm-up at construction (`trl_marl.trainers.warmup`), for the comparison. `--device cuda` runs
in bf16 (and adds the `qwen0.5b` shape, Qwen2-0.5B's); there the warm-up also compiles the fused head's Triton
kernels (`trl_marl.models.fused_head`), and the marks wait for the device (`torch.cuda.synchronize`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import _common
from vllm_throughput import SHAPES as VLLM_SHAPES

_common.set_offline_env()

SHAPES = {
    "tiny (h64, 2 layers)": {},
    "model-shaped (h512, 8 layers)": dict(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8
    ),
}
SHAPES["qwen0.5b (h896, 24 layers, vocabulary 151,936)"] = VLLM_SHAPES["qwen0.5b"]  # Qwen2-0.5B
SHAPE_KEYS = {name.split(" (")[0]: name for name in SHAPES}  # `--shapes tiny model-shaped qwen0.5b`


def child(shape_name: str, steps: int, warm: bool, device: str) -> dict:
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

    def mark() -> None:
        if device == "cuda":
            torch.cuda.synchronize()
        marks.append(time.perf_counter())

    class Marks(TrainerCallback):
        def on_train_begin(self, *a, **k):
            mark()

        def on_step_end(self, *a, **k):
            mark()

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
        use_cpu=device == "cpu",
        bf16=device == "cuda",
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
    p.add_argument(
        "--shapes", nargs="+", choices=list(SHAPE_KEYS), default=["tiny", "model-shaped"], help="teams to run"
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: bf16, on the first GPU")
    p.add_argument("--output", type=Path, default=_common.RESULTS / "first_step.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--no_warm_up", action="store_true", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.steps < 3:
        p.error(f"--steps must be >= 3 (the steady step is the median of steps 3..N), got {opts.steps}")
    if opts.child:
        _common.emit_result(child(opts.child, opts.steps, not opts.no_warm_up, opts.device))
        return {}
    report = {"machine": _common.machine()}
    for name in (SHAPE_KEYS[key] for key in opts.shapes):
        for warm in (False, True):
            flags = ["--child", name, "--steps", str(opts.steps), "--device", opts.device]
            flags += [] if warm else ["--no_warm_up"]
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
