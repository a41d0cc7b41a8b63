"""Learning curves: the eval task reward against training steps, for every trainer on the built-in toy tasks.

    python benchmarks/learning_curves.py                                  # 9 trainers x 2 tasks x 3 seeds
    python benchmarks/learning_curves.py --tasks coordination --seeds 0 --trainers MAGRPO MADPO

Each curve is a recipe run on the tiny Llama, `recipes/<algo>.py --task TASK --seed SEED --max_steps 40
--eval_interval 5`: the recipe's embedded tiny defaults (`trl_marl.cli.recipe_args.TINY_DEFAULTS` and the recipe's own:
learning rate 3e-3, G=4, 16 new tokens, 8 prompts per rollout; MADPO: ~250 pairs from 4 candidates per item, 8
pairs per step; MARLHF: a joint reward model fitted on all pairs of 8 candidates per item, then RL) with a common
budget of 40 training steps (the recipes' own is 60, MADPO's 4 epochs) and, for MARLHF, one reward-model epoch
instead of two (`--reward_num_train_epochs 1`): that keeps the whole benchmark near half an hour here. Every 5
training steps the trainer samples the current agents once per item on the task's 16 held-out items and scores
them with the TASK reward (`eval_reward`, through the config's `eval_interval`; a fixed sampling stream, so
successive points differ only by the weights). Step 0 is the recipe's evaluation before training. The
MAGRPO-family variants run with `--baseline raw|loo|max` (advantage normalization off, as the recipe sets it).
Seeds change the training randomness (sampling, shuffling) and the evaluation's sampling stream (seeded from the
run's seed); the initial model is the same tiny Llama for every run, so the spread of the step-0 points over seeds
is the evaluation's own sampling noise.

A "training step" is one optimizer step: MAGRPO-family, MAAC and IAC take one per rollout of 8 prompts, MAPPO two
(`ppo_epochs=2`), MADPO one per 8 preference pairs (after collecting them), MARLHF one per RL rollout (after
collecting pairs and fitting its reward model). `env_step` (joint actions scored) is recorded beside each point.

One subprocess per (task, trainer) runs the seeds in turn, one torch thread. Budget on the project's machine kind
(2 vCPU, shared): about 30 minutes for the default 54 runs (see benchmarks/README.md for the measured time).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    DOCS_IMG,
    RESULTS,
    ROOT,
    TINY_MODEL,
    emit_result,
    machine,
    publish_figures,
    pyplot,
    run_child,
    set_offline_env,
    write_json,
)

# trainer -> (recipe, extra flags)
TRAINERS: dict[str, tuple[str, list[str]]] = {
    "MAGRPO": ("magrpo", []),
    "MAREINFORCE": ("magrpo", ["--baseline", "raw"]),
    "MARLOO": ("magrpo", ["--baseline", "loo"]),
    "MAReMax": ("magrpo", ["--baseline", "max"]),
    "MAAC": ("maac", []),
    "IAC": ("iac", []),
    "MAPPO": ("mappo", []),
    "MADPO": ("madpo", []),
    "MARLHF": ("marlhf", ["--reward_num_train_epochs", "1"]),
}
FAMILIES = {
    "REINFORCE family": ["MAGRPO", "MAREINFORCE", "MARLOO", "MAReMax"],
    "actor-critic": ["MAAC", "IAC", "MAPPO"],
    "preference": ["MADPO", "MARLHF"],
}
TASKS = ["coordination", "length_ratio"]


# ---------------------------------------------------------------------------------------------------- child


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def curve_of(trainer: Any) -> dict[str, list[float]]:
    """(step, eval_reward, env_step) points: step 0 from the recipe's evaluation before training, then every eval
    the trainer logged (`eval_interval`). A step evaluated twice (MADPO / MARLHF evaluate after training too) keeps
    its last value; sampling uses a fixed stream, so both are the same weights' score."""
    points: dict[int, float] = {0: float(trainer.before_reward)}
    env_at: dict[int, float] = {0: 0.0}
    for h in trainer.state.log_history:
        if "eval_reward" in h:
            points[int(h["step"])] = float(h["eval_reward"])
        if "env_step" in h and "step" in h:
            env_at[int(h["step"])] = float(h["env_step"])
    steps = sorted(points)
    return {
        "step": [float(s) for s in steps],
        "eval_reward": [points[s] for s in steps],
        "env_step": [env_at.get(s, math.nan) for s in steps],
    }


DEFAULT_OUTPUT = RESULTS / "learning_curves.json"


def run_trainer(task: str, trainer_name: str, seeds: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Every seed of one (task, trainer) in this process."""
    recipe, extra = TRAINERS[trainer_name]
    module = _recipe(recipe)
    runs = {}
    for seed in seeds:
        with tempfile.TemporaryDirectory() as out:
            argv = [
                *("--task", task, "--seed", str(seed), "--output_dir", out),
                *("--eval_interval", str(args.eval_interval), "--disable_tqdm", "true"),
                *extra,
            ]
            if args.max_steps:
                argv += ["--max_steps", str(args.max_steps)]
            t0 = time.perf_counter()
            trainer = module.main(argv)
            wall = time.perf_counter() - t0
        curve = curve_of(trainer)
        runs[str(seed)] = {
            **curve,
            "wall_s": wall,
            "before": float(trainer.before_reward),
            "after": float(trainer.after_reward),
            "global_step": trainer.state.global_step,
        }
        print(
            f"{task} {trainer_name} seed {seed}: {trainer.before_reward:.3f} -> {trainer.after_reward:.3f} ({wall:.0f} s)"
        )
        del trainer
    return {"task": task, "trainer": trainer_name, "recipe": recipe, "flags": extra, "runs": runs}


# ---------------------------------------------------------------------------------------------------- parent


def summarize(entry: dict[str, Any]) -> dict[str, Any]:
    """Mean / std over seeds at every step all seeds share, and the after / before ratio per seed."""
    runs = list(entry["runs"].values())
    common = sorted(set.intersection(*(set(r["step"]) for r in runs)))
    mean, std = [], []
    for s in common:
        vals = [r["eval_reward"][r["step"].index(s)] for r in runs]
        mean.append(statistics.fmean(vals))
        std.append(statistics.pstdev(vals) if len(vals) > 1 else 0.0)
    ratios = [r["after"] / r["before"] for r in runs if r["before"] > 0]
    befores, afters = [r["before"] for r in runs], [r["after"] for r in runs]
    return {
        "step": common,
        "mean": mean,
        "std": std,
        "before_mean": statistics.fmean(befores),
        "after_mean": statistics.fmean(afters),
        "after_std": statistics.pstdev(afters) if len(afters) > 1 else 0.0,
        "after_over_before_mean": statistics.fmean(ratios) if ratios else math.nan,
        "wall_s_mean": statistics.fmean(r["wall_s"] for r in runs),
    }


def plot(entries: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per task: a panel per trainer family, the mean over seeds with a +-1 std band."""
    plt = pyplot()
    written = []
    for task in dict.fromkeys(e["task"] for e in entries):
        mine = {e["trainer"]: e for e in entries if e["task"] == task}
        fams = [(f, [t for t in ts if t in mine]) for f, ts in FAMILIES.items()]
        fams = [(f, ts) for f, ts in fams if ts]
        fig, axes = plt.subplots(1, len(fams), figsize=(4.6 * len(fams), 3.8), sharey=True, squeeze=False)
        for ax, (fam, names) in zip(axes[0], fams):
            for name in names:
                s = mine[name]["summary"]
                ax.plot(s["step"], s["mean"], marker=".", label=name)
                lo = [m - d for m, d in zip(s["mean"], s["std"])]
                hi = [m + d for m, d in zip(s["mean"], s["std"])]
                ax.fill_between(s["step"], lo, hi, alpha=0.2)
            ax.set_title(fam)
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0][0].set_ylabel("eval task reward")
        seeds = len(next(iter(mine.values()))["runs"])
        fig.suptitle(
            f"{task}: eval reward vs training steps (tiny Llama, mean +- std over {seeds} seeds)", fontsize=10
        )
        fig.tight_layout()
        path = out / f"learning_curves_{task}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def markdown(entries: list[dict[str, Any]]) -> str:
    lines = [
        "| task | trainer | steps | eval reward at step 0 | final (mean +- std over seeds) | final / step 0 | s per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        s = e["summary"]
        lines.append(
            f"| {e['task']} | {e['trainer']} | {int(s['step'][-1])} | {s['before_mean']:.3f} | "
            f"{s['after_mean']:.3f} +- {s['after_std']:.3f} | {s['after_over_before_mean']:.2f} | "
            f"{s['wall_s_mean']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS)
    p.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=list(TRAINERS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--eval_interval", type=int, default=5)
    p.add_argument("--max_steps", type=int, default=40, help="training steps of every run (0: the recipes' own)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--output",
        default=str(DEFAULT_OUTPUT),
        help="result JSON; the figures go beside it (and to docs/img/ only when this is the default)",
    )
    p.add_argument("--child", nargs=2, metavar=("TASK", "TRAINER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    set_offline_env()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        emit_result(run_trainer(args.child[0], args.child[1], args.seeds, args))
        return {}
    t_start = time.perf_counter()
    entries = []
    flags = [
        *("--seeds", *map(str, args.seeds), "--eval_interval", str(args.eval_interval)),
        *("--threads", str(args.threads)),
        *("--max_steps", str(args.max_steps)),
    ]
    for task in args.tasks:
        for name in args.trainers:
            t0 = time.perf_counter()
            entry = run_child(__file__, [*flags, "--child", task, name])
            entry["summary"] = summarize(entry)
            entries.append(entry)
            s = entry["summary"]
            print(
                f"{task:13s} {name:12s} {s['before_mean']:.3f} -> {s['after_mean']:.3f} +- {s['after_std']:.3f}"
                f"   ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    out = Path(args.output)
    report = {
        "settings": {
            "model": TINY_MODEL,
            "threads": args.threads,
            "seeds": args.seeds,
            "eval_interval": args.eval_interval,
            "max_steps": args.max_steps,
            "eval_items": 16,
        },
        "machine": machine(),
        "wall_s": time.perf_counter() - t_start,
        "curves": entries,
    }
    write_json(out, report)
    figures = plot(entries, out.parent)
    copies = publish_figures(figures, out, DEFAULT_OUTPUT)
    print()
    print(markdown(entries))
    copied = f" (copied to {DOCS_IMG})" if copies else ""
    print(f"\nwritten to {out} and {', '.join(str(f) for f in figures)}{copied}; {report['wall_s']:.0f} s")
    return report


if __name__ == "__main__":
    main()
