"""trl_marl's MAGRPO (one agent) against TRL's own `GRPOTrainer` on the same model and work, each in its own process.

    python benchmarks/trl_grpo_side_by_side.py                                  # CPU, transformers' generate
    python benchmarks/trl_grpo_side_by_side.py --device cuda --dtype bfloat16 --models qwen0.5b --use_vllm  # gpu_check.sh

One policy (MAGRPO with `num_agents=1` is GRPO's setting: a group of G samples per prompt, the group baseline),
8 prompts x G=4 per optimizer step, `--tokens` new tokens, temperature 1, learning rate 1e-6, no KL (`beta=0`),
`--warmup` untimed steps then `--steps` timed ones; shapes of `vllm_throughput.py` (random weights, built locally).
Activation checkpointing is the same in both: off, or on with `--gradient_checkpointing` (the libraries' defaults
differ: TRL's GRPOConfig turns it on, trl_marl's configs leave it off).
With `--use_vllm` both sample with colocated vLLM (TRL: `vllm_mode="colocate"`; TRL looks for the distribution `vllm`,
so this needs the CUDA build). Reports seconds per step, prompts per second, peak RSS and, on a GPU, peak CUDA memory,
and trl_marl / TRL.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import _common
from vllm_throughput import SHAPES

_common.set_offline_env()


def reward(completions, **kwargs) -> list[float]:
    """Longer completions score higher (a reward both libraries call the same way: one list of completions)."""
    return [len(c) / 100.0 for c in completions]


def child(opts) -> dict:
    import torch

    torch.set_num_threads(opts.threads)
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_marl.testing import tiny_model_path

    path = tiny_model_path(**SHAPES[opts.models])
    ends: list[float] = []

    class Ends(TrainerCallback):
        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter())

    steps = opts.warmup + opts.steps
    common = dict(
        output_dir=_common.scratch_dir("trl-side-by-side"),
        num_generations=4,
        max_completion_length=opts.tokens,
        learning_rate=1e-6,
        beta=0.0,
        temperature=1.0,
        max_steps=steps,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        bf16=opts.dtype == "bfloat16",
        use_cpu=opts.device == "cpu",
        use_vllm=opts.use_vllm,
        # the same for both: TRL's GRPOConfig defaults to True, ours to False (activation checkpointing trades a
        # second forward for memory, so two defaults would compare different work)
        gradient_checkpointing=opts.gradient_checkpointing,
    )
    if opts.use_vllm:
        common.update(vllm_mode="colocate", vllm_gpu_memory_utilization=opts.vllm_gpu_memory_utilization)
    data = Dataset.from_list([{"prompt": p} for p in _common.story_prompts(8 * steps)])
    if opts.child == "trl":
        from trl import GRPOConfig, GRPOTrainer

        # 8 prompts x 4 generations = 32 completions per optimizer step
        args = GRPOConfig(**common, per_device_train_batch_size=32, gradient_accumulation_steps=1)
        trainer = GRPOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=data, callbacks=[Ends()])
    else:
        from trl_marl import MAGRPOConfig, MAGRPOTrainer

        args = MAGRPOConfig(**common, num_agents=1, rollout_buffer_size=8)
        trainer = MAGRPOTrainer(
            model=path, reward_funcs=lambda c: reward(c), args=args, train_dataset=data, callbacks=[Ends()]
        )
    trainer.train()
    durations = [b - a for a, b in zip(ends, ends[1:])][opts.warmup - 1 :] if opts.warmup else None
    s_per_step = statistics.median(durations)
    return {
        "s_per_step": s_per_step,
        "prompts_per_s": 8 / s_per_step,
        "peak_rss_mb": _common.peak_rss_mb(),
        "peak_cuda_mb": _common.peak_cuda_mb(),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", choices=["trl", "trl_marl"], help=argparse.SUPPRESS)
    p.add_argument("--models", default="tiny", choices=list(SHAPES))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--use_vllm", action="store_true")
    p.add_argument(
        "--gradient_checkpointing", action="store_true", help="activation checkpointing in both (default: in neither)"
    )
    p.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.3)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default=str(_common.RESULTS / "trl_grpo_side_by_side.json"))
    opts = p.parse_args(argv)
    if opts.warmup < 1:
        p.error("--warmup must be >= 1 (the first step's end starts the clock)")
    if opts.child:
        _common.emit_result(child(opts))
        return {}
    flags = ["--models", opts.models, "--device", opts.device, "--dtype", opts.dtype, "--tokens", str(opts.tokens)]
    flags += ["--steps", str(opts.steps), "--warmup", str(opts.warmup), "--threads", str(opts.threads)]
    flags += ["--vllm_gpu_memory_utilization", str(opts.vllm_gpu_memory_utilization)]
    flags += ["--use_vllm"] if opts.use_vllm else []
    flags += ["--gradient_checkpointing"] if opts.gradient_checkpointing else []
    runs = {name: _common.run_child(__file__, ["--child", name, *flags]) for name in ("trl", "trl_marl")}
    report = {
        "config": {k: v for k, v in vars(opts).items() if k not in ("child", "output")},
        "machine": _common.machine(),
        "runs": runs,
        "prompts_per_s_ratio": runs["trl_marl"]["prompts_per_s"] / runs["trl"]["prompts_per_s"],
        "peak_rss_ratio": runs["trl_marl"]["peak_rss_mb"] / runs["trl"]["peak_rss_mb"],
    }
    if runs["trl"]["peak_cuda_mb"]:
        report["peak_cuda_ratio"] = runs["trl_marl"]["peak_cuda_mb"] / runs["trl"]["peak_cuda_mb"]
    print(
        f"TRL GRPOTrainer {runs['trl']['s_per_step']:.3f} s/step, trl_marl MAGRPO {runs['trl_marl']['s_per_step']:.3f} "
        f"s/step: prompts/s x{report['prompts_per_s_ratio']:.2f}, peak RSS x{report['peak_rss_ratio']:.2f}"
        + (f", peak CUDA memory x{report['peak_cuda_ratio']:.2f}" if "peak_cuda_ratio" in report else "")
    )
    _common.write_json(Path(opts.output), report)
    return report


if __name__ == "__main__":
    main()
