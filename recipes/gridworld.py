"""Classic MARL on the two-agent grid world: independent learners, MADDPG, QMIX and MAPPO, same seeds and episodes.

    python recipes/gridworld.py                                   # 3 seeds x 800 episodes, then the race (~1 min)
    python recipes/gridworld.py --seeds 8 --episodes 1000 --output_dir outputs/gridworld --ablations
    python recipes/gridworld.py --no-competitive

Prints a table of steps to the goal of each learner's greedy, decentralized policy (mean over the last 20% of the
evaluations of each seed, then mean and spread over seeds, the optimum beside it), writes it to
`<output_dir>/results.md` and `results.json`, and plots steps to goal against episodes to `<output_dir>/gridworld.png`
(needs matplotlib; skipped with a message otherwise). Then it runs the competitive variant (a race: the first agent
on the goal takes the only reward) and prints what each learner's greedy agents do there.

The environment and the learners are in `trl_marl.envs.gridworld` and `trl_marl.classic`; `docs/classic-marl.md`
explains the results.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from trl_marl.classic import LEARNERS, IndependentAgents, QMIXStyle, TrainResult, evaluate, train
from trl_marl.envs import OPTIMAL_STEPS, RACE, GridConfig, GridWorld

# Extra rows of `--ablations`: what the two optimistic devices are worth (see docs/classic-marl.md).
ABLATIONS = {
    "QMIXStyle (plain, optimism=1)": lambda seed: QMIXStyle(optimism=1.0, seed=seed),
    "IndependentAgents (hysteretic)": lambda seed: IndependentAgents(negative_lr_scale=0.1, seed=seed),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds", type=int, default=3, help="number of seeds (0 .. seeds-1), the same for every learner"
    )
    parser.add_argument("--episodes", type=int, default=800, help="training episodes per learner and seed")
    parser.add_argument("--eval_every", type=int, default=10, help="greedy evaluation every this many episodes")
    parser.add_argument("--output_dir", default="outputs/gridworld", help="where results.md/json and the plot go")
    parser.add_argument(
        "--competitive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the competitive variant (a race for one goal)",
    )
    parser.add_argument("--competitive_episodes", type=int, default=400, help="training episodes in the race")
    parser.add_argument("--ablations", action="store_true", help="also train plain QMIX and hysteretic independent Q")
    return parser.parse_args(argv)


def last_fraction_mean(values: np.ndarray, fraction: float = 0.2) -> float:
    """Mean of the last `fraction` of a curve (at least one point)."""
    k = max(1, int(round(len(values) * fraction)))
    return float(np.mean(values[-k:]))


def summarize(name: str, runs: list[TrainResult]) -> dict:
    """One table row: greedy steps to goal over the last 20% of evaluations, per seed, then over seeds."""
    per_seed = np.array([last_fraction_mean(r.eval_steps) for r in runs])
    final = [int(r.final.steps_to_goal) for r in runs]
    return {
        "learner": name,
        "steps_mean": float(per_seed.mean()),
        "steps_std": float(per_seed.std()),
        "per_seed": per_seed.round(2).tolist(),
        "final_greedy": final,
        "at_optimum": sum(f == OPTIMAL_STEPS for f in final),
        "train_steps": float(np.mean([last_fraction_mean(r.train_steps) for r in runs])),
        "seconds": float(np.mean([r.seconds for r in runs])),
    }


def format_table(rows: list[dict], seeds: int, episodes: int) -> str:
    lines = [
        f"Steps to goal of the greedy decentralized policies, last 20% of evaluations; {seeds} seeds x {episodes} "
        f"episodes; optimum {OPTIMAL_STEPS}, a failure counts {GridConfig().max_steps}.",
        "",
        "| learner | steps to goal (mean ± std over seeds) | per seed | final greedy run | seeds at optimum "
        "| exploring episodes | optimum | s / seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['learner']} | {r['steps_mean']:.2f} ± {r['steps_std']:.2f} | {' '.join(f'{x:g}' for x in r['per_seed'])} "
            f"| {' '.join(map(str, r['final_greedy']))} | {r['at_optimum']}/{len(r['final_greedy'])} "
            f"| {r['train_steps']:.2f} | {OPTIMAL_STEPS} | {r['seconds']:.1f} |"
        )
    return "\n".join(lines)


def smooth(x: np.ndarray, window: int = 5) -> np.ndarray:
    """Trailing moving average over the last axis (shorter windows at the start)."""
    c = np.cumsum(np.pad(x, [(0, 0)] * (x.ndim - 1) + [(1, 0)]), axis=-1)
    n = np.minimum(np.arange(1, x.shape[-1] + 1), window)
    return (c[..., 1:] - c[..., np.arange(x.shape[-1]) + 1 - n]) / n


def plot(results: dict[str, list[TrainResult]], path: Path) -> bool:
    """Steps to goal (greedy) against episodes: mean over seeds, band = 25th..75th percentile over seeds, both
    smoothed over 5 evaluations. Ablations are dashed. Returns False (and says why) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the plot (pip install matplotlib, or trl-marl[dev])")
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, runs in results.items():
        x = runs[0].eval_at
        curves = smooth(np.stack([r.eval_steps for r in runs]).astype(float))
        style = "--" if "(" in name else "-"
        (line,) = ax.plot(x, curves.mean(axis=0), style, label=name, linewidth=1.8)
        low, high = np.percentile(curves, [25, 75], axis=0)
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.12)
    ax.axhline(OPTIMAL_STEPS, color="black", linestyle=":", linewidth=1.2, label=f"optimum ({OPTIMAL_STEPS})")
    ax.set_xlabel("training episodes")
    ax.set_ylabel("steps to goal (greedy, decentralized)")
    ax.set_ylim(0, GridConfig().max_steps + 0.5)
    seeds = len(next(iter(results.values())))
    ax.set_title(f"Two agents, 4x4 grid: mean over {seeds} seeds (band: 25-75th percentile), failure = 12")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def race_outcome(env: GridWorld, learner, seed: int) -> str:
    """What one greedy race looks like: `tie@t` (both on the goal at step t, a coin flip picks the winner),
    `A@t` / `B@t` (that agent alone first), `crash@t`, or `timeout`."""
    episode = evaluate(learner, env, seed=seed)
    t = episode.length
    if episode.crashed:
        return f"crash@{t}"
    if episode.winner is None:
        return "timeout"
    goal = env.config.goal[0] * env.config.size + env.config.goal[1]
    if (episode.obs[-1] == goal).all():
        return f"tie@{t}"
    return f"{'AB'[episode.winner]}@{t}"


def run_competitive(seeds: int, episodes: int, eval_every: int) -> tuple[list[dict], str]:
    """Train every learner in the race and describe its greedy agents. QMIX optimises the team reward (the mean of
    the two agents' rewards); the others optimise each agent's own reward."""
    rows = []
    for name, cls in LEARNERS.items():
        outcomes, wins = [], np.zeros(3)
        for seed in range(seeds):
            env, learner = GridWorld(RACE), cls(seed=seed)
            result = train(learner, env, episodes, seed, eval_every=eval_every)
            outcomes.append(race_outcome(env, learner, seed))
            k = max(1, episodes // 5)
            tail = result.train_winners[-k:]
            wins += [
                np.mean([w == 0 for w in tail]),
                np.mean([w == 1 for w in tail]),
                np.mean([w is None for w in tail]),
            ]
        wins /= seeds
        rows.append(
            {
                "learner": name,
                "greedy_race": dict(Counter(outcomes)),
                "exploring_A_wins": float(wins[0]),
                "exploring_B_wins": float(wins[1]),
                "exploring_no_winner": float(wins[2]),
            }
        )
    lines = [
        f"Race (competitive variant): {seeds} seeds x {episodes} episodes; greedy outcome per seed "
        "(tie@t: both on the goal at step t, a coin flip picks the winner).",
        "",
        "| learner | greedy race, per seed | exploring episodes (last 20%): A wins / B wins / no winner |",
        "|---|---|---|",
    ]
    for r in rows:
        race = ", ".join(f"{k} x{v}" for k, v in sorted(r["greedy_race"].items()))
        lines.append(
            f"| {r['learner']} | {race} | {r['exploring_A_wins']:.2f} / {r['exploring_B_wins']:.2f} "
            f"/ {r['exploring_no_winner']:.2f} |"
        )
    return rows, "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    factories = {name: (lambda seed, cls=cls: cls(seed=seed)) for name, cls in LEARNERS.items()}
    if args.ablations:
        factories.update(ABLATIONS)
    results: dict[str, list[TrainResult]] = {}
    for name, make in factories.items():
        results[name] = [
            train(make(seed), GridWorld(), args.episodes, seed, eval_every=args.eval_every)
            for seed in range(args.seeds)
        ]
        print(f"{name}: done ({sum(r.seconds for r in results[name]):.1f}s)", flush=True)
    rows = [summarize(name, runs) for name, runs in results.items()]
    table = format_table(rows, args.seeds, args.episodes)
    print("\n" + table + "\n")
    print("Greedy traces of seed 0, (row, col) per step — debug MARL from every agent's stream:")
    for name, runs in results.items():
        e, size = runs[0].final, GridConfig().size
        for i, agent in enumerate("AB"):
            print(f"  {name:<32} {agent}: {' '.join(f'({o // size},{o % size})' for o in e.obs[:, i])}")
    plotted = plot(results, output_dir / "gridworld.png")
    summary = {
        "args": vars(args),
        "cooperative": rows,
        "curves": {
            name: {"eval_at": runs[0].eval_at.tolist(), "eval_steps": [r.eval_steps.tolist() for r in runs]}
            for name, runs in results.items()
        },
        "plot": str(output_dir / "gridworld.png") if plotted else None,
    }
    markdown = table
    if args.competitive:
        race_rows, race_table = run_competitive(args.seeds, args.competitive_episodes, args.eval_every)
        print("\n" + race_table + "\n")
        summary["competitive"] = race_rows
        markdown += "\n\n" + race_table
    (output_dir / "results.md").write_text(markdown + "\n")
    (output_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {output_dir / 'results.md'} in {time.perf_counter() - start:.0f}s")
    return summary


if __name__ == "__main__":
    main()
