"""A team loss that is a sum of per-agent terms, backpropagated one agent at a time where the engine allows it.

The REINFORCE family's loss (the seed's policy gradient and TRL's GRPO loss family) is `L = sum_i L_i`, each `L_i` a
function of agent i's log-probs only: the advantages come frozen from the rollout, and the agents' parameters are
disjoint. Its gradient is the same whether `L` is backpropagated once or each `L_i` as soon as it is computed; the
second keeps ONE agent's graph at a time instead of every agent's until the one backward. The team forward's chunked
scoring (`trl_marl.models.scoring`) reaches the same peak by recomputing every agent but the last in the backward,
one more forward of those agents per step: on the model-shaped side-by-side (two agents, `benchmarks/`) one agent at
a time took 0.85x the step time at the same peak RSS.

`sum_of_agent_losses` does it where one process trains the unwrapped team (`backward_each_agent`): DDP, DeepSpeed
and FSDP2 expect one backward per forward of the model they wrap (DDP's reducer, DeepSpeed's `engine.backward`,
FSDP2's reshard hooks), so there the team is scored in one forward and the trainer backpropagates the sum, as before.
The early terms are scaled as `transformers.Trainer.training_step` scales the loss it backpropagates (divided by the
micro-step's gradient-accumulation steps), and the returned loss is the full sum (the early terms detached): the
trainer's backward of it adds the last agent's gradient, and its logged value and finiteness check are those of `L`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate.utils import DistributedType
from torch import nn

__all__ = ["backward_each_agent", "sum_of_agent_losses"]

# Optimizers that fuse the backward with the update (transformers' `OptimizerNames.LOMO` / `ADALOMO`).
_FUSED_BACKWARD_OPTIMIZERS = ("lomo", "adalomo")


def backward_each_agent(trainer: Any, batches: Sequence[Any]) -> bool:
    """Whether the loss over `batches` (one per agent, None for an agent not scored) may backpropagate each agent's
    term before the next agent's forward: gradients on, more than one agent scored, one process training the team
    without a wrapper that expects one backward per forward (no DDP, DeepSpeed, FSDP2 or `DataParallel`), and an
    optimizer that does not run inside the backward (LOMO)."""
    args = trainer.args
    return (
        torch.is_grad_enabled()
        and sum(b is not None for b in batches) > 1
        and trainer.accelerator.distributed_type == DistributedType.NO
        and args.n_gpu <= 1
        and str(getattr(args.optim, "value", args.optim)) not in _FUSED_BACKWARD_OPTIMIZERS
    )


def sum_of_agent_losses(
    trainer: Any,
    model: nn.Module,
    batches: Sequence[Any],
    agent_loss: Callable[[int, dict[str, list]], torch.Tensor],
    **forward_kwargs: Any,
) -> tuple[torch.Tensor, dict[str, list]]:
    """`(sum_i L_i, the team forward's outputs)`, `L_i = agent_loss(i, out)` computed from the team forward `out =
    model(batches, **forward_kwargs)` (`TeamModel.forward`: `out[key][i]` is agent i's entry) for every agent whose
    batch is not None.

    With `backward_each_agent`, the team forward runs once per agent (the other agents' batches None) and each
    term but the last is backpropagated right after it is computed (module docstring); the outputs returned are the
    agents' entries of those forwards, merged. Otherwise one forward scores every agent and nothing is
    backpropagated here."""
    scored = [i for i, b in enumerate(batches) if b is not None]
    if not backward_each_agent(trainer, batches):
        out = model(batches, **forward_kwargs)
        losses = [agent_loss(i, out) for i in scored]
    else:
        out, losses = {}, []
        scale = getattr(trainer, "current_gradient_accumulation_steps", trainer.args.gradient_accumulation_steps)
        for i in scored:
            out_i = model([b if j == i else None for j, b in enumerate(batches)], **forward_kwargs)
            for key, values in out_i.items():
                out.setdefault(key, [None] * len(batches))[i] = values[i]
            loss_i = agent_loss(i, out_i)
            if i != scored[-1]:
                trainer.accelerator.backward(loss_i / scale)  # frees agent i's graph before the next agent's forward
                loss_i = loss_i.detach()
            losses.append(loss_i)
    return sum(loss.to(losses[0].device) for loss in losses), out
