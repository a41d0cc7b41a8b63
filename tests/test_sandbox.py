"""trl_marl.tasks.sandbox: limits, kills and isolation of untrusted programs (short timeouts; the file runs in ~20 s).

Attacks on the kernel boundary itself are in tests/test_sandbox_adversary.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from trl_marl.tasks import sandbox
from trl_marl.tasks.sandbox import (
    CallOutcome,
    SandboxLimits,
    SandboxResult,
    SandboxSession,
    child,
    cleanup_stale_dirs,
    decode_value,
    encode_value,
    isolation_support,
    launcher,
    run_many,
    run_python,
    weak,
)

FAST = SandboxLimits(timeout_s=2.0)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox's limits are Linux-specific")


def _limits(**kw) -> SandboxLimits:
    """Limits for `backend`; the weak backends need the explicit `allow_weak_sandbox`."""
    weak = kw.get("backend", "auto") in ("unshare", "none")
    return SandboxLimits(allow_weak_sandbox=weak, **kw)


def _alive_with(token: str) -> list[int]:
    """Pids of live processes whose command line contains `token`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmd and state != "Z":
            found.append(int(name))
    return found


def _wait_gone(token: str, seconds: float = 2.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := _alive_with(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def test_runs_a_program_and_captures_stdout_and_stderr():
    r = run_python("import sys\nprint('hello')\nprint('oops', file=sys.stderr)\n", FAST)
    assert isinstance(r, SandboxResult)
    assert r.ok and r.returncode == 0
    assert r.stdout == "hello\n" and r.stderr == "oops\n"
    assert not r.timed_out and not r.output_overflow


def test_crash_is_reported_not_raised():
    r = run_python("def f():\n    raise ValueError('boom')\nf()\n", FAST)
    assert not r.ok and r.returncode == 1
    assert "ValueError: boom" in r.stderr


def test_exit_status_is_passed_through():
    assert run_python("raise SystemExit(3)", FAST).returncode == 3


def test_infinite_loop_is_killed_at_the_deadline():
    start = time.monotonic()
    r = run_python("while True:\n    pass\n", SandboxLimits(timeout_s=1.0, cpu_time_s=30))
    assert r.timed_out and not r.ok
    assert time.monotonic() - start < 3.0


@linux_only
def test_cpu_limit_kills_before_the_wall_clock():
    r = run_python("while True:\n    pass\n", SandboxLimits(timeout_s=8.0, cpu_time_s=1))
    assert not r.timed_out and not r.ok  # killed by RLIMIT_CPU (1 s of CPU) before the 8 s wall clock


def test_unbounded_output_is_cut_and_killed():
    r = run_python("while True:\n    print('x' * 1000)\n", SandboxLimits(timeout_s=5.0, max_output_bytes=10_000))
    assert r.output_overflow and not r.timed_out and not r.ok
    assert len(r.stdout) <= 10_000
    assert r.duration_s < 3.0


@linux_only
def test_memory_limit():
    r = run_python(
        "x = bytearray(1 << 31)\nprint('allocated')\n", SandboxLimits(timeout_s=5.0, memory_bytes=256 << 20)
    )
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_fork_bomb_is_stopped_by_default():
    start = time.monotonic()
    r = run_python("import os\nwhile True:\n    os.fork()\n", FAST)
    assert not r.ok and not r.timed_out
    assert "PermissionError" in r.stderr and "os.fork" in r.stderr
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    "src",
    [
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import _posixsubprocess\n_posixsubprocess.fork_exec()",
        "import ctypes",
        "import os\nos.kill(424242, 9)",
    ],
)
@pytest.mark.parametrize("backend", ["auto", "unshare"])
def test_process_creation_signals_and_ctypes_are_blocked(src, backend):
    r = run_python(src, _limits(timeout_s=2.0, backend=backend))
    assert r.returncode == 1 and "PermissionError" in r.stderr


@pytest.mark.parametrize(
    "src",
    [
        "import socket\ns = socket.socket()\ns.connect(('10.255.255.1', 80))",
        "import socket\nsocket.create_connection(('example.com', 80), timeout=1)",
        "import _socket\n_socket.socket().connect(('1.1.1.1', 53))",
        "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)",
    ],
)
@pytest.mark.parametrize("backend", ["auto", "unshare"])
def test_network_is_blocked(src, backend):
    r = run_python(src, _limits(timeout_s=2.0, backend=backend))
    assert not r.ok and not r.timed_out
    assert "PermissionError" in r.stderr or "URLError" in r.stderr


@linux_only
def test_network_namespace_has_no_interface_but_loopback():
    if "net" not in isolation_support()[1]:
        pytest.skip("network namespaces are not permitted here; only the audit hook blocks the network")
    r = run_python("print(open('/proc/net/dev').read())", FAST)
    interfaces = {line.split(":")[0].strip() for line in r.stdout.splitlines() if ":" in line}
    assert interfaces == {"lo"}


@pytest.mark.parametrize("backend", ["auto", "unshare"])
def test_fresh_working_directory_and_write_restriction(tmp_path, backend):
    outside = tmp_path / "must_not_exist.txt"
    src = (
        "import os\n"
        "print(os.getcwd())\n"
        "print(sorted(os.listdir('.')))\n"
        "open('scratch.txt', 'w').write('ok')\n"
        "print(open('scratch.txt').read())\n"
        f"open({str(outside)!r}, 'w').write('bad')\n"
    )
    limits = _limits(timeout_s=2.0, backend=backend)
    r = run_python(src, limits)
    cwd, listing, scratch = r.stdout.splitlines()[:3]
    assert listing == "['main.py']" and scratch == "ok"
    assert r.returncode == 1 and not outside.exists()
    if r.backend != "bwrap":  # bwrap: a private tmpfs at /tmp that vanishes with the run
        assert "trl_marl_sandbox_" in cwd
        assert not os.path.exists(cwd), "the temporary directory is removed after the run"
    r = run_python(f"import os\nos.remove({str(tmp_path)!r})", limits)
    assert not r.ok and tmp_path.exists()


@linux_only
@pytest.mark.parametrize("backend", ["auto", "unshare", "none"])
def test_whole_process_group_is_killed_on_timeout(backend):
    token = f"trl_marl_test_{uuid.uuid4().hex}"
    src = (
        "import subprocess, sys, time\n"
        f"kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}]) for _ in range(3)]\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    limits = _limits(timeout_s=1.5, allow_subprocesses=True, backend=backend)
    r = run_python(src, limits)
    assert r.timed_out and "started" in r.stdout
    assert _wait_gone(token) == []


@linux_only
def test_setsid_descendant_dies_with_the_pid_namespace():
    if "pid" not in isolation_support()[1]:
        pytest.skip("PID namespaces are not permitted here")
    token = f"trl_marl_test_{uuid.uuid4().hex}"
    src = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(60)', "
        f"{token!r}], start_new_session=True)\n"
        "print('started', flush=True)\n"
    )
    r = run_python(src, SandboxLimits(timeout_s=2.0, allow_subprocesses=True))
    assert r.ok and "started" in r.stdout
    assert _wait_gone(token) == []


@linux_only
def test_fork_bomb_with_subprocesses_allowed_is_bounded_by_nproc():
    """Also for a root trainer: the program runs as a dropped, unprivileged uid, for which Linux enforces the limit."""
    start = time.monotonic()
    src = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(src, SandboxLimits(timeout_s=2.0, allow_subprocesses=True, max_processes=16))
    assert r.timed_out and time.monotonic() - start < 5.0


def test_run_many_keeps_order_and_a_hang_does_not_stall_the_others():
    sources = ["while True:\n    pass\n"] + [f"print({i})" for i in range(1, 6)]
    start = time.monotonic()
    results = run_many(sources, SandboxLimits(timeout_s=1.5), max_workers=2)
    elapsed = time.monotonic() - start
    assert results[0].timed_out
    assert [r.stdout.strip() for r in results[1:]] == ["1", "2", "3", "4", "5"]
    assert all(r.ok for r in results[1:])
    assert elapsed < 4.0
    assert run_many([], FAST) == []


def test_limits_validation():
    with pytest.raises(ValueError):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError):
        SandboxLimits(max_output_bytes=0)


# --------------------------------------------------------------------------------------------------------------
# Backends: bubblewrap (strong), the unshare fallback, and how each is chosen

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or sandbox.strong_sandbox_problem() is not None,
    reason="bubblewrap does not work here",
)


@linux_only
def test_backend_env_switch_needs_the_explicit_weak_flag(monkeypatch):
    monkeypatch.setenv(sandbox.BACKEND_ENV, "unshare")
    r = run_python("print('hi')", FAST)
    assert not r.ok and "allow_weak_sandbox=True" in r.error  # an environment variable alone never weakens it
    r = run_python("print('hi')", SandboxLimits(timeout_s=2.0, allow_weak_sandbox=True))
    assert r.ok and r.backend == "unshare" and "mount" in r.isolation
    monkeypatch.setenv(sandbox.BACKEND_ENV, "chroot")
    r = run_python("print('hi')", FAST)
    assert not r.ok and "TRL_MARL_SANDBOX_BACKEND must be one of" in r.error
    with pytest.raises(ValueError, match="backend must be one of"):
        SandboxLimits(backend="docker")
    with pytest.raises(ValueError, match="allow_weak_sandbox=True"):
        SandboxLimits(backend="unshare")


@linux_only
def test_without_the_strong_sandbox_runs_refuse_unless_weak_is_allowed(monkeypatch, caplog):
    monkeypatch.delenv(sandbox.BACKEND_ENV, raising=False)
    monkeypatch.setitem(launcher._PROBED, "strong", "bubblewrap (`bwrap`) is not installed; " + launcher.INSTALL_HINT)
    monkeypatch.setattr(launcher, "_WARNED", set())
    refused = run_python("print(1)", FAST)
    assert refused.returncode is None and "apt-get install bubblewrap" in refused.error
    assert "pip install 'trl-marl[code]'" in refused.error
    session = SandboxSession("def f():\n    return 1\n", "f", FAST)
    assert not session.alive and "apt-get install bubblewrap" in session.load_error
    weak = SandboxLimits(timeout_s=2.0, allow_weak_sandbox=True)
    with caplog.at_level(logging.WARNING, logger="trl_marl.tasks.sandbox"):
        results = run_many(["print(1)", "print(2)", "print(3)"], weak, max_workers=2)
    assert [r.backend for r in results] == ["unshare"] * 3 and all(r.ok for r in results)
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == "trl_marl.tasks.sandbox"]
    assert len(warnings) == 1 and "unsafe for reinforcement learning" in warnings[0]
    assert "apt-get install bubblewrap" in warnings[0]


@linux_only
@needs_bwrap
def test_bubblewrap_view_is_read_only_minimal_and_private():
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [os.path.join(sys.base_prefix, "lib", version, "site-packages"), "/usr/lib/python3/dist-packages"]
    candidates.append(os.path.join("/usr/local/lib", version, "dist-packages"))
    site_dirs = [d for d in candidates if os.path.isdir(d)]
    src = (
        "import os, sys\n"
        "print(sorted(os.listdir('/')))\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(sorted(os.environ))\n"
        f"print(os.path.exists({str(Path(__file__).resolve())!r}), os.path.exists('/work'), os.path.exists('/etc/passwd'))\n"
        f"print([os.listdir(d) for d in {site_dirs!r} if os.path.isdir(d)])\n"
        "for path in ('/usr/x', sys.base_prefix + '/x', '/x'):\n"
        "    try:\n"
        "        open(path, 'w')\n"
        "        print('WROTE', path)\n"
        "    except OSError as e:\n"
        "        print(type(e).__name__)\n"
    )
    r = run_python(src, SandboxLimits(timeout_s=5.0, backend="bwrap"))
    assert r.ok, r.stderr
    root, pids, env, exists, site, *writes = r.stdout.splitlines()
    assert set(eval(root)) <= {
        "bin",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "root",
        "sbin",
        "tmp",
        "usr",
    }
    assert eval(pids) == ["1", "2"]  # bwrap's init and the program: nothing of the host
    assert set(eval(env)) <= {*child.child_env("/tmp"), "PWD"}
    assert exists == "False False False"
    assert all(listing == [] for listing in eval(site))  # installed packages are hidden
    assert writes == ["OSError"] * 3  # EROFS: read-only view, read-only root


@linux_only
@pytest.mark.parametrize("backend", ["auto", "unshare"])
def test_file_size_and_disk_limits(backend):
    src = (
        "import os\n"
        "try:\n"
        "    open('big', 'wb').write(b'x' * (2 << 20))\n"
        "    print('big written')\n"
        "except OSError as e:\n"
        "    print('big', e.errno)\n"
        "n = 0\n"
        "try:\n"
        "    for n in range(64):\n"
        "        with open('part%d' % n, 'wb') as f:\n"
        "            f.write(b'x' * (512 << 10))\n"
        "    print('parts written')\n"
        "except OSError as e:\n"
        "    print('disk full after', n)\n"
    )
    limits = _limits(timeout_s=5.0, max_file_bytes=1 << 20, max_disk_bytes=4 << 20, backend=backend)
    r = run_python(src, limits)
    lines = r.stdout.splitlines()
    assert lines[0] == "big 27"  # EFBIG: RLIMIT_FSIZE
    if r.backend == "bwrap":
        assert lines[1].startswith("disk full after") and int(lines[1].split()[-1]) <= 8  # the 4 MiB tmpfs


@linux_only
@pytest.mark.parametrize("backend", ["auto", "unshare"])
def test_audit_hook_settings_cannot_be_changed(backend):
    src = (
        "import gc, os, sys\n"
        "main = sys.modules['__main__']\n"
        "for cfg in [v for v in vars(main).values() if isinstance(v, dict)]:\n"
        "    cfg.update(allow_subprocesses=True, allow_network=True, restrict_writes=False)\n"
        "hooks = [f for f in gc.get_objects() if callable(f) and getattr(f, '__name__', '') == '_hook']\n"
        "print(len(hooks))\n"
        "try:\n"
        "    hooks[0].__code__ = (lambda event, args: None).__code__\n"
        "    print('CHANGED')\n"
        "except PermissionError:\n"
        "    print('refused')\n"
        "try:\n"
        "    os.fork()\n"
        "    print('FORKED')\n"
        "except PermissionError:\n"
        "    print('fork refused')\n"
    )
    r = run_python(src, _limits(timeout_s=5.0, backend=backend))
    assert r.stdout.splitlines() == ["1", "refused", "fork refused"], (r.stdout, r.stderr)


# --------------------------------------------------------------------------------------------------------------
# Sessions and the plain-data codec


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(10**30),
        1.5,
        float("inf"),
        2j,
        "é\ud800",
        b"\x00\xff",
        [1, [2]],
        (1, (2,)),
        {1, (2, 3)},
        frozenset({"a"}),
        {"k": [1], (1, 2): {3}},
    ],
)
def test_codec_round_trip(value):
    data = json.loads(json.dumps(encode_value(value)))
    out = decode_value(data)
    assert out == value and type(out) is type(value)


def test_codec_refuses_non_plain_values_and_data():
    class Int(int):
        pass

    for bad in (Int(1), object(), [print], {"a": Int(2)}):
        with pytest.raises(TypeError, match="only plain built-in values"):
            encode_value(bad)
    for bad in ({"x": 1}, {"t": 1}, {"s": [[1]]}, {"d": [[1]]}, {"c": [1, 2]}, {"b": 1}, {"t": [], "s": []}):
        with pytest.raises(ValueError):
            decode_value(bad)


def test_session_calls_times_out_and_reports_errors():
    src = "import time\ndef f(x, mode='ok'):\n    if mode == 'sleep':\n        time.sleep(10)\n    if mode == 'raise':\n        raise KeyError(x)\n    if mode == 'object':\n        return object()\n    return [x, {x}]\n"
    with SandboxSession(src, "f", FAST) as s:
        assert s.load_error is None
        assert s.call([1]) == CallOutcome("value", [1, {1}])
        assert s.call([2], {"mode": "raise"}) == CallOutcome("error", error="KeyError: 2")
        out = s.call([3], {"mode": "object"})
        assert out.status == "error" and "only plain built-in values" in out.error
        assert s.call([lambda: 0]).status == "error"  # arguments must be plain too
        start = time.monotonic()
        assert s.call([4], {"mode": "sleep"}, timeout_s=0.3).status == "timeout"
        assert time.monotonic() - start < 1.5 and not s.alive
        assert s.call([5]).status == "lost"
    bad = SandboxSession("raise ValueError('at definition')\ndef f():\n    pass\n", "f", FAST)
    assert bad.load_error == "ValueError: at definition" and not bad.alive
    assert SandboxSession("x = 1\n", "f", FAST).load_error == "NameError: f is not defined"


def test_session_reply_size_is_bounded():
    with SandboxSession(
        "def f(n):\n    return 'x' * n\n", "f", SandboxLimits(timeout_s=2.0, max_output_bytes=1000)
    ) as s:
        assert s.call([10]).value == "x" * 10
        out = s.call([5000])
        assert out.status == "lost" and "exceeded 1000 bytes" in out.error


def test_stale_directories_are_removed_by_owner_marker_only(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / "trl_marl_sandbox_stale"
    (stale / "work").mkdir(parents=True)
    (stale / "owner.json").write_text(json.dumps({"pid": dead_pid, "start": "1", "uid": os.geteuid()}))
    live = tmp_path / "trl_marl_sandbox_live"
    live.mkdir()
    me = {"pid": os.getpid(), "start": weak._process_start_time(os.getpid()), "uid": os.geteuid()}
    (live / "owner.json").write_text(json.dumps(me))
    unmarked = tmp_path / "trl_marl_sandbox_unmarked"
    unmarked.mkdir()
    other = tmp_path / "someone_else"
    other.mkdir()
    (other / "owner.json").write_text(json.dumps({"pid": dead_pid, "start": "1", "uid": os.geteuid()}))
    assert cleanup_stale_dirs(str(tmp_path), force=True) == [str(stale)]
    assert not stale.exists() and live.exists() and unmarked.exists() and other.exists()


@linux_only
@needs_bwrap
def test_session_says_why_the_sandbox_did_not_start(monkeypatch):
    real = launcher._bwrap_args
    monkeypatch.setattr(launcher, "_bwrap_args", lambda *a: [*real(*a), "--ro-bind", "/no/such/dir", "/x"])
    s = SandboxSession("def f():\n    return 1\n", "f", SandboxLimits(timeout_s=5.0, backend="bwrap"))
    assert not s.alive and s.load_error.startswith("the program exited (status 1): bwrap:")


def test_the_old_module_path_is_a_deprecated_alias(monkeypatch):
    import importlib
    import sys

    monkeypatch.delitem(sys.modules, "trl_marl.sandbox", raising=False)
    with pytest.warns(DeprecationWarning, match="trl_marl.tasks.sandbox"):
        old = importlib.import_module("trl_marl.sandbox")
    assert old.run_python is run_python and old.SandboxLimits is SandboxLimits and old.SandboxSession is SandboxSession


def test_limits_name_the_bad_field():
    for bad, field in (
        ({"memory_bytes": 0}, "memory_bytes"),
        ({"max_shm_bytes": -1}, "max_shm_bytes"),
        ({"cpu_time_s": 0}, "cpu_time_s"),
        ({"sandbox_uids": range(0, 4)}, "sandbox_uids"),
        ({"sandbox_uids": range(5, 5)}, "sandbox_uids"),
    ):
        with pytest.raises(ValueError, match=field):
            SandboxLimits(**bad)


def test_missing_pyseccomp_names_the_extra(monkeypatch):
    from trl_marl.tasks.sandbox import SandboxUnavailable, policy

    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # `import pyseccomp` now raises ImportError
    policy.seccomp_filter.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match=r"pip install 'trl-marl\[code\]'.*apt-get install libseccomp2"):
            policy.seccomp_filter(False, False)
    finally:
        policy.seccomp_filter.cache_clear()


def test_decoding_is_bounded_in_depth_and_hash_collisions():
    from trl_marl.tasks.sandbox.protocol import COLLISION_LIMIT, MAX_DEPTH

    p = 2**61 - 1  # k * p hash alike for every k
    ok = [k * p for k in range(COLLISION_LIMIT)] + list(range(50_000))
    assert decode_value(ok) == ok
    start = time.monotonic()
    for bad in (
        [k * p for k in range(COLLISION_LIMIT + 1)],
        {"s": [k * p for k in range(40_000)]},
        {"d": [[{"t": [0, k * p]}, 0] for k in range(20_000)]},
        [[{"t": [k * p]}] for k in range(20_000)],
    ):
        with pytest.raises(ValueError, match="share one hash"):
            decode_value(json.loads(json.dumps(bad)))
    assert time.monotonic() - start < 2.0
    deep: list = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        decode_value(deep)


def test_a_session_calls_back_into_the_caller_through_proxies():
    src = "def f(x):\n    return helper(x, y=2) + 1\n\ndef g():\n    return helper()\n"
    seen = []

    def handler(name, args, kwargs, clock):
        seen.append((name, args, kwargs))
        if not args:
            raise KeyError("boom")  # a failing handler answers an error; the program goes on
        clock.extend(0.5)
        return CallOutcome("value", args[0] * 10 + kwargs["y"])

    with SandboxSession(src, "f", FAST, proxies=["helper"]) as s:
        assert s.call([3], on_request=handler) == CallOutcome("value", 33)
        assert seen == [("helper", [3], {"y": 2})]
        assert s.call([3]).error == "NameError: name 'helper' is not available"  # no handler
    with SandboxSession(src, "g", FAST, proxies=["helper"]) as s:
        out = s.call([], on_request=handler)
        assert out.status == "error" and "the request failed (KeyError" in out.error
