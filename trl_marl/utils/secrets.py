"""The one place that decides what is a secret in a configuration.

A NAME (an HTTP header, a URL query parameter, a key of `extra_body`, a config field) is secret when one of its words
(split at `-`, `_`, `.`, spaces and camelCase) contains `token`, `secret`, `key`, `auth`, `passw`, `credential`,
`cookie`, `session`, `bearer` or `signature` -- except `tokens`, which counts tokens (`max_tokens`). So `Authorization`,
`X-Api-Key`, `X-Auth-Token`, `Api-Key`, `Cookie`, `?api-key=`, `?access_token=`, `{"api_key": ...}` are secret. A
URL with user info (`https://user:password@host`) carries a secret too.

Configs refuse secrets at construction (`check_no_secrets`: keys come from environment variables, named by
`*_key_env`); `redact_secrets` scrubs anything that slips through before a config is published (`team.json`, model
cards); `secret_values` lists the values to scrub from quoted text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["REDACTED", "check_no_secrets", "find_secrets", "is_secret_name", "redact_secrets", "secret_values"]

REDACTED = "***"
_SECRET_PARTS = ("token", "secret", "key", "auth", "passw", "credential", "cookie", "session", "bearer", "signature")
_NOT_SECRET_WORDS = {"tokens"}  # max_tokens, max_output_tokens: a length
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def is_secret_name(name: str) -> bool:
    """Whether a header / query parameter / body key / field called `name` holds a secret (see the module doc)."""
    for word in _WORDS.findall(str(name)):
        word = word.lower()
        if word not in _NOT_SECRET_WORDS and any(part in word for part in _SECRET_PARTS):
            return True
    return False


def _url_secrets(url: str) -> list[tuple[str, str]]:
    """(where, value) of the secrets in a URL: user info and secret-named query parameters."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = []
    if parts.password:
        found.append(("the URL's user info (user:password@)", parts.password))
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if is_secret_name(name) and value:
            found.append((f"the URL query parameter {name!r}", value))
    return found


def _mapping_secrets(mapping: Any, where: str) -> list[tuple[str, str]]:
    found = []
    if isinstance(mapping, Mapping):
        for name, value in mapping.items():
            if is_secret_name(str(name)) and value not in (None, ""):
                found.append((f"{where} {name!r}", str(value)))
            elif isinstance(value, Mapping):
                found += _mapping_secrets(value, f"{where} {name!r} ->")
    return found


def find_secrets(url: str | None = None, headers: Any = None, extra_body: Any = None) -> list[tuple[str, str]]:
    """Every `(where, value)` secret in a URL, a header mapping and a request-body mapping."""
    found = _url_secrets(url) if isinstance(url, str) else []
    found += _mapping_secrets(headers, "the header")
    found += _mapping_secrets(extra_body, "the extra_body field")
    return found


def secret_values(url: str | None = None, headers: Any = None, extra_body: Any = None) -> list[str]:
    """The secret values found by `find_secrets` (to redact them from text)."""
    return [value for _, value in find_secrets(url, headers, extra_body) if value]


def check_no_secrets(
    prefix: str, url: str | None = None, headers: Any = None, extra_body: Any = None, key_env_field: str = ""
) -> None:
    """Raise `ValueError` when a URL, headers or body fields (config fields `{prefix}_url`, `{prefix}_headers`,
    `{prefix}_extra_body`) carry a secret; the message names where and says to use an environment variable."""
    found = find_secrets(url, headers, extra_body)
    if found:
        places = ", ".join(where for where, _ in found)
        env = f" named by {key_env_field}" if key_env_field else ""
        raise ValueError(
            f"{prefix} settings carry a secret ({places}): secrets never go into a config (it is saved in "
            f"checkpoints, team.json and model cards); put the key in an environment variable{env} instead"
        )


def _redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or not parts.netloc:
        return url
    netloc = parts.netloc
    if parts.password:
        netloc = f"{parts.username}:{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if is_secret_name(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_secrets(value: Any) -> Any:
    """`value` (JSON-like) with every secret replaced by `***`: the values of secret-named mapping keys, and the
    user info and secret-named query parameters of URL strings, recursively."""
    if isinstance(value, str):
        return _redact_url(value) if "://" in value else value
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if is_secret_name(str(k)) and v not in (None, "") else redact_secrets(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_secrets(v) for v in value]
    return value


def redacted_args(args: Any) -> Any:
    """A shallow copy of a config (dataclass) safe to pickle into `training_args.bin`: fields named like a credential
    (`hub_token`, `*_key`, `*_secret`, `*_password`) emptied, every other value passed through `redact_secrets`."""
    import copy
    import dataclasses

    out = copy.copy(args)
    for f in dataclasses.fields(args):
        value = getattr(args, f.name, None)
        if value in (None, "", [], {}):
            continue
        last = f.name.lower().rsplit("_", 1)[-1]
        if last in ("token", "key", "secret", "password", "passwd"):
            object.__setattr__(out, f.name, None)
        elif isinstance(value, (str, list, tuple, Mapping)):
            redacted = redact_secrets(value)
            if redacted != value:
                object.__setattr__(out, f.name, type(value)(redacted) if isinstance(value, tuple) else redacted)
    return out
