"""Step time and per-rank peak RSS of the distributed engines on the same run, against 2-process DDP.

    python benchmarks/engines.py [--configs multi_cpu zero3_cpu fsdp2_cpu]

Each config launches `tests/scripts/dist_run.py OUT rss` (a model-shaped team: 2 agents, hidden 512, 8 layers;
MAGRPO, 3 steps) through `accelerate launch`; every rank writes its RSS before the trainer, its peak RSS, its step
times and the trainer's generation / update seconds. Prints one row per engine with ratios against the first
config (DDP) and writes benchmarks/results/engines.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(config: str, out: Path) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    cmd += [str(ROOT / "accelerate_configs" / f"{config}.yaml"), str(ROOT / "tests/scripts/dist_run.py"), str(out)]
    proc = subprocess.run([*cmd, "rss"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{config} failed:\n{proc.stderr[-4000:]}")
    return [json.loads(f.read_text()) for f in sorted(out.glob("rss_rank*.json"))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["multi_cpu", "zero3_cpu", "fsdp2_cpu"])
    a = p.parse_args(argv)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for config in a.configs:
            ranks = run(config, Path(tmp) / config)
            rows[config] = {
                "step_s": sum(sum(r["steps"]) / len(r["steps"]) for r in ranks) / len(ranks),
                "generation_s": max(r["timings"].get("generation", 0.0) for r in ranks),
                "update_s": max(r["timings"].get("update", 0.0) for r in ranks),
                "peak_rss_growth_mb": [round((r["peak"] - r["before"]) / 2**20) for r in ranks],
            }
    base = rows[a.configs[0]]
    for config, r in rows.items():
        r["step_vs_first"] = r["step_s"] / base["step_s"]
        r["memory_vs_first"] = max(r["peak_rss_growth_mb"]) / max(base["peak_rss_growth_mb"])
        print(
            f"{config:12} {r['step_s']:6.2f} s/step ({r['step_vs_first']:.2f}x)  generation {r['generation_s']:.1f} s"
            f"  update {r['update_s']:.1f} s  peak RSS growth {r['peak_rss_growth_mb']} MB"
            f" ({r['memory_vs_first']:.2f}x)"
        )
    out = ROOT / "benchmarks" / "results" / "engines.json"
    out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
