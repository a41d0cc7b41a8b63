"""MADPO's per-agent forward on TRL's DPO machinery: TRL's preference collator and TRL's concatenated forward.

TRL 1.16 has no `concatenated_forward` method any more: its `DataCollatorForPreference` (trl/trainer/dpo_trainer.py)
lays a batch out as `[all chosen ; all rejected]` (each row `prompt + completion`, right-padded, with a
`completion_mask` over the whole row), and `DPOTrainer._compute_loss` runs ONE forward over it,

    labels = input_ids.masked_fill(completion_mask == 0, -100)
    per_token_logps = model(input_ids, attention_mask, labels=labels, fused_lm_head=True).log_probs
    chosen_logps, rejected_logps = per_token_logps.sum(dim=1).chunk(2)

with the model's forward patched by `add_fused_lm_head` (log-probs of the labelled positions only, without the
`(batch, seq, vocab)` logits). `_compute_loss` is a bound method of a whole `DPOTrainer`, so `PreferenceBatch`
reproduces exactly that scheme per agent (`token_logps`), with TRL's collator and TRL's fused head themselves.
The fused head is added for the duration of one call only (`fused_lm_head`), so the agents' own `forward` (and
`generate`, copies, checkpoints) stays untouched.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from trl_marl.models.adapters import causal_lm
from trl_marl.trainers.preference.trl_pieces import DataCollatorForPreference, add_fused_lm_head

__all__ = ["PreferenceBatch", "fused_lm_head"]


@contextmanager
def fused_lm_head(model: nn.Module, temperature: float = 1.0, outputs: tuple[str, ...] = ("log_probs",)) -> Iterator:
    """TRL's `add_fused_lm_head` on `model`'s causal LM for the duration of the block, then the forward it had
    before (an instance-level forward, e.g. a wrapper's, is restored as it was)."""
    target = causal_lm(model)
    saved = target.__dict__.get("forward")
    add_fused_lm_head(target, temperature=temperature, outputs=outputs)
    try:
        yield model
    finally:
        if saved is None:
            del target.forward
        else:
            target.forward = saved


@dataclass
class PreferenceBatch:
    """One agent's preference batch in TRL's DPO layout (`DataCollatorForPreference`): `2B` rows, the `B` chosen
    sequences then the `B` rejected ones, each `prompt + completion` right-padded; `completion_mask` marks the
    completion tokens of each row."""

    input_ids: torch.Tensor  # (2B, T)
    attention_mask: torch.Tensor  # (2B, T)
    completion_mask: torch.Tensor  # (2B, T)

    @classmethod
    def collate(
        cls,
        prompt_ids: Sequence[torch.Tensor],
        chosen_ids: Sequence[torch.Tensor],
        rejected_ids: Sequence[torch.Tensor],
        pad_token_id: int,
    ) -> PreferenceBatch:
        """TRL's `DataCollatorForPreference` on `{"prompt_ids", "chosen_ids", "rejected_ids"}` rows (no truncation:
        the pairs' prompts and completions are already cut to `max_prompt_length` / `max_completion_length`)."""
        collator = DataCollatorForPreference(pad_token_id=pad_token_id)
        rows = [
            {"prompt_ids": p.tolist(), "chosen_ids": c.tolist(), "rejected_ids": r.tolist()}
            for p, c, r in zip(prompt_ids, chosen_ids, rejected_ids, strict=True)
        ]
        out = collator(rows)
        return cls(out["input_ids"], out["attention_mask"], out["completion_mask"])

    def to(self, device: torch.device | str) -> PreferenceBatch:
        return PreferenceBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.completion_mask)))

    @property
    def shift_completion_mask(self) -> torch.Tensor:
        """`(2B, T-1)`: the mask of the scored positions, aligned with `token_logps`' output."""
        return self.completion_mask[:, 1:]

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Completion token counts `(B,)` of the chosen and of the rejected sequences."""
        return self.completion_mask.sum(dim=1).chunk(2)

    def token_logps(
        self, model: nn.Module, temperature: float = 1.0, return_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE forward over chosen and rejected together, as `DPOTrainer._compute_loss` (TRL 1.16) does it: labels
        are the completion tokens (`-100` elsewhere) and the fused LM head returns their log-probs
        `(2B, T-1)` (0 at every other position) of `log_softmax(logits / temperature)`; plus the per-token entropy
        (detached) when `return_entropy`."""
        device = next(model.parameters()).device
        batch = self.to(device)
        labels = batch.input_ids.masked_fill(batch.completion_mask == 0, -100)
        outputs = ("log_probs", "entropy") if return_entropy else ("log_probs",)
        with fused_lm_head(model, temperature, outputs):
            out = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                labels=labels,
                fused_lm_head=True,
                use_cache=False,
            )
        seq_len = batch.completion_mask.shape[1] - 1  # prompt-learning PEFT prepends virtual tokens: keep the real
        entropy = None if out.entropy is None else out.entropy[:, -seq_len:].detach()
        return out.log_probs[:, -seq_len:], entropy

    @staticmethod
    def chosen_rejected(token_logps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence log-probs `(B,)` of the chosen and of the rejected completions (`sum` over the row, as TRL)."""
        chosen, rejected = token_logps.sum(dim=1).chunk(2)
        return chosen, rejected
