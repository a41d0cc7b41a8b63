"""Wall time of the `code` task's evaluator: the kernel-enforced sandbox (issue 25) against the evaluator it replaced.

The baseline is the evaluator of commit `BASELINE_COMMIT` (trusted harness in the trainer, one bubblewrap process
per program, no uid drop, no seccomp, `aux` judged by its shape), loaded from git history into a temporary package,
so no old code stays in the library. Both run in this process, in the same run, on two batches of HumanEval joint
actions:

- `hanging`: 64 joint actions, 40 canonical solutions, 8 wrong ones and 16 that loop forever (each costs
  `max_timeouts x test_timeout_s` = 2 x 2 s);
- `canonical`: 64 canonical solutions;
- `aux`: 64 canonical solutions written by agent 1 as `aux` (the entry point's name renamed), with agent 2's entry
  point a wrapper that calls it: every test's calls go through the `aux` proxy, and the new evaluator replays the
  tests once more to judge whether `aux`'s result is used (the baseline judged it from the code's shape).

Defaults of the task (`test_timeout_s=2.0`, `max_timeouts=2`, `timeout_s=10.0`), 2 workers. The configurations run
interleaved, `--passes` times; each keeps its fastest pass (all passes are in the JSON).

    python benchmarks/sandbox.py                 # about 4 minutes; writes benchmarks/results/sandbox.json
    python benchmarks/sandbox.py --only aux      # about 1 minute; writes benchmarks/results/sandbox_aux.json
    python benchmarks/sandbox.py --passes 1 --workers 1 --only canonical --output /tmp/sandbox.json  # smoke run

Needs bubblewrap and libseccomp (`trl_marl.tasks.sandbox.strong_sandbox_problem()` says what is missing) and the git
history of the checkout (the baseline commit).
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, ROOT, write_json

BASELINE_COMMIT = "a203d5c"
BASELINE_FILES = ("trl_marl/sandbox.py", "trl_marl/tasks/base.py", "trl_marl/tasks/code.py")


def load_baseline(folder: Path):
    """The baseline `CodeEvaluator` class, from git history, as package `trl_marl_baseline` under `folder`."""
    pkg = folder / "trl_marl_baseline"
    (pkg / "tasks").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks" / "__init__.py").write_text("")
    for path in BASELINE_FILES:
        source = subprocess.run(
            ["git", "show", f"{BASELINE_COMMIT}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        (pkg / Path(path).relative_to("trl_marl")).write_text(source)
    sys.path.insert(0, str(folder))
    return importlib.import_module("trl_marl_baseline.tasks.code").CodeEvaluator


def batches(problems: list[dict]) -> dict[str, tuple[list[str], list[str], list[dict]]]:
    aux = "```python\ndef aux(x):\n    return x\n```"
    items = [{**p, "problem": p["prompt"]} for p in problems[:64]]

    def canonical(p: dict) -> str:
        return f"```python\n{p['prompt']}{p['canonical_solution']}\n```"

    def wrong(p: dict) -> str:
        return f"```python\ndef {p['entry_point']}(*args):\n    return None\n```"

    def hanging(p: dict) -> str:
        return f"```python\ndef {p['entry_point']}(*args):\n    while True:\n        pass\n```"

    def as_aux(p: dict) -> str:
        code = re.sub(rf"\b{re.escape(p['entry_point'])}\b", "aux", p["prompt"] + p["canonical_solution"])
        return f"```python\n{code}\n```"

    def wrapper(p: dict) -> str:
        return f"```python\ndef {p['entry_point']}(*args):\n    return aux(*args)\n```"

    mixed = [hanging(p) if i % 4 == 0 else wrong(p) if i % 8 == 1 else canonical(p) for i, p in enumerate(items)]
    return {
        "hanging": ([aux] * 64, mixed, items),
        "canonical": ([aux] * 64, [canonical(p) for p in items], items),
        "aux": ([as_aux(p) for p in items], [wrapper(p) for p in items], items),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--only", nargs="*", choices=["hanging", "canonical", "aux"], default=["hanging", "canonical"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="default: benchmarks/results/sandbox.json, or sandbox_<batches>.json without both hanging and canonical",
    )
    args = parser.parse_args()
    if args.output is None:
        both = set(args.only) >= {"hanging", "canonical"}
        args.output = RESULTS / ("sandbox.json" if both else f"sandbox_{'_'.join(args.only)}.json")

    from trl_marl.tasks.code import CodeEvaluator, load_humaneval

    work = batches(load_humaneval())
    with tempfile.TemporaryDirectory() as tmp:
        baseline_cls = load_baseline(Path(tmp))
        configs = {
            f"baseline ({BASELINE_COMMIT})": lambda: baseline_cls(max_workers=args.workers),
            "kernel-enforced sandbox": lambda: CodeEvaluator(max_workers=args.workers, backend="bwrap"),
        }
        runs: dict[str, dict[str, list[dict]]] = {b: {c: [] for c in configs} for b in args.only}
        for _ in range(args.passes):
            for batch in args.only:
                for name, make in configs.items():
                    evaluator = make()  # fresh: no cache
                    start = time.monotonic()
                    evs = evaluator.evaluate(*work[batch])
                    wall = time.monotonic() - start
                    passed = sum(ev.passed == len(ev.tests) and len(ev.tests) > 0 for ev in evs)
                    runs[batch][name].append({"wall_s": wall, "fully_passed": passed})
                    print(f"{batch:9s} {name:38s} {wall:7.2f} s  fully passed {passed}/64", flush=True)
    summary = {}
    for batch, by_config in runs.items():
        base = min(r["wall_s"] for r in by_config[f"baseline ({BASELINE_COMMIT})"])
        summary[batch] = {
            name: {"best_wall_s": min(r["wall_s"] for r in rs), "x_baseline": min(r["wall_s"] for r in rs) / base}
            for name, rs in by_config.items()
        }
    for batch, rows in summary.items():
        for name, row in rows.items():
            print(f"{batch:9s} {name:38s} best {row['best_wall_s']:7.2f} s  x baseline {row['x_baseline']:.2f}")
    write_json(args.output, {"workers": args.workers, "passes": args.passes, "summary": summary, "runs": runs})
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
