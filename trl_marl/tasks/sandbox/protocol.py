"""The trusted side of a session: the plain-data codec with a bounded decoder, and `SandboxSession`.

A session's process defines a program once and then serves calls of one of its functions: one JSON line per
request and per reply (see `bootstrap`). Every reply is decoded HERE by `decode_value`, which never runs code of the
data and is bounded in size (the reply's byte limit), depth (`MAX_DEPTH`) and time: it refuses values in which more
than `COLLISION_LIMIT` distinct hashable values share one hash, the only way a few bytes of plain data can make set,
dict or `==` work in the trainer quadratic (integers, floats and tuples hash deterministically, so colliding ones are
easy to build).
"""

from __future__ import annotations

import json
import os
import selectors
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trl_marl.tasks.sandbox.launcher import Launched, finish, launch, read_available, wait_exit_no_reap
from trl_marl.tasks.sandbox.policy import SandboxLimits

__all__ = ["COLLISION_LIMIT", "MAX_DEPTH", "CallOutcome", "Clock", "SandboxSession", "decode_value", "encode_value"]

MAX_DEPTH = 24
COLLISION_LIMIT = 8
MAX_REQUESTS_PER_CALL = 100_000
# str and bytes hashes are salted per process (unless PYTHONHASHSEED fixes them): the sandbox cannot aim at them.
_SALTED = (str, bytes) if sys.flags.hash_randomization else ()


def encode_value(value: Any) -> Any:
    """`value` as JSON-ready plain data (`None`, `bool`, `int`, `float`, `complex`, `str`, `bytes`, `list`,
    `tuple`, `dict`, `set`, `frozenset`, recursively); TypeError for anything else, subclasses included."""
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str:
        return value
    if t is list:
        return [encode_value(v) for v in value]
    if t is tuple:
        return {"t": [encode_value(v) for v in value]}
    if t is set:
        return {"s": [encode_value(v) for v in value]}
    if t is frozenset:
        return {"f": [encode_value(v) for v in value]}
    if t is dict:
        return {"d": [[encode_value(k), encode_value(v)] for k, v in value.items()]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [value.real, value.imag]}
    raise TypeError(f"a value of type {t.__name__}; only plain built-in values are accepted")


class _Decoder:
    def __init__(self, max_depth: int, collision_limit: int):
        self.max_depth, self.collision_limit = max_depth, collision_limit
        self.by_hash: dict[int, list] = {}

    def note(self, value: Any) -> None:
        """Count `value` among the distinct values of its hash; ValueError past the collision limit."""
        if isinstance(value, _SALTED):
            return
        try:
            h = hash(value)
        except TypeError:  # a tuple holding a list: it can never be a set element or a dict key
            return
        seen = self.by_hash.get(h)
        if seen is None:
            self.by_hash[h] = [value]
            return
        for other in seen:
            if other is value or other == value:
                return
        seen.append(value)
        if len(seen) > self.collision_limit:
            raise ValueError(f"more than {self.collision_limit} distinct values share one hash")

    def decode(self, data: Any, depth: int) -> Any:
        t = type(data)
        if data is None or t is bool or t is int or t is float or t is str:
            self.note(data)
            return data
        if depth >= self.max_depth:
            raise ValueError(f"the value is nested deeper than {self.max_depth} levels")
        if t is list:
            return [self.decode(v, depth + 1) for v in data]
        if t is dict and len(data) == 1:
            ((tag, body),) = data.items()
            if tag == "b" and type(body) is str:
                value = bytes.fromhex(body)
            elif tag == "c" and type(body) is list and len(body) == 2 and all(type(x) is float for x in body):
                value = complex(body[0], body[1])
            elif type(body) is not list:
                raise ValueError("not an encoded plain value")
            elif tag == "t":
                value = tuple(self.decode(v, depth + 1) for v in body)
            elif tag in ("s", "f"):
                items = [self.decode(v, depth + 1) for v in body]  # each element noted: building the set is linear
                try:
                    value = set(items) if tag == "s" else frozenset(items)
                except TypeError as e:
                    raise ValueError("unhashable set element") from e
            elif tag == "d":
                pairs = []
                for pair in body:
                    if type(pair) is not list or len(pair) != 2:
                        raise ValueError("malformed dict item")
                    pairs.append((self.decode(pair[0], depth + 1), self.decode(pair[1], depth + 1)))
                try:
                    value = dict(pairs)
                except TypeError as e:
                    raise ValueError("unhashable dict key") from e
            else:
                raise ValueError("not an encoded plain value")
            self.note(value)
            return value
        raise ValueError("not an encoded plain value")


def decode_value(data: Any, *, max_depth: int = MAX_DEPTH, collision_limit: int = COLLISION_LIMIT) -> Any:
    """The value that `encode_value` encoded as `data`; ValueError for anything else, for values nested deeper
    than `max_depth`, and for values in which more than `collision_limit` distinct hashable values (at any depth)
    share a hash. Never calls code of the data; time linear in the size of `data` (times the depth for nested
    tuples)."""
    return _Decoder(max_depth, collision_limit).decode(data, 0)


@dataclass(frozen=True)
class CallOutcome:
    """The outcome of one `SandboxSession.call` (or the answer of a request handler).

    Attributes:
        status: "value" (the function returned `value`), "error" (it raised, or returned something that is not
            plain data; `error` says what), "timeout" (no reply in time: the session was killed), or "lost" (the
            sandboxed process ended or broke the protocol: the session was killed; `error` says how).
        value: the decoded return value (status "value").
        error: a bounded description for every other status.
    """

    status: str
    value: Any = None
    error: str = ""


class Clock:
    """The deadline of one `SandboxSession.call`, as its request handler sees it."""

    def __init__(self, timeout_s: float):
        self.deadline = time.monotonic() + timeout_s

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def extend(self, seconds: float) -> None:
        """Give the call `seconds` more: for time the handler spent on something the program did not cause (such as
        starting another sandboxed process)."""
        self.deadline += max(seconds, 0.0)


RequestHandler = Callable[[str, list, dict, Clock], CallOutcome]


class SandboxSession:
    """A sandboxed process that defines `source` and then serves calls of its function `function`.

    The constructor starts the process and waits (at most `limits.timeout_s`) until the program is defined;
    `load_error` is then None, or why defining it failed (the session is closed). Each `call` sends the encoded
    arguments and waits for the reply; a reply is decoded by `decode_value` in this (trusted) process, so the
    sandboxed program can only ever hand back plain values. Use as a context manager or call `close()`; a timed-out
    or broken session is killed at once and stays closed. Not thread-safe: one thread drives one session, and the
    process is SIGKILLed when the thread that created it exits (the parent-death signal follows the thread).

    `proxies` names functions that the program finds defined before it runs and that run in the TRAINER: a call
    of one sends a request during `call(..., on_request=handler)`, and `handler(name, args, kwargs, clock)` answers
    it with a `CallOutcome` ("value" or "error"; "timeout" ends the call as timed out) within `clock.remaining()`.
    """

    def __init__(
        self,
        source: str,
        function: str,
        limits: SandboxLimits | None = None,
        cpu_time_s: int = 60,
        proxies: Sequence[str] = (),
    ):
        self.limits = limits or SandboxLimits()
        self.load_error: str | None = None
        self.backend: str | None = None
        self.isolation: tuple[str, ...] = ()
        self._buf = b""
        self._ready = False
        self._launch_stderr = ""
        self._launched: Launched | None = None
        try:
            self._launched = launch(source, self.limits, function, cpu_time_s, tuple(proxies))
        except (OSError, ValueError, RuntimeError) as e:
            self.load_error = f"could not start the sandbox: {e}"
            return
        self.backend, self.isolation = self._launched.backend, self._launched.isolation
        for fd in (self._launched.proc.stdin.fileno(), self._launched.proc.stdout.fileno()):
            os.set_blocking(fd, False)
        first = self._read_reply(time.monotonic() + self.limits.timeout_s)
        if isinstance(first, CallOutcome):
            self.load_error = "defining the functions took too long" if first.status == "timeout" else first.error
            if self._launch_stderr.strip():
                self.load_error += ": " + _bounded(self._launch_stderr.strip().splitlines()[-1], 300)
            self.close()
        elif first.get("ready") is not True:
            self.load_error = _bounded(str(first.get("load_error", "the program could not be defined")))
            self.close()
        else:
            self._ready = True

    @property
    def alive(self) -> bool:
        return self._launched is not None

    def call(
        self,
        args: Sequence[Any],
        kwargs: dict[str, Any] | None = None,
        timeout_s: float = 1.0,
        on_request: RequestHandler | None = None,
    ) -> CallOutcome:
        """Call the function with `args` / `kwargs` (plain values); wait at most `timeout_s` for the reply,
        answering the program's proxy requests with `on_request` meanwhile (within the same time limit)."""
        if self._launched is None:
            return CallOutcome("lost", error="the sandboxed process is not running")
        try:
            line = json.dumps([encode_value(list(args)), encode_value(dict(kwargs or {}))]) + "\n"
        except (TypeError, ValueError, RecursionError) as e:
            return CallOutcome("error", error=f"the arguments cannot be sent to the sandbox: {e}")
        clock = Clock(timeout_s)
        if not self._write(line.encode("utf-8", "surrogatepass"), clock.deadline):
            return self._lost("timeout", "no reply within the time limit")
        for _ in range(MAX_REQUESTS_PER_CALL + 1):
            reply = self._read_reply(clock.deadline)
            if isinstance(reply, CallOutcome):
                return reply
            keys = set(reply)
            if keys == {"v"}:
                try:
                    return CallOutcome("value", value=decode_value(reply["v"]))
                except (ValueError, RecursionError, MemoryError, OverflowError) as e:
                    return self._lost("lost", f"the reply was not a plain value ({e})")
            if keys == {"e"} and isinstance(reply["e"], str):
                return CallOutcome("error", error=_bounded(reply["e"]))
            if keys != {"q", "a", "k"} or not isinstance(reply["q"], str):
                return self._lost("lost", "the reply was not a plain value")
            answer = self._answer(reply, on_request, clock)
            if answer is None:
                return self._lost("lost", "a request of the program was not a plain value")
            if answer.status == "timeout":
                return self._lost("timeout", "no reply within the time limit")
            try:
                message = {"v": encode_value(answer.value)} if answer.status == "value" else {"e": str(answer.error)}
            except (TypeError, RecursionError) as e:
                message = {"e": f"TypeError: the answer cannot be sent to the sandbox: {e}"}
            if not self._write((json.dumps(message) + "\n").encode("utf-8", "surrogatepass"), clock.deadline):
                return self._lost("timeout", "no reply within the time limit")
        return self._lost("lost", f"more than {MAX_REQUESTS_PER_CALL} requests in one call")

    def _answer(self, request: dict, on_request: RequestHandler | None, clock: Clock) -> CallOutcome | None:
        try:
            args, kwargs = decode_value(request["a"]), decode_value(request["k"])
        except (ValueError, RecursionError, MemoryError, OverflowError):
            return None
        if type(args) is not list or type(kwargs) is not dict or not all(type(k) is str for k in kwargs):
            return None
        if on_request is None:
            return CallOutcome("error", error=f"NameError: name {request['q'][:100]!r} is not available")
        try:
            return on_request(request["q"], args, kwargs, clock)
        except Exception as e:  # the handler's own failure must not leave the program waiting for an answer
            return CallOutcome("error", error=_bounded(f"RuntimeError: the request failed ({type(e).__name__}: {e})"))

    def close(self) -> None:
        """Kill the process (if running) and release everything."""
        if self._launched is not None:
            launched, self._launched = self._launched, None
            finish(launched)

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _lost(self, status: str, error: str) -> CallOutcome:
        returncode = None
        if self._launched is not None:
            wait = time.monotonic() + (0.5 if error.startswith("the program exited") else 0.0)
            if wait_exit_no_reap(self._launched.proc, wait):
                returncode = self._launched.proc.poll()
            if self.load_error is None and not self._ready:  # not started: say why, from the launcher's stderr
                self._launch_stderr = read_available(self._launched.proc.stderr.fileno(), 4096)
        self.close()
        if status == "lost" and returncode is not None and error.startswith("the program exited"):
            error = f"the program exited (status {returncode})"
        return CallOutcome(status, error=error)

    def _write(self, data: bytes, deadline: float) -> bool:
        fd = self._launched.proc.stdin.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while data:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    return False
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    continue
                except OSError:  # the process is gone: the read that follows reports it
                    return True
        return True

    def _read_reply(self, deadline: float) -> dict | CallOutcome:
        fd = self._launched.proc.stdout.fileno()
        limit = self.limits.max_output_bytes
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                if len(self._buf) > limit:
                    return self._lost("lost", f"the reply exceeded {limit} bytes")
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    return self._lost("timeout", "no reply within the time limit")
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return self._lost("lost", "the program exited")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        if len(line) > limit:
            return self._lost("lost", f"the reply exceeded {limit} bytes")
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError, MemoryError):
            return self._lost("lost", "the reply was not a plain value")
        if not isinstance(reply, dict):
            return self._lost("lost", "the reply was not a plain value")
        return reply


def _bounded(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 15] + "... (truncated)"
