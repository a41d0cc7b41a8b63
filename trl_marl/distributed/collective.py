"""Keeping processes in step where the work is a collective.

Under DeepSpeed ZeRO-3 and FSDP2 a module's parameters are sharded over the processes: generating with an agent
(its parameters gathered, `trl_marl.distributed.zero3.gathered` / `trl_marl.distributed.fsdp.gathered_for_generation`, then transformers'
`generate(synced_gpus=True)`, which all-reduces "still generating?" after every token), a forward of the sharded
joint reward model, critic or reference model: each is a collective that EVERY process must enter, the same
number of times, in the same order. A process with less work (a multi-turn rollout whose branches all
terminated early, the last, shorter share of an evaluation set or of a pair collection, an empty share) must
still take part: it makes the same calls with a discarded placeholder row (one pad token, greedy: no random draw),
as accelerate's `even_batches` pads the last batch and TRL generates with `synced_gpus=True` under ZeRO-3 / FSDP.
The number of batches and turns is agreed with one small all-reduce (`max_over_processes`).
"""

from __future__ import annotations

import atexit
import functools
from collections.abc import Sequence
from typing import TypeVar

import torch

__all__ = ["is_sharded", "max_over_processes", "any_over_processes", "even_chunks", "destroy_process_group_at_exit"]

T = TypeVar("T")


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether `module` holds sharded parameters: ZeRO-3 partitions (`ds_id`) or FSDP2 DTensors. Check it before
    gathering (gathered FSDP2 parameters are plain tensors)."""
    from torch.distributed.tensor import DTensor

    return any(hasattr(p, "ds_id") or isinstance(p, DTensor) for p in module.parameters())


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def max_over_processes(value: int) -> int:
    """The largest `value` over all processes (a collective every process must call); `value` itself in a
    one-process run."""
    if _world() == 1:
        return int(value)
    import torch.distributed as dist

    # a CPU tensor works with gloo; NCCL needs the process's device
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([int(value)], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_over_processes(flag: bool) -> bool:
    """Whether `flag` is true on any process (a collective every process must call)."""
    return max_over_processes(int(bool(flag))) > 0


def even_chunks(rows: Sequence[T], size: int, synced: bool = True) -> list[list[T]]:
    """`rows` cut into consecutive chunks of `size`; with `synced`, followed by empty chunks up to the largest
    number of chunks of any process (a collective), so that every process loops the same number of times."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    chunks = [list(rows[s : s + size]) for s in range(0, len(rows), size)]
    if synced:
        chunks += [[] for _ in range(max_over_processes(len(chunks)) - len(chunks))]
    return chunks


@functools.cache
def destroy_process_group_at_exit() -> None:
    """Have the process group destroyed when the interpreter exits normally (registered once; a no-op where the
    script destroyed it itself, as `Accelerator.end_training` does).

    A gloo group left to the C++ static destructors can abort the exit ("terminate called without an active
    exception", SIGABRT, after training finished): its worker threads still hold work objects whose tensors need
    the interpreter, which is being torn down. `atexit` runs while the interpreter is whole. The trainers register
    this after a successful `train()` only: after an error a process's peers may still be inside a collective,
    where destroying a NCCL group can block (torchtitan destroys on success only, for the same reason)."""
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    import sys

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    vllm_groups = sys.modules.get("vllm.distributed.parallel_state")
    if vllm_groups is not None and vllm_groups.model_parallel_is_initialized():
        return  # a colocated vLLM engine's shutdown destroys every group itself (and fails on one destroyed before)
    dist.destroy_process_group()
