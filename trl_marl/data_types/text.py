"""Prompt and completion text that remember how they were made (a chat template; the EOS a completion ended with)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PromptText", "UNKNOWN_EOS", "CompletionText"]


class PromptText(str):
    """A prompt string that remembers whether a chat template produced it (then no special tokens are added) and,
    for a prompt given as tokens, its exact token ids (`PromptText.of_ids`)."""

    chat: bool = False
    token_ids: list[int] | None = None  # when set, generation engines use these ids instead of tokenizing the text

    @classmethod
    def of_ids(cls, text: str, token_ids: list[int]) -> PromptText:
        """A prompt given as token ids (`text` is what they decode to, for records): an agent's turn continued after
        a tool result is generated from prompt + completion + tool-result ids, never re-tokenized (as TRL does)."""
        prompt = cls(text)
        prompt.chat, prompt.token_ids = True, list(token_ids)
        return prompt


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN_EOS"


UNKNOWN_EOS: Any = _Unknown()  # "how this completion ended is not known" (a plain text from a user or an API)


class CompletionText(str):
    """A completion's text that remembers how it was generated (a comparator's sample).

    Attributes:
        eos_token: the text of the EOS token the completion ended with, or None when it was cut at
            `max_new_tokens` (no EOS).
        token_ids: the exact generated ids (EOS included), valid for the tokenizer named by `tokenizer`; None
            when unknown.
        tokenizer: the tokenizer object `token_ids` belong to (ids are reused only for that very tokenizer).
    """

    eos_token: str | None = None
    token_ids: torch.Tensor | None = None
    tokenizer: Any = None

    def __new__(cls, text: str, eos_token: str | None = None, token_ids=None, tokenizer: Any = None):
        obj = super().__new__(cls, text)
        obj.eos_token, obj.token_ids, obj.tokenizer = eos_token, token_ids, tokenizer
        return obj
