"""A problem's trusted parts: its context, its test statements and the instrumented `check` that the trusted
harness runs in the trainer's process."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["TRUSTED_COLUMNS", "PreparedProblem", "prepare_problem", "problem_imports", "trusted_problem"]

TRUSTED_COLUMNS = ("problem", "entry_point", "test")


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


def trusted_problem(item: dict) -> str:
    """The item's trusted problem text: its `problem` column (the original problem prompt, which transitions never
    replace). Fails closed: there is no fallback to `item["prompt"]`, which in later turns is a prompt built from the
    agents' own code, and the problem's context runs UNSANDBOXED in the trainer's process (see the package docstring).
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


def problem_imports(items: Iterable[dict]) -> set[str]:
    """The modules that the trusted context and tests of `items` import (absolute imports, with their parent
    packages), for importing them once before any program runs."""
    names: set[str] = set()
    for item in items:
        for source in (item.get("problem") or item.get("prompt") or "", item.get("test") or ""):
            try:
                tree = ast.parse(source)
            except (SyntaxError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found = [node.module]
                else:
                    continue
                for name in found:
                    parts = name.split(".")
                    names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return names
