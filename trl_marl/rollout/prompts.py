"""From task items to prompt text: formatters (one per agent) and rendering through an agent's chat template."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trl_marl.data_types.text import PromptText

__all__ = [
    "render_prompt",
    "PromptRenderer",
    "default_formatter",
    "resolve_formatters",
    "formatter_failure",
    "format_item",
]


def render_prompt(formatted: Any, tokenizer) -> PromptText:
    """Turn a formatter's output into prompt text: a string as is, or chat messages through the chat template."""
    if isinstance(formatted, str):
        return PromptText(formatted)
    if isinstance(formatted, (list, tuple)) and all(isinstance(m, dict) for m in formatted):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "a formatter returned chat messages but the agent's tokenizer has no chat_template; return a string "
                "or use a tokenizer with a chat template"
            )
        text = PromptText(tokenizer.apply_chat_template(list(formatted), tokenize=False, add_generation_prompt=True))
        text.chat = True
        return text
    raise TypeError(f"a formatter must return a string or a list of chat messages, got {type(formatted).__name__}")


class PromptRenderer:
    """Renders agent i's formatted prompt with agent i's tokenizer (`render_prompt`), remembering in `chat[i]` whether
    agent i's formatter produced chat messages: their text is tokenized without special tokens (the chat template
    already holds them)."""

    def __init__(self, tokenizers: Sequence[Any]):
        self.tokenizers = tokenizers
        self.chat = [False] * len(tokenizers)

    def __call__(self, i: int, formatted: Any) -> PromptText:
        text = render_prompt(formatted, self.tokenizers[i])
        if text.chat:
            self.chat[i] = True
        return text


def default_formatter(item: dict) -> str:
    """The default formatter: the item's `"prompt"` field."""
    if "prompt" not in item:
        raise KeyError(
            f"the default formatter reads item['prompt'], but the item has only {sorted(item)}; pass formatters="
        )
    return item["prompt"]


def resolve_formatters(formatters: Callable | Sequence[Callable] | None, num_agents: int) -> list[Callable]:
    """One formatter for all agents, or a per-agent list whose length must be `num_agents`."""
    if formatters is None:
        return [default_formatter] * num_agents
    if callable(formatters):
        return [formatters] * num_agents
    formatters = list(formatters)
    if len(formatters) != num_agents:
        raise ValueError(
            f"formatters has {len(formatters)} entries but num_agents is {num_agents}; pass one callable "
            f"for all agents or exactly {num_agents}"
        )
    for i, f in enumerate(formatters):
        if not callable(f):
            raise TypeError(f"formatters[{i}] is not callable ({type(f).__name__})")
    return formatters


def formatter_failure(i: int, formatter, item: Any, exc: BaseException) -> str:
    """The message of a formatter that failed on an item: which agent, which formatter, which columns exist."""
    name = getattr(formatter, "__qualname__", type(formatter).__name__)
    columns = sorted(item) if isinstance(item, dict) else type(item).__name__
    return f"the formatter of agent {i + 1} ({name}) failed on an item with columns {columns}: {type(exc).__name__}: {exc}"


def format_item(formatters: Sequence[Callable], i: int, item: dict) -> Any:
    """Agent i's formatter on `item`; its failure is re-raised (same type) naming the agent, the formatter and the
    item's columns (a bare `KeyError: 'question'` does not say whose formatter wanted the column)."""
    try:
        return formatters[i](item)
    except Exception as exc:
        try:
            named = type(exc)(formatter_failure(i, formatters[i], item, exc))
        except Exception:  # an exception type that needs other arguments: keep the original
            raise exc from None
        raise named from exc
