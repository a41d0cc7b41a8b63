"""HTTP clients for the API comparator (`comparator_policy="api"`).

One client sends a batch of prompts to a remote model and returns `num_candidates` completions per prompt. The
request format is `format` (`comparator_kwargs["format"]` of the iterative configs):

| format | endpoint | candidates per request | completions read from |
|---|---|---|---|
| `generic` (default) | any JSON endpoint | `num_return_sequences`, chunked by `max_n_per_request` | the dotted `response_field` |
| `openai` | Chat Completions (also DeepSeek and other compatible servers) | `n`, chunked by `max_n_per_request` | `choices[*].message.content` |
| `anthropic` | Messages API (`/v1/messages`) | 1 (no `n`) | the `text` blocks of `content` |
| `openai_responses` (aliases `responses`, `codex`) | Responses API (`/v1/responses`) | 1 (no `n`) | `output_text`, else the `output_text` parts of `output` |

Keys. The key is read from the environment variable named by `key_env` (`comparator_kwargs["key_env"]`; defaults:
`OPENAI_API_KEY` for `openai` and `openai_responses`, `ANTHROPIC_API_KEY` for `anthropic`, none for `generic`), at
request time, and is never stored on the client or its config: it cannot appear in a repr, `to_dict()`, a pickle,
a log line or an exception message (response text quoted in errors is scrubbed of it too).

Limits. `timeout` is a wall-clock deadline for a whole attempt (connecting, sending, and reading the body: a server
that drips a byte at a time cannot stall a request past it); the response body is streamed and refused as soon as it
exceeds `max_response_bytes` (default 4 MiB), so a huge body never sits in memory. Text quoted in errors has the key
and every other configured secret redacted BEFORE it is cut to length, so no fragment of a key can survive the cut.
The key lives only in a `_Secret` object (redacted repr) that an `httpx.Auth` reads when the request is sent: no
frame of this module holds it in a local variable that traceback-with-locals tools would print.

Failures. Timeouts, connection errors, HTTP 429 and HTTP 5xx are retried up to `max_retries` times with exponential
backoff, `min(backoff_max, backoff_base * 2 ** r)` seconds before retry r = 0, 1, ... (a numeric `Retry-After` header
is honoured, capped at `backoff_max`). Other HTTP errors fail at once. Every failure raises `APIComparatorError`
naming the URL (without query string) and the status.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from trl_marl.data_types.text import valid_texts
from trl_marl.plugins.comparators_protocol import option_name
from trl_marl.utils.secrets import check_no_secrets

__all__ = [
    "FORMATS",
    "FORMAT_ALIASES",
    "DEFAULT_KEY_ENV",
    "ANTHROPIC_VERSION",
    "GENERATION_KEYS",
    "APIClientConfig",
    "APIClient",
    "APIComparatorError",
    "normalize_format",
    "candidate_chunks",
    "build_body",
    "build_headers",
    "parse_completions",
    "backoff_delay",
]

logger = logging.getLogger(__name__)

FORMATS = ("generic", "openai", "anthropic", "openai_responses")
FORMAT_ALIASES = {"responses": "openai_responses", "codex": "openai_responses"}
DEFAULT_KEY_ENV: dict[str, str | None] = {
    "generic": None,
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "openai_responses": "OPENAI_API_KEY",
}
ANTHROPIC_VERSION = "2023-06-01"
GENERATION_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k")
# Formats whose requests carry a candidate count; the others send one request per candidate.
_HAS_N = ("generic", "openai")
_RETRY_STATUS = frozenset({408, 429})
_ERROR_TEXT_CHARS = 300
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class _Secret:
    """A key held out of sight: its repr / str are redacted, it does not pickle, and `redact(text)` removes it."""

    __slots__ = ("_value",)

    def __init__(self, value: str | None) -> None:
        self._value = value or None

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "<redacted>" if self._value else "<no key>"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("a key is not picklable")

    def reveal(self) -> str | None:
        return self._value

    def redact(self, text: str) -> str:
        return text.replace(self._value, "***") if self._value else text


class _KeyAuth(httpx.Auth):
    """Adds the key header when the request is sent (the key stays inside `_Secret`)."""

    def __init__(self, secret: _Secret, fmt: str) -> None:
        self.secret, self.fmt = secret, fmt

    def auth_flow(self, request: httpx.Request):
        if self.secret:
            if self.fmt == "anthropic":
                request.headers["x-api-key"] = self.secret.reveal()
            else:
                request.headers["Authorization"] = "Bearer " + self.secret.reveal()
        yield request


class _ResponseTooLarge(Exception):
    pass


class _DeadlinePassed(Exception):
    pass


class APIComparatorError(RuntimeError):
    """An API comparator request failed. `url` is the endpoint (query string removed), `status_code` the last HTTP
    status (None for timeouts, connection errors and unusable responses)."""

    def __init__(self, message: str, *, url: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status_code = status_code


def normalize_format(fmt: str) -> str:
    """The canonical format name: one of `FORMATS`, with `responses` and `codex` mapped to `openai_responses`."""
    canonical = FORMAT_ALIASES.get(fmt, fmt)
    if canonical not in FORMATS:
        raise ValueError(
            f"{option_name('format')} must be one of {list(FORMATS)} (or the aliases {sorted(FORMAT_ALIASES)} of "
            f"'openai_responses'), got {fmt!r}"
        )
    return canonical


def _display_url(url: str) -> str:
    """`url` without user info, query or fragment, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _redact(text: str, *secrets: Any) -> str:
    """`text` with every secret (strings or `_Secret`s) replaced by `***`."""
    for secret in secrets:
        if isinstance(secret, _Secret):
            text = secret.redact(text)
        elif secret:
            text = text.replace(secret, "***")
    return text


def _quote(text: str, *secrets: Any, limit: int = _ERROR_TEXT_CHARS) -> str:
    """Response text for an error message: redacted FIRST, then cut to `limit` characters."""
    return _redact(text, *secrets)[:limit]


@dataclasses.dataclass
class APIClientConfig:
    """Settings of an API comparator client; holds the NAME of the key's environment variable, never the key.

    Attributes:
        url: the full endpoint URL (for example `https://api.openai.com/v1/chat/completions`).
        format: one of `FORMATS` or an alias (stored canonical).
        model: the model name; required by `openai`, `anthropic` and `openai_responses`, sent by `generic` when set.
        key_env: the environment variable holding the key; None means the format's default (`DEFAULT_KEY_ENV`).
            An explicitly named variable must be set; a missing default variable sends the request without a key
            (for local servers) and logs a warning once.
        timeout: wall-clock seconds per attempt: connecting, sending and reading the whole response (a server that
            drips its body slowly is cut off at this deadline).
        max_response_bytes: largest response body accepted (checked while streaming; a larger one fails the request
            at once, without retries).
        headers: extra request headers (no credential headers: `Authorization`, `X-Api-Key`, `X-Auth-Token`, `Cookie`,
            any name with token / secret / key / auth, ... are rejected; see `trl_marl.utils.secrets`). The URL's
            query parameters and `extra_body` keys are held to the same rule.
        extra_body: extra top-level request fields, merged last; a field set to None removes a default field
            (for example `{"max_tokens": None, "max_completion_tokens": 512}` for OpenAI reasoning models).
        max_n_per_request: most candidates in one request for the formats with a candidate count (`generic`,
            `openai`); None sends all of a prompt's candidates in one request. The other formats send one request per
            candidate and accept only None or 1.
        response_field: the dotted path of the completions in a `generic` response (`"completions"`,
            `"data.outputs"`, `"choices.0.texts"`: integer segments index lists).
        max_retries: retries after the first attempt, for timeouts, connection errors, HTTP 408, 429 and 5xx.
        backoff_base: seconds before the first retry; doubled at each further retry.
        backoff_max: cap on one backoff delay, `Retry-After` included.
        max_concurrency: most requests in flight at once (threads and pooled connections).
    """

    url: str
    format: str = "generic"
    model: str | None = None
    key_env: str | None = None
    timeout: float = 120.0
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    headers: dict[str, str] | None = None
    extra_body: dict[str, Any] | None = None
    max_n_per_request: int | None = None
    response_field: str = "completions"
    max_retries: int = 3
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    max_concurrency: int = 8

    def __post_init__(self) -> None:
        if not self.url or urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError(f"{option_name('url')} must be an http(s) URL, got {self.url!r}")
        self.format = normalize_format(self.format)
        if self.format != "generic" and not self.model:
            raise ValueError(f"{option_name('model')} is required when {option_name('format')}={self.format!r}")
        if self.key_env is not None and (not isinstance(self.key_env, str) or not self.key_env.isidentifier()):
            raise ValueError(
                f"{option_name('key_env')} must be the NAME of an environment variable (keys are read from the "
                f"environment only), got a {type(self.key_env).__name__} that is not a valid variable name"
            )
        if self.headers is not None and not isinstance(self.headers, Mapping):
            raise ValueError(f"{option_name('headers')} must be a mapping, got {type(self.headers).__name__}")
        if self.extra_body is not None and not isinstance(self.extra_body, Mapping):
            raise ValueError(f"{option_name('extra_body')} must be a mapping, got {type(self.extra_body).__name__}")
        # the URL, headers and body fields must not carry credentials (trl_marl.utils.secrets decides what is one)
        check_no_secrets("comparator_kwargs", self.url, self.headers, self.extra_body, option_name("key_env"))
        if self.headers:
            self.headers = {str(k): str(v) for k, v in self.headers.items()}
        if self.max_n_per_request is not None:
            if isinstance(self.max_n_per_request, bool) or int(self.max_n_per_request) < 1:
                raise ValueError(
                    f"{option_name('max_n_per_request')} must be >= 1 or None, got {self.max_n_per_request!r}"
                )
            if self.format not in _HAS_N and self.max_n_per_request != 1:
                raise ValueError(
                    f"{option_name('max_n_per_request')} applies to the formats {list(_HAS_N)}; "
                    f"{option_name('format')}={self.format!r} always sends one request per candidate (use None or 1)"
                )
        if not (self.timeout > 0):
            raise ValueError(f"{option_name('timeout')} must be > 0 seconds, got {self.timeout!r}")
        if isinstance(self.max_response_bytes, bool) or int(self.max_response_bytes) < 1:
            raise ValueError(f"{option_name('max_response_bytes')} must be >= 1, got {self.max_response_bytes!r}")
        if int(self.max_retries) < 0:
            raise ValueError(f"{option_name('max_retries')} must be >= 0, got {self.max_retries!r}")
        if self.backoff_base < 0 or self.backoff_max < 0:
            raise ValueError(f"{option_name('backoff_base')} and {option_name('backoff_max')} must be >= 0 seconds")
        if int(self.max_concurrency) < 1:
            raise ValueError(f"{option_name('max_concurrency')} must be >= 1, got {self.max_concurrency!r}")

    @property
    def resolved_key_env(self) -> str | None:
        """`key_env`, or the format's default variable name."""
        return self.key_env if self.key_env is not None else DEFAULT_KEY_ENV[self.format]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able settings (for logs, configs, model cards). Contains the key's variable name, never a key."""
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------------------
# Pure request / response functions.
# ---------------------------------------------------------------------------------------------------------------


def candidate_chunks(fmt: str, num_candidates: int, max_n_per_request: int | None) -> list[int]:
    """How many candidates each request for one prompt asks for; the chunks sum to `num_candidates`.

    `generic` / `openai`: chunks of `max_n_per_request` (all at once when None), the last one smaller.
    `anthropic` / `openai_responses`: `[1] * num_candidates` (these APIs have no `n`).
    """
    if num_candidates < 0:
        raise ValueError(f"num_candidates must be >= 0, got {num_candidates}")
    if normalize_format(fmt) not in _HAS_N:
        return [1] * num_candidates
    size = num_candidates if max_n_per_request is None else max_n_per_request
    return [min(size, num_candidates - start) for start in range(0, num_candidates, max(size, 1))]


def _jsonable(value: Any) -> Any:
    """`value` as plain JSON types: containers recursively, numpy / torch values through `.tolist()`, anything else
    through `str()`."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return str(value)


def _generation(gen: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(gen) - set(GENERATION_KEYS))
    if unknown:
        raise TypeError(f"unsupported generation settings {unknown}; supported: {list(GENERATION_KEYS)}")
    return {k: v for k, v in gen.items() if v is not None}


def build_body(
    config: APIClientConfig,
    prompt: str,
    n: int,
    gen: Mapping[str, Any],
    *,
    agent_index: int | None = None,
    item: Any = None,
) -> dict[str, Any]:
    """The JSON body of one request for `n` candidates of `prompt`.

    - `generic`: `{"prompt", "agent_idx", "batch_item", "num_return_sequences": n, "model"?, <generation settings>}`
      (generation settings under their own names: `max_new_tokens`, `temperature`, `top_p`, `top_k`).
    - `openai`: `{"model", "messages": [{"role": "user", "content": prompt}], "n": n, "max_tokens"?, "temperature"?,
      "top_p"?}` (`top_k` is not part of the API and is dropped).
    - `anthropic`: `{"model", "max_tokens", "messages": [...], "temperature"?, "top_p"?, "top_k"?}` (`n == 1`;
      `max_new_tokens` is required: the API requires `max_tokens`).
    - `openai_responses`: `{"model", "input": prompt, "max_output_tokens"?, "temperature"?, "top_p"?}` (`n == 1`).

    Settings that are None are left out. `config.extra_body` is merged last; its None values delete fields.
    """
    settings = _generation(gen)
    fmt = config.format
    if fmt == "generic":
        body: dict[str, Any] = {
            "prompt": prompt,
            "agent_idx": agent_index,
            "batch_item": _jsonable(item),
            "num_return_sequences": n,
            **settings,
        }
        if config.model:
            body["model"] = config.model
    elif fmt == "openai":
        body = {"model": config.model, "messages": [{"role": "user", "content": prompt}], "n": n}
        if "max_new_tokens" in settings:
            body["max_tokens"] = settings["max_new_tokens"]
        body.update({k: settings[k] for k in ("temperature", "top_p") if k in settings})
    elif fmt == "anthropic":
        if n != 1:
            raise ValueError(f"the anthropic format sends one candidate per request, got n={n}")
        if "max_new_tokens" not in settings:
            raise ValueError(
                f"{option_name('format')}='anthropic' needs max_new_tokens (the Messages API's max_tokens)"
            )
        body = {
            "model": config.model,
            "max_tokens": settings["max_new_tokens"],
            "messages": [{"role": "user", "content": prompt}],
        }
        body.update({k: settings[k] for k in ("temperature", "top_p", "top_k") if k in settings})
    else:  # openai_responses
        if n != 1:
            raise ValueError(f"the openai_responses format sends one candidate per request, got n={n}")
        body = {"model": config.model, "input": prompt}
        if "max_new_tokens" in settings:
            body["max_output_tokens"] = settings["max_new_tokens"]
        body.update({k: settings[k] for k in ("temperature", "top_p") if k in settings})
    for key, value in (config.extra_body or {}).items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def build_headers(config: APIClientConfig, key: str | None) -> dict[str, str]:
    """Request headers: JSON content type, the key (`x-api-key` plus `anthropic-version: 2023-06-01` for
    `anthropic`, `Authorization: Bearer <key>` otherwise; no key header when `key` is None), then `config.headers`."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if config.format == "anthropic":
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if key:
            headers["x-api-key"] = key
    elif key:
        headers["Authorization"] = f"Bearer {key}"
    headers.update(config.headers or {})
    return headers


class _ResponseShapeError(ValueError):
    pass


def _dotted(data: Any, path: str) -> Any:
    node = data
    for segment in path.split("."):
        if isinstance(node, Mapping) and segment in node:
            node = node[segment]
        elif isinstance(node, list) and segment.lstrip("-").isdigit() and -len(node) <= int(segment) < len(node):
            node = node[int(segment)]
        else:
            keys = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise _ResponseShapeError(f"the response has no field {path!r} (top-level keys: {keys})")
    return node


def _text_of(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping) and isinstance(part.get("text"), str):
        return part["text"]
    return None


def parse_completions(fmt: str, data: Any, response_field: str = "completions") -> list[str]:
    """The completion strings of one response, in candidate order.

    - `generic`: the value at the dotted `response_field`: a string (one completion) or a list of strings or of
      `{"text": ...}` objects.
    - `openai`: `choices[*].message.content`, ordered by `choices[*].index` (None content reads as "").
    - `anthropic`: the concatenated `text` of the `content` blocks of type `text` (one completion).
    - `openai_responses`: `output_text` when present, else the concatenated `text` of the `output_text` parts of
      the `message` items of `output` (one completion).

    Raises `ValueError` when the response does not have that shape.
    """
    fmt = normalize_format(fmt)
    if fmt == "generic":
        value = _dotted(data, response_field)
        values = [value] if isinstance(value, (str, Mapping)) else value
        texts = [_text_of(v) for v in values] if isinstance(values, list) else None
        if texts is None or any(t is None for t in texts):
            raise _ResponseShapeError(
                f"the response field {response_field!r} must hold a string or a list of strings, "
                f"got {type(value).__name__}"
            )
        return texts
    if not isinstance(data, Mapping):
        raise _ResponseShapeError(f"expected a JSON object, got {type(data).__name__}")
    if fmt == "openai":
        choices = data.get("choices")
        if not isinstance(choices, list):
            raise _ResponseShapeError(f"the response has no 'choices' list (top-level keys: {sorted(data)})")
        ordered = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, Mapping) else 0)
        out = []
        for choice in ordered:
            content = choice.get("message", {}).get("content") if isinstance(choice, Mapping) else None
            if isinstance(content, list):  # some compatible servers return content parts
                content = "".join(t for t in map(_text_of, content) if t is not None)
            out.append(content if isinstance(content, str) else "")
        return out
    if fmt == "anthropic":
        blocks = data.get("content")
        if not isinstance(blocks, list):
            raise _ResponseShapeError(f"the response has no 'content' list (top-level keys: {sorted(data)})")
        return ["".join(b["text"] for b in blocks if isinstance(b, Mapping) and b.get("type") == "text")]
    if isinstance(data.get("output_text"), str):
        return [data["output_text"]]
    output = data.get("output")
    if not isinstance(output, list):
        raise _ResponseShapeError(f"the response has no 'output' list (top-level keys: {sorted(data)})")
    parts = [
        part["text"]
        for entry in output
        if isinstance(entry, Mapping) and entry.get("type") == "message"
        for part in entry.get("content") or []
        if isinstance(part, Mapping)
        and part.get("type") in ("output_text", "text")
        and isinstance(part.get("text"), str)
    ]
    return ["".join(parts)]


def backoff_delay(retry: int, base: float, cap: float, retry_after: str | None = None) -> float:
    """Seconds to wait before retry number `retry` (0-based): `min(cap, base * 2 ** retry)`, or a numeric
    `Retry-After` header value capped at `cap` when the server sent one."""
    if retry_after is not None:
        try:
            return min(cap, max(0.0, float(retry_after)))
        except ValueError:
            pass  # an HTTP-date: fall back to exponential backoff
    return min(cap, base * 2.0**retry)


def _status_hint(status: int, key_env: str | None) -> str:
    if status in (401, 403):
        return (
            f" (check the key in ${key_env})"
            if key_env
            else f" (the endpoint wants a key: set {option_name('key_env')})"
        )
    if status == 402:
        return " (payment required: insufficient balance on the account?)"
    if status == 404:
        return f" (check {option_name('url')} and {option_name('model')})"
    return ""


# ---------------------------------------------------------------------------------------------------------------
# The client.
# ---------------------------------------------------------------------------------------------------------------


class APIClient:
    """Sends comparator prompts to a remote model; see the module docstring for formats, keys and retries.

    Thread-safe; requests of one `generate` call run concurrently, at most `config.max_concurrency` at a time. Use
    as a context manager, or call `close()`, to release the connection pool.
    """

    def __init__(self, config: APIClientConfig, *, transport: httpx.BaseTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        self._warned_no_key = False
        if config.key_env is not None and not os.environ.get(config.key_env):
            raise ValueError(
                f"{option_name('key_env')} names the environment variable {config.key_env!r}, which is not set "
                "(or empty)"
            )

    def __repr__(self) -> str:
        c = self.config
        return (
            f"APIClient(format={c.format!r}, url={_display_url(c.url)!r}, model={c.model!r}, "
            f"key_env={c.resolved_key_env!r})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The client's settings (`APIClientConfig.to_dict`); no key."""
        return self.config.to_dict()

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "transport": self._transport}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], transport=state["transport"])

    def __enter__(self) -> APIClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool (a later request opens a new one)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                n = int(self.config.max_concurrency)
                self._client = httpx.Client(
                    timeout=httpx.Timeout(self.config.timeout),
                    limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                    transport=self._transport,
                )
            return self._client

    def _key(self) -> _Secret:
        """The key, read from the environment now (never stored on the client), wrapped in a `_Secret`."""
        env = self.config.resolved_key_env
        secret = _Secret(os.environ.get(env) if env else None)
        if env and not secret:
            if self.config.key_env is not None:
                raise APIComparatorError(
                    f"the environment variable {env!r} named by {option_name('key_env')} is not set (or empty)",
                    url=_display_url(self.config.url),
                )
            if not self._warned_no_key:
                self._warned_no_key = True
                logger.warning("API comparator: $%s is not set; sending requests without a key", env)
        return secret

    def generate(
        self,
        prompts: Sequence[str],
        num_candidates: int,
        *,
        agent_indices: Sequence[int | None] | None = None,
        items: Sequence[Any] | None = None,
        **gen: Any,
    ) -> list[list[str]]:
        """`num_candidates` completions for each prompt: `out[p][c]` is candidate c of `prompts[p]`.

        Args:
            prompts: the prompt strings.
            num_candidates: completions wanted per prompt.
            agent_indices: per prompt, the agent (role) index it was written for; sent by the `generic` format only.
            items: per prompt, its task item (made JSON-able); sent by the `generic` format only.
            **gen: generation settings among `GENERATION_KEYS` (None values are left out).

        Raises:
            APIComparatorError: a request failed after its retries, or a response lacks the completions.
            TypeError: an unsupported generation setting.
        """
        _generation(gen)
        if agent_indices is not None and len(agent_indices) != len(prompts):
            raise ValueError(f"agent_indices has {len(agent_indices)} entries for {len(prompts)} prompts")
        if items is not None and len(items) != len(prompts):
            raise ValueError(f"items has {len(items)} entries for {len(prompts)} prompts")
        chunks = candidate_chunks(self.config.format, num_candidates, self.config.max_n_per_request)
        bodies = [
            build_body(
                self.config,
                prompt,
                n,
                gen,
                agent_index=None if agent_indices is None else agent_indices[p],
                item=None if items is None else items[p],
            )
            for p, prompt in enumerate(prompts)
            for n in chunks
        ]
        results = self._run_all(bodies, [n for _ in prompts for n in chunks])
        per_prompt = len(chunks)
        return [
            [text for chunk in results[p * per_prompt : (p + 1) * per_prompt] for text in chunk]
            for p in range(len(prompts))
        ]

    def _run_all(self, bodies: list[dict[str, Any]], counts: list[int]) -> list[list[str]]:
        if len(bodies) <= 1:
            return [self._request(body, n) for body, n in zip(bodies, counts)]
        pool = ThreadPoolExecutor(max_workers=min(int(self.config.max_concurrency), len(bodies)))
        try:
            futures = [pool.submit(self._request, body, n) for body, n in zip(bodies, counts)]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for future in futures:
                if future in done and future.exception() is not None:
                    raise future.exception()
            return [future.result() for future in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _request(self, body: dict[str, Any], n: int) -> list[str]:
        """POST one body with retries; return exactly `n` completions."""
        config = self.config
        url = _display_url(config.url)
        secret = self._key()
        auth = _KeyAuth(secret, config.format)
        headers = build_headers(config, None)  # the key header is added by `auth` when the request is sent
        attempts = 1 + int(config.max_retries)
        failure, status = "", None
        for attempt in range(attempts):
            retry_after = None
            try:
                status, reason, raw, response_headers = self._post(body, headers, auth)
            except (httpx.TimeoutException, _DeadlinePassed) as exc:
                failure, status = f"timed out after {config.timeout} s ({type(exc).__name__})", None
            except _ResponseTooLarge as exc:
                raise APIComparatorError(
                    f"POST {url} failed: the response is larger than max_response_bytes="
                    f"{config.max_response_bytes} ({exc}); raise {option_name('max_response_bytes')} if it is expected",
                    url=url,
                ) from None
            except httpx.TransportError as exc:
                failure, status = f"connection error ({type(exc).__name__}: {_quote(str(exc), secret)})", None
            else:
                if 200 <= status < 300:
                    return self._completions(raw, status, n, url, secret)
                text = _quote(raw.decode("utf-8", "replace"), secret, *self._configured_secrets())
                failure = f"HTTP {status} {reason}: {text}".rstrip(": ")
                if status not in _RETRY_STATUS and not 500 <= status < 600:
                    raise APIComparatorError(
                        f"POST {url} failed: {failure}{_status_hint(status, config.resolved_key_env)}",
                        url=url,
                        status_code=status,
                    )
                retry_after = response_headers.get("retry-after")
            if attempt + 1 < attempts:
                delay = backoff_delay(attempt, config.backoff_base, config.backoff_max, retry_after)
                logger.warning(
                    "API comparator: POST %s attempt %d/%d failed (%s); retrying in %.2f s",
                    url,
                    attempt + 1,
                    attempts,
                    failure,
                    delay,
                )
                time.sleep(delay)
        raise APIComparatorError(
            f"POST {url} failed after {attempts} attempt(s): {failure}", url=url, status_code=status
        )

    def _configured_secrets(self) -> list[str]:
        """Values of configured fields that look like secrets (`trl_marl.secrets`), redacted from quoted text too."""
        from trl_marl.utils.secrets import secret_values

        return secret_values(self.config.url, self.config.headers, self.config.extra_body)

    def _post(self, body: dict[str, Any], headers: dict[str, str], auth: httpx.Auth):
        """One attempt: stream the response under the wall-clock deadline and the size cap; returns
        `(status, reason, body bytes, headers)`. The body's texts are sent as valid unicode (`valid_texts`: a lone
        surrogate in a prompt, which httpx's UTF-8 JSON cannot encode, is sent as U+FFFD)."""
        config = self.config
        deadline = time.monotonic() + config.timeout
        cap = int(config.max_response_bytes)
        body = valid_texts(body)
        with self._http().stream("POST", config.url, json=body, headers=headers, auth=auth) as response:
            # a watchdog closes the stream at the deadline, so that a read blocked on a stalled server returns
            watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), response.close)
            watchdog.daemon = True
            watchdog.start()
            try:
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > cap:
                    raise _ResponseTooLarge(f"Content-Length {declared}")
                chunks, size = [], 0
                try:
                    for chunk in response.iter_raw():
                        size += len(chunk)
                        if size > cap:
                            raise _ResponseTooLarge(f"more than {cap} bytes received")
                        chunks.append(chunk)
                        if time.monotonic() > deadline:
                            raise _DeadlinePassed(f"{size} bytes received")
                except (httpx.StreamClosed, httpx.ReadError, httpx.RemoteProtocolError):
                    if time.monotonic() >= deadline:
                        raise _DeadlinePassed(f"{size} bytes received") from None
                    raise
                if time.monotonic() > deadline:
                    raise _DeadlinePassed(f"{size} bytes received")
                raw = b"".join(chunks)
                decoder = response.headers.get("content-encoding")
                if decoder:
                    raw = _decode_content(raw, decoder, cap)
                return response.status_code, response.reason_phrase, raw, response.headers
            finally:
                watchdog.cancel()

    def _completions(self, raw: bytes, status: int, n: int, url: str, secret: _Secret) -> list[str]:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            snippet = _quote(raw.decode("utf-8", "replace"), secret, *self._configured_secrets())
            raise APIComparatorError(
                f"POST {url} returned HTTP {status} with a body that is not JSON: {snippet!r}",
                url=url,
                status_code=status,
            ) from None
        try:
            texts = parse_completions(self.config.format, data, self.config.response_field)
        except _ResponseShapeError as exc:
            raise APIComparatorError(
                f"POST {url} (format {self.config.format!r}): {_quote(str(exc), secret, limit=2000)}",
                url=url,
                status_code=status,
            ) from None
        if len(texts) < n:
            raise APIComparatorError(
                f"POST {url} returned {len(texts)} completion(s) for a request of {n}",
                url=url,
                status_code=status,
            )
        return texts[:n]


def _decode_content(raw: bytes, encoding: str, cap: int) -> bytes:
    """Undo a `Content-Encoding` (gzip / deflate), refusing output beyond `cap` bytes (no decompression bombs)."""
    import zlib

    encoding = encoding.strip().lower()
    if encoding in ("identity", ""):
        return raw
    if encoding not in ("gzip", "deflate", "x-gzip"):
        raise _ResponseTooLarge(f"unsupported Content-Encoding {encoding!r}")
    wbits = 16 + zlib.MAX_WBITS if "gzip" in encoding else zlib.MAX_WBITS
    d = zlib.decompressobj(wbits)
    out = d.decompress(raw, cap + 1)
    if len(out) > cap or d.unconsumed_tail:
        raise _ResponseTooLarge(f"more than {cap} bytes after {encoding} decoding")
    return out
