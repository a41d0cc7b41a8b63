"""PyTorch FSDP2 (`fully_shard`) for a team: sharding, gathering one agent for generation, CPU runs.

accelerate's FSDP2 path (`fsdp2_prepare_model`) wraps the decoder layers it finds through the ROOT model's
`_no_split_modules` and then the root. A team is one root holding several models, so trl_marl wraps it itself, in
the same way but one level deeper, before accelerate sees it (accelerate then leaves an already sharded root alone):

    every decoder layer of every agent / critic  ->  each agent, each critic  ->  the team

so that a forward or `generate` of agent i gathers agent i's layers one at a time and never another agent's.
Reference models are sharded the same way (TRL's `prepare_fsdp` wraps only the root; per-layer units keep the
gathered part of a reference to one layer).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = [
    "is_fsdp2",
    "enable_fsdp_on_cpu",
    "fsdp_units",
    "shard_module",
    "shard_team",
    "gathered_for_generation",
    "check_fsdp2_plugin",
    "full_state_dict",
]


def is_fsdp2(accelerator) -> bool:
    """Whether `accelerator` runs FSDP version 2."""
    plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    return plugin is not None and getattr(plugin, "fsdp_version", 1) == 2


def enable_fsdp_on_cpu(accelerator) -> bool:
    """Turn on FSDP for an `accelerate launch --config_file fsdp2_cpu.yaml` run on a CPU-only machine.

    accelerate enables FSDP only on accelerators (its `MULTI_CPU` mode ignores `distributed_type: FSDP`), although
    FSDP2 runs on CPUs over gloo. When the launcher asked for FSDP (`ACCELERATE_USE_FSDP`) and the run is
    multi-process on CPUs, this sets the accelerator's state to FSDP with the plugin the launcher's variables
    describe (as accelerate would on GPUs). Returns whether it did.
    """
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return False
    if state.distributed_type != DistributedType.MULTI_CPU or getattr(state, "fsdp_plugin", None) is not None:
        return False
    state.fsdp_plugin = FullyShardedDataParallelPlugin()
    state.distributed_type = DistributedType.FSDP
    # AcceleratorState copies PartialState's fields each time it is instantiated: set it there too (as
    # AcceleratorState.__init__ itself does for the distributed type it picks)
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True


def check_fsdp2_plugin(accelerator) -> None:
    """Reject FSDP settings trl_marl does not support, naming the field."""
    plugin = accelerator.state.fsdp_plugin
    if getattr(plugin, "fsdp_version", 1) != 2:
        raise ValueError("trl_marl supports FSDP version 2 only: set fsdp_version: 2 in the accelerate config")
    if getattr(plugin, "cpu_ram_efficient_loading", False):
        raise ValueError(
            "fsdp_cpu_ram_efficient_loading: true is not supported by trl_marl (the agents are loaded on every rank "
            "and sharded before training); set fsdp_cpu_ram_efficient_loading: false"
        )
    if "FULL_STATE_DICT" not in str(plugin.state_dict_type):
        raise ValueError(
            f"fsdp_state_dict_type must be FULL_STATE_DICT (save_model writes one from_pretrained folder per agent), "
            f"got {plugin.state_dict_type}"
        )


def _layer_classes(module: nn.Module) -> set[type]:
    """The decoder-layer classes of every transformers model inside `module` (their `_no_split_modules`)."""
    names: set[str] = set()
    for m in module.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return {type(m) for m in module.modules() if type(m).__name__ in names}


def fsdp_units(team: nn.Module) -> list[nn.Module]:
    """The modules of a team that get an FSDP unit of their own: each agent's model (or the one shared base of a
    LoRA team) and each separate critic."""
    units = [team.shared] if getattr(team, "shared_base", False) else list(team.agents)
    units += list(getattr(team, "critics", None) or [])
    return units


def _fsdp_kwargs(accelerator) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    plugin = accelerator.state.fsdp_plugin
    # the arguments accelerate's `fsdp2_prepare_model` passes (reused so a config means the same in both)
    return {
        "reshard_after_forward": plugin.reshard_after_forward,
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
    }


def shard_module(module: nn.Module, accelerator) -> nn.Module:
    """`fully_shard` every decoder layer of `module`, then `module` itself (in place; returns it)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(module, FSDPModule):
        return module
    _sync_from_rank0(module)
    kwargs = _fsdp_kwargs(accelerator)
    classes = tuple(_layer_classes(module))
    if classes:
        for m in list(module.modules()):
            if isinstance(m, classes) and not isinstance(m, FSDPModule):
                fully_shard(m, **kwargs)
    fully_shard(module, **kwargs)
    return module


def shard_team(team: nn.Module, accelerator) -> nn.Module:
    """Shard a team in place: decoder layers, then each agent / critic (`fsdp_units`), then the team (whose own
    unit keeps what is left: value heads)."""
    from torch.distributed.fsdp import fully_shard

    check_fsdp2_plugin(accelerator)
    _sync_from_rank0(team)
    for unit in fsdp_units(team):
        shard_module(unit, accelerator)
    # the root: reshard_after_forward=None lets torch keep the root's small remainder gathered (as accelerate does)
    kwargs = {k: v for k, v in _fsdp_kwargs(accelerator).items() if k != "reshard_after_forward"}
    fully_shard(team, **kwargs)
    return team


def _sync_from_rank0(module: nn.Module) -> None:
    """Broadcast every parameter and buffer from rank 0, as DDP does when it wraps a model: `fully_shard` keeps
    each rank's own slice, so ranks whose initial weights differ (a randomly initialised LoRA adapter or value
    head) would otherwise train a mixture."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if t.device.type != "meta":
                dist.broadcast(t.data, src=0)


def _fsdp_modules(module: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered_for_generation(module: nn.Module, root: nn.Module | None = None) -> Iterator[nn.Module]:
    """Hold `module`'s full parameters (every FSDP unit inside it) for the duration of the block, then shard them
    again: `generate` then runs without a collective per token, and only this one module is ever gathered.

    Every rank must enter the block for the same module (the gather is a collective). `root` is the FSDP root the
    module belongs to; it is initialised first (FSDP2 requires the root's forward to run before a child's).
    """
    units = _fsdp_modules(module)
    if not units:
        yield module
        return
    if root is not None:
        _lazy_init_root(root)
    previous = []
    for u in units:
        state = u._get_fsdp_state()
        group = state._fsdp_param_group
        previous.append(None if group is None else group.post_forward_mesh_info is not None)
        u.unshard()
        u.set_reshard_after_forward(False, recurse=False)
    try:
        yield module
    finally:
        for u, prev in zip(units, previous):
            if prev is not None:
                u.set_reshard_after_forward(prev, recurse=False)
            u.reshard()


def _lazy_init_root(root: nn.Module) -> None:
    """Run FSDP2's root initialisation (what the root's first forward does) if it has not run yet."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(root, FSDPModule):
        return
    state = root._get_fsdp_state()
    if state._is_root is None:
        state._lazy_init()


def full_state_dict(model: nn.Module, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of an FSDP2 model as CPU tensors; a collective every rank must call.

    - `rank0_only=False` (default): on EVERY rank, gathered one tensor at a time (`DTensor.full_tensor`), so a rank
      never holds more than one full parameter on its device besides its shards.
    - `rank0_only=True`: on rank 0 only (torch's `get_model_state_dict(full_state_dict=True, cpu_offload=True)`,
      what accelerate's `get_state_dict` returns for FSDP2); the other ranks get an empty dict. For a writer that
      saves on the main process only: the other ranks hold no full copy at all.
    """
    if rank0_only:
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        out = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        on_rank0 = not dist.is_initialized() or dist.get_rank() == 0
        return out if on_rank0 else {}  # torch returns an empty dict there already; made explicit
    from torch.distributed.tensor import DTensor

    out = {}
    for name, value in model.state_dict().items():
        value = value.full_tensor() if isinstance(value, DTensor) else value
        out[name] = value.detach().cpu().clone()
    return out
