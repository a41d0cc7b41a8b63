"""What the agents read: their prompts (role, problem, output format) and, in later turns, the previous round's
results (`feedback_text`, `CodeFeedbackTransition`).

Feedback is built from the trusted results only and cannot forge or leak: every text that came from the agents'
code or its run (an exception message, a returned value, a parse error) is quoted on ONE line with line breaks,
other control characters and lone surrogates escaped, and capped, so it cannot imitate the harness's own lines
(such as a "Results:" line or "- 4 of 4 tests passed."); each agent's code is shown in a fence longer than any run
of backticks it contains; the whole text is valid UTF-8; and the value of every secret-looking variable of the
trainer's environment is redacted as a second line of defence (the sandbox cannot read that environment).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trl_marl.tasks.code.evaluator import AUX_NAME, CodeEvaluation, CodeEvaluator
from trl_marl.tasks.code.harness import redact
from trl_marl.tasks.code.problem import trusted_problem

__all__ = ["CodeFeedbackTransition", "feedback_text", "format_aux", "format_main", "make_formatter", "one_line"]

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


def make_formatter(agent: int, chat: bool):
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


format_aux = make_formatter(0, chat=False)
format_main = make_formatter(1, chat=False)

_MAX_CODE_CHARS = 3000
_MAX_LISTED_TESTS = 5
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_BACKTICKS = re.compile(r"`+")


def utf8(text: str) -> str:
    """`text` as valid UTF-8 text: lone surrogates become `\\udXXX` escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def one_line(text: str, limit: int = 300) -> str:
    """`text` quoted on one line: line breaks, other control characters and lone surrogates escaped (`\\n`,
    `\\x1b`, `\\u2028`, `\\udc80`), at most `limit` characters."""
    text = _UNSAFE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), str(text))
    return text if len(text) <= limit else text[: limit - 15] + "... (truncated)"


def _code_block(code: str) -> str:
    code = utf8(code)
    if len(code) > _MAX_CODE_CHARS:
        code = code[: _MAX_CODE_CHARS - 15] + "\n... (truncated)"
    fence = "`" * max(3, 1 + max((len(m) for m in _BACKTICKS.findall(code)), default=0))
    return f"{fence}python\n{code}\n{fence}"


def feedback_text(ev: CodeEvaluation, agent: int, entry_point: str) -> str:
    """The "previous attempt" section that `CodeFeedbackTransition` shows agent `agent` (0: aux, 1: main)."""
    try:
        return redact(utf8(_feedback_lines(ev, agent, entry_point)))
    except Exception as e:  # never let one joint action's feedback stop the run
        return f"Previous round:\n(the results could not be summarised: {type(e).__name__})"


def _feedback_lines(ev: CodeEvaluation, agent: int, entry_point: str) -> str:
    own, other = (ev.aux, ev.main) if agent == 0 else (ev.main, ev.aux)
    lines = ["Previous round:"]
    for label, fn in (("Your code", own), ("Your teammate's code", other)):
        code = fn.code.strip()
        lines.append(f"{label}:\n{_code_block(code)}" if code else f"{label}: (no `{fn.name}` found)")
    lines.append("")
    lines.append("Results:")
    if not ev.aux.defined:
        error = f" ({one_line(ev.aux.syntax_error)})." if ev.aux.syntax_error else "."
        lines.append(f"- `{AUX_NAME}` was not defined{error}")
    elif not ev.aux.has_return:
        lines.append(f"- `{AUX_NAME}` does not return a value.")
    if not ev.main.defined:
        detail = f" ({one_line(ev.main.syntax_error)})" if ev.main.syntax_error else ""
        lines.append(f"- `{entry_point}` was not defined{detail}, so no test ran.")
    elif ev.syntax_error:
        lines.append(f"- The combined program does not compile: {one_line(ev.syntax_error)}. No test ran.")
    else:
        total = len(ev.tests)
        lines.append(f"- {ev.passed} of {total} tests passed.")
        if ev.load_error:
            lines.append(f"- Defining the functions failed: {one_line(ev.load_error, 500)}")
        failing = [t for t in ev.tests if not t.passed]
        labels = {"failed": "FAILED", "error": "ERROR", "timeout": "TIMEOUT", "not_run": "NOT RUN"}
        for t in failing[:_MAX_LISTED_TESTS]:
            detail = f": {one_line(t.detail)}" if t.detail else ""
            lines.append(f"- {labels.get(t.status, t.status.upper())}: `{one_line(t.source)}`{detail}")
        if len(failing) > _MAX_LISTED_TESTS:
            lines.append(f"- ... and {len(failing) - _MAX_LISTED_TESTS} more failing tests.")
        if ev.aux_result_ignored:
            lines.append(
                f"- `{entry_point}` calls `{AUX_NAME}` but its result does not change what `{entry_point}` returns."
            )
        elif not ev.uses_aux:
            lines.append(f"- `{entry_point}` does not use the result of `{AUX_NAME}`.")
        elif ev.trivial_wrapper:
            lines.append(f"- `{entry_point}` only returns `{AUX_NAME}(...)`; it should do part of the work itself.")
    return "\n".join(lines)


class CodeFeedbackTransition:
    """Multi-turn transition of the coding task: each agent's next prompt is its role instructions, the problem,
    both agents' previous code and the previous round's test results, and the output format.

    Called as `transition(prompt=..., agent_completions=[aux_text, main_text], num_agents=2,
    prompt_history_per_agent=..., response_history_per_agent=..., batch_item=item)`; returns two complete
    prompts (see the package docstring on passthrough). Shares the evaluator's cache with `CodeReward`, so a joint
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
                utf8(
                    _instructions(agent, batch_item)
                    + "\n"
                    + feedback_text(ev, agent, batch_item["entry_point"])
                    + "\n\n"
                    + _output_line(agent, batch_item).replace("Write only", "Write an improved version of only", 1)
                    + "\n"
                )
            )
        return out
