"""MADPO throughput: preference pairs collected per second and training pairs per second (tiny Llama, 1 thread).

    python benchmarks/preference.py            # writes benchmarks/results/preference.json

In the same run it times the margin computation two ways on the same pairs: ONE masked forward per agent over the
batch's winners and losers together (what `MADPOTrainer` does) and one forward per sequence (what the reference
implementation does), and reports the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from _common import scratch_dir

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--items", type=int, default=32)
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--batch", type=int, default=8, help="pairs per training step")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "preference.json"))
    args = p.parse_args(argv)
    for k, v in {"HF_HUB_OFFLINE": "1", "CI": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    import torch
    from datasets import Dataset

    from trl_marl import MADPOConfig, MADPOTrainer
    from trl_marl.algorithms import sequence_logprobs
    from trl_marl.tasks.toy import TOPICS, coordination_reward
    from trl_marl.team import agent_token_logprobs, collate_agent_batch
    from trl_marl.testing import tiny_model_path

    torch.set_num_threads(args.threads)
    data = Dataset.from_list([{"prompt": f"Together, describe {TOPICS[i % len(TOPICS)]}."} for i in range(args.items)])
    cfg = MADPOConfig(
        output_dir=scratch_dir("madpo"),
        max_new_tokens=16,
        rollout_buffer_size=16,
        preference_num_candidates=args.candidates,
        train_batch_size=args.batch,
        learning_rate=1e-3,
        num_train_epochs=1,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = MADPOTrainer(
        agent_model=tiny_model_path(), reward_func=coordination_reward, args=cfg, train_dataset=data
    )
    t0 = time.perf_counter()
    trainer.pairs = trainer.collect_preference_pairs()
    collect_s = time.perf_counter() - t0
    n_pairs = len(trainer.pairs)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0

    # margins: one batched forward per agent vs one forward per sequence, same pairs, no grad
    pairs = trainer.pairs[: args.batch]
    team = trainer.team.eval()

    def batched():
        with torch.no_grad():
            return trainer.preference_margins(team, pairs)

    def per_sequence():
        out = []
        with torch.no_grad():
            for i, agent in enumerate(team.agents):
                pad = trainer.tokenizers[i].pad_token_id
                row = []
                for pr in pairs:
                    s = []
                    for comp in (pr.winner_ids[i], pr.loser_ids[i]):
                        b = collate_agent_batch([pr.prompt_ids[i]], [comp], pad)
                        s.append(sequence_logprobs(agent_token_logprobs(agent, b), b.completion_mask)[0])
                    row.append(s[0] - s[1])
                out.append(torch.stack(row))
        return torch.stack(out)

    torch.testing.assert_close(batched(), per_sequence(), atol=1e-3, rtol=1e-4)
    timings = {}
    for name, fn in (("batched", batched), ("per_sequence", per_sequence)):
        fn()
        t0 = time.perf_counter()
        for _ in range(10):
            fn()
        timings[name] = (time.perf_counter() - t0) / 10
    report = {
        "config": {
            "items": args.items,
            "candidates": args.candidates,
            "pairs_per_step": args.batch,
            "threads": args.threads,
            "max_new_tokens": 16,
            "model": "tiny llama v512 h64 l2",
        },
        "pairs": n_pairs,
        "collection_s": collect_s,
        "pairs_collected_per_s": n_pairs / collect_s,
        "joint_responses_per_s": args.items * args.candidates / collect_s,
        "train_s": train_s,
        "training_pairs_per_s": n_pairs / train_s,
        "margin_s_batched": timings["batched"],
        "margin_s_per_sequence": timings["per_sequence"],
        "margin_speedup_batched_vs_per_sequence": timings["per_sequence"] / timings["batched"],
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    for k, v in report.items():
        if k != "config":
            print(f"{k:40s} {v:.4f}" if isinstance(v, float) else f"{k:40s} {v}")
    return report


if __name__ == "__main__":
    main()
