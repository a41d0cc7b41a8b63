"""`JointRewardModel`: one scalar score for the WHOLE team's response.

All agents' prompts and responses are written as ONE text; the model is transformers'
`AutoModelForSequenceClassification(num_labels=1)` — the same scalar head on the backbone's last hidden state at the
final non-padding token that TRL's `RewardTrainer` uses — fitted with the Bradley-Terry loss

    L(psi) = - E_{(w, l)} [ log sigmoid( R(h^w, a^w) - R(h^l, a^l) ) ]

It never falls back on the task reward. Training is a small loop here (rather than a nested `RewardTrainer`) because
it runs inside another Trainer's `train()`: a second Trainer would need a second accelerate / DeepSpeed engine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ...algorithms.losses import bradley_terry_loss
from ...progress import progress_bar

__all__ = ["JointRewardModel", "joint_text"]


def joint_text(prompts: Sequence[str], responses: Sequence[str]) -> str:
    """The joint transcript the reward model reads: every agent's prompt, then every agent's response.

    The responses come last, next to the final token the scalar head reads (and `reward_max_length` truncation
    keeps the end), so they dominate the score's input rather than the (often long) prompts.
    """
    head = "\n".join(f"Agent {i + 1} prompt:\n{p}" for i, p in enumerate(prompts))
    tail = "\n".join(f"Agent {i + 1} response:\n{r}" for i, r in enumerate(responses))
    return f"Joint multi-agent response\n{head}\n{tail}"


class JointRewardModel(nn.Module):
    """A sequence-classification model (one label) and its tokenizer, scoring joint transcripts.

    Args:
        model: an `AutoModelForSequenceClassification` with `num_labels == 1`.
        tokenizer: its tokenizer (a pad token is required; EOS is used when there is none).
        max_length: truncate transcripts to this many tokens (keeping the END, where the responses are).
    """

    def __init__(self, model: nn.Module, tokenizer, max_length: int | None = None):
        super().__init__()
        if getattr(model.config, "num_labels", None) != 1:
            raise ValueError(f"the joint reward model needs num_labels == 1, got {model.config.num_labels}")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, tokenizer=None, max_length: int | None = None, seed: int = 0, **kwargs
    ) -> JointRewardModel:
        """Load the backbone from `name_or_path` with a NEWLY initialised scalar head (seeded)."""
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_pretrained(name_or_path, num_labels=1, **kwargs)
        tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(name_or_path)
        return cls(model, tok, max_length)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        # Every transcript ends with EOS (as TRL's RewardTrainer appends it to plain text): the head then reads a
        # summary position that attends over the whole transcript rather than the last response token.
        eos = self.tokenizer.eos_token if self.tokenizer.eos_token_id != self.tokenizer.pad_token_id else None
        texts = [t + eos if eos and not t.endswith(eos) else t for t in texts]
        enc = self.tokenizer(list(texts), padding=True, return_tensors="pt", add_special_tokens=True)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        if self.max_length is not None and ids.shape[1] > self.max_length:
            # keep the end of each transcript: left-align by the mask, then cut from the left
            rows_ids, rows_mask = [], []
            for r in range(ids.shape[0]):
                toks = ids[r][mask[r].bool()][-self.max_length :]
                rows_ids.append(toks)
                rows_mask.append(torch.ones_like(toks))
            from trl.trainer.utils import pad

            side = self.tokenizer.padding_side
            ids = pad(rows_ids, self.tokenizer.pad_token_id, padding_side=side)
            mask = pad(rows_mask, 0, padding_side=side)
        return {"input_ids": ids, "attention_mask": mask}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores `(B,)`. Position ids follow the mask, so left and right padding give the same score."""
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            position_ids=position_ids.to(self.device),
        )
        return out.logits.squeeze(-1)

    @torch.no_grad()
    def score(
        self, prompts: Sequence[Sequence[str]], responses: Sequence[Sequence[str]], batch_size: int = 16
    ) -> list[float]:
        """Scores of joint responses: `prompts[j]` / `responses[j]` hold every agent's prompt / response."""
        was_training = self.training
        self.eval()
        texts = [joint_text(p, r) for p, r in zip(prompts, responses)]
        out: list[float] = []
        for start in range(0, len(texts), batch_size):
            enc = self.encode(texts[start : start + batch_size])
            out.extend(self(**enc).float().cpu().tolist())
        self.train(was_training)
        return out

    def fit(
        self,
        pairs: Sequence,
        learning_rate: float = 1e-5,
        num_epochs: int = 1,
        batch_size: int = 4,
        freeze_backbone: bool = False,
        seed: int = 0,
        progress: bool = False,
    ) -> list[float]:
        """Bradley-Terry fit on preference pairs (objects with `prompts`, `winner_completions`,
        `loser_completions`). Returns the loss of every step; the model is left in eval mode, frozen. `progress`
        shows a progress bar over the steps."""
        params = self._trainable(freeze_backbone)
        opt = torch.optim.AdamW(params, lr=learning_rate)
        order = list(range(len(pairs)))
        rng = random.Random(seed)
        losses: list[float] = []
        self.train()
        epochs = max(1, math.ceil(num_epochs))
        steps = iter(
            progress_bar(range(epochs * math.ceil(len(order) / batch_size)), "Fitting the reward model", progress)
        )
        for _ in range(epochs):
            rng.shuffle(order)
            for start in range(0, len(order), batch_size):
                next(steps, None)
                chunk = [pairs[k] for k in order[start : start + batch_size]]
                texts = [joint_text(p.prompts, p.winner_completions) for p in chunk] + [
                    joint_text(p.prompts, p.loser_completions) for p in chunk
                ]
                scores = self(**self.encode(texts))
                chosen, rejected = scores.chunk(2)
                loss = bradley_terry_loss(chosen, rejected)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        self.eval()
        for p in self.parameters():
            p.requires_grad_(False)
        return losses

    def _trainable(self, freeze_backbone: bool) -> list[nn.Parameter]:
        for p in self.model.parameters():
            p.requires_grad_(not freeze_backbone)
        if freeze_backbone:
            head = getattr(self.model, "score", None) or getattr(self.model, "classifier", None)
            if head is None:
                raise ValueError("reward_freeze_backbone=True needs a model with a `score` or `classifier` head")
            for p in head.parameters():
                p.requires_grad_(True)
        return [p for p in self.model.parameters() if p.requires_grad]

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
