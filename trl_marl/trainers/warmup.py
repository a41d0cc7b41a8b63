"""Warming a trainer at construction, so that its first optimizer step costs about what a steady one does.

What a first step pays once, and what `warm_up` does about it (at the end of the trainer's construction):

- transformers' `generate` (the transformers engine only): its first call sets up the generation config, the logits
  processors and the cache classes, and runs the model's kernels for the first time: one sampled decode (up to
  `max_completion_length` tokens, sampling as training does, every random stream it draws from restored after) of a
  short prompt per agent, through the engine's own path (mixed adapters for a shared-base team);
- the scoring forward and the model's backward: the first call imports TRL's entropy helper and takes the
  shared-prompt path (`trl_marl.models.scoring`) for the first time, and the first backward through the model loads
  its gradient kernels (on CUDA each kernel's module is loaded at its first launch: the H200's first step was 1.20x a
  steady one with the forward warmed only, Qwen2-0.5B shape): per agent, the scoring of 2 rows sharing a prompt with
  the entropy, under the training autocast, then the gradient of their log-probs with respect to the first decoder
  layer's trainable parameters (`torch.autograd.grad`: every layer's input gradient and one layer's weight gradient
  run; no `.grad` is written);
- the fused head's kernels (CUDA: `trl_marl.models.fused_head`): Triton compiles TRL's chunked log-prob kernels at
  their first call for each dtype, forward and backward (the first fused scoring took 3.5 s against 1.4 s for the
  logits path on an H200): one forward and backward of 2 token rows through each distinct head under the training
  autocast, with the entropy as the loss forward asks for it;
- autograd: the engine starts its worker on the first backward: one backward of a scalar graph outside the model.

What it cannot warm (`benchmarks/first_step.py` measures what is left): the optimizer's state (AdamW allocates its
moments at its first `step`; the optimizer itself is created by `Trainer.train`), the dataloader (built in `train()`),
the first allocation of activation-sized buffers, and a vLLM engine's first calls (its own warm-up, several calls on
CPU). Nothing else changes: the random streams are untouched (`torch.random.fork_rng`, the CPU's and every CUDA
device's the agents are on), the agents' train/eval modes are restored (the scoring runs in eval mode: no dropout
draws) and no gradient is left. Skipped when generating or scoring is a collective (ZeRO-3, FSDP2 with several
processes: every process would have to take part) and for agents given as API models.
"""

from __future__ import annotations

from typing import Any

import torch

from trl_marl.data_types.batches import AgentBatch, collate_agent_batch
from trl_marl.data_types.text import PromptText
from trl_marl.distributed.memory import first_block
from trl_marl.generation.hf import HFGeneration
from trl_marl.models.fused_head import fused_head, head_logprobs
from trl_marl.models.scoring import score_completions

__all__ = ["warm_up"]


def warm_up(trainer: Any) -> None:
    """Warm `trainer`'s generation, scoring and autograd paths (see the module docstring)."""
    team = trainer.team
    if trainer.generation.collective or not all(isinstance(a, torch.nn.Module) for a in team.agents):
        return
    devices = sorted({p.device.index or 0 for a in team.agents for p in a.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        if isinstance(trainer.generation, HFGeneration):
            trainer.generation.generate([[PromptText("Hi")] for _ in range(team.num_agents)], 1)
        was_training = team.training
        team.eval()
        try:
            for i, agent in enumerate(team.agents):
                _warm_scoring(trainer, i, agent)
        finally:
            team.train(was_training)
        _warm_fused_heads(trainer)
    x = torch.ones(1, requires_grad=True)
    (x * 2).sum().backward()


def _first_layer_parameters(agent: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trainable parameters of the agent's first decoder layer (`trl_marl.distributed.memory.first_block`), or all
    of its trainable parameters where there is none or it has none."""
    block = first_block(agent)
    first = [] if block is None else [p for p in block.parameters() if p.requires_grad]
    return first or [p for p in agent.parameters() if p.requires_grad]


def _warm_scoring(trainer: Any, i: int, agent: torch.nn.Module) -> None:
    """Agent i's scoring forward, and its backward down to the first decoder layer (module docstring)."""
    rows = _rows(trainer, i)
    wrt = _first_layer_parameters(agent)
    with torch.set_grad_enabled(bool(wrt)), trainer.accelerator.autocast():
        logp, _ = score_completions(agent, rows, trainer.team.agent_temperature(i), return_entropy=True)
    if wrt and logp.requires_grad:
        torch.autograd.grad(logp.sum(), wrt, allow_unused=True)


def _warm_fused_heads(trainer: Any) -> None:
    """TRL's kernel once, forward and backward, per distinct fused head; the head's gradients are left as they were."""
    seen: set[int] = set()
    for agent in trainer.team.agents:
        fused = fused_head(agent)
        if fused is None or id(fused[1]) in seen:
            continue
        head = fused[1]
        seen.add(id(head))
        grads = [(p, p.grad) for p in head.parameters()]
        weight = head.weight
        hidden = torch.zeros(1, 2, head.in_features, device=weight.device, dtype=weight.dtype, requires_grad=True)
        targets = torch.zeros(1, 2, dtype=torch.long, device=weight.device)
        with trainer.accelerator.autocast():
            logp, _ = head_logprobs(hidden, head, targets, 1.0, entropy=True)
        logp.sum().backward()
        for param, grad in grads:
            param.grad = grad


def _rows(trainer: Any, i: int) -> AgentBatch:
    """Two rows of agent i sharing a 2-token prompt, with 2-token completions."""
    tokens = torch.tensor([1, 2], dtype=torch.long).clamp(max=len(trainer.tokenizers[i]) - 1)
    return collate_agent_batch([tokens, tokens], [tokens, tokens.flip(0)], trainer.tokenizers[i].pad_token_id)
