"""The benchmark scripts survive their smallest settings and write only where their output flags say."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture
def bench_module(monkeypatch):
    """Import a benchmark script as a module (they import `_common` from their own folder)."""
    monkeypatch.syspath_prepend(str(BENCH))

    def load(name: str):
        return importlib.import_module(name)

    return load


def _result(trainer: str, prompts_per_s: float, **extra) -> dict:
    return {
        "config": {"trainer": trainer, "num_agents": 2, "num_generations": 4, "max_new_tokens": 16},
        "s_per_step_mean": 0.5,
        "cpu_s_per_step_mean": 0.4,
        "prompts_per_s": prompts_per_s,
        "tokens_per_s": 10.0 * prompts_per_s,
        "peak_rss_mb": 500.0,
        "phase_s_per_step": dict.fromkeys(["generation", "reward", "scoring", "update", "other"], 0.1),
        **extra,
    }


def test_grid_tables_survive_runs_that_timed_no_generation(bench_module):
    """`grid.py --only trainers --steps 1`: MAPPO's one timed step reuses a rollout (0 prompts/s) and is not MADPO
    (no pairs/s): the tables must not raise (it was a KeyError 'pairs_per_s'), and ratios to a zero are NaN."""
    grid = bench_module("grid")
    results = [
        _result("MAGRPO", 8.0),
        _result("MAPPO", 0.0),
        _result("MADPO", 0.0, pairs_per_s=16.0),
    ]
    grid.add_ratios(results)
    table = grid.markdown(results, ["trainers"])
    assert "| MAPPO |" in table and "0 (no generation timed) | -" in table and "(16 pairs/s) | -" in table
    silent = [_result("MAGRPO", 0.0), _result("MAPPO", 0.0)]
    grid.add_ratios(silent)  # R itself generated nothing: no ZeroDivisionError
    assert math.isnan(silent[1]["prompts_per_s_vs_ref"])


def test_figures_reach_docs_img_only_for_the_default_output(bench_module, tmp_path):
    common = bench_module("_common")
    figure = tmp_path / "grid_trainers.png"
    figure.write_bytes(b"not the docs' figure")
    before = _fingerprint(common.DOCS_IMG)
    assert common.publish_figures([figure], tmp_path / "grid.json", common.RESULTS / "grid.json") == []
    assert _fingerprint(common.DOCS_IMG) == before


def _fingerprint(*folders: Path) -> dict[str, str]:
    out = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")) if folder.exists() else []:
            if path.is_file():
                out[str(path)] = hashlib.sha1(path.read_bytes()).hexdigest()
    return out


SMALLEST = {
    "agentic.py": ["--prompts", "1", "--repeats", "1", "--max_completion_length", "4"],
    "throughput.py": ["--steps", "1", "--warmup", "0", "--repeats", "1", "--batched_prompts", "2"],
    "grid.py": [
        *("--only", "trainers", "--trainers", "MAPPO"),  # with R (MAGRPO): MAPPO's step 1 timed no generation
        *("--steps", "1", "--warmup", "0", "--repeats", "1", "--items", "4"),
    ],
    "preference.py": ["--items", "2", "--candidates", "2", "--batch", "2"],
    "lora.py": ["--memory_model", "tiny", "--repeats", "1"],
    "grpo_reuse.py": ["--steps", "1", "--repeats", "1", "--items", "4", "--max_completion_length", "4"],
    "learning_curves.py": [
        *("--tasks", "coordination", "--trainers", "MAGRPO", "--seeds", "0"),
        *("--max_steps", "2", "--eval_interval", "1"),
    ],
}


@pytest.mark.slow
def test_every_benchmark_runs_at_its_smallest_settings_into_a_temp_dir(tmp_path):
    """Each script at its smallest settings, `--output` in a temp dir: it finishes, writes its JSON there and
    nothing into the checkout (docs/img, benchmarks/results, outputs/)."""
    watched = (ROOT / "docs" / "img", BENCH / "results", ROOT / "outputs")
    before = _fingerprint(*watched)
    outputs_existed = (ROOT / "outputs").exists()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pending, running = list(SMALLEST.items()), []
    while pending or running:
        while pending and len(running) < 2:  # two scripts at a time: the machine has 2 cores, each run uses one
            script, flags = pending.pop(0)
            out = tmp_path / script.removesuffix(".py") / "result.json"
            cmd = [sys.executable, str(BENCH / script), *flags, "--output", str(out)]
            proc = subprocess.Popen(
                cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            running.append((script, out, proc))
        script, out, proc = running.pop(0)
        log, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{script}: {log[-4000:]}"
        assert json.loads(out.read_text()), script
    assert _fingerprint(*watched) == before
    assert (ROOT / "outputs").exists() == outputs_existed
