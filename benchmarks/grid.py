"""Throughput grid: every trainer, team sizes 1-4, `num_generations` and `max_new_tokens`, on the tiny model.

    python benchmarks/grid.py                          # the full grid, 3 passes, 1 torch thread
    python benchmarks/grid.py --only trainers          # one section: trainers, agents, generations, tokens
    python benchmarks/grid.py --steps 40 --output benchmarks/results/grid.json

The reference configuration R: MAGRPO, 2 agents, G=4 completions per agent per prompt, 16 new tokens, 4 prompts per
training step (`rollout_buffer_size=4`), the tiny Llama (vocab 512, hidden 64, intermediate 128, 2 layers, 4 heads),
learning rate 1e-3, one torch thread, every other field at the trainer's default. Each section changes ONE thing
from R: the trainer; the team size (1-4, MAGRPO); `num_generations` (2, 4, 8); `max_new_tokens` (8, 16, 32, 64).
The task is the alphabet-splitting coordination game generalised to n agents (`_common.team_letters_reward`: agent
k writes with the k-th n-th of the alphabet) on 32 story prompts; its reward costs microseconds, so the figures are
the machinery's.

Every configuration runs in its own subprocess (so peak RSS is that configuration's) for `--warmup` steps, then
`--steps` timed steps; the whole grid runs `--repeats` times in interleaved passes and each configuration keeps its
fastest repeat by wall time (the one least disturbed by other load; every repeat's figures stay in the JSON). Per timed step it reports seconds (mean and median) split into the trainer's own phase
timers: generation (sampling and building the rollout tree), reward (inside the reward function; for MARLHF the
learned reward model's scoring), scoring (returns, advantages, critics' no-grad values) and update
(forward/backward/optimizer step), plus `other` (the Trainer loop around them); the process's CPU seconds per step
(`time.process_time`: with one torch thread this is the work done, and unlike wall time it barely moves when other
processes share the CPUs; `cpu_share` = CPU / wall shows how much of the wall time the run actually got); prompts
(task items rolled out) per second, generated tokens per second and peak RSS. The preference trainers first collect pairs (MADPO; MARLHF also
fits its reward model): that one-off setup is reported apart (`setup`), and MADPO's timed steps are DPO steps on
`train_batch_size=8` pairs that generate nothing (their rate is pairs/s).

Every ratio (`x R`) is against R measured in the same run; absolute seconds move with machine load.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import (
    DOCS_IMG,
    RESULTS,
    TINY_MODEL,
    emit_result,
    machine,
    peak_rss_mb,
    publish_figures,
    pyplot,
    run_child,
    scratch_dir,
    set_offline_env,
    story_prompts,
    team_formatters,
    team_letters_reward,
    write_json,
)

TRAINERS = ["MAGRPO", "MAREINFORCE", "MARLOO", "MAReMax", "MAAC", "IAC", "MAPPO", "MADPO", "MARLHF"]
REFERENCE: dict[str, Any] = {"trainer": "MAGRPO", "num_agents": 2, "num_generations": 4, "max_new_tokens": 16}
SWEEPS: dict[str, tuple[str, list]] = {
    "trainers": ("trainer", TRAINERS),
    "agents": ("num_agents", [1, 2, 3, 4]),
    "generations": ("num_generations", [2, 4, 8]),
    "tokens": ("max_new_tokens", [8, 16, 32, 64]),
}
PHASES = ["generation", "reward", "scoring", "update", "other"]


def configurations(sections: list[str], trainers: list[str] | None = None) -> list[dict[str, Any]]:
    """The unique configurations of the chosen sections (R first), each `REFERENCE` with one field changed;
    `trainers` restricts the trainers section."""
    out = [dict(REFERENCE)]
    for name in sections:
        field, values = SWEEPS[name]
        for v in values:
            if name == "trainers" and trainers is not None and v not in trainers:
                continue
            cfg = {**REFERENCE, field: v}
            if cfg not in out:
                out.append(cfg)
    return out


def label(cfg: dict[str, Any]) -> str:
    return f"{cfg['trainer']} n={cfg['num_agents']} G={cfg['num_generations']} T={cfg['max_new_tokens']}"


# ---------------------------------------------------------------------------------------------------- child


DEFAULT_OUTPUT = RESULTS / "grid.json"


def build_trainer(cfg: dict[str, Any], args: argparse.Namespace, callbacks: list):
    """The trainer of one configuration on the tiny model and the n-agent coordination task."""
    from datasets import Dataset

    import trl_marl
    from trl_marl.testing import tiny_model_path

    path = tiny_model_path()
    n, G, name = cfg["num_agents"], cfg["num_generations"], cfg["trainer"]
    common: dict[str, Any] = dict(
        output_dir=scratch_dir("grid"),
        num_agents=n,
        max_completion_length=cfg["max_new_tokens"],
        rollout_buffer_size=args.prompts_per_step,
        learning_rate=1e-3,
        max_steps=args.warmup + args.steps,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    if name == "MADPO":
        common.update(preference_num_candidates=G)
    elif name == "MARLHF":
        common.update(num_generations=G, preference_num_candidates=G)
    else:
        common.update(num_generations=G)
    config = getattr(trl_marl, f"{name}Config")(**common)
    kwargs: dict[str, Any] = {}
    if name in ("MAAC", "MAPPO"):
        kwargs["critic_model"] = path  # IAC defaults to a copy of each agent
    data = Dataset.from_list([{"prompt": p} for p in story_prompts(args.items)])
    return getattr(trl_marl, f"{name}Trainer")(
        agent_model=path,
        reward_func=team_letters_reward,
        formatters=team_formatters(n),
        args=config,
        train_dataset=data,
        callbacks=callbacks,
        **kwargs,
    )


def run_config(cfg: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Train one configuration; time the steps after warm-up and the one-off setup before the first step."""
    import torch
    from transformers import TrainerCallback

    torch.manual_seed(0)
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    state = {"phase": "setup", "t0": 0.0, "c0": 0.0}
    step_times: list[float] = []
    step_cpu: list[float] = []
    holder: dict[str, Any] = {}
    warm = args.warmup

    class Probe(TrainerCallback):
        def on_step_begin(self, a, s, control, **kw):
            if state["phase"] == "setup":
                state["phase"] = "warmup" if warm > 0 else "steady"
            state["t0"], state["c0"] = time.perf_counter(), time.process_time()

        def on_step_end(self, a, s, control, **kw):
            if state["phase"] == "steady":
                step_times.append(time.perf_counter() - state["t0"])
                step_cpu.append(time.process_time() - state["c0"])
            if s.global_step == warm:  # steady state from here: reset the trainer's phase timers
                holder["trainer"]._metrics.timings.clear()
                state["phase"] = "steady"

    t0 = time.perf_counter()
    trainer = build_trainer(cfg, args, [Probe()])
    init_s = time.perf_counter() - t0
    holder["trainer"] = trainer

    generate = trainer.generation.generate

    def timed_generate(prompts_per_agent, num_generations):
        t = time.perf_counter()
        out = generate(prompts_per_agent, num_generations)
        a = acc[state["phase"]]
        a["generate_s"] += time.perf_counter() - t
        a["tokens"] += sum(c.numel() for o in out for c in o.completion_ids)
        return out

    trainer.generation.generate = timed_generate
    for engine in {id(e): e for e in (trainer.rollout_engine, trainer.train_rollout_engine)}.values():

        def timed_run(items, *a, _run=engine.run, **k):
            rollout = _run(items, *a, **k)
            acc[state["phase"]]["items"] += len(items)
            acc[state["phase"]]["reward_s"] += rollout.reward_seconds
            return rollout

        engine.run = timed_run
    setup_timers: dict[str, float] = {}
    for method in ("collect_preference_pairs", "fit_reward_model"):
        if hasattr(trainer, method):
            original = getattr(trainer, method)

            def timed(*a, _f=original, _name=method, **k):
                t = time.perf_counter()
                out = _f(*a, **k)
                setup_timers[_name] = setup_timers.get(_name, 0.0) + time.perf_counter() - t
                return out

            setattr(trainer, method, timed)

    t0 = time.perf_counter()
    trainer.train()
    train_wall_s = time.perf_counter() - t0
    n = len(step_times)
    if n != args.steps:
        raise RuntimeError(f"{label(cfg)}: timed {n} steps, expected {args.steps}")
    total = sum(step_times)
    phases = {k: trainer._metrics.timings.get(k, 0.0) / n for k in PHASES[:-1]}
    phases["other"] = total / n - sum(phases.values())
    steady = acc["steady"]
    result: dict[str, Any] = {
        "name": label(cfg),
        "config": cfg,
        "prompts_per_step": args.prompts_per_step,
        "steps": n,
        "s_per_step_mean": total / n,
        "s_per_step_median": statistics.median(step_times),
        "cpu_s_per_step_mean": sum(step_cpu) / n,
        "cpu_share": sum(step_cpu) / total,
        "phase_s_per_step": phases,
        "prompts_per_s": steady["items"] / total,
        "tokens_per_s": steady["tokens"] / total,
        "peak_rss_mb": peak_rss_mb(),
        "init_s": init_s,
        "train_wall_s": train_wall_s,
    }
    if cfg["trainer"] == "MADPO":  # it trains on collected pairs: its timed steps generate nothing
        result["pairs_per_s"] = trainer.args.per_device_train_batch_size / (total / n)
    if setup_timers:
        setup = acc["setup"]
        result["setup"] = {
            "collection_s": setup_timers.get("collect_preference_pairs", 0.0),
            "collection_items": setup["items"],
            "collection_generate_s": setup["generate_s"],
            "collection_reward_s": setup["reward_s"],
            "collection_tokens": setup["tokens"],
            "pairs": len(trainer.pairs or []),
            "reward_model_fit_s": setup_timers.get("fit_reward_model", 0.0),
        }
    return result


# ---------------------------------------------------------------------------------------------------- parent


def add_ratios(results: list[dict[str, Any]]) -> None:
    """`*_vs_ref`: every result against R (the first result), same run."""
    ref = results[0]

    def ratio(a: float, b: float) -> float:  # NaN where R measured nothing (e.g. no generation in 1 timed step)
        return a / b if b else math.nan

    for r in results:
        r["s_per_step_vs_ref"] = ratio(r["s_per_step_mean"], ref["s_per_step_mean"])
        r["cpu_s_per_step_vs_ref"] = ratio(r["cpu_s_per_step_mean"], ref["cpu_s_per_step_mean"])
        r["prompts_per_s_vs_ref"] = ratio(r["prompts_per_s"], ref["prompts_per_s"])
        r["tokens_per_s_vs_ref"] = ratio(r["tokens_per_s"], ref["tokens_per_s"])
        r["peak_rss_vs_ref"] = ratio(r["peak_rss_mb"], ref["peak_rss_mb"])


def prompts_cell(r: dict[str, Any]) -> tuple[str, str]:
    """(prompts/s, its ratio to R) for the tables: MADPO's steps train on collected pairs (pairs/s instead); a run
    whose timed steps generated nothing (e.g. MAPPO's epochs reusing one rollout, with --steps 1) shows 0 and '-'."""
    if r["prompts_per_s"] > 0:
        return f"{r['prompts_per_s']:.1f}", f"{r['prompts_per_s_vs_ref']:.2f}"
    if "pairs_per_s" in r:
        return f"({r['pairs_per_s']:.0f} pairs/s)", "-"
    return "0 (no generation timed)", "-"


def section(results: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The results of one sweep, in sweep order."""
    field, values = SWEEPS[name]
    by_cfg = {json.dumps(r["config"], sort_keys=True): r for r in results}
    rows = []
    for v in values:
        key = json.dumps({**REFERENCE, field: v}, sort_keys=True)
        if key in by_cfg:
            rows.append(by_cfg[key])
    return rows


def markdown(results: list[dict[str, Any]], sections: list[str]) -> str:
    """Tables for benchmarks/README.md."""
    lines = []
    head = (
        "| {first} | s/step | x R | CPU s/step | x R | generation | reward | scoring | update | other | prompts/s "
        "| x R | tokens/s | peak RSS MB |"
    )
    for name in sections:
        field, _ = SWEEPS[name]
        lines += [f"**{name}** (`{field}`)", "", head.format(first=field), "|" + "---|" * 14]
        for r in section(results, name):
            ph = r["phase_s_per_step"]
            pps, ratio = prompts_cell(r)
            lines.append(
                f"| {r['config'][field]} | {r['s_per_step_mean']:.3f} | {r['s_per_step_vs_ref']:.2f} | "
                f"{r['cpu_s_per_step_mean']:.3f} | {r['cpu_s_per_step_vs_ref']:.2f} | "
                + " | ".join(f"{ph[p]:.3f}" for p in PHASES)
                + f" | {pps} | {ratio} | {r['tokens_per_s']:.0f} | {r['peak_rss_mb']:.0f} |"
            )
        lines.append("")
    setups = [r for r in results if "setup" in r]
    if setups:
        lines += [
            "**preference setup** (before the first step)",
            "",
            "| trainer | collection s | items | pairs | generate s | reward s | reward-model fit s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in setups:
            s = r["setup"]
            lines.append(
                f"| {r['config']['trainer']} | {s['collection_s']:.2f} | {s['collection_items']:.0f} | "
                f"{s['pairs']} | {s['collection_generate_s']:.2f} | {s['collection_reward_s']:.3f} | "
                f"{s['reward_model_fit_s']:.2f} |"
            )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], sections: list[str], out: Path) -> list[Path]:
    """`grid_trainers.png` (phase split and prompts/s per trainer) and `grid_sweeps.png` (team size, G, T)."""
    plt = pyplot()
    colors = dict(zip(PHASES, ["#4c72b0", "#dd8452", "#937860", "#55a868", "#bbbbbb"]))
    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)

    def stacked(ax, rows, labels):
        bottom = [0.0] * len(rows)
        for p in PHASES:
            vals = [max(r["phase_s_per_step"][p], 0.0) for r in rows]
            ax.bar(labels, vals, bottom=bottom, color=colors[p], label=p)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("s / step")

    if "trainers" in sections:
        rows = section(results, "trainers")
        labels = [r["config"]["trainer"] for r in rows]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
        stacked(a1, rows, labels)
        a1.set_title("seconds per training step, by phase")
        a1.tick_params(axis="x", rotation=45)
        a1.legend(fontsize=8)
        vals = [r["prompts_per_s"] for r in rows]
        a2.bar(labels, vals, color="#4c72b0")
        for i, r in enumerate(rows):
            if r["prompts_per_s"] == 0 and "pairs_per_s" in r:
                a2.text(i, 0.2, f"{r['pairs_per_s']:.0f}\npairs/s", ha="center", fontsize=7)
        a2.set_title("prompts (task items) per second")
        a2.tick_params(axis="x", rotation=45)
        fig.suptitle("Trainers at R (2 agents, G=4, 16 new tokens, 4 prompts/step, tiny Llama, 1 thread)", fontsize=10)
        save(fig, "grid_trainers.png")
    sweeps = [s for s in ("agents", "generations", "tokens") if s in sections]
    if sweeps:
        fig, axes = plt.subplots(1, len(sweeps), figsize=(4.2 * len(sweeps), 4.0), squeeze=False)
        for ax, name in zip(axes[0], sweeps):
            field, _ = SWEEPS[name]
            rows = section(results, name)
            stacked(ax, rows, [str(r["config"][field]) for r in rows])
            ax.set_xlabel(field)
            twin = ax.twinx()
            twin.plot(range(len(rows)), [r["tokens_per_s"] for r in rows], "k.-", label="tokens/s")
            twin.set_ylabel("generated tokens / s")
            twin.set_ylim(bottom=0)
            ax.set_title(f"MAGRPO, {field}")
        axes[0][0].legend(fontsize=8, loc="upper left")
        fig.suptitle("MAGRPO from R, one field changed (bars: s/step by phase; line: tokens/s)", fontsize=10)
        save(fig, "grid_sweeps.png")
    return written


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", choices=list(SWEEPS), default=list(SWEEPS), help="sections to run")
    p.add_argument("--trainers", nargs="+", choices=TRAINERS, default=None, help="the trainers section's trainers")
    p.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    p.add_argument("--prompts_per_step", type=int, default=4, help="rollout_buffer_size")
    p.add_argument("--items", type=int, default=32, help="task items in the training set")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3, help="interleaved passes; each configuration keeps its fastest")
    p.add_argument(
        "--output",
        default=str(DEFAULT_OUTPUT),
        help="result JSON; the figures go beside it (and to docs/img/ only when this is the default)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    set_offline_env()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        emit_result(run_config(json.loads(args.child), args))
        return {}
    common = [
        *("--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)),
        *("--prompts_per_step", str(args.prompts_per_step), "--items", str(args.items)),
    ]
    t_start = time.perf_counter()
    configs = configurations(args.only, args.trainers)
    runs: list[list[dict[str, Any]]] = [[] for _ in configs]
    for rep in range(args.repeats):  # interleaved passes: a burst of load hits one repeat of many configurations
        for k, cfg in enumerate(configs):
            t0 = time.perf_counter()
            runs[k].append(run_child(__file__, [*common, "--child", json.dumps(cfg)]))
            r = runs[k][-1]
            print(
                f"pass {rep + 1}/{args.repeats}  {label(cfg):36s} {r['s_per_step_mean']:.3f} s/step  "
                f"{r['cpu_s_per_step_mean']:.3f} CPU s/step   ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    results = []
    for reps in runs:
        best = dict(min(reps, key=lambda r: r["s_per_step_mean"]))  # the least disturbed repeat
        best["repeats"] = {
            k: [r[k] for r in reps] for k in ("s_per_step_mean", "cpu_s_per_step_mean", "prompts_per_s", "peak_rss_mb")
        }
        results.append(best)
    add_ratios(results)
    out = Path(args.output)
    report = {
        "reference": {**REFERENCE, "prompts_per_step": args.prompts_per_step},
        "settings": {
            "model": TINY_MODEL,
            "threads": args.threads,
            "steps": args.steps,
            "warmup": args.warmup,
            "items": args.items,
            "repeats": args.repeats,
            "learning_rate": 1e-3,
        },
        "machine": machine(),
        "wall_s": time.perf_counter() - t_start,
        "results": results,
    }
    write_json(out, report)
    figures = plot(results, args.only, out.parent)
    copies = publish_figures(figures, out, DEFAULT_OUTPUT)
    print()
    print(markdown(results, args.only))
    copied = f" (copied to {DOCS_IMG})" if copies else ""
    print(f"\nwritten to {out} and {', '.join(str(f) for f in figures)}{copied}; {report['wall_s']:.0f} s")
    return report


if __name__ == "__main__":
    main()
