"""The trusted harness: a problem's tests run HERE, in the trainer's process; only the agents' code runs sandboxed.

One `TestPass` runs the instrumented `check(candidate)` of a problem once. `candidate` is a proxy: each call sends
its arguments to the entry point's sandboxed process (a `SandboxSession` of the context, agent 1's imports and
agent 2's function) and gets back the returned value as plain data, or the exception as text. That process finds
`aux` defined as a proxy too: each call of it comes back to this process, which forwards it to agent 1's own
sandboxed process (context, agent 2's imports and `aux`; started on the first call), records it and answers. So
this process sees every real call of agent 1's `aux` while agent 2's function runs; agent 2 can shadow the name
(its calls then reach nothing of agent 1's) but cannot forge one.

`aux_use` decides whether the entry point USES `aux`'s result: it replays the tests in a fresh entry-point process
(agent 1's process is kept: it never sees the entry point's state, and in the perturbed test this process chooses
the values the entry point receives) and, in the first test in which `aux` returned a value, replaces `aux`'s
results by different values of the same type (`perturb`); the result is used when the entry point's outcome in that
test changes while everything before it repeats exactly.

Nothing here executes code from a path the sandbox could write: the test code's imports are served from modules
imported before any program ran (`trusted_builtins`), and its `random` is a private, seeded instance built in
memory.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import importlib
import os
import re
import reprlib
import sys
import time
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trl_marl.tasks.code.problem import PreparedProblem
from trl_marl.tasks.sandbox import CallOutcome, SandboxLimits, SandboxSession

__all__ = [
    "DEFAULT_TRUSTED_MODULES",
    "AuxUse",
    "CandidateError",
    "TestOutcome",
    "TestPass",
    "aux_use",
    "perturb",
    "preimport",
    "redact",
]

AUX_NAME = "aux"
# Imported when the evaluator is built, before any program runs; the test code may import only these (and what a
# task adds, e.g. the imports of its own problems).
DEFAULT_TRUSTED_MODULES = (
    "abc",
    "array",
    "bisect",
    "collections",
    "collections.abc",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "itertools",
    "json",
    "math",
    "numbers",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "textwrap",
    "typing",
    "unicodedata",
)


@dataclass
class TestOutcome:
    """One test statement's outcome.

    Attributes:
        source: the test statement (e.g. `assert candidate([1, 2]) == 3`).
        status: "passed", "failed" (assertion failed), "error" (an exception), "timeout" or "not_run".
        detail: the exception, the returned value or why it did not run.
    """

    source: str
    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class _Timeout(BaseException):
    """A test statement ran past its time limit."""


class _Stop(BaseException):
    """No further test runs (too many timeouts, the time limit, the process was lost, or a replay is done)."""


class CandidateError(Exception):
    """The entry point raised (its exception type and message, as text), or returned a value that is not plain
    data, in the sandbox. Raised in the trusted harness where the test called `candidate`."""


def fmt_exception(e: BaseException) -> str:
    if isinstance(e, CandidateError):
        return str(e)
    try:
        msg = str(e)
    except Exception:
        msg = ""
    return type(e).__name__ + (": " + msg[:300] if msg else "")


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 120
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 12
_MAX_DETAIL_CHARS = 500
_STARTUP_S = 2.0  # allowance for starting a sandboxed process, on top of a test's time limit
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL|AUTH", re.I)


def redact(text: str) -> str:
    """`text` with the value of every secret-looking variable of the trainer's environment replaced (defence in
    depth: the sandbox has no access to that environment in the first place)."""
    for name, value in os.environ.items():
        if len(value) >= 6 and _SECRET_NAME.search(name) and value in text:
            text = text.replace(value, "<redacted>")
    return text


def _detail(text: str) -> str:
    """A test outcome's detail: bounded and redacted."""
    return redact(text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 15] + "... (truncated)")


def preimport(names: Iterable[str]) -> frozenset[str]:
    """Import `names` now (those that exist) and return them: the modules the test code may import later."""
    done = set()
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        done.add(name)
    return frozenset(done)


def _private_random(seed: int) -> types.ModuleType:
    """A `random` module of its own, seeded: the shared module's namespace with every function bound to the shared
    instance rebound to a new `Random(seed)` (what `random.py` does for its own instance), built in memory."""
    import random as shared

    module = types.ModuleType("random", shared.__doc__)
    module.__dict__.update({k: v for k, v in vars(shared).items() if k not in ("__name__", "__doc__")})
    instance = shared.Random(seed)
    for name, value in vars(shared).items():
        if getattr(value, "__self__", None) is shared._inst:
            setattr(module, name, getattr(instance, name))
    module._inst = instance
    return module


def trusted_builtins(allowed: frozenset[str], private_seed: int) -> dict:
    """Builtins for the trusted test code: `import` serves only modules of `allowed` that are already imported
    (never a file from disk), and `random` is a private module seeded with `private_seed`, so tests with random
    inputs are reproducible and never touch the trainer's global `random` state."""
    private: dict[str, Any] = {}

    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name == "random":
            if "random" not in private:
                private["random"] = _private_random(private_seed)
            return private["random"]
        if level != 0 or name not in allowed or name not in sys.modules:
            raise ImportError(
                f"the test code may import only modules imported before any program ran, not {name!r} "
                "(CodeEvaluator(trusted_modules=...))"
            )
        module = sys.modules[name]
        if fromlist:
            missing = [a for a in fromlist if a != "*" and not hasattr(module, a)]
            if missing:
                raise ImportError(f"cannot import {missing} from {name!r} (not loaded before the tests)")
            return module
        return sys.modules[name.partition(".")[0]]

    return {**vars(builtins), "__import__": import_}


def perturb(value: Any) -> Any:
    """A value of the same type as `value` that differs from it: its zero / empty value, or, when `value` is that,
    a small non-empty one (`None` becomes 0)."""
    t = type(value)
    if t is bool:
        return not value
    if t in (int, float, complex):
        return t(1) if value == 0 else t(0)
    if t in (str, bytes):
        return t() if value else ("a" if t is str else b"a")
    if t in (list, tuple, set, frozenset):
        return t() if value else t([0])
    if t is dict:
        return {} if value else {0: 0}
    return 0


@dataclass
class _Call:
    """One `candidate` call as seen here: in which test, with what outcome."""

    test: int | None
    status: str
    value: Any = None

    def same(self, other: _Call) -> bool:
        if (self.test, self.status) != (other.test, other.status):
            return False
        if self.status == "value":
            a, b = self.value, other.value
            try:
                return type(a) is type(b) and (a == b or repr(a) == repr(b))
            except Exception:
                return False
        if self.status == "error":  # messages may hold addresses: compare the exception type
            return str(self.value).partition(":")[0] == str(other.value).partition(":")[0]
        return True


@dataclass
class TestPass:
    """One run of a problem's tests against the entry point (`main_program`) and, through the proxy, `aux`
    (`aux_program`, None when agent 1 defined none; `aux_session`: its process, kept from an earlier pass, else
    started on the first call). With `perturb_test=k`, `aux`'s results are perturbed during test k and the pass
    stops after it."""

    limits: SandboxLimits
    test_timeout_s: float
    max_timeouts: int
    trusted_modules: frozenset[str]
    prepared: PreparedProblem
    main_program: str
    aux_program: str | None
    perturb_test: int | None = None
    aux_session: SandboxSession | None = None
    calls: list[_Call] = field(default_factory=list)
    aux_calls: int = 0
    aux_value_tests: list[int] = field(default_factory=list)
    backend: str | None = None

    def __post_init__(self):
        self.deadline = time.monotonic() + self.limits.timeout_s
        self.test_deadline: float | None = None  # None: no test statement is running
        self.current: int | None = None
        self.session: SandboxSession | None = None
        self.aux_error: str | None = None
        self.timeouts = 0
        self.stop_reason: str | None = None
        self.got: Any = None
        self.has_got = False
        self.outcomes: dict[int, TestOutcome] = {}

    def _session(self, program: str, function: str, timeout_s: float, proxies: tuple[str, ...]) -> SandboxSession:
        limits = dataclasses.replace(self.limits, timeout_s=max(timeout_s, 0.001))
        cpu = int(self.limits.timeout_s + 0.999) + 1
        session = SandboxSession(program, function, limits, cpu_time_s=cpu, proxies=proxies)
        self.backend = self.backend or session.backend
        return session

    def _open(self, timeout_s: float) -> str | None:
        """Start the entry point's process (define it); None, or why it could not be defined."""
        session = self._session(self.main_program, self.prepared.entry_point, timeout_s, (AUX_NAME,))
        if session.load_error is not None:
            return session.load_error
        self.session = session
        return None

    def run(self, keep_aux: bool = False) -> tuple[list[TestOutcome], str | None]:
        """(one outcome per test statement, the load error or None). With `keep_aux`, agent 1's process stays
        open in `aux_session` for a replay (the caller closes it)."""
        prepared = self.prepared
        try:
            load_error = self._open(min(self.deadline - time.monotonic(), self.test_timeout_s + _STARTUP_S))
            if load_error is not None:
                load_error = _detail(load_error)
                return [TestOutcome(src, "not_run", f"not run: {load_error}") for src in prepared.tests], load_error
            seed = int(hashlib.sha256(prepared.test_module.encode()).hexdigest()[:8], 16)
            namespace: dict[str, Any] = {
                "__name__": "tests",
                "__builtins__": trusted_builtins(self.trusted_modules, seed),
            }
            try:
                exec(compile(prepared.context, "context.py", "exec"), namespace)
                exec(compile(prepared.test_module, "tests.py", "exec"), namespace)
                namespace.update(
                    {prepared.entry_point: self.candidate},  # a test may name the entry point (HumanEval/33 does)
                    candidate=self.candidate,
                    __t_begin=self.begin,
                    __t_rec=self.record,
                    __t_pass=self.passed,
                    __t_fail=self.failed,
                )
                namespace["check"](self.candidate)
            except _Stop:
                pass
            except _Timeout:  # a call of `candidate` outside the test statements ran out of time
                self.stop_reason = self.stop_reason or "the test code ran out of time"
            except Exception as e:
                self.stop_reason = self.stop_reason or f"the test code failed ({fmt_exception(e)})"
        finally:
            self.close(keep_aux)
        why = _detail(f"not run: {self.stop_reason or 'the tests stopped'}")
        return [self.outcomes.get(k) or TestOutcome(src, "not_run", why) for k, src in enumerate(prepared.tests)], None

    def close(self, keep_aux: bool = False) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        if self.aux_session is not None and not (keep_aux and self.aux_session.alive):
            self.aux_session.close()
            self.aux_session = None

    def candidate(self, *args, **kwargs):
        if self.stop_reason is not None:
            raise _Stop()
        deadline = self.test_deadline
        if deadline is None:  # a call outside the test statements: its own time limit
            deadline = time.monotonic() + self.test_timeout_s
        remaining = min(deadline, self.deadline) - time.monotonic()
        if remaining <= 0:
            raise _Timeout()
        if self.session is None:  # killed by a timeout in an earlier test: a fresh process for this one
            error = self._open(remaining + _STARTUP_S)
            if error is not None:
                self.stop_reason = f"the program could not be defined again ({error})"
                raise _Stop()
            remaining = min(deadline, self.deadline) - time.monotonic()
        out = self.session.call(args, kwargs, max(remaining, 0.001), on_request=self._aux_request)
        self.calls.append(_Call(self.current, out.status, out.value if out.status == "value" else out.error))
        if out.status == "value":
            return out.value
        if out.status == "error":
            raise CandidateError(out.error)
        self.session = None
        if self.aux_session is not None:  # it may be stuck in the call that timed out
            self.aux_session.close()
            self.aux_session = None
        if out.status == "timeout":
            raise _Timeout()
        self.stop_reason = out.error
        raise CandidateError(out.error)

    def _aux_request(self, name: str, args: list, kwargs: dict, clock) -> CallOutcome:
        """Answer the entry point's call of `aux` with agent 1's `aux` (see the module docstring)."""
        if name != AUX_NAME:
            return CallOutcome("error", error=f"NameError: name {name!r} is not defined")
        self.aux_calls += 1
        if self.aux_program is None:
            return CallOutcome("error", error=f"NameError: name {AUX_NAME!r} is not defined")
        if self.aux_session is None and self.aux_error is None:
            started = time.monotonic()
            session = self._session(self.aux_program, AUX_NAME, clock.remaining() + _STARTUP_S, ())
            if session.load_error is not None:
                self.aux_error = f"RuntimeError: agent 1's `{AUX_NAME}` could not be defined: {session.load_error}"
            else:
                self.aux_session = session
            spent = time.monotonic() - started  # starting the process is not the program's time
            clock.extend(spent)
            self.deadline += spent
            if self.test_deadline is not None:
                self.test_deadline += spent
        if self.aux_session is None:
            return CallOutcome("error", error=self.aux_error or "RuntimeError: the helper is not running")
        out = self.aux_session.call(args, kwargs, max(clock.remaining(), 0.001))
        if out.status == "lost":
            self.aux_session = None
            return CallOutcome("error", error=f"RuntimeError: the helper's process ended ({out.error})")
        if out.status == "timeout":
            self.aux_session = None
            return out
        if out.status == "value":
            if self.current is not None and self.current not in self.aux_value_tests:
                self.aux_value_tests.append(self.current)
            if self.perturb_test is not None and self.current == self.perturb_test:
                return CallOutcome("value", perturb(out.value))
        return out

    def begin(self, k: int) -> None:
        self.test_deadline = time.monotonic() + self.test_timeout_s
        self.current = k
        self.got, self.has_got = None, False

    def record(self, value: Any) -> Any:
        self.got, self.has_got = value, True
        return value

    def _end(self, k: int) -> None:
        self.test_deadline, self.current = None, None
        if self.perturb_test is not None and k >= self.perturb_test:
            self.stop_reason = self.stop_reason or "the replay is done"
            raise _Stop()

    def passed(self, k: int) -> None:
        self.outcomes[k] = TestOutcome(self.prepared.tests[k], "passed")
        self._end(k)

    def failed(self, k: int, e: BaseException) -> None:
        source = self.prepared.tests[k]
        if isinstance(e, _Stop):
            raise e
        if isinstance(e, _Timeout):
            self.timeouts += 1
            self.close()
            self.outcomes[k] = TestOutcome(source, "timeout", f"time limit ({self.test_timeout_s:g} s) exceeded")
            if time.monotonic() >= self.deadline:
                self.stop_reason = f"the program's time limit ({self.limits.timeout_s:g} s) was reached"
            elif self.timeouts >= self.max_timeouts:
                self.stop_reason = f"stopped after {self.timeouts} timeouts"
            self._end(k)
            if self.stop_reason is not None:
                raise _Stop()
            return
        detail = fmt_exception(e)
        if self.has_got:
            try:
                got = _REPR.repr(self.got)
            except Exception:
                got = "<unprintable>"
            detail = f"returned {got}" if detail in ("", "AssertionError") else f"{detail} (returned {got})"
        status = "failed" if isinstance(e, AssertionError) else "error"
        self.outcomes[k] = TestOutcome(source, status, _detail(detail))
        self._end(k)
        if self.stop_reason is not None:
            raise _Stop()


@dataclass(frozen=True)
class AuxUse:
    """What the trusted side saw of agent 1's `aux` while the entry point ran the tests.

    Attributes:
        calls: calls of agent 1's `aux` that reached the trusted side.
        used: perturbing `aux`'s results in the first test in which it returned a value changed the entry point's
            outcome in that test, everything before it repeating exactly.
        ignored: `aux` returned a value, and perturbing its results changed nothing (while everything before
            repeated exactly).
    """

    calls: int = 0
    used: bool = False
    ignored: bool = False


def aux_use(first: TestPass, replay: TestPass | None) -> AuxUse:
    """Compare the normal pass `first` with `replay` (the same tests, `perturb_test` set, fresh processes)."""
    if replay is None or replay.perturb_test is None:
        return AuxUse(calls=first.aux_calls)
    k = replay.perturb_test

    def split(calls: list[_Call]) -> tuple[list[_Call], list[_Call]]:
        start = next((i for i, c in enumerate(calls) if c.test == k), len(calls))
        end = start
        while end < len(calls) and calls[end].test == k:
            end += 1
        return calls[:start], calls[start:end]

    before_a, during_a = split(first.calls)
    before_b, during_b = split(replay.calls)
    repeated = len(before_a) == len(before_b) and all(a.same(b) for a, b in zip(before_a, before_b))
    if not repeated or not during_b:  # nondeterministic, or the replay never reached test k: no verdict
        return AuxUse(calls=first.aux_calls)
    changed = len(during_a) != len(during_b) or not all(a.same(b) for a, b in zip(during_a, during_b))
    return AuxUse(calls=first.aux_calls, used=changed, ignored=not changed)
