"""The training data of a rollout trainer: which task items each process rolls out and when, and what each training
step on a rollout gets (`Experience`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

__all__ = ["Experience", "RolloutSampler", "consecutive_chunks", "identity_collate", "rollout_dataloader"]

logger = logging.getLogger(__name__)


@dataclass
class Experience:
    """What an algorithm makes of one rollout (`MultiAgentTrainer._experience`).

    Attributes:
        advantages: per agent, the `(num_nodes, G)` advantages of its samples (row `node.id`, column k); the traces,
            the completions table and the metrics callback report them.
        inputs: what every training step taken on the rollout gets beside `rollout` and `items` (e.g. the
            advantages, or an actor-critic's frozen critic data).
    """

    advantages: list[torch.Tensor]
    inputs: dict[str, Any]


class RolloutSampler(Sampler[int]):
    """Index sampler that yields rollout batches, each repeated `repeat` times (once per training step taken on it).

    Like TRL's `RepeatSampler`: `global_batch` consecutive indices form one rollout batch across all processes
    (accelerate hands each process its `global_batch / num_processes` share); the same indices are yielded `repeat`
    times so every process sees its rollout batch on each of the steps taken on it. Incomplete trailing batches are
    dropped; the order is reshuffled each epoch with a seed shared by every process.
    """

    def __init__(self, num_items: int, global_batch: int, repeat: int, shuffle: bool = True, seed: int = 0):
        self.num_items, self.global_batch, self.repeat = num_items, global_batch, repeat
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_items, generator=g).tolist()
        else:
            order = list(range(self.num_items))
        self.epoch += 1
        for start in range(0, self.num_items - self.global_batch + 1, self.global_batch):
            chunk = order[start : start + self.global_batch]
            for _ in range(self.repeat):
                yield from chunk

    def __len__(self) -> int:
        return (self.num_items // self.global_batch) * self.global_batch * self.repeat


def consecutive_chunks(num_items: int, steps: int) -> list[list[int]]:
    """The item indices of each of `steps` training steps on one rollout of `num_items` items: consecutive slices."""
    per = num_items // steps
    return [list(range(k * per, (k + 1) * per)) for k in range(steps)]


def identity_collate(batch: list) -> list:
    """A batch of task items stays a list of items (formatters and rewards read them whole)."""
    return batch


def rollout_dataloader(dataset: Any, args: Any, accelerator: Any, repeat: int | None = None) -> DataLoader:
    """The training loader of a rollout trainer: each process gets `rollout_buffer_size` items per rollout
    (`RolloutSampler`), the same batch once per training step taken on it (`repeat`, default `steps_per_rollout`;
    times `num_iterations` when a generation is reused); an epoch skips the items left over after the last whole
    rollout batch (with a warning saying how many)."""
    n_proc = accelerator.num_processes
    global_batch = args.rollout_buffer_size * n_proc
    if len(dataset) < global_batch:
        raise ValueError(
            f"train_dataset has {len(dataset)} items, fewer than one rollout batch "
            f"(rollout_buffer_size={args.rollout_buffer_size} x {n_proc} processes)"
        )
    skipped = len(dataset) % global_batch
    if skipped and accelerator.is_main_process:
        logger.warning(
            "train_dataset has %d items, not a multiple of one rollout batch (%d = rollout_buffer_size x "
            "processes): each epoch rolls out %d and skips the %d left after the shuffle (another %d each "
            "epoch). Choose rollout_buffer_size so that it divides the dataset to use every item every epoch.",
            len(dataset),
            global_batch,
            len(dataset) - skipped,
            skipped,
            skipped,
        )
    repeat = args.steps_per_rollout if repeat is None else repeat
    sampler = RolloutSampler(len(dataset), global_batch, repeat, True, args.seed)
    loader = DataLoader(
        dataset, batch_size=args.rollout_buffer_size, sampler=sampler, collate_fn=identity_collate, num_workers=0
    )
    return accelerator.prepare(loader)
