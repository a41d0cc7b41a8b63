"""Cost of one checkpoint: the crash-safe one (staging folder, fsync, marker, rename, resume state) against the
plain transformers `Trainer._save_checkpoint` the trainers used before, in the same process, interleaved.

    python benchmarks/checkpoint_cost.py [--repeats 5] [--output PATH]  # default benchmarks/results/checkpoint_cost.json

Two teams of 2 agents (MAGRPO, one optimizer step taken so the optimizer has state): the tiny reference model, and a
model-shaped one (hidden 512, intermediate 1376, 8 layers, 8 heads). Each repeat times one checkpoint of each kind
(rotating which goes first): plain, crash-safe, crash-safe with fsync made a no-op (the cost of durability itself)
and crash-safe with the marker's digest made a constant (the cost of the checksums); the figure is the median.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common

_common.set_offline_env()

SHAPES = {
    "tiny (h64, 2 layers)": {},
    "model-shaped (h512, 8 layers)": dict(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8
    ),
}


def _trainer(shape: dict, out: str):
    from datasets import Dataset

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.testing import tiny_model_path

    args = MAGRPOConfig(
        output_dir=out,
        num_agents=2,
        num_generations=2,
        max_completion_length=4,
        rollout_buffer_size=2,
        max_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
    )
    items = Dataset.from_list([{"prompt": f"Say {i}."} for i in range(4)])
    t = MAGRPOTrainer(
        agent_model=tiny_model_path(**shape),
        reward_func=lambda a, b: [float(len(x)) for x in a],
        args=args,
        train_dataset=items,
    )
    t.train()
    return t


class _NoHash:
    """A digest that costs nothing: the crash-safe routine without the marker's digest."""

    def update(self, data) -> None:
        pass

    def hexdigest(self) -> str:
        return "0" * 64


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(shape: dict, repeats: int) -> dict:
    from transformers import Trainer

    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    try:
        t = _trainer(shape, str(root / "run"))
        t.args.save_total_limit = None
        model = t.model_wrapped
        import trl_marl.checkpointing.durable as durable

        def without(name: str, stand_in):
            def save():  # the same routine with one piece replaced: what that piece costs
                real = getattr(durable, name)
                setattr(durable, name, stand_in)
                try:
                    t._save_checkpoint(model, None)
                finally:
                    setattr(durable, name, real)

            return save

        plain = lambda: Trainer._save_checkpoint(t, model, None)  # noqa: E731 -- the transformers routine, as before
        atomic = lambda: t._save_checkpoint(model, None)  # noqa: E731 -- trl_marl.checkpointing.checkpoint
        variants = [
            ("plain", plain),
            ("atomic", atomic),
            ("atomic_no_fsync", without("_fsync", lambda fd: None)),  # the durability itself
            ("atomic_no_hash", without("_hasher", _NoHash)),  # the marker's digest of every file
        ]
        times = {name: [] for name, _ in variants}
        step = 100
        for r in range(repeats + 1):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for name, fn in order:
                step += 1
                t.state.global_step = step
                seconds = _time(fn)
                if r > 0:  # the first round warms the caches
                    times[name].append(seconds)
                shutil.rmtree(root / "run" / f"checkpoint-{step}", ignore_errors=True)
        size = sum(p.stat().st_size for p in (root / "run").rglob("*") if p.is_file())
        params = sum(p.numel() for p in t.team.parameters())
        plain_s, atomic_s = statistics.median(times["plain"]), statistics.median(times["atomic"])
        no_fsync_s = statistics.median(times["atomic_no_fsync"])
        no_hash_s = statistics.median(times["atomic_no_hash"])
        return {
            "params": params,
            "plain_s": plain_s,
            "atomic_s": atomic_s,
            "atomic_no_fsync_s": no_fsync_s,
            "ratio": atomic_s / plain_s,
            "ratio_no_fsync": no_fsync_s / plain_s,
            "atomic_no_hash_s": no_hash_s,
            "ratio_no_hash": no_hash_s / plain_s,
            "hash_share_of_plain": (atomic_s - no_hash_s) / plain_s,
            "times": times,
            "leftover_bytes": size,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=_common.RESULTS / "checkpoint_cost.json")
    parser.add_argument("--shapes", nargs="+", choices=["tiny", "model-shaped"], default=["tiny", "model-shaped"])
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    shapes = {name: shape for name, shape in SHAPES.items() if name.split(" (")[0] in args.shapes}
    results = {name: measure(shape, args.repeats) for name, shape in shapes.items()}
    for name, r in results.items():
        print(
            f"{name}: {r['params'] / 1e6:.2f} M params, plain {r['plain_s']:.3f} s, crash-safe {r['atomic_s']:.3f} s, "
            f"ratio {r['ratio']:.2f}x (without fsync {r['atomic_no_fsync_s']:.3f} s, {r['ratio_no_fsync']:.2f}x; "
            f"without hashing {r['atomic_no_hash_s']:.3f} s, {r['ratio_no_hash']:.2f}x)"
        )
    _common.write_json(args.output, results)


if __name__ == "__main__":
    sys.exit(main())
