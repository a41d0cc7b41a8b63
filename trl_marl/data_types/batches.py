"""Batches laid out for one masked forward pass: an agent's prompt + completion rows, and a critic's sequences."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["AgentBatch", "collate_agent_batch", "CriticBatch", "collate_critic_batch"]


@dataclass
class AgentBatch:
    """One agent's batch of prompt + completion sequences, laid out for a single masked forward pass.

    `input_ids = [left-padded prompt | right-padded completion]`; `completion_mask` marks the scored completion
    tokens (up to and including the first EOS; tool-result tokens inside an agentic turn are attended to but not
    scored: 0, TRL's `completion_mask * tool_mask`).
    """

    input_ids: torch.Tensor  # (B, P + C)
    attention_mask: torch.Tensor  # (B, P + C)
    completion_ids: torch.Tensor  # (B, C)
    completion_mask: torch.Tensor  # (B, C)

    def to(self, device: torch.device | str) -> AgentBatch:
        return AgentBatch(
            *(t.to(device) for t in (self.input_ids, self.attention_mask, self.completion_ids, self.completion_mask))
        )

    @property
    def num_completion_tokens(self) -> int:
        return self.completion_ids.shape[1]


def collate_agent_batch(
    prompt_ids: Sequence[torch.Tensor],
    completion_ids: Sequence[torch.Tensor],
    pad_token_id: int,
    tool_masks: Sequence[torch.Tensor | None] | None = None,
) -> AgentBatch:
    """Build an `AgentBatch` from unpadded prompt and completion token ids (completions include their EOS).
    `tool_masks` (one per row, `Sample.tool_mask`; None for a row the agent generated whole) zero the inserted
    tokens of `completion_mask`."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError("prompt_ids and completion_ids must have the same length")
    if tool_masks is not None and len(tool_masks) != len(completion_ids):
        raise ValueError("tool_masks must have one entry (or None) per completion")
    B = len(prompt_ids)
    P = max(int(p.numel()) for p in prompt_ids)
    C = max(max(int(c.numel()) for c in completion_ids), 1)
    input_ids = torch.full((B, P + C), pad_token_id, dtype=torch.long)
    attention = torch.zeros((B, P + C), dtype=torch.long)
    comp = torch.full((B, C), pad_token_id, dtype=torch.long)
    cmask = torch.zeros((B, C), dtype=torch.long)
    for r, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        lp, lc = int(p.numel()), int(c.numel())
        input_ids[r, P - lp : P] = p
        attention[r, P - lp : P] = 1
        input_ids[r, P : P + lc] = c
        attention[r, P : P + lc] = 1
        comp[r, :lc] = c
        cmask[r, :lc] = 1 if tool_masks is None or tool_masks[r] is None else tool_masks[r]
    return AgentBatch(input_ids, attention, comp, cmask)


@dataclass
class CriticBatch:
    """Left-padded critic inputs: the value of row r is read at its last position."""

    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L)

    def to(self, device: torch.device | str) -> CriticBatch:
        return CriticBatch(self.input_ids.to(device), self.attention_mask.to(device))

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate_critic_batch(sequences: Sequence[torch.Tensor], pad_token_id: int) -> CriticBatch:
    """Left-pad unpadded token-id sequences into a `CriticBatch`."""
    if not sequences:
        raise ValueError("a critic batch needs at least one sequence")
    L = max(max(int(s.numel()) for s in sequences), 1)
    ids = torch.full((len(sequences), L), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), L), dtype=torch.long)
    for r, s in enumerate(sequences):
        n = int(s.numel())
        if n:
            ids[r, L - n :] = s
            mask[r, L - n :] = 1
    return CriticBatch(ids, mask)
