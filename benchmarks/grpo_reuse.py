"""Reusing a generation (TRL's `num_iterations` / `steps_per_generation`): trained tokens per second, and the memory
of the stored old log-probs. Every figure is measured in this run, each configuration against `num_iterations=1,
steps_per_generation=1` (and the seed's loss) on the same machine, in the same process, interleaved over repeats.

    python benchmarks/grpo_reuse.py                          # writes benchmarks/results/grpo_reuse.json
    python benchmarks/grpo_reuse.py --steps 2 --repeats 1 --output /tmp/reuse.json    # smallest: a smoke run

A 2-agent MAGRPO team (tiny Llama, hidden 128) with TRL's `dapo` loss takes `--steps` optimizer steps per
configuration. "Trained tokens" are the completion tokens that enter a loss forward (a token trained twice counts
twice); per second of the whole training loop (generation, reward, scoring, update), wall time and this process's CPU
time (one thread: the CPU time is the work, and the figure least moved by other load on a shared machine; the
ratios use it). The best of `--repeats` interleaved runs is kept. The old log-probs are what
`GRPOLossStep.prepare` keeps per generation (one float32 per completion position and agent) when a step trains on
weights that moved since generation; the reference log-probs of `beta` would take as much again.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import machine, scratch_dir, set_offline_env, story_prompts, team_letters_reward, write_json

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "grpo_reuse.json"
# (label, loss_type, num_iterations, steps_per_generation)
CONFIGS = [
    ("seed loss", None, 1, 1),
    ("dapo, mu=1, spg=1", "dapo", 1, 1),
    ("dapo, mu=2, spg=1", "dapo", 2, 1),
    ("dapo, mu=4, spg=1", "dapo", 4, 1),
    ("dapo, mu=1, spg=4", "dapo", 1, 4),
]


def run(loss_type, iterations: int, spg: int, steps: int, args) -> dict:
    import torch
    from transformers import PrinterCallback

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.testing import tiny_model_path

    path = tiny_model_path(hidden_size=128, num_attention_heads=2, num_key_value_heads=2)
    cfg = MAGRPOConfig(
        output_dir=scratch_dir("grpo_reuse"),
        num_agents=2,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        rollout_buffer_size=args.items,
        steps_per_generation=spg,
        num_iterations=iterations,
        loss_type=loss_type,
        learning_rate=1e-4,
        max_steps=steps,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    data = [{"prompt": p} for p in story_prompts(args.items * steps)]
    trainer = MAGRPOTrainer(model=path, reward_funcs=team_letters_reward, args=cfg, train_dataset=data)
    trainer.remove_callback(PrinterCallback)  # the final log line of every run
    trained, stored, generations = [0], [], [0]
    compute_loss = trainer.compute_loss

    def counting_loss(model, inputs, *a, **k):
        nodes = inputs["rollout"].nodes_of_items(inputs["items"])
        trained[0] += sum(
            s.completion_ids.numel() for i in range(2) for s in inputs["rollout"].samples_of_agent(i, nodes)
        )
        return compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = counting_loss
    grpo_step = trainer.rl_step.grpo_step
    if grpo_step is not None:
        prepare = grpo_step.prepare

        def measured_prepare(rollout):
            out = prepare(rollout)
            generations[0] += 1
            stored.append(
                sum(g.old_logps.numel() * g.old_logps.element_size() for g in out if g.old_logps is not None)
            )
            return out

        grpo_step.prepare = measured_prepare
    else:
        original = trainer._rollout_step

        def counted(items):
            generations[0] += 1
            return original(items)

        trainer._rollout_step = counted
    torch.manual_seed(0)
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "trained_tokens": trained[0],
        "trained_tokens_per_s": trained[0] / seconds,
        "trained_tokens_per_cpu_s": trained[0] / cpu_seconds,
        "generations": generations[0],
        "old_logps_bytes_per_generation": max(stored) if stored else 0,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per configuration")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--items", type=int, default=8, help="task items per generation (rollout_buffer_size)")
    p.add_argument("--num_generations", type=int, default=4)
    p.add_argument("--max_completion_length", type=int, default=32)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args(argv)
    set_offline_env()
    import torch

    torch.set_num_threads(1)
    runs: dict[str, list[dict]] = {label: [] for label, *_ in CONFIGS}
    run(CONFIGS[1][1], 1, 1, 1, args)  # warm-up: model build, first-call costs
    for _ in range(args.repeats):
        for label, loss_type, iterations, spg in CONFIGS:
            runs[label].append(run(loss_type, iterations, spg, args.steps, args))
    base = "dapo, mu=1, spg=1"
    rows = []
    for label, loss_type, iterations, spg in CONFIGS:
        best = max(runs[label], key=lambda r: r["trained_tokens_per_cpu_s"])
        rows.append(
            {
                "config": label,
                "loss_type": loss_type,
                "num_iterations": iterations,
                "steps_per_generation": spg,
                **best,
            }
        )
    ref = next(r for r in rows if r["config"] == base)["trained_tokens_per_cpu_s"]
    for r in rows:
        r["trained_tokens_per_cpu_s_vs_mu1"] = r["trained_tokens_per_cpu_s"] / ref
    report = {"machine": machine(), "settings": vars(args) | {"output": str(args.output)}, "rows": rows}
    write_json(args.output, report)
    print(
        "| configuration | generations | trained tokens / CPU s | x mu=1 | trained tokens / s (wall) | old log-probs |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        kib = r["old_logps_bytes_per_generation"] / 1024
        print(
            f"| {r['config']} | {r['generations']} | {r['trained_tokens_per_cpu_s']:.0f} | "
            f"{r['trained_tokens_per_cpu_s_vs_mu1']:.2f} | {r['trained_tokens_per_s']:.0f} | {kib:.1f} KiB |"
        )
    return report


if __name__ == "__main__":
    main()
