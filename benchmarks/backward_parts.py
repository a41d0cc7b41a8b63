"""An agent's rows backpropagated in parts against checkpointed chunks, on the model-shaped side-by-side's work.

    python benchmarks/backward_parts.py                          # 32 prompts per step: above the memory budget
    python benchmarks/backward_parts.py --prompts_per_step 8 --logprob_batch_size 8

Above the memory budget (or with `logprob_batch_size`) the REINFORCE family on one process cuts each agent's rows
into parts, each backpropagated right after its own forward (`trl_marl.trainers.agent_losses`,
`trl_marl.models.scoring.backward_parts`). The baseline is the code before it: one forward per agent, its rows in
chunks of the same size, every chunk but the last recomputed in the backward (activation checkpointing). The same
work as `comlrl_side_by_side.py` (2 Llama-shaped agents of 21.5M parameters, G=4, 16 new tokens, one torch thread);
each configuration runs in its own process, alternated `--rounds` times, and keeps its best round. Reported: seconds
per optimizer step, peak RSS, and the ratios parts / chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import _common
import comlrl_side_by_side as side_by_side

ROOT = Path(__file__).resolve().parents[1]


def child(opts) -> dict:
    """One trl_marl run; `--chunks` puts back the baseline (each agent one part: its checkpointed chunks)."""
    if opts.chunks:
        import trl_marl.trainers.agent_losses as agent_losses

        agent_losses.backward_parts = lambda model, batch, rows: [(0, batch.input_ids.shape[0])]
    return side_by_side.run_ours(opts)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--chunks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    p.add_argument("--ours_config", default="", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=2, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps first")
    p.add_argument("--rounds", type=int, default=2, help="alternate the two configurations this many times")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--num_generations", type=int, default=4)
    p.add_argument("--prompts_per_step", type=int, default=32)
    p.add_argument("--logprob_batch_size", type=int, default=None, help="None: the automatic size (the budget)")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "backward_parts.json"))
    opts = p.parse_args(argv)
    if opts.child:
        _common.emit_result(child(opts))
        return {}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from trl_marl.testing import tiny_model_path

    model = tiny_model_path(**side_by_side.SHAPE)
    topics = side_by_side.TOPICS
    n = opts.prompts_per_step * (opts.warmup + opts.steps)
    prompts = [f"Write the opening of a short story about {topics[i % len(topics)]}." for i in range(n)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    config = json.dumps({"logprob_batch_size": opts.logprob_batch_size} if opts.logprob_batch_size else {})
    flags = ["--child", "--model", model, "--prompts", f.name, "--ours_config", config]
    for key in ("steps", "warmup", "threads", "tokens", "num_generations", "prompts_per_step"):
        flags += [f"--{key}", str(getattr(opts, key))]
    _common.set_offline_env()
    os.environ["OMP_NUM_THREADS"] = str(opts.threads)
    runs: dict[str, list[dict]] = {"parts": [], "chunks": []}
    t0 = time.perf_counter()
    for r in range(opts.rounds):
        for name in ["parts", "chunks"] if r % 2 == 0 else ["chunks", "parts"]:
            result = _common.run_child(__file__, flags + (["--chunks"] if name == "chunks" else []))
            runs[name].append(result)
            print(name, json.dumps(result), flush=True)
    os.unlink(f.name)
    best = {
        name: {"s_per_step": min(x["s_per_step"] for x in rs), "peak_rss_mb": min(x["peak_rss_mb"] for x in rs)}
        for name, rs in runs.items()
    }
    report = {
        "config": {k: v for k, v in vars(opts).items() if k not in ("child", "chunks", "model", "prompts", "output")},
        "shape": side_by_side.SHAPE,
        "machine": _common.machine(),
        "wall_s": time.perf_counter() - t0,
        "runs": runs,
        "best": best,
        "step_time_ratio": best["parts"]["s_per_step"] / best["chunks"]["s_per_step"],
        "peak_rss_ratio": best["parts"]["peak_rss_mb"] / best["chunks"]["peak_rss_mb"],
    }
    print(
        f"s/step: parts {best['parts']['s_per_step']:.2f} chunks {best['chunks']['s_per_step']:.2f} "
        f"x{report['step_time_ratio']:.2f} | peak RSS: parts {best['parts']['peak_rss_mb']:.0f} MB chunks "
        f"{best['chunks']['peak_rss_mb']:.0f} MB x{report['peak_rss_ratio']:.2f}"
    )
    _common.write_json(Path(opts.output), report)
    return report


if __name__ == "__main__":
    main()
