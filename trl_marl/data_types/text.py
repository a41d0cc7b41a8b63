"""Prompt and completion text that remember how they were made (a chat template; the EOS a completion ended with),
and `valid_text` / `valid_texts`: any text made fit for a file, a console, a JSON body or a tokenizer."""

from __future__ import annotations

import re
from typing import Any

import torch

__all__ = ["PromptText", "UNKNOWN_EOS", "CompletionText", "valid_text", "valid_texts"]


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


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` as valid Unicode: each lone surrogate (U+D800..U+DFFF) becomes U+FFFD, the replacement character (two
    that form a surrogate pair become the character they encode). Valid text (accents, CJK, emoji, control
    characters) is returned unchanged, as the same object: a `PromptText` / `CompletionText` keeps its attributes.

    A model's or an environment's text can hold lone surrogates (an API's JSON answer with a `"\\ud800"` escape, a
    tool's output), which no UTF-8 file, console, JSON request or tokenizer takes (`UnicodeEncodeError: surrogates
    not allowed`). Whatever writes, prints, logs, sends or tokenizes such text passes it through here first.

    Why U+FFFD and not a `\\udXXX` escape (`backslashreplace`): U+FFFD is what decoders already write for invalid
    text (a tokenizer's decode of a broken byte sequence), so invalid text reads the same however it came; it cannot
    be taken for text the model wrote (code often holds a literal `\\ud800` escape); a lone surrogate is one
    character and so is its replacement; and a file keeps valid UTF-8 and strictly valid JSON, which JSON's own
    lone `\\ud800` escape is not (pyarrow, hence `datasets.load_dataset("json")`, refuses it). Only the invalid code
    point is lost: it encoded no character."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def valid_texts(value: Any) -> Any:
    """`value` with `valid_text` applied to every string in it: JSON-like data (dicts, their keys too, lists, tuples,
    nested) is rebuilt; any other value (a number, None, a tensor) is returned as it is."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_texts(k): valid_texts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [valid_texts(v) for v in value]
    if isinstance(value, tuple):
        return tuple(valid_texts(v) for v in value)
    return value
