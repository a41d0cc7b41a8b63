"""trl_marl's MAGRPO against the reference library CoMLRL 1.4.3 on the same model shape and work, in one run.

    python benchmarks/comlrl_side_by_side.py                               # CoMLRL from /work/comlrl-venv
    python benchmarks/comlrl_side_by_side.py --comlrl_python /path/to/venv/bin/python --rounds 2

CoMLRL needs its own environment (it pins another transformers and pulls wandb):
`python3 -m venv comlrl-venv && comlrl-venv/bin/pip install torch==2.13.0 comlrl==1.4.3`.

The work: 2 agents, Llama-shaped (hidden 512, intermediate 1024, 8 layers, 8 heads, vocab 512: 21.5M parameters per
agent, fp32, random weights, the project's tiny tokenizer), G=4 samples per prompt, 16 new tokens (temperature 1,
no top-k / top-p), 8 prompts per optimizer step (CoMLRL: `rollout_buffer_size=train_batch_size=8`, one AdamW step
per agent per 8 prompts; trl_marl: `rollout_buffer_size=8`), advantage normalization on, the same joint reward (a
length ratio), one torch thread. Each library runs in its own process: `--warmup` untimed optimizer steps, then
`--steps` timed ones (wall time from the end of the last warm-up step to the end of the last step). Reported per
library: prompts per second, peak RSS of the process (`ru_maxrss`: imports, model, optimizer, the steps), RSS after
the imports, and the ratios trl_marl / CoMLRL. `--rounds` alternates the two processes that many times (a load
change hits both); each keeps its best round (fastest, and lowest peak RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = "RESULT "
SHAPE = dict(
    hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8
)
TOPICS = ["a lighthouse", "a lost key", "two robots", "a storm", "a garden", "an old map", "a train", "a violin"]


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MB."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    current = int(fields["VmRSS"].split()[0]) / 1024
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reward(a: list[str], b: list[str]) -> list[float]:
    """Agent 2 should write twice as much as agent 1 (1 at a ratio of exactly 2)."""
    return [1.0 / (1.0 + abs(len(y) / max(len(x), 1) - 2.0)) for x, y in zip(a, b)]


# ---------------------------------------------------------------------------------------------------------- CoMLRL
def run_comlrl(opts) -> dict:
    import torch

    torch.set_num_threads(opts.threads)
    from comlrl.trainers import MAGRPOConfig, MAGRPOTrainer
    from datasets import Dataset
    from transformers import AutoTokenizer

    after_import = rss_mb()[0]
    prompts = json.loads(Path(opts.prompts).read_text())
    torch.manual_seed(0)
    cfg = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=1e-5,
        logging_steps=10**6,
        num_agents=2,
        num_generations=opts.num_generations,
        max_new_tokens=opts.tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        num_turns=1,
        early_termination_threshold=None,
        eval_interval=0,
        rollout_buffer_size=opts.prompts_per_step,
        train_batch_size=opts.prompts_per_step,
    )
    trainer = MAGRPOTrainer(
        agent_model=opts.model,
        num_agents=2,
        tokenizer=AutoTokenizer.from_pretrained(opts.model),
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        reward_func=reward,
        args=cfg,
    )
    ends: list[tuple[float, float]] = []  # (wall, CPU) seconds at the end of each optimizer step
    last = trainer.optimizers[-1]
    step = last.step

    def timed_step(*a, **kw):
        out = step(*a, **kw)
        ends.append((time.perf_counter(), time.process_time()))
        return out

    last.step = timed_step
    trainer.train()
    return _summary("comlrl", ends, opts, after_import)


# ---------------------------------------------------------------------------------------------------------- trl_marl
def run_ours(opts) -> dict:
    import torch

    torch.set_num_threads(opts.threads)
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_marl import MAGRPOConfig, MAGRPOTrainer

    after_import = rss_mb()[0]
    prompts = json.loads(Path(opts.prompts).read_text())
    ends: list[tuple[float, float]] = []  # (wall, CPU) seconds at the end of each optimizer step

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append((time.perf_counter(), time.process_time()))

    extra = json.loads(opts.ours_config) if opts.ours_config else {}
    settings = dict(
        output_dir=tempfile.mkdtemp(prefix="side-by-side-"),
        num_agents=2,
        num_generations=opts.num_generations,
        max_completion_length=opts.tokens,
        rollout_buffer_size=opts.prompts_per_step,
        learning_rate=1e-5,
        max_steps=opts.warmup + opts.steps,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    cfg = MAGRPOConfig(**{**settings, **extra})
    trainer = MAGRPOTrainer(
        model=opts.model,
        reward_funcs=reward,
        args=cfg,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        callbacks=[StepEnds()],
    )
    trainer.train()
    if opts.ours_config and "logging_steps" in extra:  # where the time went, from the trainer's own metrics
        print({k: v for k, v in trainer.state.log_history[-2].items() if k.startswith("time/")}, file=sys.stderr)
    return _summary("trl_marl", ends, opts, after_import)


def _summary(name: str, ends: list[tuple[float, float]], opts, after_import: float) -> dict:
    if len(ends) < opts.warmup + opts.steps:
        raise SystemExit(f"{name}: {len(ends)} optimizer steps, expected {opts.warmup + opts.steps}")
    timed = ends[opts.warmup - 1 : opts.warmup + opts.steps] if opts.warmup else ends[: opts.steps]
    seconds, cpu = timed[-1][0] - timed[0][0], timed[-1][1] - timed[0][1]
    steps = len(timed) - 1
    return {
        "library": name,
        "steps": steps,
        "seconds": seconds,
        "s_per_step": seconds / steps,
        "cpu_s_per_step": cpu / steps,
        "prompts_per_s": steps * opts.prompts_per_step / seconds,
        "prompts_per_cpu_s": steps * opts.prompts_per_step / cpu,
        "rss_after_import_mb": after_import,
        "peak_rss_mb": rss_mb()[1],
    }


# ---------------------------------------------------------------------------------------------------------- parent
def child(python: str, which: str, opts, model: str, prompts: str) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--child", which, "--model", model, "--prompts", prompts]
    cmd += ["--steps", str(opts.steps), "--warmup", str(opts.warmup), "--threads", str(opts.threads)]
    cmd += ["--tokens", str(opts.tokens), "--num_generations", str(opts.num_generations)]
    cmd += ["--prompts_per_step", str(opts.prompts_per_step)]
    if opts.ours_config:
        cmd += ["--ours_config", opts.ours_config]
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    env.update(TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error", TRL_EXPERIMENTAL_SILENCE="1")
    if which == "comlrl":
        env.pop("PYTHONPATH", None)  # CoMLRL's own environment only
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)), None)
    if proc.returncode != 0 or line is None:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit(f"the {which} run failed")
    return json.loads(line[len(RESULT) :])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", choices=["comlrl", "ours"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    p.add_argument("--comlrl_python", default=os.environ.get("COMLRL_PYTHON", "/work/comlrl-venv/bin/python"))
    p.add_argument("--steps", type=int, default=4, help="timed optimizer steps (8 prompts each)")
    p.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps first")
    p.add_argument("--rounds", type=int, default=1, help="alternate the two processes this many times")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--num_generations", type=int, default=4)
    p.add_argument("--prompts_per_step", type=int, default=8)
    p.add_argument("--ours_config", default="", help="extra MAGRPOConfig fields for trl_marl, as JSON")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "comlrl_side_by_side.json"))
    opts = p.parse_args(argv)
    if opts.child:
        run = run_comlrl if opts.child == "comlrl" else run_ours
        print(RESULT + json.dumps(run(opts)), flush=True)
        return {}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from trl_marl.testing import tiny_model_path

    model = tiny_model_path(**SHAPE)
    n = opts.prompts_per_step * (opts.warmup + opts.steps)
    prompts = [f"Write the opening of a short story about {TOPICS[i % len(TOPICS)]}." for i in range(n)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    runs: dict[str, list[dict]] = {"comlrl": [], "trl_marl": []}
    t0 = time.perf_counter()
    for r in range(opts.rounds):
        order = [("comlrl", opts.comlrl_python), ("ours", sys.executable)]
        for which, python in order if r % 2 == 0 else order[::-1]:
            result = child(python, which, opts, model, f.name)
            runs[result["library"]].append(result)
            print(json.dumps(result), flush=True)
    os.unlink(f.name)
    best = {
        name: {
            "prompts_per_s": max(x["prompts_per_s"] for x in rs),
            "prompts_per_cpu_s": max(x["prompts_per_cpu_s"] for x in rs),
            "peak_rss_mb": min(x["peak_rss_mb"] for x in rs),
            "rss_after_import_mb": min(x["rss_after_import_mb"] for x in rs),
        }
        for name, rs in runs.items()
    }
    ours, ref = best["trl_marl"], best["comlrl"]
    report = {
        "config": {k: v for k, v in vars(opts).items() if k not in ("child", "model", "prompts", "output")},
        "shape": SHAPE,
        "wall_s": time.perf_counter() - t0,
        "runs": runs,
        "best": best,
        "prompts_per_s_ratio": ours["prompts_per_s"] / ref["prompts_per_s"],
        "prompts_per_cpu_s_ratio": ours["prompts_per_cpu_s"] / ref["prompts_per_cpu_s"],
        "peak_rss_ratio": ours["peak_rss_mb"] / ref["peak_rss_mb"],
    }
    print(
        f"prompts/s: trl_marl {ours['prompts_per_s']:.2f} CoMLRL {ref['prompts_per_s']:.2f} "
        f"x{report['prompts_per_s_ratio']:.2f} (CPU time x{report['prompts_per_cpu_s_ratio']:.2f}) | peak RSS: trl_marl {ours['peak_rss_mb']:.0f} MB CoMLRL "
        f"{ref['peak_rss_mb']:.0f} MB x{report['peak_rss_ratio']:.2f}"
    )
    out = Path(opts.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
