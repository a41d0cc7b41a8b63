"""MADPO throughput: preference pairs collected per second and training pairs per second (tiny Llama, 1 thread).

    python benchmarks/preference.py            # writes benchmarks/results/preference.json
    python benchmarks/preference.py --reward-fit   # writes benchmarks/results/reward_fit.json

`--reward-fit` times MARLHF's joint reward-model fit on the same pairs and epochs, in the same run: through TRL's
`RewardTrainer` (what `JointRewardModel.fit` does now) against the hand-written AdamW loop it replaced (kept below
as the baseline), and the TRL fit under 1 and 2 processes (`accelerate launch`: DDP over gloo, ZeRO-3, FSDP2).

In the same run it times the margin computation on the same pairs (no grad, and forward + backward):
  * `trl_concatenated`: what `MADPOTrainer` does, TRL's `DataCollatorForPreference` per agent and ONE forward over
    winners and losers together through TRL's fused LM head (`DPOTrainer._compute_loss`'s scheme);
  * `two_forwards`: the same TRL scheme, with the winners and the losers in two forwards per agent;
  * `own_collate`: the forward MADPO had before (our left-padded `collate_agent_batch` of `[winners; losers]`, one
    forward per agent, logits of the completion positions + `selective_log_softmax`);
  * `per_sequence` (no grad only): one forward per sequence (what the reference implementation does);
and reports the ratios.
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
    p.add_argument("--output", default=None)
    p.add_argument("--reward-fit", action="store_true", help="time the joint reward-model fit (TRL vs the old loop)")
    p.add_argument("--pairs", type=int, default=128, help="--reward-fit: preference pairs")
    p.add_argument("--epochs", type=int, default=2, help="--reward-fit: epochs")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (the best is kept)")
    args = p.parse_args(argv)
    if args.reward_fit:
        return reward_fit(args)
    args.output = args.output or str(ROOT / "benchmarks" / "results" / "preference.json")
    for k, v in {"HF_HUB_OFFLINE": "1", "CI": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    import torch
    from datasets import Dataset

    from trl_marl import MADPOConfig, MADPOTrainer
    from trl_marl.algorithms import sequence_logprobs
    from trl_marl.data_types.batches import collate_agent_batch
    from trl_marl.models.team import agent_token_logprobs
    from trl_marl.tasks.toy import TOPICS, coordination_reward
    from trl_marl.testing import tiny_model_path

    torch.set_num_threads(args.threads)
    data = Dataset.from_list([{"prompt": f"Together, describe {TOPICS[i % len(TOPICS)]}."} for i in range(args.items)])
    cfg = MADPOConfig(
        output_dir=scratch_dir("madpo"),
        max_completion_length=16,
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

    # margins on the same pairs, several ways (see the module docstring)
    from trl_marl.trainers.preference.dpo_forward import PreferenceBatch

    pairs = trainer.pairs[: args.batch]
    team = trainer.team.eval()
    T = trainer.args.temperature

    def trl_concatenated():
        return trainer.preference_margins(team, pairs)

    def two_forwards():  # through the team as MADPO calls it: the winners' batches, then the losers'
        halves = []
        for rows in (slice(0, len(pairs)), slice(len(pairs), None)):
            batches = []
            for b in trainer._agent_pair_batches(pairs):
                width = int(b.attention_mask[rows].sum(1).max())
                batches.append(PreferenceBatch(b.input_ids[rows, :width], b.attention_mask[rows, :width],
                                               b.completion_mask[rows, :width]))  # fmt: skip
            halves.append(torch.stack([lp.sum(1) for lp in team(batches)["logprobs"]]))
        return halves[0] - halves[1]

    def own_collate():  # the replaced MADPO forward: AgentBatch through the team (TeamModel.forward still takes it)
        batches = [
            collate_agent_batch(
                [p.prompt_ids[i] for p in pairs] * 2,
                [p.winner_ids[i] for p in pairs] + [p.loser_ids[i] for p in pairs],
                trainer.tokenizers[i].pad_token_id,
            )
            for i in range(len(team.agents))
        ]
        out = []
        for lp, b in zip(team(batches)["logprobs"], batches):
            w, lo = sequence_logprobs(lp, b.completion_mask).chunk(2)
            out.append(w - lo)
        return torch.stack(out)

    def per_sequence():
        out = []
        for i, agent in enumerate(team.agents):
            pad = trainer.tokenizers[i].pad_token_id
            row = []
            for pr in pairs:
                s = []
                for comp in (pr.winner_ids[i], pr.loser_ids[i]):
                    b = collate_agent_batch([pr.prompt_ids[i]], [comp], pad)
                    s.append(sequence_logprobs(agent_token_logprobs(agent, b, T), b.completion_mask)[0])
                row.append(s[0] - s[1])
            out.append(torch.stack(row))
        return torch.stack(out)

    with torch.no_grad():
        ref = trl_concatenated()
        for fn in (two_forwards, own_collate, per_sequence):
            torch.testing.assert_close(fn(), ref, atol=1e-3, rtol=1e-4)
    schemes = {"trl_concatenated": trl_concatenated, "two_forwards": two_forwards, "own_collate": own_collate}
    reps = args.repeats * 5
    timings = {name: float("inf") for name in [*schemes, "per_sequence"]}  # interleaved repeats, best kept
    for _ in range(args.repeats):
        for name, fn in {**schemes, "per_sequence": per_sequence}.items():
            with torch.no_grad():
                fn()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
            timings[name] = min(timings[name], (time.perf_counter() - t0) / reps)
    grad_timings = {name: float("inf") for name in schemes}
    team.train()
    for _ in range(args.repeats):
        for name, fn in schemes.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                fn().sum().backward()
            grad_timings[name] = min(grad_timings[name], (time.perf_counter() - t0) / reps)
            team.zero_grad()
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
        "margin_s": timings,
        "margin_forward_backward_s": grad_timings,
        "margin_speedup_batched_vs_per_sequence": timings["per_sequence"] / timings["trl_concatenated"],
        "margin_two_forwards_over_concatenated": timings["two_forwards"] / timings["trl_concatenated"],
        "margin_own_collate_over_trl_concatenated": timings["own_collate"] / timings["trl_concatenated"],
        "step_two_forwards_over_concatenated": grad_timings["two_forwards"] / grad_timings["trl_concatenated"],
        "step_own_collate_over_trl_concatenated": grad_timings["own_collate"] / grad_timings["trl_concatenated"],
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    for k, v in report.items():
        if k != "config":
            print(f"{k:44s} {v:.4f}" if isinstance(v, float) else f"{k:44s} {v}")
    return report


def _legacy_fit(rm, pairs, learning_rate, num_epochs, batch_size, seed=0) -> list[float]:
    """The hand-written loop `JointRewardModel.fit` used before it called TRL's RewardTrainer (the baseline)."""
    import random

    import torch

    from trl_marl.algorithms.losses import bradley_terry_loss
    from trl_marl.trainers.preference.reward_model import joint_text

    opt = torch.optim.AdamW([p for p in rm.model.parameters()], lr=learning_rate)
    order = list(range(len(pairs)))
    rng = random.Random(seed)
    losses = []
    rm.train()
    for _ in range(num_epochs):
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            chunk = [pairs[k] for k in order[start : start + batch_size]]
            texts = [joint_text(p.prompts, p.winner_completions) for p in chunk] + [
                joint_text(p.prompts, p.loser_completions) for p in chunk
            ]
            chosen, rejected = rm(**rm.encode(texts)).chunk(2)
            loss = bradley_terry_loss(chosen, rejected)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    rm.eval()
    # the old fit_reward_model then scored every pair's winner and loser for `reward_model/pair_accuracy`
    w = rm.score([p.prompts for p in pairs], [p.winner_completions for p in pairs])
    lo = rm.score([p.prompts for p in pairs], [p.loser_completions for p in pairs])
    losses.append(sum(a > b for a, b in zip(w, lo)) / len(w))
    return losses


def reward_fit(args) -> dict:
    """TRL RewardTrainer fit vs the old loop (same pairs, epochs, batch; 1 process), then TRL under 1 vs 2
    processes (DDP), and 2 processes under ZeRO-3 and FSDP2 (the reward model sharded)."""
    import subprocess
    import sys
    import tempfile

    for k, v in {"HF_HUB_OFFLINE": "1", "CI": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    import torch

    from trl_marl.testing import tiny_model_path
    from trl_marl.trainers.preference import JointRewardModel, PreferencePair

    torch.set_num_threads(args.threads)
    pairs = [
        PreferencePair(
            [f"Describe topic {i} together.", f"Write about item {i}."],
            [f"a good long answer number {i}", "yes indeed good"],
            [f"bad {i}", "no"],
            1.0,
            0.0,
            0.5,
        )
        for i in range(args.pairs)
    ]
    path = tiny_model_path()
    timings = {"legacy_loop": [], "trl_reward_trainer": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for name in ("legacy_loop", "trl_reward_trainer"):
                rm = JointRewardModel.from_pretrained(path, seed=0)
                t0 = time.perf_counter()
                if name == "legacy_loop":
                    _legacy_fit(rm, pairs, 1e-3, args.epochs, 4)
                else:
                    rm.fit(pairs, learning_rate=1e-3, num_epochs=args.epochs, batch_size=4, output_dir=tmp)
                timings[name].append(time.perf_counter() - t0)
        procs = {}
        script = ROOT / "tests" / "scripts" / "dist_reward_model.py"
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
        # 1 process, then 2 processes under DDP (full copies), ZeRO-3 and FSDP2 (the reward model sharded)
        for name, config in [(1, None), (2, "multi_cpu"), ("zero3", "zero3_cpu"), ("fsdp2", "fsdp2_cpu")]:
            out = os.path.join(tmp, f"p{name}")
            cmd = [sys.executable, str(script), out, str(args.pairs), str(args.epochs)]
            if config is not None:
                cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                       str(ROOT / "accelerate_configs" / f"{config}.yaml"), *cmd[1:]]  # fmt: skip
            subprocess.run(cmd, check=True, env=env, cwd=ROOT, capture_output=True)
            ranks = 1 if config is None else 2
            procs[name] = max(json.loads(Path(out, f"rank{r}.json").read_text())["fit_s"] for r in range(ranks))
    best = {k: min(v) for k, v in timings.items()}
    report = {
        "config": {
            "pairs": args.pairs,
            "epochs": args.epochs,
            "batch": 4,
            "threads": args.threads,
            "model": "tiny llama v512 h64 l2",
            "repeats": args.repeats,
        },  # fmt: skip
        "legacy_loop_s": best["legacy_loop"],
        "trl_reward_trainer_s": best["trl_reward_trainer"],
        "trl_over_legacy": best["trl_reward_trainer"] / best["legacy_loop"],
        "all_timings_s": timings,
        "trl_1_process_s": procs[1],
        "trl_2_processes_s": procs[2],
        "speedup_2_over_1_process": procs[1] / procs[2],
        "trl_2_processes_zero3_s": procs["zero3"],
        "trl_2_processes_fsdp2_s": procs["fsdp2"],
        "zero3_over_ddp_2_processes": procs["zero3"] / procs[2],
        "fsdp2_over_ddp_2_processes": procs["fsdp2"] / procs[2],
    }
    out = Path(args.output or ROOT / "benchmarks" / "results" / "reward_fit.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    for k, v in report.items():
        print(f"{k:28s} {v}")
    return report


if __name__ == "__main__":
    main()
