"""What one rank holds of a module (used by the launched test scripts): `full` (the model's element count),
`shard` (this rank's persistent slice: ZeRO-3's `ds_tensor`, FSDP2's local DTensor shard; the whole model when
unsharded) and `held` (elements materialised on this rank right now: a ZeRO-3 parameter outside its forward holds
nothing unless DeepSpeed keeps it persistent)."""

import torch


def shard_numel(module: torch.nn.Module) -> dict[str, int]:
    from torch.distributed.tensor import DTensor

    full = shard = held = 0
    for p in module.parameters():
        if hasattr(p, "ds_id"):
            full += p.ds_numel
            shard += p.ds_tensor.numel()
            held += p.data.numel()
        elif isinstance(p, DTensor):
            full += p.numel()
            shard += p.to_local().numel()
            held += p.to_local().numel()
        else:
            full += p.numel()
            shard += p.numel()
            held += p.numel()
    return {"full": full, "shard": shard, "held": held}
