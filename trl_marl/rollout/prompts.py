"""From task items to prompt text: formatters (one per agent) and rendering through an agent's chat template."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl_marl.data_types.text import PromptText

__all__ = [
    "prompt_rule",
    "PromptError",
    "prompt_problem",
    "prompt_kind",
    "one_kind_rule",
    "describe_item",
    "render_prompt",
    "PromptRenderer",
    "default_formatter",
    "resolve_formatters",
    "formatter_failure",
    "format_item",
]


def prompt_rule(allow_empty: bool = False) -> str:
    """What a prompt may be (`prompt_problem`), for error messages."""
    some = "" if allow_empty else "non-empty "
    return f"a prompt must be a {some}string or a {some}list of chat messages (dicts with a 'role' and a 'content')"


class PromptError(ValueError):
    """A task item whose prompt cannot be generated from (no text, neither a string nor chat messages, a chat template
    that fails on it, no tokens), named with the agent. Raised at the rollout that meets the item; a trainer writes
    the checkpoint of the last optimizer step before passing it on (`save_after_failure`)."""


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _a(value: Any) -> str:
    kind = type(value).__name__
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind} ({_short(value, 60)})"


def prompt_problem(value: Any, allow_empty: bool = False) -> str | None:
    """What makes `value` (a prompt column's value, a formatter's output) no prompt, as the end of a sentence about
    it ("is an empty string"); None for a usable one. `allow_empty`: an empty string or message list is fine (an
    agentic item, whose environment's `reset()` adds the task)."""
    if isinstance(value, str):
        return None if value or allow_empty else "is an empty string"
    if isinstance(value, (list, tuple)):
        if not value:
            return None if allow_empty else "is an empty list of chat messages"
        for j, message in enumerate(value):
            if not isinstance(message, Mapping):
                return f"is a list whose entry {j} is {_a(message)}, not a chat message"
            if not isinstance(message.get("role"), str):
                keys = sorted(str(k) for k, v in message.items() if v is not None)
                return f"has a chat message (entry {j}) without a 'role' (its keys: {keys})"
        return None
    if value is None:
        return "is None (missing)"
    return f"is {_a(value)}, not a string or chat messages"


def prompt_kind(value: Any) -> str:
    """The kind of a prompt (a prompt column's value, a formatter's output): `"a string"`, `"chat messages"` (a list,
    rendered through the agent's chat template), or `"no prompt"` (`prompt_problem` says what is wrong with it)."""
    if isinstance(value, str):
        return "a string"
    return "chat messages" if isinstance(value, (list, tuple)) else "no prompt"


def one_kind_rule() -> str:
    """Why an agent's prompts must all be one kind (`prompt_kind`) and how to make them so, for error messages."""
    return (
        "an agent's prompts must all be one kind: chat messages go through its chat template and are tokenized "
        "without special tokens, a string is tokenized as is, with them, and the trainer keeps one setting per "
        "agent (TRL decides it from a batch's first row). Make them all one kind, e.g. wrap each string s as "
        "[{'role': 'user', 'content': s}]"
    )


def describe_item(item: Any) -> str:
    """A task item as an error message names it: its repr, cut short."""
    return f"the task item {_short(item, 200)}"


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
    already holds them).

    A prompt that cannot be generated from raises `PromptError` naming the agent: one that is no prompt
    (`prompt_problem`: empty, None, a number, a message without a 'role'), one whose chat template fails, and one
    that its tokenizer turns into no tokens (e.g. whitespace where the tokenizer strips it), which transformers'
    `generate` would meet as a bare `IndexError`."""

    def __init__(self, tokenizers: Sequence[Any]):
        self.tokenizers = tokenizers
        self.chat = [False] * len(tokenizers)

    def __call__(self, i: int, formatted: Any) -> PromptText:
        problem = prompt_problem(formatted)
        if problem is not None:
            raise PromptError(f"agent {i + 1}'s prompt {problem}; {prompt_rule()}")
        tokenizer = self.tokenizers[i]
        try:
            text = render_prompt(formatted, tokenizer)
        except Exception as exc:
            raise PromptError(f"agent {i + 1}'s prompt cannot be rendered: {type(exc).__name__}: {exc}") from exc
        if not text:
            raise PromptError(f"agent {i + 1}'s chat template renders its prompt {_short(formatted)} as no text")
        # only a blank text can tokenize to nothing (tokenizers keep or replace other characters): the rest skips
        # a second tokenization (generation tokenizes every prompt anyway)
        if not str(text).strip() and not tokenizer(str(text), add_special_tokens=not text.chat)["input_ids"]:
            raise PromptError(
                f"agent {i + 1}'s prompt {_short(str(text))} has no tokens (its tokenizer keeps none of its "
                "characters), and generation needs at least one"
            )
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
    if isinstance(formatters, (str, bytes)):  # list("prompt") would be six formatters
        raise TypeError(
            f"formatters must be a callable (item -> prompt) or a list of {num_agents}, got the string "
            f"{formatters!r}; to read a column, pass formatters=lambda item: item[{formatters!r}]"
        )
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
