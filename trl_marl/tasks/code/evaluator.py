"""Scoring joint actions: extraction, the level-gated reward, a bounded cache, and the guarantee that no completion
can stop the run (any exception while scoring one scores it as failing and is counted in `scoring_errors`)."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from trl_marl.tasks.code.extract import ExtractedFunction, describe_syntax_error, extract_function, is_trivial_wrapper
from trl_marl.tasks.code.harness import AUX_NAME, DEFAULT_TRUSTED_MODULES, TestOutcome, TestPass, aux_use, preimport
from trl_marl.tasks.code.problem import PreparedProblem, prepare_problem, trusted_problem
from trl_marl.tasks.sandbox import SandboxLimits, SandboxUnavailable, isolation_support

__all__ = ["AUX_NAME", "LEVELS", "MAX_REWARD", "CodeEvaluation", "CodeEvaluator"]

logger = logging.getLogger("trl_marl.tasks.code")

# Level values of the joint reward (see the package docstring's table).
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


@dataclass
class CodeEvaluation:
    """Everything the reward and the feedback transition know about one joint action.

    Attributes:
        aux, main: the extracted functions of agent 1 and agent 2.
        program: the combined program whose compilation level 3 checks (context + aux + entry point), or "".
        syntax_error: why the combined program did not compile, else None.
        tests: one `TestOutcome` per test statement (empty when no test ran).
        load_error: an error while defining the entry point in the sandbox, else None.
        aux_calls: calls of agent 1's `aux` that reached the trusted side while the tests ran.
        uses_aux, aux_result_ignored: the entry point's use of `aux`'s result, judged by behaviour (see the package
            docstring); trivial_wrapper: its shape (a single `return aux(...)`).
        backend: the sandbox backend the program ran under ("bwrap", "unshare" or "none"), when it ran.
        scoring_errors: errors raised while scoring this joint action ("stage/ExceptionType"); it then scores as
            failing from that stage on.
        breakdown: level name -> value earned (see `LEVELS`).
    """

    aux: ExtractedFunction
    main: ExtractedFunction
    program: str = ""
    syntax_error: str | None = None
    tests: list[TestOutcome] = field(default_factory=list)
    load_error: str | None = None
    aux_calls: int = 0
    uses_aux: bool = False
    aux_result_ignored: bool = False
    trivial_wrapper: bool = False
    backend: str | None = None
    scoring_errors: list[str] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def reward(self) -> float:
        return float(sum(self.breakdown.values()))


def check_sandbox(backend: str, allow_weak_sandbox: bool) -> str:
    """The sandbox backend the task's programs will run under; raises `SandboxUnavailable` (naming what is missing
    and how to install it) when that is not the strong sandbox and the weak one was not explicitly allowed. A weak
    backend is warned about once per process by the sandbox (unsafe for reinforcement learning)."""
    try:
        name, _ = isolation_support(backend, allow_weak_sandbox=allow_weak_sandbox)
    except (SandboxUnavailable, ValueError) as e:
        raise SandboxUnavailable(
            f"the code task runs model-written programs and needs the strong sandbox, which cannot run here: {e}. "
            "To run it anyway under a weak sandbox (no kernel boundary against native code; unsafe for "
            "reinforcement learning), pass allow_weak_sandbox=True"
        ) from e
    return name


class CodeEvaluator:
    """Extracts, assembles, runs and scores (aux, entry point) pairs; keeps a bounded cache of evaluations so that
    the reward and the feedback transition of the same joint action run it once.

    Args:
        test_timeout_s: time limit of each test statement (and of defining the functions).
        max_timeouts: stop running a program's tests after this many timed-out tests (the rest count as failed).
        timeout_s: wall-clock limit of one pass over a program's tests (tests not reported by then count as failed).
        max_workers: programs run in parallel (default: CPUs, at most 8).
        memory_bytes: address-space limit of each sandboxed process.
        max_output_bytes: the largest reply (one returned value, encoded) accepted from the sandboxed process.
        cache_size: evaluations kept (least recently used are dropped).
        backend: the sandbox backend ("auto", "bwrap", "unshare" or "none"; see `trl_marl.tasks.sandbox`).
        allow_weak_sandbox: accept a weak sandbox where the strong one cannot run (unsafe for RL; one warning per
            process). Without it, construction raises `SandboxUnavailable` naming what is missing. `self.backend`
            is the backend the programs will run under.
        trusted_modules: modules the problems' test code may import; imported here, before any program runs.
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
        allow_weak_sandbox: bool = False,
        trusted_modules: Sequence[str] = DEFAULT_TRUSTED_MODULES,
    ):
        if not test_timeout_s > 0 or not timeout_s > 0 or not max_timeouts >= 1:
            raise ValueError(
                f"test_timeout_s and timeout_s must be > 0 and max_timeouts >= 1, got test_timeout_s={test_timeout_s}"
                f", timeout_s={timeout_s}, max_timeouts={max_timeouts}"
            )
        if max_workers is not None and (not isinstance(max_workers, int) or max_workers < 1):
            raise ValueError(f"max_workers must be None or an int >= 1, got {max_workers!r}")
        self.test_timeout_s = float(test_timeout_s)
        self.max_timeouts = int(max_timeouts)
        self.max_workers = max_workers
        self.limits = SandboxLimits(
            timeout_s=timeout_s,
            memory_bytes=memory_bytes,
            max_output_bytes=max_output_bytes,
            backend=backend,
            allow_weak_sandbox=allow_weak_sandbox,
        )
        self.backend = check_sandbox(backend, allow_weak_sandbox)
        self.trusted_modules = preimport([*DEFAULT_TRUSTED_MODULES, *trusted_modules])
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, CodeEvaluation] = OrderedDict()
        self._lock = threading.Lock()
        self._errors: Counter[str] = Counter()
        self._errors_since: Counter[str] = Counter()

    # ----------------------------------------------------------------------------------------------------------
    # scoring errors

    @property
    def scoring_errors(self) -> dict[str, int]:
        """Errors raised while scoring completions since construction, by "stage/ExceptionType"."""
        with self._lock:
            return dict(self._errors)

    def drain_metrics(self) -> dict[str, float]:
        """Scoring errors since the last call, as metrics: `code/scoring_errors` (all) and
        `code/scoring_errors/<stage>/<ExceptionType>`."""
        with self._lock:
            since, self._errors_since = self._errors_since, Counter()
        out = {"code/scoring_errors": float(sum(since.values()))}
        out.update({f"code/scoring_errors/{k}": float(v) for k, v in sorted(since.items())})
        return out

    def _count(self, stage: str, e: BaseException) -> str:
        """Count a scoring error; its reason "stage/ExceptionType"."""
        logger.debug("scoring a completion failed at %s: %r", stage, e)
        return self._count_reason(f"{stage}/{type(e).__name__}")

    def _count_reason(self, reason: str) -> str:
        with self._lock:
            self._errors[reason] += 1
            self._errors_since[reason] += 1
        return reason

    def _failed(self, ev: CodeEvaluation, stage: str, e: BaseException) -> str:
        ev.scoring_errors.append(self._count(stage, e))
        return f"{type(e).__name__} while scoring ({stage})"

    # ----------------------------------------------------------------------------------------------------------
    # evaluation

    @staticmethod
    def _key(item: dict, aux_text: str, main_text: str) -> tuple:
        digest = hashlib.sha256(
            "\0".join([trusted_problem(item), item["entry_point"], item["test"]]).encode("utf-8", "surrogatepass")
        ).hexdigest()
        return digest, aux_text, main_text

    def evaluate(
        self, aux_texts: Sequence[str], main_texts: Sequence[str], items: Sequence[dict]
    ) -> list[CodeEvaluation]:
        """Evaluate joint actions `(aux_texts[i], main_texts[i])` on `items[i]`; programs run in parallel.

        Raises only for the caller's mistakes (lengths that differ, items without the trusted columns); anything
        a completion causes scores that completion as failing (`CodeEvaluation.scoring_errors`)."""
        if not len(aux_texts) == len(main_texts) == len(items):
            raise ValueError(
                f"got {len(aux_texts)} agent-1 completions, {len(main_texts)} agent-2 completions and "
                f"{len(items)} batch items; they must have the same length"
            )
        results: list[CodeEvaluation | None] = [None] * len(items)
        keys = [self._key(item, a, m) for item, a, m in zip(items, aux_texts, main_texts)]
        prepared = [prepare_problem(item) for item in items]
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
            ev, job = self._stage(aux_texts[i], main_texts[i], prepared[i])
            staged.append((key, idx, ev, job))
        to_run = [(ev, job) for _, _, ev, job in staged if job is not None]
        workers = max(1, min(self.max_workers or min(os.cpu_count() or 1, 8), len(to_run) or 1))
        if workers == 1:
            for ev, job in to_run:
                self._run(ev, *job)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trl_marl_code") as pool:
                list(pool.map(lambda task: self._run(task[0], *task[1]), to_run))
        with self._lock:
            for key, idx, ev, _ in staged:
                for i in idx:
                    results[i] = ev
                self._cache[key] = ev
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return results  # type: ignore[return-value]

    def _extract(self, text: str, name: str, errors: list[str]) -> ExtractedFunction:
        try:
            found = extract_function(text, name)
            for kind in found.parse_errors:  # not a SyntaxError: the parser itself gave up on the text
                errors.append(self._count_reason(f"parse/{kind}"))
            return found
        except Exception as e:  # e.g. RecursionError in ast.unparse of a pathologically deep function
            errors.append(self._count("extract", e))
            why = f"{type(e).__name__} while scoring (extract)"
            return ExtractedFunction(name=name, syntax_error=f"the completion could not be processed: {why}")

    def _stage(self, aux_text: str, main_text: str, prepared: PreparedProblem) -> tuple[CodeEvaluation, tuple | None]:
        """Levels 1 to 3, and what `_run` needs (None when no test can run)."""
        errors: list[str] = []
        ev = CodeEvaluation(
            aux=self._extract(aux_text, AUX_NAME, errors), main=self._extract(main_text, prepared.entry_point, errors)
        )
        ev.scoring_errors.extend(errors)
        if ev.aux.defined and ev.aux.has_return:
            ev.breakdown["aux_defined"] = LEVELS["aux_defined"]
        if not ev.main.defined:
            return ev, None
        ev.breakdown["main_defined"] = LEVELS["main_defined"]
        try:
            ev.program = "\n\n\n".join(p for p in (prepared.context, ev.aux.code, ev.main.code) if p.strip())
            try:
                compile(ev.program, "solution.py", "exec")
            except (SyntaxError, ValueError) as e:
                ev.syntax_error = describe_syntax_error(e)
                if ev.aux.syntax_error:
                    ev.syntax_error = f"agent 1's `{AUX_NAME}`: {ev.aux.syntax_error}"
                return ev, None
            main_program = "\n\n\n".join(p for p in (prepared.context, ev.aux.imports, ev.main.code) if p.strip())
            aux_program = None
            if ev.aux.defined:
                aux_program = "\n\n\n".join(p for p in (prepared.context, ev.main.imports, ev.aux.code) if p.strip())
            ev.trivial_wrapper = is_trivial_wrapper(ev.main.node, AUX_NAME)
        except Exception as e:  # e.g. RecursionError or MemoryError compiling a degenerate program
            ev.syntax_error = self._failed(ev, "compile", e)
            return ev, None
        ev.breakdown["syntax"] = LEVELS["syntax"]
        return ev, (prepared, main_program, aux_program)

    def _pass(self, prepared: PreparedProblem, main_program: str, aux_program: str | None, **options) -> TestPass:
        return TestPass(
            limits=self.limits,
            test_timeout_s=self.test_timeout_s,
            max_timeouts=self.max_timeouts,
            trusted_modules=self.trusted_modules,
            prepared=prepared,
            main_program=main_program,
            aux_program=aux_program,
            **options,
        )

    def _run(self, ev: CodeEvaluation, prepared: PreparedProblem, main_program: str, aux_program: str | None) -> None:
        """Run the tests (trusted, here) against the program (sandboxed) and score levels 4 to 6."""
        first = replay = None
        try:
            first = self._pass(prepared, main_program, aux_program)
            ev.tests, ev.load_error = first.run(keep_aux=True)
            ev.backend = first.backend
            if first.aux_value_tests:
                kept, first.aux_session = first.aux_session, None
                replay = self._pass(
                    prepared, main_program, aux_program, perturb_test=first.aux_value_tests[0], aux_session=kept
                )
                replay.run()
            use = aux_use(first, replay)
        except Exception as e:
            why = self._failed(ev, "run", e)
            ev.tests = [TestOutcome(src, "error", why) for src in prepared.tests]
            return
        finally:
            for done in (first, replay):
                if done is not None:
                    done.close()
        ev.aux_calls, ev.uses_aux, ev.aux_result_ignored = use.calls, use.used, use.ignored
        total = len(ev.tests)
        ev.breakdown["tests"] = LEVELS["tests"] * (ev.passed / total if total else 0.0)
        if ev.aux_result_ignored:
            ev.breakdown["aux_result_ignored"] = LEVELS["aux_result_ignored"]
        if ev.uses_aux and ev.aux.defined and ev.passed >= 1:
            ev.breakdown["uses_aux"] = LEVELS["uses_aux"]
            if not ev.trivial_wrapper:
                ev.breakdown["not_trivial_wrapper"] = LEVELS["not_trivial_wrapper"]
