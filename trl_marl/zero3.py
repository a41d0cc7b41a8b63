"""DeepSpeed ZeRO-3 with `zero3_init_flag: true`: models built partitioned from the start.

With the flag, accelerate / transformers construct every `from_pretrained` model inside `deepspeed.zero.Init`, so
each rank holds only its partition of each agent from the moment it is loaded. What trl_marl builds from the
agents afterwards (frozen reference copies) must be built partitioned too: a `copy.deepcopy` of a partitioned
module copies empty placeholders.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["zero3_init_enabled", "zero3_frozen_copy", "hooks_removed", "gathered"]


def zero3_init_enabled() -> bool:
    """Whether models are being constructed inside `deepspeed.zero.Init` (ZeRO-3 with `zero3_init_flag: true`)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled()


def _is_partitioned(module: nn.Module) -> bool:
    return any(hasattr(p, "ds_id") for p in module.parameters())


def zero3_frozen_copy(module: nn.Module) -> nn.Module:
    """A frozen copy of `module` built partitioned: a new model of the same class and config constructed inside
    `deepspeed.zero.Init`, its parameters filled from `module`'s, gathered ONE layer-sized parameter at a time
    (never the whole model on one rank). Every rank must call it (the gathers are collectives)."""
    import deepspeed

    if not _is_partitioned(module):
        return copy.deepcopy(module)
    # transformers' `_from_config` constructs (and initialises) inside deepspeed.zero.Init when ZeRO-3 is enabled
    clone = type(module)._from_config(copy.deepcopy(module.config))
    src = dict(module.named_parameters())
    for name, p in clone.named_parameters():
        with deepspeed.zero.GatheredParameters([src[name], p], modifier_rank=0):
            if p.data.shape == src[name].data.shape:
                p.data.copy_(src[name].data)
    src_buffers = dict(module.named_buffers())
    for name, b in clone.named_buffers():
        if name in src_buffers and b.shape == src_buffers[name].shape:
            b.data.copy_(src_buffers[name].data)
    if hasattr(module, "generation_config"):
        clone.generation_config = copy.deepcopy(module.generation_config)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


@contextmanager
def hooks_removed(engine) -> Iterator[None]:
    """DeepSpeed's ZeRO-3 fetch/release hooks off for the block (TRL's `remove_hooks` / `add_hooks`), so that a
    module gathered with `gathered` runs `generate` without a collective per layer and token."""
    from trl.models.utils import add_hooks, remove_hooks

    if not hasattr(engine, "optimizer"):  # not an engine yet (before training): no hooks to remove
        yield
        return
    remove_hooks(engine)
    try:
        yield
    finally:
        add_hooks(engine)


def gathered(module: nn.Module):
    """The full parameters of ONE module for the block (`deepspeed.zero.GatheredParameters`; a no-op for a module
    that is not partitioned). Every rank must enter it for the same module."""
    import deepspeed

    return deepspeed.zero.GatheredParameters([p for p in module.parameters() if hasattr(p, "ds_id")])
