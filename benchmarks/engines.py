"""Step time and per-rank peak RSS of the distributed engines on the same run, against 2-process DDP.

    python benchmarks/engines.py [--configs multi_cpu zero2_cpu zero3_cpu_flag_off zero3_cpu fsdp2_cpu] [--rounds 2]
                                 [--num_processes 4] [--mode rss=kl,steps=2] [--output PATH]
    python benchmarks/engines.py --configs multi_cpu --mode rss=steps=1 --output /tmp/engines.json  # smoke run

Each config launches `tests/scripts/dist_run.py OUT rss` (a model-shaped team: 2 agents, hidden 512, 8 layers;
MAGRPO, 3 steps) through `accelerate launch`; every rank writes its RSS before the trainer, its peak RSS, its RSS at
the end of each phase (built, prepared, rollout, step), its step times and the trainer's generation / update
seconds. `zero3_cpu_flag_off` is zero3_cpu.yaml with `zero3_init_flag: false`. With `--rounds N` the configs run
interleaved N times (round-robin, so that a load change on a shared machine hits every engine alike); each row is
the mean step time and the largest per-rank peak over the rounds, with ratios against the first config (DDP).
Writes `--output`, by default benchmarks/results/engines.json (`engines_{N}p_{mode}.json` with other
`--num_processes` / `--mode`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import RESULTS, ROOT, write_json

CONFIGS = ["multi_cpu", "zero2_cpu", "zero3_cpu_flag_off", "zero3_cpu", "fsdp2_cpu"]


def config_file(config: str, tmp: Path) -> Path:
    if config == "zero3_cpu_flag_off":
        path = tmp / f"{config}.yaml"
        text = (ROOT / "accelerate_configs" / "zero3_cpu.yaml").read_text()
        path.write_text(text.replace("zero3_init_flag: true", "zero3_init_flag: false"))
        return path
    return ROOT / "accelerate_configs" / f"{config}.yaml"


def run(config: str, out: Path, tmp: Path, num_processes: int = 2, mode: str = "rss") -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file(config, tmp))]
    cmd += ["--num_processes", str(num_processes), str(ROOT / "tests/scripts/dist_run.py"), str(out), mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{config} failed:\n{proc.stderr[-4000:]}")
    return [json.loads(f.read_text()) for f in sorted(out.glob("rss_rank*.json"))]


def load_average() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=CONFIGS)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--num_processes", type=int, default=2)
    p.add_argument("--mode", default="rss", help="dist_run.py's mode: `rss`, or `rss=kl,steps=2` (reference KL)")
    p.add_argument("--output", type=Path, default=None, help="default: benchmarks/results/engines[_{N}p_{mode}].json")
    a = p.parse_args(argv)
    if a.output is None:
        default = (a.num_processes, a.mode) == (2, "rss")
        a.output = RESULTS / ("engines.json" if default else f"engines_{a.num_processes}p_{a.mode}.json")
    runs: dict[str, list[list[dict]]] = {c: [] for c in a.configs}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for config in a.configs:
                loads.append(load_average())
                out = Path(tmp) / f"{config}_{r}"
                runs[config].append(run(config, out, Path(tmp), a.num_processes, a.mode))
    rows = {}
    for config, rounds in runs.items():
        ranks = [rank for ranks in rounds for rank in ranks]
        rows[config] = {
            "step_s": sum(sum(r["steps"]) / len(r["steps"]) for r in ranks) / len(ranks),
            "generation_s": sum(r["timings"].get("generation", 0.0) for r in ranks) / len(ranks),
            "update_s": sum(r["timings"].get("update", 0.0) for r in ranks) / len(ranks),
            "peak_rss_growth_mb": [round((r["peak"] - r["before"]) / 2**20) for r in ranks],
            "built_peak_growth_mb": [round((r["built"] - r["before"]) / 2**20) for r in ranks],
        }
    base = rows[a.configs[0]]
    for config, r in rows.items():
        r["step_vs_first"] = r["step_s"] / base["step_s"]
        r["memory_vs_first"] = max(r["peak_rss_growth_mb"]) / max(base["peak_rss_growth_mb"])
        print(
            f"{config:18} {r['step_s']:6.2f} s/step ({r['step_vs_first']:.2f}x)  generation {r['generation_s']:.1f} s"
            f"  update {r['update_s']:.1f} s  peak RSS growth {r['peak_rss_growth_mb']} MB"
            f" ({r['memory_vs_first']:.2f}x)  built {r['built_peak_growth_mb']} MB"
        )
    print(f"load average (1 min) before each launch: {[round(x, 1) for x in loads]}")
    result = {"rows": rows, "load_average": loads, "rounds": a.rounds, "num_processes": a.num_processes}
    write_json(a.output, {**result, "mode": a.mode})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
