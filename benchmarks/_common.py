"""Helpers the benchmark scripts share: the offline environment, prompts, peak RSS, one subprocess per
configuration, a small n-agent task, and plotting defaults.

The scripts import this module as `_common` (they run as `python benchmarks/<name>.py`, so their folder is on
`sys.path`).
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS_IMG = ROOT / "docs" / "img"
TINY_MODEL = "tiny llama v512 h64 i128 l2 a4"
RESULT_PREFIX = "RESULT "


def set_offline_env() -> None:
    """Offline, quiet, no telemetry: set before transformers / huggingface_hub are imported."""
    for k, v in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "CI": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "WANDB_MODE": "disabled",
        "TRL_EXPERIMENTAL_SILENCE": "1",
    }.items():
        os.environ.setdefault(k, v)


def scratch_dir(name: str) -> str:
    """A fresh temporary folder for a benchmark trainer's `output_dir` (these runs keep nothing there), removed at
    exit: a benchmark writes only where its `--output` flag says."""
    path = tempfile.mkdtemp(prefix=f"trl_marl-bench-{name}-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def publish_figures(figures: Sequence[Path], output: Path, default_output: Path) -> list[Path]:
    """Copy `figures` to `docs/img/` (the docs show them) only for a run whose `--output` is the default results file;
    a run pointed elsewhere writes nothing into the checkout. Returns the copies."""
    if Path(output).resolve() != Path(default_output).resolve():
        return []
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    copies = []
    for f in figures:
        (DOCS_IMG / f.name).write_bytes(f.read_bytes())
        copies.append(DOCS_IMG / f.name)
    return copies


def story_prompts(n: int) -> list[str]:
    """`n` story prompts over the toy tasks' topics (cycled)."""
    from trl_marl.tasks.toy import TOPICS

    return [f"Write the opening of a short story about {TOPICS[i % len(TOPICS)]}." for i in range(n)]


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MB (Linux reports `ru_maxrss` in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def peak_cuda_mb() -> float | None:
    """Peak CUDA memory this process allocated through torch, in MB; None where CUDA was never used."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def emit_result(result: dict[str, Any]) -> None:
    """Print a child's result as one `RESULT {json}` line for `run_child`."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def run_child(script: str | Path, args: Sequence[str], timeout: float | None = None) -> dict[str, Any]:
    """Run `python script *args` in a fresh process (so peak RSS is per configuration) and return the dict it
    printed with `emit_result`. Exits with the child's output tail when it fails."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ},
        cwd=ROOT,
        timeout=timeout,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if proc.returncode != 0 or line is None:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"benchmark run {list(args)} failed")
    return json.loads(line[len(RESULT_PREFIX) :])


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import torch

    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
    return found


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))


# ---------------------------------------------------------------------------------------------------- n-agent task


def letter_ranges(num_agents: int) -> list[frozenset[str]]:
    """The alphabet cut into `num_agents` contiguous ranges (one per agent)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    cuts = [round(k * len(letters) / num_agents) for k in range(num_agents + 1)]
    return [frozenset(letters[cuts[k] : cuts[k + 1]]) for k in range(num_agents)]


def team_letters_reward(*completions: list[str]) -> list[float]:
    """The coordination game for any team size n: agent k should write with the k-th n-th of the alphabet.

        r = mean_k share_{range_k}(completion of agent k)

    For n = 2 this is `trl_marl.tasks.toy.coordination_reward`.
    """
    ranges = letter_ranges(len(completions))

    def share(text: str, letters: frozenset[str]) -> float:
        chars = [c for c in text.lower() if c.isalpha() and c.isascii()]
        return sum(c in letters for c in chars) / len(chars) if chars else 0.0

    return [sum(share(t, r) for t, r in zip(joint, ranges)) / len(ranges) for joint in zip(*completions, strict=True)]


def team_formatters(num_agents: int) -> list:
    """One formatter per agent: the item's prompt and the agent's part."""

    def make(k: int):
        return lambda item: f"{item['prompt']} You write part {k + 1} of {num_agents}.\n"

    return [make(k) for k in range(num_agents)]


# ---------------------------------------------------------------------------------------------------- plotting


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
