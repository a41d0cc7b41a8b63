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

__all__ = [
    "is_zero3",
    "zero3_init_enabled",
    "zero3_init_flag_honoured",
    "loaded_in_full",
    "zero3_frozen_copy",
    "hooks_removed",
    "gathered",
    "fill_bucket_sizes",
]


def is_zero3(accelerator) -> bool:
    """Whether `accelerator` runs DeepSpeed ZeRO stage 3."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return plugin is not None and plugin.zero_stage == 3


def zero3_init_enabled() -> bool:
    """Whether models are being constructed inside `deepspeed.zero.Init` (ZeRO-3 with `zero3_init_flag: true`)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled()


@contextmanager
def zero3_init_flag_honoured(args) -> Iterator[None]:
    """Models built in the block are constructed inside `deepspeed.zero.Init` only if `zero3_init_flag` is on.

    accelerate's `DeepSpeedPlugin.set_deepspeed_weakref` registers transformers' DeepSpeed config whenever DeepSpeed
    runs (TrainingArguments calls it), and `from_pretrained` partitions while loading whenever that config says
    ZeRO-3, so `zero3_init_flag: false` was silently ignored. With the flag off, the block runs with transformers'
    config unregistered (every rank loads the full models; the engine partitions them when it is built) and
    registers it again afterwards."""
    plugin = getattr(args, "deepspeed_plugin", None)
    if plugin is not None and plugin.zero3_init_flag:
        yield
        return
    with loaded_in_full(plugin):
        yield


@contextmanager
def loaded_in_full(plugin) -> Iterator[None]:
    """Models built in the block are loaded in full on this rank, outside `deepspeed.zero.Init`: transformers'
    DeepSpeed config is unregistered for the block and registered again by `plugin` (accelerate's
    `DeepSpeedPlugin`) afterwards. A no-op when models are not being built partitioned."""
    if plugin is None or not zero3_init_enabled():
        yield
        return
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


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


def _numel(p) -> int:
    return int(getattr(p, "ds_numel", p.numel()))  # a partitioned parameter's full size


def _largest_layer(team: nn.Module) -> int:
    """Parameters of the largest decoder layer (a `_no_split_modules` class) of any model in `team`."""
    from trl_marl.distributed.fsdp import _layer_classes

    classes = tuple(_layer_classes(team))
    sizes = [sum(_numel(p) for p in m.parameters()) for m in team.modules() if classes and isinstance(m, classes)]
    return max(sizes, default=0)


def fill_bucket_sizes(ds_config: dict, team: nn.Module) -> dict[str, int]:
    """Size DeepSpeed's buffers for the team, where the config leaves them unset or `"auto"` (returns what it set).

    accelerate's `deepspeed_config` YAML keys cannot set them, so without this DeepSpeed's defaults apply, made for
    one big model: 5e8-element reduce / all-gather buckets (flat buffers that end up the size of every gradient of
    the team) and, under ZeRO-3, `stage3_max_live_parameters` / `stage3_max_reuse_distance` of 1e9 elements, which
    keep every gathered parameter of the team gathered between the forward and the backward: each rank then holds
    the whole team, the memory ZeRO-3 exists to save. With `h` the largest hidden size of the team's models, as
    transformers' / accelerate's `"auto"` values: `reduce_bucket_size = h*h`, `stage3_prefetch_bucket_size =
    0.9*h*h`, `stage3_param_persistence_threshold = 10*h` (and `allgather_bucket_size = h*h` under ZeRO-1/2); and
    `stage3_max_live_parameters = stage3_max_reuse_distance = ` one decoder layer of the largest model (at least
    h*h): a rank holds the layer it computes plus one prefetched, never another agent's weights.
    """
    zero = ds_config.setdefault("zero_optimization", {})
    stage = int(zero.get("stage", 0) or 0)
    if stage < 1:
        return {}
    hidden = [getattr(getattr(m, "config", None), "hidden_size", None) for m in team.modules()]
    hidden = [h for h in hidden if isinstance(h, int)]
    if not hidden:
        return {}
    h = max(hidden)
    sizes = {"reduce_bucket_size": h * h}
    if stage == 3:
        layer = max(_largest_layer(team), h * h)
        sizes.update(
            stage3_prefetch_bucket_size=int(0.9 * h * h),
            stage3_param_persistence_threshold=10 * h,
            stage3_max_live_parameters=layer,
            stage3_max_reuse_distance=layer,
        )
    else:
        sizes["allgather_bucket_size"] = h * h
    filled = {}
    for key, value in sizes.items():
        if zero.get(key, "auto") == "auto":
            zero[key] = filled[key] = value
    return filled
