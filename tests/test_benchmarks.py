"""The benchmark scripts survive their smallest settings and write only where their output flags say."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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


# Each script's smoke run: its fewest steps, repeats and configurations. Most of the time is process start-up
# (about 8 CPU-seconds of imports per trainer process). Longest first, so that the two-at-a-time runs end together.
SMALLEST = {
    "lora.py": ["--memory_model", "tiny", "--repeats", "1"],
    "trl_grpo_side_by_side.py": ["--steps", "1", "--warmup", "1", "--tokens", "4"],
    "throughput.py": ["--steps", "1", "--warmup", "0", "--repeats", "1", "--batched_prompts", "2"],
    "preference.py": ["--items", "2", "--candidates", "2", "--batch", "2"],
    "first_step.py": ["--steps", "3", "--shapes", "tiny"],  # 3: the steady step is the median of steps 3..N
    "grid.py": [
        *("--only", "trainers", "--trainers", "MAPPO"),  # with R (MAGRPO): MAPPO's step 1 timed no generation
        *("--steps", "1", "--warmup", "0", "--repeats", "1", "--items", "4"),
    ],
    "engines.py": ["--configs", "multi_cpu", "--mode", "rss=steps=1"],  # DDP, 2 processes, 1 step
    "learning_curves.py": [
        *("--tasks", "coordination", "--trainers", "MAGRPO", "--seeds", "0"),
        *("--max_steps", "2", "--eval_interval", "1"),
    ],
    "grpo_reuse.py": ["--steps", "1", "--repeats", "1", "--items", "4", "--max_completion_length", "4"],
    "vllm_throughput.py": [  # HF generate alone: the vLLM side needs vLLM (the default suite's vLLM venv)
        *("--backend", "hf", "--models", "tiny", "--tokens", "4"),
        *("--steps", "1", "--warmup", "0", "--prompts_per_step", "2"),
    ],
    "sandbox.py": ["--passes", "1", "--workers", "1", "--only", "canonical"],  # needs bubblewrap: _cannot_run_here
    "agentic.py": ["--prompts", "1", "--repeats", "1", "--max_completion_length", "4"],
    "checkpoint_cost.py": ["--repeats", "1", "--shapes", "tiny"],
    "backward_parts.py": [
        *("--prompts_per_step", "1", "--steps", "1", "--warmup", "1", "--tokens", "4"),
        *("--rounds", "1", "--logprob_batch_size", "2"),  # 4 rows in parts of 2
    ],
    "memory_table.py": [],  # estimates only: no model is built
    "fused_head.py": ["--shape", "tiny", "--tokens", "4", "--prompts", "2", "--repeats", "1"],
}
# Scripts CI's main venv cannot run, and why; the default suite checks that they compile and answer `--help`.
NOT_RUN = {
    "comlrl_side_by_side.py": "needs CoMLRL 1.4.3 in its own venv (/work/comlrl-venv), which CI does not build",
    "vllm_profile.py": "profiles vLLM's engines with py-spy: needs vLLM (the vLLM venv), absent from the main venv",
}


def test_every_benchmark_script_is_smoke_run_or_says_why_not():
    """A new benchmark cannot be forgotten: each script is in exactly one of SMALLEST (the slow test runs it) and
    NOT_RUN (with the reason)."""
    scripts = {p.name for p in BENCH.glob("*.py")} - {"_common.py"}
    assert not set(SMALLEST) & set(NOT_RUN), f"in both SMALLEST and NOT_RUN: {sorted(set(SMALLEST) & set(NOT_RUN))}"
    listed = set(SMALLEST) | set(NOT_RUN)
    assert not scripts - listed, f"benchmarks in neither SMALLEST nor NOT_RUN: {sorted(scripts - listed)}"
    assert not listed - scripts, f"SMALLEST / NOT_RUN name scripts that do not exist: {sorted(listed - scripts)}"
    assert all(reason.strip() for reason in NOT_RUN.values())


def test_every_benchmark_script_compiles_and_the_unrun_ones_answer_help():
    """Every script parses (compiled in memory: no __pycache__ in the checkout); the ones the slow test cannot run
    at least import in this venv and build their argument parser."""
    for script in sorted(BENCH.glob("*.py")):
        compile(script.read_text(), str(script), "exec")
    for script in NOT_RUN:
        proc = subprocess.run(
            [sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0 and "usage:" in proc.stdout, f"{script} --help: {proc.stderr[-2000:]}"


def _cannot_run_here() -> dict[str, str]:
    """Scripts of SMALLEST this machine lacks a system requirement for (CI installs them), with the reason."""
    from trl_marl.tasks.sandbox import strong_sandbox_problem

    missing = {}
    problem = strong_sandbox_problem()
    if problem is None:
        from sandbox import BASELINE_COMMIT

        history = subprocess.run(
            ["git", "cat-file", "-e", f"{BASELINE_COMMIT}^{{commit}}"], cwd=ROOT, capture_output=True
        )
        problem = None if history.returncode == 0 else f"the checkout lacks commit {BASELINE_COMMIT} (its baseline)"
    if problem:
        missing["sandbox.py"] = problem
    return missing


@pytest.mark.slow
def test_every_benchmark_runs_at_its_smallest_settings_into_a_temp_dir(tmp_path, monkeypatch):
    """Each script at its smallest settings, `--output` in a temp dir: it finishes, writes its JSON there and
    nothing into the checkout (docs/img, benchmarks/results, outputs/)."""
    monkeypatch.syspath_prepend(str(BENCH))
    skipped = _cannot_run_here()
    watched = (ROOT / "docs" / "img", BENCH / "results", ROOT / "outputs")
    before = _fingerprint(*watched)
    outputs_existed = (ROOT / "outputs").exists()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def smoke_run(script: str, flags: list[str]) -> tuple[str, Path, subprocess.CompletedProcess, float]:
        out = tmp_path / script.removesuffix(".py") / "result.json"
        cmd = [sys.executable, str(BENCH / script), *flags, "--output", str(out)]
        start = time.perf_counter()
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900
        )
        return script, out, proc, time.perf_counter() - start

    runnable = [(script, flags) for script, flags in SMALLEST.items() if script not in skipped]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time: the machine has 2 cores, each run uses one
        runs = list(pool.map(lambda item: smoke_run(*item), runnable))
    for script, out, proc, seconds in runs:
        print(f"{script}: {seconds:.0f} s")
        assert proc.returncode == 0, f"{script}: {proc.stdout[-4000:]}"
        assert json.loads(out.read_text()), script
    assert _fingerprint(*watched) == before
    assert (ROOT / "outputs").exists() == outputs_existed
    if skipped:
        pytest.skip(f"not run on this machine: {skipped}")


@pytest.mark.parametrize(
    "script, flags, message",
    [
        (
            "first_step.py",
            ["--steps", "2"],
            "--steps must be >= 3 (the steady step is the median of steps 3..N), got 2",
        ),
        ("engines.py", ["--configs", "zero9"], "argument --configs: invalid choice: 'zero9'"),
    ],
)
def test_benchmark_arguments_are_refused_before_any_run(script, flags, message, tmp_path):
    """A smoke setting the median cannot use, an engine config that does not exist: argparse's error, exit 2."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *flags, "--output", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "r.json").exists()


# `python benchmarks/x.py ARGS` in the docs, the benchmarks' README and the scripts' docstrings (usage synopses'
# brackets dropped); shell lines joined at their backslashes; comments, pipes and redirections end a command
_DOCUMENTED = re.compile(r"python3? (benchmarks/\w+\.py)((?:[ \t]+[^\s`#|;&>]+)*)")
_PARSE_ONLY = """
import argparse, json, runpy, sys
class Parsed(Exception):
    pass
original = argparse.ArgumentParser.parse_args
def parse_args(self, args=None, namespace=None):
    original(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parse_args
failed = []
for script, argv in json.loads(sys.argv[1]):
    sys.argv = [script, *argv]
    try:
        runpy.run_path(script, run_name="__main__")
        failed.append([script, argv, "ran without parsing its arguments"])
    except Parsed:
        pass
    except SystemExit as exc:
        if exc.code not in (0, None):
            failed.append([script, argv, f"exit {exc.code}"])
print(json.dumps(failed))
"""


def _documented_benchmark_commands() -> list[tuple[str, list[str]]]:
    sources = [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", BENCH / "README.md", *BENCH.glob("*.py")]
    commands = set()
    for source in sources:
        for match in _DOCUMENTED.finditer(source.read_text().replace("\\\n", " ")):
            argv = shlex.split(match.group(2).replace("[", " ").replace("]", " "))
            commands.add((match.group(1), tuple(argv)))
    return sorted((script, list(argv)) for script, argv in commands)


def test_every_documented_benchmark_command_parses():
    """Each `python benchmarks/...` command a reader can copy names a script that exists and arguments its parser
    takes (parsed only: the parser stops the script before it runs)."""
    commands = _documented_benchmark_commands()
    assert len(commands) > 40, commands  # the extraction finds the docs' commands
    missing = sorted({script for script, _ in commands if not (ROOT / script).is_file()})
    assert not missing, f"documented benchmark scripts that do not exist: {missing}"
    proc = subprocess.run(
        [sys.executable, "-c", _PARSE_ONLY, json.dumps(commands)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(BENCH)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, f"documented commands their scripts refuse: {failed}\n{proc.stderr[-3000:]}"


def test_gpu_check_refuses_an_unknown_device():
    proc = subprocess.run(
        ["bash", str(BENCH / "gpu_check.sh")],
        env={**os.environ, "GPU_CHECK_DEVICE": "tpu"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "GPU_CHECK_DEVICE must be cuda (the default) or cpu (a smoke run), got 'tpu'" in proc.stderr


@pytest.mark.slow
def test_gpu_check_runs_its_commands_at_smoke_size_on_cpu(tmp_path):
    """`benchmarks/gpu_check.sh`'s commands, as written, at smoke size on CPU (`GPU_CHECK_DEVICE=cpu`): each writes
    its JSON; without vLLM the script says it skips the vLLM runs and runs the HF ones."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        ["bash", str(BENCH / "gpu_check.sh"), str(out)],
        env={**os.environ, "GPU_CHECK_DEVICE": "cpu", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    throughput = json.loads(out.read_text())
    side_by_side = json.loads((tmp_path / "gpu_check_trl_grpo.json").read_text())
    assert side_by_side["runs"]["trl"]["s_per_step"] > 0 and side_by_side["runs"]["trl_marl"]["s_per_step"] > 0
    has_vllm = importlib.util.find_spec("vllm") is not None
    assert ("vLLM is not installed" in proc.stdout) != has_vllm
    assert set(throughput["results"][0]) >= ({"hf", "vllm"} if has_vllm else {"hf"})
