"""Tools for agents: schemas, rendering, parsing tool calls, and running them (sync and async, with timeouts).

The contract is TRL 1.16's (`GRPOTrainer(tools=...)`), applied per agent:

- a tool is a Python callable with type hints and a Google-style docstring; its JSON schema is
  `transformers.utils.get_json_schema(fn)`, exactly what `apply_chat_template(tools=[fn])` renders;
- a tool may take an `agent_index: int` argument: the runner fills it with the calling agent's index and it is
  hidden from the schema (the model never sees or sets it; a value the model writes is overwritten);
- tool calls are parsed from a completion with TRL's own `trl.chat_template_utils.parse_response` (reused, not
  re-implemented): the tokenizer's response template, arguments typed by the tools' schemas, and a plain-text
  fallback when the model writes a malformed call;
- a tool that raises returns `str({"error": str(exception)})` to the model, as TRL does, and counts as a failure;
  an unknown tool name and a non-function call type are failures too (TRL's messages);
- beyond TRL: every call has a timeout. An async tool past it is cancelled; a sync tool runs in a daemon thread of
  its own and is abandoned (Python cannot kill a thread: it runs on, its result is discarded). Both return
  `{"error": "Tool NAME timed out after S s"}` and count as a failure and a timeout.

`ToolExecutor.run(requests)` executes a batch of calls from many branches at once: the calls of ONE branch run in the
order the model wrote them (they may act on the same environment), different branches run concurrently; async tools
on the executor's event loop under a semaphore of `max_concurrency`, sync tools in threads under a semaphore of
`max_sync_concurrency` (default 1: one at a time, as TRL runs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import threading
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trl_marl.data_types.text import valid_texts

__all__ = [
    "AGENT_INDEX_ARG",
    "COMPACT_TOOL_CHAT_TEMPLATE",
    "Tool",
    "ToolCallRequest",
    "ToolExecutor",
    "ToolResult",
    "ToolStats",
    "as_tools",
    "make_tool",
    "parse_completion",
    "prepare_tool_tokenizer",
    "render_prompt",
    "tool_suffix_ids",
    "use_compact_tool_template",
]

AGENT_INDEX_ARG = "agent_index"

# A short ChatML template with tool support, for tiny models whose context cannot hold a long tool preamble (tests,
# the built-in game). Tool calls are written as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, the
# format of TRL's `qwen3_template` response template, which `use_compact_tool_template` sets for parsing.
COMPACT_TOOL_CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\nTools:' }}{% for tool in tools %}"
    "{{ '\n' + ((tool.function if tool.function is defined else tool) | tojson) }}{% endfor %}"
    '{{ \'\nCall: <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call><|im_end|>\n\' }}{% endif %}'
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}{{ '<|im_start|>tool\n' + message.content + '<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\n' }}{% if message.content is string %}{{ message.content }}{% endif %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    "{% set fn = call.function if call.function is defined else call %}"
    '{{ \'<tool_call>\n{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{{ fn.arguments if fn.arguments is string else (fn.arguments | tojson) }}{{ '}\n</tool_call>' }}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Tool:
    """A callable exposed to agents.

    `schema` is what the chat template renders (`{"type": "function", "function": {...}}`, with `agent_index`
    removed when the callable takes it); `function` is what runs.
    """

    name: str
    function: Callable[..., Any]
    schema: dict
    is_async: bool
    takes_agent_index: bool
    timeout: float | None = None  # None: the executor's default


def _hidden_schema(fn: Callable, hidden: str) -> dict:
    """`get_json_schema` of `fn` as if it had no parameter `hidden` (which then needs no docstring line)."""
    from transformers.utils import get_json_schema

    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)  # resolved here: the proxy's globals could not resolve string annotations

    def proxy(*args, **kwargs):  # never called; only its signature and docstring are read
        raise NotImplementedError

    proxy.__name__ = getattr(fn, "__name__", "tool")
    proxy.__qualname__ = proxy.__name__
    proxy.__doc__ = fn.__doc__
    proxy.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != hidden])
    proxy.__annotations__ = {k: v for k, v in hints.items() if k != hidden}
    return get_json_schema(proxy)


def make_tool(fn: Callable[..., Any] | Tool, *, timeout: float | None = None) -> Tool:
    """Turn a callable (function, bound method, async function) into a `Tool`.

    Raises `TypeError` when `fn` is not callable and `ValueError` (naming the tool) when transformers cannot build
    its schema (a missing docstring, an undocumented argument, a missing type hint).
    """
    if isinstance(fn, Tool):
        return fn if timeout is None else dataclasses.replace(fn, timeout=timeout)
    if not callable(fn):
        raise TypeError(f"a tool must be a callable (function or method), got {type(fn).__name__}")
    name = getattr(fn, "__name__", None) or type(fn).__name__
    takes_agent_index = AGENT_INDEX_ARG in inspect.signature(fn).parameters
    try:
        if takes_agent_index:
            schema = _hidden_schema(fn, AGENT_INDEX_ARG)
        else:
            from transformers.utils import get_json_schema

            schema = get_json_schema(fn)
    except Exception as e:  # transformers raises its own TypeError / DocstringParsingException subclasses
        raise ValueError(
            f"tool {name!r}: transformers.utils.get_json_schema cannot describe it ({e}). A tool needs a "
            "Google-style docstring with a description of every argument and a type hint on every argument."
        ) from e
    is_async = inspect.iscoroutinefunction(fn)  # TRL's test too
    return Tool(name, fn, schema, is_async, takes_agent_index, timeout)


def as_tools(tools: Sequence[Callable | Tool] | None) -> list[Tool]:
    """`make_tool` over a list; raises `ValueError` when two tools share a name."""
    out = [make_tool(t) for t in tools or []]
    names = [t.name for t in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"tools: two tools share the name(s) {dupes}; tool names must be unique per agent")
    return out


# --------------------------------------------------------------------------------------------------------- chat


def prepare_tool_tokenizer(tokenizer) -> str | None:
    """Make `tokenizer` ready for tool calling as TRL 1.16's `GRPOTrainer.__init__` does, and return the chat template
    to render with (`None`: the tokenizer's own).

    Reuses `trl.chat_template_utils`: `supports_tool_calling` (else `ValueError`), `add_response_schema` when no
    response template/schema is set (it raises for a template it does not know: set `tokenizer.response_template`
    yourself, or call `use_compact_tool_template`), and `get_training_chat_template` when the template is not
    prefix-preserving (`is_chat_template_prefix_preserving`).
    """
    from trl.chat_template_utils import (
        add_response_schema,
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    if not supports_tool_calling(tokenizer):
        raise ValueError(
            "the agent's chat template does not support tool calling: it must render a full tool-calling "
            "conversation (user -> assistant with tool_calls -> tool). Use a tool-capable template, e.g. "
            "trl_marl.environments.use_compact_tool_template(tokenizer)."
        )
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        add_response_schema(tokenizer)
    if not is_chat_template_prefix_preserving(tokenizer):
        return get_training_chat_template(tokenizer)
    return None


def use_compact_tool_template(tokenizer):
    """Give a ChatML tokenizer (`<|im_start|>`/`<|im_end|>`, e.g. `trl_marl.testing`'s tiny models) the short
    tool-capable `COMPACT_TOOL_CHAT_TEMPLATE` and TRL's `qwen3_template` response template. Returns the tokenizer."""
    from trl.chat_template_utils import qwen3_template

    tokenizer.chat_template = COMPACT_TOOL_CHAT_TEMPLATE
    tokenizer.response_template = qwen3_template
    return tokenizer


def render_prompt(
    tokenizer, messages: list[dict], tools: Sequence[Tool | dict] | None, chat_template: str | None = None, **kwargs
) -> str:
    """The prompt text of one conversation with its tools' schemas, as TRL renders it
    (`apply_chat_template(..., tools=schemas or None, add_generation_prompt=True)`; `or None` because Llama
    templates render tool boilerplate for `tools=[]`)."""
    schemas = [t.schema if isinstance(t, Tool) else t for t in tools or []]
    return tokenizer.apply_chat_template(
        messages,
        tools=schemas or None,
        chat_template=chat_template,
        add_generation_prompt=True,
        tokenize=False,
        **kwargs,
    )


def parse_completion(
    tokenizer, completion_ids: Sequence[int], prompt_ids: Sequence[int] | None, tools: Sequence[Tool | dict] | None
) -> dict:
    """An assistant message `{"role": "assistant", "content": str, "tool_calls"?: [...]}` from generated ids.

    This is TRL 1.16's own parser, `trl.chat_template_utils.parse_response` (the one `GRPOTrainer` calls), reused:
    the tokenizer's response template parses the text, `prompt_ids` is the rendered prompt (`prefix=`), `tools`
    type the arguments, and a malformed call falls back to the decoded text as content.
    """
    from trl.chat_template_utils import parse_response

    schemas = [t.schema if isinstance(t, Tool) else t for t in tools or []] or None
    prefix = list(prompt_ids) if prompt_ids is not None else None
    return parse_response(tokenizer, list(completion_ids), prefix=prefix, tools=schemas)


def tool_suffix_ids(tokenizer, tool_messages: list[dict], chat_template: str | None = None) -> list[int]:
    """Token ids the chat template puts after an assistant turn for `tool_messages`, up to the next assistant
    header: the tool-result segment a trainer inserts between two generations and masks out of the loss.

    Same method as TRL's `GRPOTrainer._get_tool_suffix_ids` (private, so written here): render a dummy
    conversation with and without the tool messages and keep the difference; the shorter rendering is cut after its
    last EOS (templates such as Qwen's add a newline after it).
    """
    if not tool_messages:
        raise ValueError("tool_suffix_ids: tool_messages is empty")
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    kw = dict(tokenize=True, chat_template=chat_template, return_dict=False)
    prefix = list(tokenizer.apply_chat_template(dummy, add_generation_prompt=False, **kw))
    full = list(tokenizer.apply_chat_template(dummy + list(tool_messages), add_generation_prompt=True, **kw))
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[: eos[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError("tool_suffix_ids: the chat template is not prefix-preserving around tool messages")
    return full[len(prefix) :]


# ----------------------------------------------------------------------------------------------------- execution


@dataclass
class ToolStats:
    """Per-agent counters. `failures` counts every unsuccessful call (raised, unknown tool, bad arguments, timeout);
    `timeouts` the calls stopped or abandoned at their timeout (a subset of `failures`)."""

    calls: int = 0
    failures: int = 0
    timeouts: int = 0

    def add(self, result: ToolResult) -> None:
        self.calls += 1
        self.failures += int(not result.ok)
        self.timeouts += int(result.timed_out)


@dataclass
class ToolCallRequest:
    """One parsed tool call to run. `tools` are the tools this agent may call in this branch (name -> Tool);
    `group` keys calls that must run in order (one branch); `index` is the call's position in its completion."""

    call: dict  # as parse_response writes it: {"type": "function", "function": {"name", "arguments"}}
    tools: dict[str, Tool]
    agent_index: int
    group: Any = 0
    index: int = 0


@dataclass
class ToolResult:
    """The outcome of one call; `message()` is the tool message appended to the conversation (its text valid
    unicode: a lone surrogate in a tool's output, which the tokenizer refuses, is U+FFFD, `valid_text`)."""

    name: str
    content: Any  # str, or a list of content blocks (multimodal, passed through as TRL does)
    ok: bool = True
    timed_out: bool = False
    error: str | None = None
    seconds: float = 0.0
    arguments: dict | None = None  # the keyword arguments the tool was called with (None: it was not called)

    def message(self) -> dict:
        return {"role": "tool", "name": self.name, "content": valid_texts(self.content)}


def _content(result: Any) -> Any:
    return result if isinstance(result, list) else str(result)


def _failure(name: str, text: str, timed_out: bool = False) -> ToolResult:
    # TRL 1.16 returns `{"error": str(e)}`, rendered with str(): the model reads "{'error': '...'}"
    return ToolResult(name, str({"error": text}), ok=False, timed_out=timed_out, error=text)


def _call_target(request: ToolCallRequest) -> tuple[str, Tool | None, dict | None, ToolResult | None]:
    """Resolve a request to (name, tool, kwargs) or a failure result (TRL's messages where TRL has one)."""
    call = request.call
    if not isinstance(call, dict):
        return "unknown", None, None, _failure("unknown", f"Malformed tool call: {call!r}")
    if call.get("type", "function") != "function":
        name = call.get("name", "unknown")
        return name, None, None, _failure(name, f"Unsupported tool call type: {call.get('type')}")
    function = call.get("function", call)
    name = function.get("name", "unknown") if isinstance(function, dict) else "unknown"
    tool = request.tools.get(name)
    if tool is None:
        return name, None, None, _failure(name, f"Tool {name} not found.")
    args = function.get("arguments", {}) or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return name, None, None, _failure(name, f"Tool {name}: arguments are not valid JSON ({e.msg}).")
    if not isinstance(args, dict):
        return name, None, None, _failure(name, f"Tool {name}: arguments must be an object, got {args!r}.")
    args = dict(args)
    if tool.takes_agent_index:
        args[AGENT_INDEX_ARG] = request.agent_index  # the runner's value, never the model's
    return name, tool, args, None


class ToolExecutor:
    """Runs batches of tool calls on a private event loop in a daemon thread (started on first use).

    Args:
        timeout: default seconds per call (a `Tool.timeout` overrides it); `None` means no limit.
        max_concurrency: async tool calls in flight at once, over all branches.
        max_sync_concurrency: sync tool calls in flight at once (default 1, as TRL runs them). Raise it only for
            thread-safe tools; calls of one branch stay in order whatever the value.
    """

    def __init__(self, timeout: float | None = 30.0, max_concurrency: int = 32, max_sync_concurrency: int = 1):
        if timeout is not None and not timeout > 0:
            raise ValueError(f"ToolExecutor: timeout must be a positive number of seconds or None, got {timeout!r}")
        for arg, v in (("max_concurrency", max_concurrency), ("max_sync_concurrency", max_sync_concurrency)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ToolExecutor: {arg} must be an int >= 1, got {v!r}")
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        self.max_sync_concurrency = max_sync_concurrency
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- loop management
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve():
                    asyncio.set_event_loop(loop)
                    ready.set()
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="trl_marl-tools", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Stop the event loop thread (a later call starts a new one)."""
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=5)
                self._loop.close()
                self._loop, self._thread = None, None

    def __del__(self):  # best effort; the thread is a daemon anyway
        with contextlib.suppress(Exception):
            self.close()

    def call_soon(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Run `fn(*args, **kwargs)`, awaiting it on the executor's loop when it is a coroutine function (used for
        async `get_reward` and environment hooks). Blocks until done."""
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            return asyncio.run_coroutine_threadsafe(_await(result), self.loop).result()
        return result

    def call_with_timeout(self, fn: Callable[..., Any], timeout: float, *args, **kwargs) -> Any:
        """`call_soon` with a limit: a coroutine function is cancelled, a sync one (run in a thread of its own) is
        abandoned after `timeout` seconds, and `TimeoutError` is raised."""

        async def timed():
            if inspect.iscoroutinefunction(fn):
                return await asyncio.wait_for(fn(*args, **kwargs), timeout)
            loop = asyncio.get_running_loop()
            value = await asyncio.wait_for(_in_thread(loop, functools.partial(fn, *args, **kwargs)), timeout)
            return await value if inspect.isawaitable(value) else value

        return asyncio.run_coroutine_threadsafe(timed(), self.loop).result()

    # -- execution
    def run(self, requests: Sequence[ToolCallRequest]) -> list[ToolResult]:
        """Execute `requests`; returns one `ToolResult` per request, in the same order. Never raises for a tool's
        own failure (errors are results)."""
        if not requests:
            return []
        return asyncio.run_coroutine_threadsafe(self._run(list(requests)), self.loop).result()

    async def _run(self, requests: list[ToolCallRequest]) -> list[ToolResult]:
        sem_async = asyncio.Semaphore(self.max_concurrency)
        sem_sync = asyncio.Semaphore(self.max_sync_concurrency)
        results: list[ToolResult | None] = [None] * len(requests)
        groups: dict[Any, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(r.group, []).append(i)

        async def run_group(idxs: list[int]) -> None:
            for i in sorted(idxs, key=lambda i: requests[i].index):
                results[i] = await self._one(requests[i], sem_async, sem_sync)

        await asyncio.gather(*(run_group(idxs) for idxs in groups.values()))
        return results  # type: ignore[return-value]

    async def _one(self, request: ToolCallRequest, sem_async, sem_sync) -> ToolResult:
        loop = asyncio.get_running_loop()
        name, tool, args, failure = _call_target(request)
        if failure is not None:
            return failure
        timeout = tool.timeout if tool.timeout is not None else self.timeout
        start = loop.time()
        result: ToolResult
        try:
            if tool.is_async:
                async with sem_async:
                    value = await asyncio.wait_for(tool.function(**args), timeout)
            else:
                async with sem_sync:
                    value = await asyncio.wait_for(_in_thread(loop, functools.partial(tool.function, **args)), timeout)
        except TimeoutError:
            result = _failure(name, f"Tool {name} timed out after {timeout:g} s.", timed_out=True)
        except Exception as e:
            result = _failure(name, str(e))
        else:
            result = ToolResult(name, _content(value))
        result.seconds = loop.time() - start
        result.arguments = args
        return result


async def _await(awaitable):
    return await awaitable


def _in_thread(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> asyncio.Future:
    """Run `fn` in a new daemon thread; the returned future resolves with its result. On a timeout the future is
    cancelled and the thread is abandoned (its late result is dropped)."""
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        try:
            value, ok = fn(), True
        except BaseException as e:  # delivered to the awaiting coroutine
            value, ok = e, False
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=work, name="trl_marl-tool", daemon=True).start()
    return future
