"""trl_marl.sandbox: limits, kills and isolation of untrusted programs (short timeouts; the file runs in ~15 s)."""

from __future__ import annotations

import os
import sys
import time
import uuid

import pytest

from trl_marl.sandbox import SandboxLimits, SandboxResult, isolation_support, run_many, run_python

FAST = SandboxLimits(timeout_s=2.0)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox's limits are Linux-specific")


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
    assert not r.timed_out and not r.ok
    assert r.duration_s < 5.0


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
def test_process_creation_signals_and_ctypes_are_blocked(src):
    r = run_python(src, FAST)
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
def test_network_is_blocked(src):
    r = run_python(src, FAST)
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
    limits = SandboxLimits(timeout_s=2.0, backend=backend)
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
    limits = SandboxLimits(timeout_s=1.5, allow_subprocesses=True, backend=backend)
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
@pytest.mark.skipif(os.geteuid() == 0, reason="Linux does not enforce RLIMIT_NPROC for root")
def test_fork_bomb_with_subprocesses_allowed_is_bounded_by_nproc():
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
