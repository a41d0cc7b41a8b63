"""Where a generation call's time goes: HF `generate` against vLLM's CPU engines, by operation (a py-spy profile).

    pip install py-spy                                  # in the vLLM venv of docs/vllm.md
    python benchmarks/vllm_profile.py --models tiny --backends hf vllm --calls 4 --warmup 2    # ~1 minute
    python benchmarks/vllm_profile.py                   # tiny and model; hf, vllm, vllm_merged, vllm_lora

Each configuration (model shape x backend) builds a MAGRPO trainer as `benchmarks/vllm_throughput.py` does (2 agents,
8 prompts x G=4, `--tokens` new tokens, one torch thread, float32) in its own process, calls the trainer's generation
engine `--warmup` times untimed, then `--calls` times under py-spy (a sampling profiler: no per-call overhead that
would inflate Python-heavy code, as cProfile's does). Only samples taken inside those calls count. Each sample is put
in the first category of `CATEGORIES` one of its frames matches (most specific first: the attention kernel before the
model forward that contains it), so the shares of a configuration sum to 1. Reported per configuration: the shares,
the generation wall and process CPU seconds per call, the decode steps per call (vLLM engine steps; HF forward calls)
and each category's milliseconds per decode step.

Backends: `hf` (transformers' `generate`), `vllm` (one colocated engine per agent), `vllm_merged` (a shared-base LoRA
team, r=8, one engine per agent with its adapter merged) and `vllm_lora` (the same team on ONE multi-LoRA engine).

This script imports vLLM, so it runs only in the vLLM venv: it is not in tests/test_benchmarks.py's SMALLEST runs
(the main venv has no vLLM).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from _common import (
    RESULT_PREFIX,
    RESULTS,
    ROOT,
    emit_result,
    machine,
    scratch_dir,
    set_offline_env,
    story_prompts,
    write_json,
)
from vllm_throughput import SHAPES

BACKENDS = ("hf", "vllm", "vllm_merged", "vllm_lora")
MARKER = "_profiled_calls"  # the child's function around the profiled calls: samples outside it are dropped


@dataclass(frozen=True)
class Category:
    """A sample belongs to the category when one of its frames (below the profiled call) contains a pattern of
    `anywhere`, or its innermost frame one of `leaf` (a loop's own lines, whose callees belong elsewhere). Frames read
    `function (path:line)`, paths relative to site-packages."""

    name: str
    anywhere: tuple[str, ...] = ()
    leaf: tuple[str, ...] = ()


# First match wins: the attention kernel before the model forward that contains it. One name may have several rules.
CATEGORIES = (
    Category(
        "attention kernel + KV-cache write", ("CPUAttentionBackendImpl.", "sdpa_attention_forward", "Cache.update (")
    ),
    Category("LoRA ops (per-token adapter gather + einsum)", ("vllm/lora/ops/", "vllm/lora/punica_wrapper/")),
    # the base model's GEMM inside a LoRA layer
    Category("model forward (linears, norms, MLP, rotary)", ("UnquantizedLinearMethod.apply (",)),
    Category("LoRA layers and adapter mapping", ("vllm/lora/", "lora_model_runner_mixin", "LoRAModelManager")),
    Category("lm head (logits)", ("compute_logits (",)),
    Category("sampling (RNG, softmax, logprobs)", ("vllm/v1/sample/", "LogitsProcessorList.__call__")),
    Category("input preparation (positions, masks, block tables)", ("create_causal_mask (",)),
    Category("model forward (linears, norms, MLP, rotary)", ("vllm/model_executor/", "LlamaModel.forward (")),
    Category("lm head (logits)", ("LlamaForCausalLM.forward (",)),
    # transformers' decode loop: its own lines are softmax, multinomial (most of it), the EOS mask, the token append
    Category("sampling (RNG, softmax, logprobs)", ("softmax (",), leaf=("GenerationMixin._sample (",)),
    Category("scheduler + KV-block allocation", ("vllm/v1/core/",)),
    Category(
        "input preparation (positions, masks, block tables)",
        (
            "vllm/v1/worker/",
            "vllm/v1/attention/",
            "vllm/forward_context",
            "prepare_inputs_for_generation",
            "_update_model_kwargs_for_generation",
            "StoppingCriteriaList.__call__",
            "StopCheck.__call__",
        ),
    ),
    Category(
        "output processing (per-request outputs)", ("vllm/v1/engine/output_processor", "vllm/v1/engine/logprobs")
    ),
    Category(
        "request intake (params, input processing)",
        ("_validate_and_add_requests", "_add_request", "vllm/v1/engine/input_processor", "SamplingParams"),
    ),
    Category("engine / decode loop, other", ("vllm/", "transformers/generation/")),
    Category("trl_marl glue (token ids, seeds, texts)", ("",)),
)


# torch's call plumbing: a "top function" is the innermost frame outside these
DISPATCH = ("torch/_ops.py", "torch/nn/modules/module.py", "torch/utils/_contextlib.py")


def categorize(raw: Path) -> tuple[dict[str, float], list[tuple[str, float]], int]:
    """py-spy's raw stacks of one run: each category's share of the samples inside the profiled calls, the 12
    innermost functions with the most samples (their share), and the number of samples."""
    by_category: Counter = Counter()
    by_leaf: Counter = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        inside = [i for i, frame in enumerate(frames) if frame.startswith(MARKER + " ")]
        if not inside:
            continue  # another thread, or py-spy's attach and detach
        frames = frames[inside[-1] + 1 :]
        for c in CATEGORIES:
            if any(p in f for p in c.anywhere for f in frames) or any(p in frames[-1] for p in c.leaf):
                by_category[c.name] += int(count)
                break
        named = [f for f in frames if not any(d in f for d in DISPATCH)] or frames
        by_leaf[named[-1].split(":")[0] + ")"] += int(count)
    total = sum(by_category.values())
    shares = {name: n / total for name, n in by_category.most_common()}
    return shares, [(leaf, n / total) for leaf, n in by_leaf.most_common(12)], total


def build_trainer(args):
    from datasets import Dataset

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.tasks.toy import length_ratio_reward
    from trl_marl.testing import tiny_model_path

    lora = args.backend in ("vllm_lora", "vllm_merged")
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    cfg = MAGRPOConfig(
        output_dir=scratch_dir("vllm_profile"),
        num_agents=2,
        num_generations=args.num_generations,
        max_completion_length=args.tokens,
        rollout_buffer_size=args.prompts_per_step,
        max_steps=1,
        logging_steps=10_000,  # no log-prob gap metric (a logged step's extra scoring forward, not generation)
        report_to="none",
        disable_tqdm=True,
        seed=0,
        use_cpu=True,
        use_vllm=args.backend != "hf",
        share_base_model=lora,
        # vLLM's settings only for a vLLM backend: with use_vllm=False the config refuses them (nothing reads them)
        **(
            dict(vllm_max_model_length=512, vllm_enable_lora=args.backend == "vllm_lora")
            if args.backend != "hf"
            else {}
        ),
    )
    data = Dataset.from_list([{"prompt": p} for p in story_prompts(args.prompts_per_step)])
    return MAGRPOTrainer(
        agent_model=tiny_model_path(**SHAPES[args.model]),
        reward_func=length_ratio_reward,
        args=cfg,
        train_dataset=data,
        model_config={"dtype": "float32"},
        peft_config=peft_config,
    )


def count_decode_steps(trainer) -> Counter:
    """Count vLLM engine steps (each engine's `step`) or HF forward calls (a pre-hook on each agent)."""
    counts: Counter = Counter()
    if trainer.args.use_vllm:
        for engine in trainer.generation.engines:
            core = engine.llm_engine
            step = core.step

            def counted(*a, _step=step, **kw):
                counts["steps"] += 1
                return _step(*a, **kw)

            core.step = counted
    else:
        for agent in trainer.team.agents:
            agent.register_forward_pre_hook(lambda *a: counts.update(steps=1))
    return counts


def _profiled_calls(generate, prompts, G: int, calls: int) -> list:
    return [generate(prompts, G) for _ in range(calls)]


def _timed(fn, *a) -> tuple[float, float, object]:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*a)
    return time.perf_counter() - t0, time.process_time() - c0, out


def run_child(args) -> dict:
    """Warm up, time `--calls` calls without the profiler, then profile as many with py-spy attached to this
    process (attached only now: engine start-up stays out of the profile and out of py-spy's overhead)."""
    import torch

    from trl_marl.data_types.text import PromptText

    torch.set_num_threads(1)
    torch.manual_seed(0)
    trainer = build_trainer(args)
    prompts = [[PromptText(p) for p in story_prompts(args.prompts_per_step)] for _ in range(2)]
    trainer.team.train()  # a training rollout, as in `train()`
    generate, G = trainer.generation.generate, args.num_generations
    for _ in range(args.warmup):
        generate(prompts, G)
    counts = count_decode_steps(trainer)
    wall, cpu, outputs = _timed(_profiled_calls, generate, prompts, G, args.calls)
    steps = counts["steps"]
    spy = [args.py_spy, "record", "--pid", str(os.getpid()), "--rate", str(args.rate), "--nonblocking"]
    spy = subprocess.Popen([*spy, "--format", "raw", "-o", args.raw], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)  # py-spy attaches
    profiled_wall, _, _ = _timed(_profiled_calls, generate, prompts, G, args.calls)
    spy.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
    spy.wait(timeout=60)
    new_tokens = sum(c.numel() for out in outputs for agent in out for c in agent.completion_ids)
    if trainer.args.use_vllm:
        trainer.generation.close()
    n = args.calls
    return {
        "model": args.model,
        "backend": args.backend,
        "calls": n,
        "wall_s_per_call": wall / n,
        "cpu_s_per_call": cpu / n,
        "profiled_wall_s_per_call": profiled_wall / n,
        "decode_steps_per_call": steps / n,
        "new_tokens_per_call": new_tokens / n,
    }


def profile(args, backend: str, model: str, raw: Path) -> dict:
    """Run one configuration in a child process; its result, py-spy's raw stacks written to `raw`."""
    child = [sys.executable, __file__, "--child", "--backend", backend, "--model", model, "--raw", str(raw)]
    child += ["--tokens", str(args.tokens), "--calls", str(args.calls), "--warmup", str(args.warmup)]
    child += ["--num_generations", str(args.num_generations), "--prompts_per_step", str(args.prompts_per_step)]
    child += ["--rate", str(args.rate), "--py_spy", args.py_spy]
    proc = subprocess.run(child, capture_output=True, text=True, cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if proc.returncode != 0 or line is None:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"profiling {backend} on {model} failed")
    return json.loads(line[len(RESULT_PREFIX) :])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    p.add_argument("--model", choices=list(SHAPES), help=argparse.SUPPRESS)
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    p.add_argument("--models", nargs="+", choices=["tiny", "model"], default=["tiny", "model"])
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--calls", type=int, default=10, help="profiled generation calls per configuration")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (vLLM's first calls are slow)")
    p.add_argument("--num_generations", type=int, default=4)
    p.add_argument("--prompts_per_step", type=int, default=8)
    p.add_argument("--rate", type=int, default=400, help="py-spy samples per second")
    p.add_argument("--raw", default=None, help="keep py-spy's raw stacks in this folder")
    p.add_argument("--py_spy", default=None, help=argparse.SUPPRESS)
    p.add_argument("--output", default=str(RESULTS / "vllm_profile.json"))
    args = p.parse_args(argv)
    set_offline_env()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.child:
        emit_result(run_child(args))
        return {}
    args.py_spy = str(Path(sys.executable).with_name("py-spy"))
    if not Path(args.py_spy).exists():
        args.py_spy = shutil.which("py-spy")
    if args.py_spy is None:
        raise SystemExit("py-spy not found: pip install py-spy (in the venv that runs this script)")
    raw_dir = Path(args.raw) if args.raw else Path(tempfile.mkdtemp(prefix="vllm_profile-"))
    raw_dir.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    rows = []
    for model in args.models:
        for backend in args.backends:
            raw = raw_dir / f"{model}_{backend}.txt"
            row = profile(args, backend, model, raw)
            shares, top, samples = categorize(raw)
            # seconds of process CPU per call, split by the shares: comparable across backends (each call makes
            # the same rows and tokens), steady under other load
            ms = {name: 1e3 * share * row["cpu_s_per_call"] for name, share in shares.items()}
            rows.append({**row, "samples": samples, "shares": shares, "cpu_ms_per_call": ms, "top_functions": top})
            print(
                f"{model} {backend}: {row['cpu_s_per_call']:.3f} CPU s/call, {row['decode_steps_per_call']:.0f} "
                f"engine steps (HF: forwards)/call, {samples} samples",
                flush=True,
            )
            for name, share in shares.items():
                print(f"  {share:6.1%} {ms[name]:8.1f} ms  {name}", flush=True)
    ratios = []
    for model in args.models:
        cpu = {r["backend"]: r["cpu_s_per_call"] for r in rows if r["model"] == model}
        for base, other in (("hf", "vllm"), ("vllm_merged", "vllm_lora")):
            if base in cpu and other in cpu:  # above 1: `other` is faster
                ratios.append({"model": model, "ratio": f"{base} / {other}", "cpu": cpu[base] / cpu[other]})
                print(f"{model}: CPU s per call {base} / {other} = {ratios[-1]['cpu']:.2f}", flush=True)
    report = {
        "config": {
            "agents": 2,
            "prompts_per_step": args.prompts_per_step,
            "num_generations": args.num_generations,
            "tokens": args.tokens,
            "threads": 1,
            "calls": args.calls,
            "warmup": args.warmup,
            "rate": args.rate,
            "shapes": {m: SHAPES[m] for m in args.models},
        },
        "machine": machine(),
        "load_average": os.getloadavg(),
        "wall_s": time.perf_counter() - t_all,
        "results": rows,
        "ratios": ratios,
    }
    write_json(Path(args.output), report)
    print(f"written to {args.output}")
    return report


if __name__ == "__main__":
    main()
