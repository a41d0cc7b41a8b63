"""Extracting each agent's function from its completion, in time linear in the completion's length.

Candidates, in order: each fenced ```python (or unlabelled) block, the text from its first line that starts with
`def`, `import`, `from` or a decorator, and the whole text. The first candidate that parses and defines the function
at top level wins; failing that, the first whose longest parsing prefix of whole top-level lines (trailing prose or a
truncated tail cut off, guided by the parser's error line, at most `MAX_PREFIX_ATTEMPTS` parses) defines it.
Otherwise the first candidate that attempts `def name(` is returned, undefined, with its syntax error.

A parse that fails in any way (SyntaxError, but also RecursionError or MemoryError on degenerate text) only means
"this candidate does not parse". Errors after a successful parse (e.g. `ast.unparse` of a pathologically deep
expression) propagate: the evaluator scores the completion as failing and counts the error.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

__all__ = ["MAX_PREFIX_ATTEMPTS", "ExtractedFunction", "extract_function", "is_trivial_wrapper"]

MAX_PREFIX_ATTEMPTS = 8
_CODE_START = re.compile(r"^(?:from\s|import\s|def\s|async[ \t]+def\s|@)", re.M)
_PYTHON_LANGS = ("", "python", "python3", "py")


@dataclass
class ExtractedFunction:
    """One agent's function, as extracted from its completion.

    Attributes:
        name: the function looked for.
        defined: a parsing candidate defines `name` at top level.
        code: the imports and the function (normalised with `ast.unparse`) when defined; the raw candidate text
            when the agent attempted `def name` but it does not parse; else "".
        imports: the candidate's top-level imports (normalised), when defined.
        has_return: the function contains `return <value>` outside nested functions.
        syntax_error: the parse error of the attempted definition (or why the completion could not be processed).
        parse_errors: the types of the exceptions other than SyntaxError that parsing a candidate raised
            (RecursionError, MemoryError, ValueError for NUL bytes, UnicodeEncodeError for lone surrogates...).
        node: the function's AST node when defined.
    """

    name: str
    defined: bool = False
    code: str = ""
    imports: str = ""
    has_return: bool = False
    syntax_error: str | None = None
    parse_errors: list[str] = field(default_factory=list)
    node: ast.FunctionDef | ast.AsyncFunctionDef | None = field(default=None, repr=False)


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block: "```lang ...\\n" up to the next "```" or the end. One pass."""
    blocks = []
    pos, n = 0, len(text)
    while (start := text.find("```", pos)) >= 0:
        p = start + 3
        while p < n and text[p] in " \t":
            p += 1
        q = p
        while q < n and text[q].isascii() and (text[q].isalnum() or text[q] in "_+-"):
            q += 1
        newline = text.find("\n", q)
        if newline < 0:  # no line break after this opener, so none after any later one either
            break
        end = text.find("```", newline + 1)
        blocks.append((text[p:q], text[newline + 1 :] if end < 0 else text[newline + 1 : end]))
        if end < 0:
            break
        pos = end + 3
    return blocks


def _candidates(text: str) -> list[str]:
    out = [body for lang, body in _fenced_blocks(text) if lang.lower() in _PYTHON_LANGS and body.strip()]
    m = _CODE_START.search(text)
    if m is not None:
        out.append(text[m.start() :])
    out.append(text)
    return out


def _parse(code: str) -> ast.Module | Exception:
    try:
        return ast.parse(code)
    except Exception as e:  # SyntaxError, ValueError (NUL bytes, surrogates), RecursionError, MemoryError...
        return e


def _top_level(line: str) -> bool:
    return bool(line.strip()) and not line[:1].isspace()


def _parse_clean_prefix(code: str, error: Exception) -> ast.Module | None:
    """The longest prefix of whole lines that parses and ends right before a top-level line (so no function body
    is cut in the middle), searched downwards from the parser's error line; None when none is found within
    `MAX_PREFIX_ATTEMPTS` parses."""
    lines = code.split("\n")
    bound = len(lines)
    for _ in range(MAX_PREFIX_ATTEMPTS):
        lineno = getattr(error, "lineno", None)
        cut = min(bound, lineno if isinstance(lineno, int) and lineno >= 1 else bound) - 1
        while cut >= 1 and not (cut < bound and _top_level(lines[cut])):
            cut -= 1
        if cut < 1:
            return None
        result = _parse("\n".join(lines[:cut]))
        if isinstance(result, ast.Module):
            return result
        error, bound = result, cut
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


def describe_syntax_error(e: BaseException) -> str:
    """A one-line description of a parse or compile error."""
    if isinstance(e, SyntaxError):
        where = f"line {e.lineno}" if e.lineno else "unknown line"
        return f"SyntaxError ({where}): {e.msg}"
    message = str(e)
    return f"{type(e).__name__}: {message[:200]}" if message else type(e).__name__


def extract_function(text: str, name: str) -> ExtractedFunction:
    """Find the top-level function `name` in a completion (see the module docstring and `ExtractedFunction`)."""
    text = text or ""
    defining = re.compile(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", re.M)
    attempt: ExtractedFunction | None = None
    failed: list[tuple[str, Exception]] = []
    for cand in _candidates(text):
        result = _parse(cand)
        if isinstance(result, ast.Module):
            fn = _top_def(result, name)
            if fn is not None:
                return _defined(result, fn, name, _unusual(failed))
            continue
        failed.append((cand, result))
        if attempt is None and defining.search(cand):
            attempt = ExtractedFunction(name=name, code=cand, syntax_error=describe_syntax_error(result))
    for cand, error in list(failed):
        module = _parse_clean_prefix(cand, error) if defining.search(cand) else None
        fn = _top_def(module, name) if module is not None else None
        if fn is not None:
            return _defined(module, fn, name, _unusual(failed))
    found = attempt or ExtractedFunction(name=name)
    found.parse_errors = _unusual(failed)
    return found


def _unusual(failed: list[tuple[str, Exception]]) -> list[str]:
    return sorted({type(e).__name__ for _, e in failed if not isinstance(e, SyntaxError)})


def _defined(module: ast.Module, fn, name: str, parse_errors: list[str]) -> ExtractedFunction:
    imports = [
        ast.unparse(n)
        for n in module.body
        if isinstance(n, ast.Import) or (isinstance(n, ast.ImportFrom) and n.module != "__future__")
    ]
    code = "\n".join([*imports, "", ast.unparse(fn)] if imports else [ast.unparse(fn)])
    return ExtractedFunction(
        name=name,
        defined=True,
        code=code,
        imports="\n".join(imports),
        has_return=_returns_value(fn),
        parse_errors=parse_errors,
        node=fn,
    )


def is_trivial_wrapper(fn: ast.AST, helper: str) -> bool:
    """The function's body, docstring and `pass` aside, is a single `return helper(...)`."""
    body = list(getattr(fn, "body", []))
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0].value, "value", None), str):
        body = body[1:]
    body = [s for s in body if not isinstance(s, ast.Pass)]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Call)
        and isinstance(body[0].value.func, ast.Name)
        and body[0].value.func.id == helper
    )
