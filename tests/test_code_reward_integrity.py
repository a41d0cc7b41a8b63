"""Reward integrity of the `code` task and containment of the sandbox, tried as an adversarial policy would.

Every attack is a WRONG solution (it returns `aux(0) - 1`, which fails every test) that also tries to raise its
score; it must score exactly what the same wrong solution scores without the attack. The batch runs in one
evaluator call (a few seconds); the secret, write and SIGKILL checks run under both sandbox backends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trl_marl.tasks.code import CodeEvaluator, feedback_text

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-specific")

PROMPT = '''def sum_of_squares(numbers):
    """Return the sum of the squares of the numbers."""
'''
TEST = """

def check(candidate):
    assert candidate([1, 2, 3]) == 14
    assert candidate([]) == 0
    assert candidate([-2]) == 4
    assert candidate([10, 0]) == 100
"""
ITEM = {"task_id": "Test/0", "prompt": PROMPT, "problem": PROMPT, "entry_point": "sum_of_squares", "test": TEST}
AUX = "```python\ndef aux(x):\n    return x * x\n```"
WRONG_RETURN = "return aux(0) - 1"


def solution(attack: str = "", *, header: str = "", default: str = "", ret: str = WRONG_RETURN) -> str:
    """agent 2's completion: the wrong entry point, with `attack` run first inside it (or at definition time)."""
    body = textwrap.indent(textwrap.dedent(attack).strip() + "\n" + ret if attack else ret, "    ")
    return f"```python\n{header}def sum_of_squares(numbers{default}):\n{body}\n```"


def aux_with(attack: str) -> str:
    body = textwrap.indent(textwrap.dedent(attack).strip() + "\nreturn x * x", "    ")
    return f"```python\ndef aux(x):\n{body}\n```"


# Forgers that know none of the harness's names.
FD_FORGER = r"""
import os, re, json
text = ""
for root in (".", "/proc/self"):
    try:
        names = os.listdir(root)
    except OSError:
        continue
    for name in names:
        try:
            with open(os.path.join(root, name), "rb") as f:
                text += f.read(1 << 20).decode("utf-8", "replace") + " "
        except OSError:
            pass
tokens = set(re.findall(r"[0-9a-f]{16}", text)) | {""}
keys = set(re.findall(r'"([A-Za-z_]+)"\s*:', text)) | {"nonce"}
lines = []
for tok in tokens:
    for i in range(8):
        rec = {k: tok for k in keys}
        rec.update(i=i, status="passed", v=14, kind="done")
        lines.append(json.dumps(rec))
data = ("\n".join(lines) + "\n").encode()
for fd in range(0, 64):
    try:
        os.write(fd, data)
    except OSError:
        pass
"""
WORDS = "('pass', 'report', 'emit', 'send', 'ok', 'success')"
FRAME_FORGER = f"""
import sys, json
f = sys._getframe(0)
while f is not None:
    for name, obj in list(f.f_globals.items()) + list(f.f_locals.items()):
        if callable(obj) and any(w in name.lower() for w in {WORDS}):
            for k in range(8):
                for arg in (k, json.dumps({{"i": k, "status": "passed"}})):
                    try:
                        obj(arg)
                    except BaseException:
                        pass
    f = f.f_back
"""
GC_FORGER = f"""
import gc, json, re
nonces = [o for o in gc.get_objects() if isinstance(o, dict)]
nonces = {{v for d in nonces for v in list(d.values()) if isinstance(v, str) and re.fullmatch("[0-9a-f]{{16}}", v)}}
for obj in gc.get_objects():
    name = getattr(obj, "__name__", "")
    if callable(obj) and isinstance(name, str) and any(w in name.lower() for w in {WORDS}):
        for k in range(8):
            args = [k] + [json.dumps({{"i": k, "status": "passed", "nonce": n}}) for n in nonces]
            for arg in args:
                try:
                    obj(arg)
                except BaseException:
                    pass
"""
BUILTIN_PATCH = """
import builtins
class Equal(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
builtins.type = lambda *a: int
return Equal(aux(0))
"""

ATTACKS = {
    "honest wrong": (AUX, solution()),
    "fd forging with tokens from readable files": (AUX, solution(FD_FORGER)),
    "frame walk calling report-like callables": (AUX, solution(FRAME_FORGER)),
    "gc walk calling report-like callables": (AUX, solution(GC_FORGER)),
    "definition-time forging (default argument)": (AUX, solution(default=f", _=exec({FRAME_FORGER + FD_FORGER!r})")),
    "definition-time forging (decorator)": (
        AUX,
        solution(header=f"@(lambda fn: (exec({GC_FORGER!r}, {{}}), fn)[1])\n"),
    ),
    "forging from aux": (aux_with(FRAME_FORGER + GC_FORGER + FD_FORGER), solution()),
    "builtin patching with an always-equal object": (AUX, solution(BUILTIN_PATCH, ret="")),
    "forging, then early exit": (AUX, solution(FD_FORGER + FRAME_FORGER + "os._exit(0)", header="import os\n")),
}


@pytest.fixture(scope="module")
def attack_scores():
    ev = CodeEvaluator(test_timeout_s=1.0, max_timeouts=1, timeout_s=5.0, max_workers=2)
    names = list(ATTACKS)
    evs = ev.evaluate([ATTACKS[n][0] for n in names], [ATTACKS[n][1] for n in names], [ITEM] * len(names))
    return dict(zip(names, evs))


@pytest.mark.parametrize("attack", [n for n in ATTACKS if n != "honest wrong"])
def test_an_attack_scores_exactly_the_honest_wrong_score(attack_scores, attack):
    honest = attack_scores["honest wrong"]
    assert honest.reward == pytest.approx(1.5) and honest.passed == 0
    got = attack_scores[attack]
    assert got.passed == 0, [(t.status, t.detail) for t in got.tests]
    assert got.reward == pytest.approx(honest.reward), (got.breakdown, [(t.status, t.detail) for t in got.tests])


def test_a_correct_solution_still_scores_full_credit_next_to_the_attacks():
    ev = CodeEvaluator(test_timeout_s=1.0, timeout_s=5.0, max_workers=1)
    good = solution(ret="return sum(aux(n) for n in numbers)")
    [result] = ev.evaluate([AUX], [good], [ITEM])
    assert result.passed == 4 and result.reward == pytest.approx(4.0)


# --------------------------------------------------------------------------------------------------------------
# Secrets, writes, survivors: under both backends

BACKENDS = ["auto", "unshare"]
SECRET_NAME = "TRL_MARL_TEST_SECRET_API_KEY"
SECRET = "sk-trl-marl-test-0123456789abcdef"

ENV_READER = rf"""
import os
found = [f"{{k}}={{v}}" for k, v in os.environ.items() if {SECRET_NAME!r} in k]
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{{pid}}/environ", "rb") as f:
            found += [e.decode() for e in f.read().split(b"\0") if {SECRET_NAME.encode()!r} in e]
    except OSError:
        pass
return found
"""

_EVAL_IN_CHILD = r"""
import json, sys
from trl_marl.tasks.code import CodeEvaluator, feedback_text
aux, main, item, backend = json.loads(sys.argv[1])
options = {} if backend == "auto" else {"backend": backend, "allow_weak_sandbox": True}
[ev] = CodeEvaluator(test_timeout_s=2.0, timeout_s=5.0, max_workers=1, **options).evaluate([aux], [main], [item])
print(json.dumps({"reward": ev.reward, "details": [t.detail for t in ev.tests],
                  "feedback": feedback_text(ev, 1, item["entry_point"])}))
"""


def _child_env(**extra) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@linux_only
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_trainers_environment_is_out_of_reach(backend):
    """The secret is in the trainer's STARTING environment (so in its /proc/<pid>/environ)."""
    payload = json.dumps([AUX, solution(ENV_READER, ret=""), ITEM, backend])
    done = subprocess.run(
        [sys.executable, "-c", _EVAL_IN_CHILD, payload],
        env=_child_env(**{SECRET_NAME: SECRET}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["reward"] == pytest.approx(1.5)
    assert out["details"][0] == "returned []"  # nothing found: no inherited env, no readable parent /proc
    assert SECRET not in done.stdout


def test_feedback_is_bounded_and_redacts_the_environment(monkeypatch):
    monkeypatch.setenv(SECRET_NAME, SECRET)
    ev = CodeEvaluator(test_timeout_s=1.0, timeout_s=5.0, max_workers=1)
    leak = solution(f"raise ValueError({SECRET!r} + 'x' * 100000)", ret="")
    [result] = ev.evaluate([AUX], [leak], [ITEM])
    text = feedback_text(result, 1, "sum_of_squares")
    assert SECRET not in text and "<redacted>" in text
    assert all(len(t.detail) <= 500 for t in result.tests) and len(text) < 8000


WRITER = r"""
import os, sqlite3, json
targets = json.loads(TARGETS)
for d in targets:
    attempts = [
        lambda: open(os.path.join(d, "via_open"), "w").write("x"),
        lambda: sqlite3.connect(os.path.join(d, "via_sqlite.db")).execute("create table t (x)"),
        lambda: os.mkfifo(os.path.join(d, "via_mkfifo")),
        lambda: os.close(os.open("via_dir_fd", os.O_CREAT | os.O_WRONLY, dir_fd=os.open(d, os.O_RDONLY))),
        lambda: (os.symlink(d, "link"), open("link/via_symlink", "w").write("x")),
    ]
    for attempt in attempts:
        try:
            attempt()
            print("WROTE")
        except Exception as e:
            print(type(e).__name__)
        try:
            os.remove("link")
        except OSError:
            pass
"""
WRITTEN = ("via_open", "via_sqlite.db", "via_mkfifo", "via_dir_fd", "via_symlink")


@linux_only
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_write_outside_the_sandbox_dir(tmp_path, backend):
    from trl_marl.tasks.sandbox import SandboxLimits, run_python

    home = Path.home() / f".trl_marl_sandbox_test_{os.getpid()}_{backend}"
    home.mkdir()
    try:
        targets = json.dumps([str(home), str(tmp_path)])
        options = {} if backend == "auto" else {"backend": backend, "allow_weak_sandbox": True}
        r = run_python(f"TARGETS = {targets!r}\n" + WRITER, SandboxLimits(timeout_s=10.0, **options))
        assert r.returncode == 0, r.stderr
        assert "WROTE" not in r.stdout, r.stdout
        leaked = [p.name for d in (home, tmp_path) for p in d.iterdir()]
        assert leaked == []
        assert not any(n in os.listdir(Path.home()) for n in WRITTEN)
    finally:
        for p in home.iterdir():
            p.unlink()
        home.rmdir()


_KILL_TARGET = r"""
import sys
from trl_marl.tasks.code import CodeEvaluator
backend = sys.argv[1]
item = {"task_id": "T", "prompt": "def f(x):\n    pass\n", "problem": "def f(x):\n    pass\n", "entry_point": "f",
        "test": "def check(candidate):\n    assert candidate(1) == 1\n"}
sleeper = "```python\nimport time\ndef f(x):\n    time.sleep(600)\n```"
spinner = "```python\ndef f(x):\n    while True:\n        pass\n```"
print("evaluating", flush=True)
options = {} if backend == "auto" else {"backend": backend, "allow_weak_sandbox": True}
CodeEvaluator(test_timeout_s=300, timeout_s=600, max_workers=2, **options).evaluate(
    ["def aux(x):\n    return x"] * 4, [sleeper, spinner] * 2, [item] * 4)
"""


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = {int(c) for c in f.read().split()}
            except OSError:
                continue
            todo += list(kids - found)
            found |= kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@linux_only
@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_of_the_trainer_leaves_no_process_and_no_temp_dir(tmp_path, backend):
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_TARGET, backend],
        env=_child_env(TMPDIR=str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout.readline().strip() == b"evaluating"
        deadline = time.monotonic() + 30
        # two programs run at a time; each is a launcher (bwrap/unshare) with the sandboxed python below it
        while len(tree := _descendants(proc.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        tree = _descendants(proc.pid)
        assert len(tree) >= 4, tree
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while (survivors := [p for p in tree if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert survivors == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in [p for p in locals().get("tree", ()) if _alive(p)]:  # never leave a failed run's spinners
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    # bwrap leaves nothing on disk; the fallback's owner-marked directories are removed by the next start-up
    from trl_marl.tasks.sandbox import cleanup_stale_dirs, isolation_support

    removed = cleanup_stale_dirs(str(tmp_path), force=True)
    if isolation_support(backend, allow_weak_sandbox=True)[0] != "bwrap":
        assert removed  # the killed trainer's directories were there, and are gone now
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("trl_marl_sandbox_")] == []
