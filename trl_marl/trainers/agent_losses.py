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

On the micro-step that ends with the optimizer step (`accelerator.sync_gradients`), each earlier agent also takes
its optimizer step right after its backward (`step_each_agent`, `optimizer_step_of_agent`), and its gradients are
freed before the next agent's forward: the step holds one agent's gradients instead of the team's (86 MB less at
the peak on the side-by-side's team). The update is the one the transformers loop would apply: each agent's
gradient is clipped by its OWN norm (`building.clip_agents_each`), AdamW and torch's other optimizers update each
parameter from its own gradient and state, and the learning rate is the step's (the scheduler steps after the
loop's `optimizer.step()`, which then updates the last agent). What differs: the loop's `on_pre_optimizer_step`
callbacks see the last agent's gradients only, and a run stopped by a non-finite loss or gradient of a later agent
(`trl_marl.trainers.finite`) has applied that step to the earlier agents in memory (the error names them; the
checkpoints on disk predate the step).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate.utils import DistributedType
from torch import nn

import trl_marl.trainers.finite as finite
from trl_marl.trainers.building import clip_each

__all__ = [
    "backward_each_agent",
    "combined_grad_norm",
    "optimizer_step_of_agent",
    "step_each_agent",
    "sum_of_agent_losses",
]

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


def step_each_agent(trainer: Any) -> bool:
    """Whether, where `backward_each_agent` holds, each agent but the last may take its optimizer step right after
    its backward: this micro-step ends with the optimizer step, every agent's gradient is clipped by its own norm
    (agents sharing one base are clipped together), no gradient scaler (fp16 mixed precision) decides the step, and
    the optimizer is one of torch's (`torch.optim`: each parameter updated from its own gradient and state, a
    parameter without a gradient left alone)."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return (
        trainer.accelerator.sync_gradients
        and getattr(trainer.accelerator, "scaler", None) is None
        and not trainer.team.shared_base
        and isinstance(optimizer, torch.optim.Optimizer)
        and type(optimizer).__module__.startswith("torch.optim.")
    )


def optimizer_step_of_agent(trainer: Any, i: int, loss: torch.Tensor) -> None:
    """Agent i's part of the optimizer step, applied now: stop on a non-finite `loss` (agent i's term) or gradient
    before anything is applied (`trl_marl.trainers.finite`), clip agent i's gradient by its own norm to
    `max_grad_norm` (record it for `<agent>/grad_norm` and the step's `grad_norm`), step the optimizer with every
    other parameter's gradient set aside, and free agent i's gradients."""
    finite.check_loss(trainer, loss)
    params = [p for _, p in trainer.team.agent_named_parameters(i) if p.grad is not None]
    if not params:
        return
    max_norm = trainer.args.max_grad_norm
    if max_norm is not None and max_norm > 0:
        norm = float(clip_each([params], max_norm))
    else:
        norm = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
    finite.check_grad_norm(trainer, norm)
    trainer.record_early_agent_step(i, norm)
    own = set(params)
    groups = trainer.optimizer.param_groups
    aside = [(p, p.grad) for g in groups for p in g["params"] if p.grad is not None and p not in own]
    for p, _ in aside:
        p.grad = None
    try:
        trainer.optimizer.step()
    finally:
        for p, grad in aside:
            p.grad = grad
    for p in params:
        p.grad = None


def combined_grad_norm(rest: float, early: Sequence[float]) -> float:
    """The pre-clip gradient norm of the whole step from the norm of the gradients the loop clips (`rest`) and those
    of the agents stepped early: `sqrt(rest^2 + sum_k early_k^2)`."""
    return math.sqrt(float(rest) ** 2 + sum(n * n for n in early))


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
    backpropagated here. With `step_each_agent` too, each term but the last is followed by its agent's optimizer
    step (`optimizer_step_of_agent`)."""
    scored = [i for i, b in enumerate(batches) if b is not None]
    if not backward_each_agent(trainer, batches):
        out = model(batches, **forward_kwargs)
        losses = [agent_loss(i, out) for i in scored]
    else:
        out, losses = {}, []
        scale = getattr(trainer, "current_gradient_accumulation_steps", trainer.args.gradient_accumulation_steps)
        step_alone = step_each_agent(trainer)
        for i in scored:
            out_i = model([b if j == i else None for j, b in enumerate(batches)], **forward_kwargs)
            for key, values in out_i.items():
                out.setdefault(key, [None] * len(batches))[i] = values[i]
            loss_i = agent_loss(i, out_i)
            if i != scored[-1]:
                trainer.accelerator.backward(loss_i / scale)  # frees agent i's graph before the next agent's forward
                loss_i = loss_i.detach()
                if step_alone:
                    optimizer_step_of_agent(trainer, i, loss_i)  # frees agent i's gradients too
            losses.append(loss_i)
    return sum(loss.to(losses[0].device) for loss in losses), out
