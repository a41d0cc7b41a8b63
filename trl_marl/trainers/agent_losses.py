"""A team loss that is a sum of per-agent terms, backpropagated one agent at a time where the engine allows it.

The REINFORCE family's loss (the seed's policy gradient and TRL's GRPO loss family) is `L = sum_i L_i`, each `L_i` a
function of agent i's log-probs only: the advantages come frozen from the rollout, and the agents' parameters are
disjoint. Its gradient is the same whether `L` is backpropagated once or each `L_i` as soon as it is computed; the
second keeps ONE agent's graph at a time instead of every agent's until the one backward. The team forward's chunked
scoring (`trl_marl.models.scoring`) reaches the same peak by recomputing every agent but the last in the backward,
one more forward of those agents per step: on the model-shaped side-by-side (two agents, `benchmarks/`) one agent at
a time took 0.85x the step time at the same peak RSS.

The same holds inside one agent's term: the seed's loss and every GRPO loss type is a sum over the agent's rows
divided by a normaliser of its whole batch (B, or its scored-token count; `trl_marl.algorithms.grpo.BatchTotals`).
Above the memory budget (or with `logprob_batch_size`) an agent's rows are cut into parts
(`trl_marl.models.scoring.backward_parts`), and each part's share of `L_i` is backpropagated right after the part's
forward: a step holds one part's graph, and unlike the checkpointed chunks of the team forward nothing is recomputed
(on the side-by-side's work at 32 prompts per step, 0.84x the step time of checkpointed chunks at 0.98x their peak
RSS; `benchmarks/backward_parts.py`). An agent with `top_entropy_quantile < 1` is one part: its quantile is over its
whole batch.

`sum_of_agent_losses` does it where one process trains the unwrapped team (`backward_each_part`): DDP, DeepSpeed
and FSDP2 expect one backward per forward of the model they wrap (DDP's reducer, DeepSpeed's `engine.backward`,
FSDP2's reshard hooks), so there the team is scored in one forward and the trainer backpropagates the sum, as before.
The early terms are scaled as `transformers.Trainer.training_step` scales the loss it backpropagates (divided by the
micro-step's gradient-accumulation steps), and the returned loss is the full sum (the early terms detached): the
trainer's backward of it adds the last term's gradient, and its logged value and finiteness check are those of `L`.

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
from trl_marl.data_types.batches import AgentBatch
from trl_marl.models.scoring import backward_parts, batch_rows
from trl_marl.trainers.building import clip_each

__all__ = [
    "backward_each_part",
    "combined_grad_norm",
    "optimizer_step_of_agent",
    "step_each_agent",
    "sum_of_agent_losses",
]

# Optimizers that fuse the backward with the update (transformers' `OptimizerNames.LOMO` / `ADALOMO`).
_FUSED_BACKWARD_OPTIMIZERS = ("lomo", "adalomo")


def backward_each_part(trainer: Any, batches: Sequence[Any]) -> bool:
    """Whether the loss over `batches` (one per agent, None for an agent not scored) may be backpropagated in parts,
    each agent's (or each part of an agent's rows) right after its forward: gradients on, one process training the
    team without a wrapper that expects one backward per forward (no DDP, DeepSpeed, FSDP2 or `DataParallel`), and
    an optimizer that does not run inside the backward (LOMO)."""
    args = trainer.args
    return (
        torch.is_grad_enabled()
        and any(b is not None for b in batches)
        and trainer.accelerator.distributed_type == DistributedType.NO
        and args.n_gpu <= 1
        and str(getattr(args.optim, "value", args.optim)) not in _FUSED_BACKWARD_OPTIMIZERS
    )


def step_each_agent(trainer: Any) -> bool:
    """Whether, where `backward_each_part` holds, each agent but the last may take its optimizer step right after
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
    agent_loss: Callable[[int, dict[str, list], slice], torch.Tensor],
    in_parts: Sequence[bool] | None = None,
    **forward_kwargs: Any,
) -> tuple[torch.Tensor, dict[str, list], list[torch.Tensor | None]]:
    """`(L = sum_i L_i, the team forward's outputs, each L_i)` for every agent whose batch is not None (None for the
    others), computed from team forwards `out = model(batches, **forward_kwargs)` (`TeamModel.forward`: `out[key][i]`
    is agent i's entry).

    `agent_loss(i, out, rows)` is agent i's loss on rows `rows` of its batch (`slice(None)`: all of them), from
    `out[key][i]`, the entries of those rows (their width may be cut to the rows' last used column). For a part of
    the batch it is that part's share, with the batch's normalisers (`policy_gradient_loss(..., num_samples)`,
    `grpo_loss(..., totals=BatchTotals(...))`), so that the parts' losses add up to `L_i`.

    With `backward_each_part`, every agent has team forwards of its own (the other agents' batches None) and each
    term but the step's last is backpropagated right after its forward (module docstring); an agent with
    `in_parts[i]` (default: every agent) whose batch is an `AgentBatch` is scored in the row parts of
    `backward_parts`, each backpropagated before the next part's forward (one part's graph at a time, nothing
    recomputed). The outputs returned are merged across the parts and agents (detached where there were several
    parts; `entropy` the token-weighted mean of the parts'). Otherwise one forward scores every agent and nothing is
    backpropagated here. With `step_each_agent` too, each agent but the last takes its optimizer step after its last
    part (`optimizer_step_of_agent`)."""
    scored = [i for i, b in enumerate(batches) if b is not None]
    losses: list[torch.Tensor | None] = [None] * len(batches)
    if not backward_each_part(trainer, batches):
        out = model(batches, **forward_kwargs)
        for i in scored:
            losses[i] = agent_loss(i, out, slice(None))
    else:
        out = {}
        scale = getattr(trainer, "current_gradient_accumulation_steps", trainer.args.gradient_accumulation_steps)
        step_alone = step_each_agent(trainer)
        for i in scored:
            batch = batches[i]
            whole = not isinstance(batch, AgentBatch) or (in_parts is not None and not in_parts[i])
            parts = [None] if whole else backward_parts(trainer.team.agents[i], batch, trainer.team.logprob_batch_size)
            if len(parts) == 1:
                parts = [None]  # the batch as it is (not cut to its used columns): one forward, as without parts
            outs, terms = [], []
            for k, part in enumerate(parts):
                rows = slice(None) if part is None else slice(*part)
                scored_rows = batch if part is None else batch_rows(batch, *part)
                out_p = model([scored_rows if j == i else None for j in range(len(batches))], **forward_kwargs)
                term = agent_loss(i, out_p, rows)
                if not (i == scored[-1] and k == len(parts) - 1):  # the trainer backpropagates the step's last term
                    trainer.accelerator.backward(term / scale)  # frees this part's graph before the next forward
                    term = term.detach()
                outs.append((out_p, scored_rows))
                terms.append(term)
            losses[i] = sum(terms[1:], terms[0])
            for key, values in _merged(i, outs, batch).items():
                out.setdefault(key, [None] * len(batches))[i] = values
            if step_alone and i != scored[-1]:
                optimizer_step_of_agent(trainer, i, losses[i])  # frees agent i's gradients too
    kept = [losses[i] for i in scored]
    return sum(loss.to(kept[0].device) for loss in kept), out, losses


def _merged(i: int, outs: list[tuple[dict[str, list], Any]], batch: Any) -> dict[str, Any]:
    """Agent i's entries of the team forwards of its parts (`(outputs, the part's batch)` in row order), as one
    forward over `batch` would give them: `(B, C)` tensors padded to the batch's width and stacked (detached), the
    `entropy` float the mean over the parts weighted by their scored tokens."""
    if len(outs) == 1:
        return {key: values[i] for key, values in outs[0][0].items()}
    C = batch.num_completion_tokens
    merged: dict[str, Any] = {}
    for key in outs[0][0]:
        values = [o[key][i] for o, _ in outs]
        if any(v is None for v in values):
            merged[key] = None
        elif key == "entropy":
            tokens = [float(part.completion_mask.sum()) for _, part in outs]
            merged[key] = sum(v * n for v, n in zip(values, tokens)) / max(sum(tokens), 1.0)
        else:
            merged[key] = torch.cat([nn.functional.pad(v.detach(), (0, C - v.shape[1])) for v in values])
    return merged
