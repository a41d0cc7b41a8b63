"""Completion log-probs from the LM head's input, without materialising the `(rows, tokens, vocabulary)` logits.

Scoring needs `log_softmax(logits / T)` at the sampled tokens only. Computed from full logits, a step holds the
logits, their log-softmax and, in the backward, their gradient: each `B x C x V` in fp32, 2.5 GB for 32 rows of 128
tokens of a 151,936-token vocabulary. TRL's `ChunkedLogProbFunction` (`trl.kernels`, what GRPOTrainer's fused LM head
calls) takes the hidden states and the head's weight instead: it projects vocabulary tiles and folds each into an
online log-sum-exp (a Triton kernel on CUDA / XPU, torch ops elsewhere), and its backward recomputes each tile, so
nothing of size `V` per token is kept. The price is one more projection of the head in the backward.

TRL's `add_fused_lm_head` replaces the model's forward and turns the KV cache off, which our scoring needs (each
prompt runs once for its samples, `trl_marl.models.scoring`). So our forward stays and the causal LM is asked to
return the head's input: while scoring, its output embedding is `nn.Identity` (`set_output_embeddings`), so the
forward's `logits` are the final hidden states, and `head_logprobs` applies the head's weight with TRL's kernel.

`fused_head` decides. The head must be a plain `nn.Linear` (not LoRA-wrapped, not quantized) of a transformers
causal LM reached through our adapter views, PEFT and engine wrappers (`trl_marl.models.adapters.causal_lm`), with
no logit transform in its config (soft-capping, logit scales: the forward would apply them to the hidden states),
the model not sharded (ZeRO-3 / FSDP2 gather parameters inside the head's own forward), and on a device where
Triton runs the kernel (CUDA, XPU). There the fused path trades scoring time for memory: one forward and backward
of the Qwen2-0.5B shape over 32 rows of up to 128 tokens on an H200, bf16, in one chunk 8.4 GB against 13.6 GB above
the weights in 1.35x the time (the backward projects the head again); in the loss forward's automatic chunks 7.5
against 8.0 GB in 1.05x the time (`benchmarks/fused_head.py`). Without Triton the kernel folds each tile with torch
ops, about eight fp32 temporaries of tokens x 32,768: on CPU, with Qwen2's vocabulary on a small body, it took
1.38-1.44x the time and 2.45x the peak of live tensors of the materialised path, which the memory budget cuts into
chunks (`benchmarks/fused_head.py`'s default), so the CPU keeps the logits.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import is_triton_available

from trl_marl.distributed.collective import is_sharded
from trl_marl.models.adapters import causal_lm

__all__ = ["VOCAB_TILE", "fused_head", "fused_scoring", "head_logprobs"]

# Vocabulary columns per projection tile (TRL's `_CHUNKED_LOGPROB_CHUNK_SIZE` in trl.trainer.utils)
VOCAB_TILE = 32768
# Config fields of models whose forward scales the head's output (TRL's fused head reads the same ones)
_LOGIT_SCALES = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")

_swap_lock = threading.Lock()
_swapped: dict[int, list] = {}  # id(causal LM) -> [scorers inside, its head]


def _triton_runs_on(device: torch.device) -> bool:
    return device.type in ("cuda", "xpu") and is_triton_available()


def fused_head(model: nn.Module) -> tuple[PreTrainedModel, nn.Linear] | None:
    """`(causal LM, its head)` when `model`'s completions are scored from the head's input (module docstring), else
    None (the logits are materialised)."""
    if is_sharded(model):
        return None
    lm = causal_lm(model)
    if not isinstance(lm, PreTrainedModel):
        return None
    with _swap_lock:  # another thread may be scoring it now, with the head swapped out
        swapped = _swapped.get(id(lm))
        head = swapped[1] if swapped else lm.get_output_embeddings()
    if type(head) is not nn.Linear:
        return None
    config = lm.config.get_text_config()
    if getattr(config, "final_logit_softcapping", None) is not None:
        return None
    if any(getattr(config, name, None) not in (None, 1.0) for name in _LOGIT_SCALES):
        return None
    if not _triton_runs_on(head.weight.device):
        return None
    return lm, head


@contextmanager
def fused_scoring(model: nn.Module) -> Iterator[nn.Linear | None]:
    """Yields the head when `fused_head(model)` applies, with the causal LM returning the head's input (the final
    hidden states) as its forward's `logits` inside the block; else None, and the forward is untouched. Re-entrant
    and thread-safe: agents scored in threads may share one base model; the head is back when the last one leaves."""
    fused = fused_head(model)
    if fused is None:
        yield None
        return
    lm, head = fused
    with _swap_lock:
        entry = _swapped.setdefault(id(lm), [0, head])
        if entry[0] == 0:
            lm.set_output_embeddings(nn.Identity())
        entry[0] += 1
    try:
        yield head
    finally:
        with _swap_lock:
            entry[0] -= 1
            if entry[0] == 0:
                lm.set_output_embeddings(head)
                del _swapped[id(lm)]


def head_logprobs(
    hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(log p(targets), entropy or None)`, each `(B, C)`, of `log_softmax(head(hidden) / temperature)` for hidden
    states `(B, C, H)` and target ids `(B, C)`, through TRL's `ChunkedLogProbFunction` (gradients flow to `hidden`
    and the head's weight; to the entropy too, for callers that keep it). Inside autocast the projection runs in the
    autocast dtype with fp32 accumulation, as the head would."""
    from trl.kernels import ChunkedLogProbFunction

    B, C, H = hidden.shape
    if head.in_features != H:
        raise RuntimeError(
            f"the model returned {H} features per token where its head takes {head.in_features}: its forward "
            "does more than apply the head to the final hidden states (a custom model?)"
        )
    device = head.weight.device
    outputs = ("entropy",) if entropy else ()
    logp, ent, *_ = ChunkedLogProbFunction.apply(
        hidden.reshape(B * C, H).to(device),
        head.weight,
        head.bias,
        targets.reshape(B * C).to(device),
        temperature,
        VOCAB_TILE,
        None,
        1.0,
        outputs,
    )
    return logp.view(B, C), (ent.view(B, C) if entropy else None)
