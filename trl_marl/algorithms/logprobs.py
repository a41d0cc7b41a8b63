"""Masked completion log-probabilities.

A completion's log-probability is the SUM of the log-probabilities of all its generated tokens up to and including
the first end-of-sequence token; prompt tokens and every padding token after the end are excluded.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["completion_mask", "token_logprobs", "token_entropies", "sequence_logprobs"]


def completion_mask(completion_ids: torch.Tensor, eos_token_ids: int | Iterable[int]) -> torch.Tensor:
    """Mask of the scored tokens of right-padded completions `(B, C)`: 1 up to and including the first EOS, 0 after.

    A completion with no EOS (truncated at `max_new_tokens`) is scored on every position. This is also correct when
    the pad token equals the EOS token: only the first one counts.
    """
    eos = torch.as_tensor(
        [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids), device=completion_ids.device
    )
    is_eos = torch.isin(completion_ids, eos)
    B, C = completion_ids.shape
    first = torch.full((B,), C, dtype=torch.long, device=completion_ids.device)
    has = is_eos.any(dim=1)
    first[has] = is_eos.int().argmax(dim=1)[has]
    positions = torch.arange(C, device=completion_ids.device).expand(B, C)
    return (positions <= first.unsqueeze(1)).long()


def token_logprobs(logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probabilities `(B, C)` of `completion_ids` under `logits` `(B, C, V)`.

    `logits[:, t]` must be the prediction for `completion_ids[:, t]` (i.e. already shifted). Uses TRL's
    `selective_log_softmax` (memory-efficient log_softmax + gather), imported here so that the rest of
    `trl_marl.algorithms` stays importable without loading TRL.
    """
    from trl.trainer.utils import selective_log_softmax

    return selective_log_softmax(logits, completion_ids, temperature=temperature)


def token_entropies(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy `(B, C)` of each position's next-token distribution at `temperature` (differentiable, for an entropy
    bonus):

        p = softmax(logits / T),   H = - sum_v p_v log p_v
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def sequence_logprobs(token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`sum_t mask_t * logp_t` per row: the completion's log-probability `(B,)`."""
    return (token_logps * mask.to(token_logps.dtype)).sum(dim=-1)
