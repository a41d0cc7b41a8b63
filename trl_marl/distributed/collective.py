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
import os
import sys
import time
from collections.abc import Sequence
from typing import TypeVar

import torch

__all__ = [
    "is_sharded",
    "max_over_processes",
    "any_over_processes",
    "even_chunks",
    "destroy_process_group_at_exit",
    "wait_for_gloo_workers",
]

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
    """Have the process group destroyed when the interpreter exits normally, once gloo's worker threads have released
    their last work (registered once; the destruction is a no-op where the script destroyed the group itself, as
    `Accelerator.end_training` does).

    Why: a gloo worker thread that releases a finished collective's tensors takes the GIL (each tensor's Python
    object, kept alive while C++ holds the tensor, is released). One that asks for the GIL after the interpreter
    started finalizing is ended by CPython with `pthread_exit`, whose unwinding through torch's `noexcept` frames
    aborts the process ("terminate called without an active exception", SIGABRT) after a finished run. A worker
    that was not scheduled between the run's last collective and the exit hits it (CI's 2-process runs, rarely).
    `atexit` runs while the interpreter is whole: there the hook destroys the group (which joins the workers where
    nothing else holds it) and lets the workers run out (`wait_for_gloo_workers`), since DeepSpeed's parameters and
    DDP's reducer keep the group alive past `destroy_process_group`. The trainers register this after a successful
    `train()`, or a successful `evaluate()` outside of it (an evaluation-only script), and only then: after an error
    a process's peers may still be inside a collective, where destroying a NCCL group can block (torchtitan destroys
    on success only, for the same reason)."""
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    try:
        vllm_groups = sys.modules.get("vllm.distributed.parallel_state")
        # a colocated vLLM engine's shutdown destroys every group itself (and fails on one destroyed before)
        vllm_owns_groups = vllm_groups is not None and vllm_groups.model_parallel_is_initialized()
        if dist.is_available() and dist.is_initialized() and not vllm_owns_groups:
            dist.destroy_process_group()
    finally:
        wait_for_gloo_workers()


GLOO_WORKER_PREFIX = "pt_gloo"  # the name torch gives gloo's worker threads (`ProcessGroupGloo::runLoop`)


def _gloo_worker_states() -> list[str] | None:
    """The scheduler states ('R' running or runnable, 'S' sleeping, ...) of this process's gloo worker threads, read
    from /proc (Linux); None where it cannot be read."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    states = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # the thread has exited
        # "tid (name) state ...": the name may hold spaces and parentheses; the state follows the last ')'
        close = stat.rfind(")")
        if stat[stat.find("(") + 1 : close].startswith(GLOO_WORKER_PREFIX):
            states.append(stat[close + 2 : close + 3])
    return states


def wait_for_gloo_workers(budget_s: float = 2.0, poll_s: float = 0.005, quiet_polls: int = 3) -> bool:
    """Wait, with the GIL released, until no gloo worker thread of this process is running or runnable in
    `quiet_polls` consecutive polls `poll_s` apart, or `budget_s` has passed. Returns whether they went quiet
    (True at once where the process has no gloo worker, or where /proc cannot tell).

    A worker that has finished a collective releases the work's tensors, taking the GIL for each; the sleep hands
    it the GIL, and a worker still at it is running, runnable or (briefly) waiting for the GIL. A worker blocked in
    a collective whose peers have not joined sleeps: that work is not waited for (only a collective every process
    joins could)."""
    states = _gloo_worker_states()
    if not states:
        return True
    deadline, quiet = time.monotonic() + budget_s, 0
    while quiet < quiet_polls:
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
        states = _gloo_worker_states() or []
        quiet = quiet + 1 if "R" not in states else 0
    return True
