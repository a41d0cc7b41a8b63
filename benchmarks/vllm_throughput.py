"""HF `generate` against vLLM (`use_vllm=True`) in MAGRPO, same run: the generation phase and the whole step.

    python benchmarks/vllm_throughput.py                       # in a venv with vLLM (see docs/vllm.md)
    python benchmarks/vllm_throughput.py --models tiny --tokens 16 --steps 5
    python benchmarks/vllm_throughput.py --models tiny --tokens 16 --lora  # + shared-base LoRA team: 1 vs n engines
    python benchmarks/vllm_throughput.py --device cuda --dtype bfloat16 --models qwen0.5b   # benchmarks/gpu_check.sh
    python benchmarks/vllm_throughput.py --backend hf --models tiny --tokens 4 --steps 1 --output /tmp/v.json  # one backend

Every configuration (model shape x new tokens x backend) runs MAGRPO with 2 agents, 8 prompts per step, G=4, in its
own process: `--warmup` untimed steps (vLLM's first `generate` call is slow), then `--steps` timed ones. Reported per
step: the whole step, the generation phase (for vLLM without the weight push and without the trainer-side scoring of
the log-prob gap metric, both reported apart), and once per run the engine start-up. Ratios (`hf / vllm`) compare
configurations of the same run; above 1 vLLM is faster, below 1 it is SLOWER.

Model shapes (random weights, the tiny tokenizer): `tiny` = Llama hidden 128, 2 heads (head_dim 64, the smallest
vLLM's CPU attention accepts), 2 layers; `model` = Llama hidden 512, 8 heads (head_dim 64), intermediate 1408,
8 layers; `qwen0.5b` = the Qwen2-0.5B shape (hidden 896, 24 layers, 14 heads / 2 KV heads, intermediate 4864,
vocab 151936), for the GPU check.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from _common import (
    RESULTS,
    emit_result,
    peak_cuda_mb,
    peak_rss_mb,
    run_child,
    scratch_dir,
    set_offline_env,
    story_prompts,
    write_json,
)

SHAPES = {
    "tiny": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, intermediate_size=256),
    "model": dict(
        hidden_size=512, num_attention_heads=8, num_key_value_heads=8, intermediate_size=1408, num_hidden_layers=8
    ),
    "qwen0.5b": dict(
        architecture="qwen2",
        vocab_size=151936,
        hidden_size=896,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        num_hidden_layers=24,
        max_position_embeddings=4096,
    ),
}


def run_one(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.tasks.toy import length_ratio_reward
    from trl_marl.testing import tiny_model_path

    torch.manual_seed(0)
    path = tiny_model_path(**SHAPES[args.models[0]])
    P, total = args.prompts_per_step, args.warmup + args.steps
    data = Dataset.from_list([{"prompt": p} for p in story_prompts(max(64, P * total))])
    use_vllm = args.backend != "hf"
    lora = args.backend in ("vllm_lora", "vllm_merged")
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    cfg = MAGRPOConfig(
        output_dir=scratch_dir("vllm_throughput"),
        num_agents=2,
        num_generations=args.num_generations,
        max_completion_length=args.tokens[0],
        rollout_buffer_size=P,
        learning_rate=1e-5,
        max_steps=total,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        max_grad_norm=0.0,
        bf16=args.dtype == "bfloat16",
        use_cpu=args.device == "cpu",
        use_vllm=use_vllm,
        share_base_model=lora,
        # vLLM's settings only for a vLLM backend: with use_vllm=False the config refuses them (nothing reads them)
        **(
            dict(
                vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                vllm_max_model_length=512,
                vllm_enable_lora=args.backend == "vllm_lora",
            )
            if use_vllm
            else {}
        ),
    )

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], None

        cpu: list = []

        def on_step_begin(self, a, state, control, **kw):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, a, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)
            self.cpu.append(time.process_time() - self.c0)
            if state.global_step == args.warmup:  # steady state from here
                trainer._metrics.timings.clear()
                trainer._tokens_seen = 0
                if trainer.args.use_vllm:
                    g = trainer.generation
                    self.base = (g.sync_seconds, g.num_syncs, g.gap_seconds)

    timer = StepTimer()
    t0 = time.perf_counter()
    model_config = {"dtype": args.dtype}
    trainer = MAGRPOTrainer(
        agent_model=path,
        reward_func=length_ratio_reward,
        args=cfg,
        train_dataset=data,
        callbacks=[timer],
        model_config=model_config,
        peft_config=peft_config,
    )
    init_s = time.perf_counter() - t0
    original = trainer._record_rollout_metrics

    def count_tokens(rollout, mode):
        trainer._tokens_seen = getattr(trainer, "_tokens_seen", 0) + sum(
            s.completion_ids.numel() for s in rollout.samples
        )
        original(rollout, mode)

    trainer._record_rollout_metrics = count_tokens
    # process CPU seconds of each `generate` call (stable under other load, unlike wall time), without the weight
    # push that vLLM's first call after an optimizer step does (reported apart, as for wall time)
    gen_cpu, sync_cpu = [], []
    generate = trainer.generation.generate
    g = trainer.generation if trainer.args.use_vllm else None
    pushed = [0.0]  # CPU seconds of weight pushes so far
    if g is not None:
        sync_weights = g.sync_weights

        def timed_sync():
            c0 = time.process_time()
            sync_weights()
            sync_cpu.append(time.process_time() - c0)
            pushed[0] += sync_cpu[-1]

        g.sync_weights = timed_sync

    def timed_generate(*a, **kw):
        c0, p0 = time.process_time(), pushed[0]
        out = generate(*a, **kw)
        gen_cpu.append(time.process_time() - c0 - (pushed[0] - p0))
        return out

    trainer.generation.generate = timed_generate
    trainer.train()
    n = args.steps
    times = timer.times[args.warmup :]
    phases = {k: v / n for k, v in trainer._metrics.timings.items()}
    out = {
        "model": args.models[0],
        "tokens": args.tokens[0],
        "backend": args.backend,
        "steps": n,
        "step_s": statistics.fmean(times),
        "step_s_median": statistics.median(times),
        "step_cpu_s": statistics.fmean(timer.cpu[args.warmup :]),
        # one generate call per step (1 turn, no greedy); vLLM's weight push excluded (weight_sync_cpu_s)
        "generation_cpu_s": sum(gen_cpu[args.warmup :]) / n,
        "phase_s_per_step": phases,
        "generation_s": phases.get("generation", 0.0),
        "tokens_per_s": trainer._tokens_seen / sum(times),
        "trainer_init_s": init_s,
        "peak_rss_mb": peak_rss_mb(),
        "peak_cuda_mb": peak_cuda_mb(),
    }
    if g is not None:
        sync0, syncs0, gap0 = timer.base
        sync = (g.sync_seconds - sync0) / max(g.num_syncs - syncs0, 1)
        gap = (g.gap_seconds - gap0) / n
        out.update(
            engine_startup_s=g.startup_seconds,
            weight_sync_s=sync,
            weight_sync_cpu_s=sum(sync_cpu[syncs0:]) / max(len(sync_cpu) - syncs0, 1),
            logprob_gap_scoring_s=gap,
            # the generation phase without the weight push and the gap metric's scoring
            generation_s=phases.get("generation", 0.0) - sync * (g.num_syncs - syncs0) / n - gap,
        )
        g.close()
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--backend",
        choices=["hf", "vllm", "vllm_lora", "vllm_merged"],
        default=None,
        help="run this backend only (no ratios; `hf` needs no vLLM); default: hf and vllm side by side",
    )
    p.add_argument(
        "--lora",
        action="store_true",
        help="also compare, for a shared-base LoRA team (r=8), ONE multi-LoRA engine with one engine per agent",
    )
    p.add_argument("--models", nargs="+", default=["tiny", "model"], choices=list(SHAPES))
    p.add_argument("--tokens", nargs="+", type=int, default=[16, 128])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads (vLLM's CPU engine uses the same)")
    p.add_argument("--num_generations", type=int, default=4)
    p.add_argument("--prompts_per_step", type=int, default=8)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.05)
    p.add_argument("--output", type=Path, default=RESULTS / "throughput_vllm.json")
    args = p.parse_args(argv)
    set_offline_env()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.child:
        if args.backend is None:
            p.error("--child needs --backend")
        import torch

        torch.set_num_threads(args.threads)
        emit_result(run_one(args))
        return {}
    common = [
        "--child",
        *("--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)),
        *("--num_generations", str(args.num_generations), "--prompts_per_step", str(args.prompts_per_step)),
        *("--device", args.device, "--dtype", args.dtype),
        *("--vllm_gpu_memory_utilization", str(args.vllm_gpu_memory_utilization)),
    ]
    t_all = time.perf_counter()
    rows = []
    for model in args.models:
        for tokens in args.tokens:
            if args.backend:  # that backend alone: no ratios
                extra = ["--backend", args.backend, "--models", model, "--tokens", str(tokens)]
                alone = run_child(__file__, [*common, *extra])
                rows.append({"model": model, "tokens": tokens, args.backend: alone})
                print(
                    f"{model:9s} {tokens:4d} tok | {args.backend}: generation {alone['generation_s']:.3f}s "
                    f"step {alone['step_s']:.3f}s",
                    flush=True,
                )
                continue
            pair = {}
            for backend in ("hf", "vllm"):
                extra = ["--backend", backend, "--models", model, "--tokens", str(tokens)]
                pair[backend] = run_child(__file__, [*common, *extra])
            hf, vl = pair["hf"], pair["vllm"]
            rows.append(
                {
                    "model": model,
                    "tokens": tokens,
                    "hf": hf,
                    "vllm": vl,
                    "generation_speedup": hf["generation_s"] / vl["generation_s"],
                    "step_speedup": hf["step_s"] / vl["step_s"],
                    "generation_cpu_speedup": hf["generation_cpu_s"] / vl["generation_cpu_s"],
                    "step_cpu_speedup": hf["step_cpu_s"] / vl["step_cpu_s"],
                }
            )
            print(
                f"{model:9s} {tokens:4d} tok | generation hf {hf['generation_s']:.3f}s vllm {vl['generation_s']:.3f}s "
                f"x{rows[-1]['generation_speedup']:.2f} | step hf {hf['step_s']:.3f}s vllm {vl['step_s']:.3f}s "
                f"x{rows[-1]['step_speedup']:.2f} | CPU s: generation x{rows[-1]['generation_cpu_speedup']:.2f} "
                f"step x{rows[-1]['step_cpu_speedup']:.2f} | sync {vl['weight_sync_s']:.3f}s gap-scoring "
                f"{vl['logprob_gap_scoring_s']:.3f}s startup {vl['engine_startup_s']:.1f}s",
                flush=True,
            )
    lora_rows = []
    if args.lora:
        model, tokens = args.models[0], args.tokens[0]
        pair = {}
        for backend in ("vllm_merged", "vllm_lora"):
            extra = ["--backend", backend, "--models", model, "--tokens", str(tokens)]
            pair[backend] = run_child(__file__, [*common, *extra])
        one, per_agent = pair["vllm_lora"], pair["vllm_merged"]
        lora_rows.append(
            {
                "model": model,
                "tokens": tokens,
                "one_lora_engine": one,
                "engine_per_agent": per_agent,
                "generation_speedup": per_agent["generation_s"] / one["generation_s"],
                "step_speedup": per_agent["step_s"] / one["step_s"],
                "generation_cpu_speedup": per_agent["generation_cpu_s"] / one["generation_cpu_s"],
            }
        )
        print(
            f"LoRA team {model} {tokens} tok | generation per-agent engines {per_agent['generation_s']:.3f}s one "
            f"engine {one['generation_s']:.3f}s x{lora_rows[-1]['generation_speedup']:.2f} | step "
            f"x{lora_rows[-1]['step_speedup']:.2f} | generation CPU s x{lora_rows[-1]['generation_cpu_speedup']:.2f} | sync {per_agent['weight_sync_s']:.3f}s vs "
            f"{one['weight_sync_s']:.3f}s",
            flush=True,
        )
    report = {
        "config": {
            "agents": 2,
            "prompts_per_step": args.prompts_per_step,
            "num_generations": args.num_generations,
            "threads": args.threads,
            "device": args.device,
            "dtype": args.dtype,
            "steps": args.steps,
            "warmup": args.warmup,
            "shapes": {m: SHAPES[m] for m in args.models},
        },
        "wall_s": time.perf_counter() - t_all,
        "results": rows,
        "lora_team": lora_rows,
    }
    write_json(Path(args.output), report)
    print(f"written to {args.output}")
    return report


if __name__ == "__main__":
    main()
