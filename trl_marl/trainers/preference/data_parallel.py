"""How the preference trainers split their work over processes, so that N processes build the same pairs and make
the same update as one process with the same global batch.

* Collection (`collection_chunks`): the task items are cut into global chunks of `per_process x world` items, in
  dataset order; process r rolls out items r, r + world, ... of each chunk (at most `per_process`). Every process
  runs the same number of chunks: under ZeRO-3 and FSDP2 each `generate` gathers an agent's weights, a collective,
  so a process with no item in the last chunk rolls out a filler (the chunk's first item) and drops the result.
* Reference log-probs (`reference_chunks`): `precompute_ref_log_probs` splits the pairs still missing them as the
  collection splits items (equal chunk counts, a filler where a process has no pair in the last chunk under ZeRO-3 /
  FSDP2, where a forward of the sharded reference is a collective); the values are gathered to every process.
* Order (`merge_item_shares`): the `(item index, value)` entries of every process, gathered, in item order: the list
  one process collecting every item in order builds. Pair selection draws from a generator keyed by the item
  (`trl_marl.data_types.rng.keyed_rng`), so N processes keep the same pairs as one, in one process's order.
* Training batches (`global_batch_slices`, `GlobalBatchSampler`): each epoch's permutation of the pairs (seeded by
  the run's seed and the epoch, never by the process) is cut into global batches of `per_process x world` pairs,
  the last one filled up from the start of the permutation (every step has a full batch); process r trains on the
  r-th contiguous slice of `per_process` pairs of each. Each process's loss is the mean over its slice and the
  engine (DDP, DeepSpeed, FSDP2) averages gradients over processes: the gradient of the mean over the global batch,
  i.e. one process's with `per_process x world` pairs per step, for every loss that is a mean over pairs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader

from trl_marl.data_types.rng import stream_seed

__all__ = [
    "collection_chunks",
    "reference_chunks",
    "merge_item_shares",
    "epoch_order",
    "global_batch_slices",
    "GlobalBatchSampler",
    "EpochDataLoader",
]

T = TypeVar("T")


def collection_chunks(num_items: int, per_process: int, rank: int = 0, world: int = 1) -> list[tuple[list[int], bool]]:
    """This process's rollout chunks: `(item indices, filler)` per global chunk of `per_process x world` items.

    Process `rank` takes items `rank, rank + world, ...` of each global chunk; every process gets the same number of
    chunks, `ceil(num_items / (per_process x world))`. Where a process has no item in the last chunk, its entry is
    `([first item of the chunk], True)`: a filler to roll out (to join the collectives) and drop.
    """
    if per_process < 1 or world < 1 or not 0 <= rank < world:
        raise ValueError(f"need per_process >= 1 and 0 <= rank < world, got {per_process=}, {rank=}, {world=}")
    step = per_process * world
    chunks = []
    for start in range(0, num_items, step):
        chunk = list(range(start, min(start + step, num_items)))
        mine = chunk[rank::world]
        chunks.append((mine, False) if mine else ([chunk[0]], True))
    return chunks


def reference_chunks(
    missing: Sequence[int], per_process: int, rank: int = 0, world: int = 1, synced: bool = False
) -> list[tuple[list[int], bool]]:
    """This process's reference-forward batches over the pairs `missing` (indices into the pair list, the same on
    every process): `(pair indices, filler)` per global chunk of `per_process x world` of them.

    `collection_chunks` over the positions in `missing`: process `rank` scores `missing[rank], missing[rank + world],
    ...` of each chunk (at most `per_process` per batch), so the shares of all processes cover every missing pair
    exactly once. With `synced` (the forward is a collective: ZeRO-3 / FSDP2 with > 1 process) every process gets
    `ceil(len(missing) / (per_process x world))` batches, a process without a pair in the last chunk a filler
    `([the chunk's first pair], True)` to score and drop; without it (DDP, one process) fillers are left out.
    """
    chunks = collection_chunks(len(missing), per_process, rank, world)
    return [([missing[k] for k in ks], filler) for ks, filler in chunks if synced or not filler]


def merge_item_shares(shares: Sequence[Sequence[tuple[int, T]]]) -> list[T]:
    """The values of every process's `(item index, value)` entries, in item order (each item collected once)."""
    entries = sorted((e for share in shares for e in share), key=lambda e: e[0])
    seen = [i for i, _ in entries]
    if len(set(seen)) != len(seen):
        raise RuntimeError(f"an item was collected by more than one process: {sorted(seen)}")
    return [v for _, v in entries]


def epoch_order(num_items: int, seed: int, epoch: int) -> list[int]:
    """A permutation of `range(num_items)` that depends only on (seed, epoch)."""
    g = torch.Generator().manual_seed(stream_seed(seed, "pair_order", epoch))
    return torch.randperm(num_items, generator=g).tolist()


def global_batch_slices(order: Sequence[int], per_process: int, rank: int = 0, world: int = 1) -> list[list[int]]:
    """`order` cut into global batches of `per_process x world` (the last filled up by wrapping around to the start
    of `order`); this process's contiguous slice `[rank x per_process, (rank + 1) x per_process)` of each."""
    if not order:
        return []
    per_step = per_process * world
    order = list(order)
    missing = -len(order) % per_step
    order += [order[k % len(order)] for k in range(missing)]
    lo, hi = rank * per_process, (rank + 1) * per_process
    return [order[s + lo : s + hi] for s in range(0, len(order), per_step)]


class GlobalBatchSampler:
    """A batch sampler over `num_items` pairs: epoch e yields this process's slices of
    `global_batch_slices(epoch_order(num_items, seed, e), ...)` (`set_epoch` is called by the Trainer)."""

    def __init__(self, num_items: int, per_process: int, rank: int = 0, world: int = 1, seed: int = 0):
        self.num_items, self.per_process, self.rank, self.world, self.seed = num_items, per_process, rank, world, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return math.ceil(self.num_items / (self.per_process * self.world))

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_order(self.num_items, self.seed, self.epoch)
        yield from global_batch_slices(order, self.per_process, self.rank, self.world)


class EpochDataLoader(DataLoader):
    """A `DataLoader` whose `set_epoch` reaches its batch sampler (the Trainer calls it at each epoch)."""

    def set_epoch(self, epoch: int) -> None:
        set_epoch: Any = getattr(self.batch_sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)
