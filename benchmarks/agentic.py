"""Episodes per second of agentic rollouts on the built-in signalling game: the batched rollout against a loop that
plays one branch at a time, in one run.

    python benchmarks/agentic.py                        # 1 and 8 prompts per step, about 3 minutes
    python benchmarks/agentic.py --prompts 1 8 16 --repeats 5 --output benchmarks/results/agentic.json

Setting: MAGRPO's rollout on `SignalGame` (2 agents, turn order "sequential", one tool round per turn), G=4 branches
per prompt, 16 new tokens, the tiny Llama with the compact tool template, one torch thread. The batched rollout is
the trainer's own (`AgenticRollout`): one `generate` per agent position per tool round over every branch of every
prompt. The loop plays the same episodes one branch at a time (`run([item], num_generations=1)` per branch: one
`generate` per agent position per tool round per episode). Both run in this process, interleaved, `--repeats`
times; each keeps its fastest repeat. Only the ratio is meaningful (same machine, same load).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import RESULTS, machine, scratch_dir, set_offline_env, write_json


def build(args):
    import torch
    from transformers import AutoTokenizer

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.environments import SignalGame, signal_game_dataset, use_compact_tool_template
    from trl_marl.testing import tiny_model_path

    torch.set_num_threads(1)
    path = tiny_model_path()
    tok = use_compact_tool_template(AutoTokenizer.from_pretrained(path))
    tok.eos_token = "<|im_end|>"
    config = MAGRPOConfig(
        output_dir=scratch_dir("agentic"),
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        rollout_buffer_size=max(args.prompts),
        turn_order="sequential",
        max_tool_calling_iterations=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    data = signal_game_dataset(max(64, max(args.prompts)))
    trainer = MAGRPOTrainer(
        model=path, args=config, train_dataset=data, processing_class=tok, environment_factory=SignalGame
    )
    return trainer, [data[i] for i in range(len(data))]


def measure(trainer, items, G: int, batched: bool) -> tuple[float, int]:
    """(seconds, generate calls) to play G episodes of every item."""
    engine, player = trainer.train_rollout_engine, trainer.train_rollout_engine.player
    calls = player.generate_calls
    t0 = time.perf_counter()
    if batched:
        engine.run(items, trainer.generation.generate, num_generations=G)
    else:
        for item in items:
            for _ in range(G):
                engine.run([item], trainer.generation.generate, num_generations=1)
    return time.perf_counter() - t0, player.generate_calls - calls


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--max_completion_length", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS / "agentic.json")
    args = parser.parse_args(argv)
    set_offline_env()
    import torch

    trainer, items = build(args)
    G = args.num_generations
    measure(trainer, items[:2], G, batched=True)  # warm-up
    rows = []
    for P in args.prompts:
        best = {"batched": (float("inf"), 0), "loop": (float("inf"), 0)}
        passes = {"batched": [], "loop": []}
        for r in range(args.repeats):
            for mode in ("batched", "loop") if r % 2 == 0 else ("loop", "batched"):
                torch.manual_seed(r)
                seconds, calls = measure(trainer, items[r * P : (r + 1) * P] or items[:P], G, mode == "batched")
                passes[mode].append(seconds)
                best[mode] = min(best[mode], (seconds, calls))
        episodes = P * G
        row = {
            "prompts": P,
            "episodes": episodes,
            **{f"{m}_seconds": best[m][0] for m in best},
            **{f"{m}_generate_calls": best[m][1] for m in best},
            **{f"{m}_episodes_per_second": episodes / best[m][0] for m in best},
            "speedup": best["loop"][0] / best["batched"][0],
            "passes": passes,
        }
        rows.append(row)
        print(
            f"{P} prompt(s) x G={G}: batched {row['batched_episodes_per_second']:.1f} episodes/s "
            f"({row['batched_generate_calls']} generate calls), one branch at a time "
            f"{row['loop_episodes_per_second']:.1f} episodes/s ({row['loop_generate_calls']} calls): "
            f"{row['speedup']:.2f}x"
        )
    report = {"setting": vars(args) | {"output": str(args.output)}, "machine": machine(), "rows": rows}
    write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
