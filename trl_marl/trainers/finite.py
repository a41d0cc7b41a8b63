"""Stopping a diverged run: a training step that produces a non-finite loss, gradient or weight ends the run with a
`NonFiniteError` naming the module (agent, critic), the step and what was non-finite, BEFORE the optimizer applies
it and before anything non-finite is saved. (On one process the agents before the failing one have taken their
part of the step right after their backward, `trl_marl.trainers.agent_losses`; the error names them.)

Each check rides on a value the step computes anyway, so a healthy step pays one scalar test per check:

- `check_loss`: the loss of each micro-step, after its backward (transformers already reads it back for its
  `logging_nan_inf_filter`);
- `check_grad_norm`: the gradient norm of each optimizer step, before `optimizer.step()` (the pre-clip norm the
  trainer computes per agent in `_clip_grad_norm`, or transformers' own);
- `check_weights`: the state dict a save is about to write (each tensor's min and max, one pass without a
  temporary; a small fraction of writing it), so that no team or checkpoint is written with a non-finite weight.

Only when a check fails are the per-module gradients inspected, to name the culprit.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["NonFiniteError", "check_loss", "check_grad_norm", "check_weights"]


class NonFiniteError(FloatingPointError):
    """A training step produced a non-finite loss, gradient or weight (the run stops; see `trl_marl.trainers.finite`)."""


def _value(x: Any) -> float:
    return float(x.detach().float().cpu()) if isinstance(x, torch.Tensor) else float(x)


def _modules_with_bad_grads(trainer: Any) -> list[str]:
    """The modules (agents, critics, value heads) holding a non-finite gradient (only called once a check failed)."""
    bad = []
    for name, module in trainer._grad_norm_modules():
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        if grads and not bool(torch.stack([torch.isfinite(g).all().cpu() for g in grads]).all()):
            bad.append(name)
    return bad


def _advice(trainer: Any, applied: bool = False) -> str:
    a = trainer.args
    rates = f"learning_rate={a.learning_rate:g}"
    if getattr(a, "agent_learning_rate", None) is not None:
        rates += f", agent_learning_rate={a.agent_learning_rate}"
    from trl_marl.checkpointing.checkpoint import latest_complete_checkpoint

    last = latest_complete_checkpoint(a.output_dir, warn=False)
    resume = f"resume from {last}, the latest complete checkpoint" if last else "start again"
    precision = " or an overflow in bf16/fp16" if (a.bf16 or a.fp16) else ""
    return (
        f"Likely causes: a learning rate too high ({rates}), rewards too large (scale them, e.g. "
        f"trl_marl.rewards.scale){precision}. Nothing non-finite was {'saved' if applied else 'applied or saved'}: "
        f"fix the cause, then {resume}"
    )


def _raise(trainer: Any, what: str) -> None:
    step = trainer.state.global_step + 1
    bad = _modules_with_bad_grads(trainer)
    where = f" (non-finite gradient in {', '.join(bad)})" if bad else ""
    stopped = "training stopped before the step was applied"
    early = getattr(trainer, "_early_steps", None)
    if early:  # one process steps each agent right after its backward (`trl_marl.trainers.agent_losses`)
        stopped += (
            f" to the other agents ({', '.join(early)} had already taken it in memory, right after "
            "their backward; the checkpoints on disk predate it)"
        )
    raise NonFiniteError(
        f"{type(trainer).__name__}: optimizer step {step}: {what}{where}; {stopped}. {_advice(trainer)}"
    )


def check_loss(trainer: Any, loss: Any) -> None:
    """Stop on a non-finite micro-step loss (after its backward, before the optimizer step)."""
    if loss is not None and not math.isfinite(_value(loss)):
        _raise(trainer, f"the loss is {_value(loss)}")


def check_grad_norm(trainer: Any, grad_norm: Any) -> None:
    """Stop on a non-finite gradient norm (before `optimizer.step()` applies it)."""
    if grad_norm is not None and not math.isfinite(_value(grad_norm)):
        _raise(trainer, f"the gradient norm is {_value(grad_norm)}")


def check_weights(trainer: Any, state_dict: Mapping[str, torch.Tensor], output_dir: str) -> None:
    """Refuse to write `state_dict` to `output_dir` when a floating-point weight is not finite, naming the modules
    (`agent_2`, `critic`, ...) and tensors. Each tensor's min and max come from one pass without a temporary (NaN and
    inf show in them); one read-back per module and device."""
    groups: dict[tuple[str, torch.device], list[str]] = {}
    for key, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel():
            parts = key.split(".")
            module = ".".join(parts[:2]) if parts[0] == "agents" else parts[0]
            groups.setdefault((module, tensor.device), []).append(key)
    bad: dict[str, list[str]] = {}
    for (module, _device), keys in groups.items():
        extremes = torch.stack([torch.stack(torch.aminmax(state_dict[k].detach())).float() for k in keys])
        flags = torch.isfinite(extremes).all(dim=1).cpu()
        if not bool(flags.all()):
            label = f"agent_{int(module.split('.')[1]) + 1}" if module.startswith("agents.") else module
            bad.setdefault(label, []).extend(k for k, ok in zip(keys, flags.tolist()) if not ok)
    if bad:
        where = "; ".join(f"{label} ({', '.join(n[:3])}{', ...' if len(n) > 3 else ''})" for label, n in bad.items())
        raise NonFiniteError(
            f"{type(trainer).__name__}: not saving to {os.path.abspath(output_dir)} at step "
            f"{trainer.state.global_step}: non-finite weights in {where}. {_advice(trainer, applied=True)}"
        )
