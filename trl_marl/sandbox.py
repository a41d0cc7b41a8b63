"""Run untrusted, model-generated Python code in a separate, resource-limited process.

`run_python(source, limits)` runs one program; `run_many(sources, limits, max_workers)` runs many in parallel
(a bounded `ThreadPoolExecutor` whose threads each launch and babysit one subprocess). Neither ever raises
because of what the program does: a crash, a hang, a fork bomb, unbounded output or a network call ends as a
`SandboxResult` with `timed_out`, `output_overflow` or a non-zero `returncode`, and the caller carries on.

What a run does, in order:

1. A fresh temporary directory is created and the program is written to `main.py` in it; it is the child's
   working directory, `HOME` and `TMPDIR`, and it is deleted afterwards.
2. The child is started in a new session (its own process group) with a minimal environment, stdin from
   `/dev/null`, and the interpreter in isolated mode (`python -I -B`, plus `-S` unless
   `limits.site_packages`): no user site, no `PYTHON*` variables, no `.pyc` files written.
3. Where the OS permits (probed once per process), the child runs under `unshare --net --pid --fork
   --kill-child` (with `--user --map-root-user` when not privileged): a network namespace with no interfaces
   but a downed loopback, and a PID namespace whose processes all die with its first process, so that no
   descendant (not even one that called `setsid`) outlives the run.
4. A bootstrap that runs before the program sets resource limits (`RLIMIT_CPU`, `RLIMIT_AS`, `RLIMIT_FSIZE`,
   `RLIMIT_NOFILE`, `RLIMIT_NPROC`, `RLIMIT_CORE=0`) and installs a Python audit hook (`sys.addaudithook`, which
   cannot be removed) that raises `PermissionError` on: every `socket.*` event (unless `allow_network`);
   process creation (`os.fork`, `os.forkpty`, `os.exec*`, `os.posix_spawn*`, `os.system`, `subprocess.Popen`,
   and `_posixsubprocess.fork_exec`, which has no audit event and is replaced), signals to other processes, and
   `ctypes` (unless `allow_subprocesses`); and writes outside the temporary directory (`open` for writing,
   remove, rename, mkdir, chmod, chown, link, symlink, truncate, utime, `shutil.rmtree`; unless
   `restrict_writes=False`; `/dev/null`, `/dev/stdout` and `/dev/stderr` stay writable).
5. The parent reads stdout, stderr and an optional report channel (see below) concurrently, each bounded by
   `limits.max_output_bytes`; overflow kills the run. At the wall-clock deadline (`limits.timeout_s`), on
   overflow, and after every normal exit, the whole process group is sent `SIGKILL` (with the PID namespace, its
   first process is killed first, so that the kernel kills and reaps everything inside and no orphan is left for
   the system's init to reap).

The report channel: the program finds a function `__sandbox_report__(text: str)` in its globals that writes
one line to a pipe that only the parent reads (`SandboxResult.report`). It lets a test harness return
structured results without mixing them with the program's own prints.

What it does NOT protect against (it is a guard against accidents and runaway code, not a security boundary
against a determined attacker):

- Native code. An audit hook only sees what Python reports; `ctypes` is blocked, but any C extension
  importable by the child (only the standard library's, unless `site_packages=True`) runs unchecked.
  Introspection (`gc`, frames) can reach and tamper with the hook's state.
- Reading files. The program can read every file the user running the trainer can read.
- Writes: the audit-hook check is by path; a write relative to a directory file descriptor (`dir_fd=`) is
  not resolved, so a deliberate program can escape it. There is no mount namespace or chroot.
- Disk usage: `RLIMIT_FSIZE` bounds each file, not their number.
- Process count as root: Linux does not enforce `RLIMIT_NPROC` for root (uid 0), and the limit counts all
  processes of the user unless a fresh user namespace is used. For root, process creation is stopped only by
  the audit hook (`allow_subprocesses=False`, the default); with `allow_subprocesses=True` a fork bomb runs
  until the wall-clock deadline (then it is killed as a group, completely when the PID namespace is active).
- Without namespaces (no `unshare`, or not permitted): no network isolation other than the audit hook, a
  descendant that calls `setsid` escapes the process-group kill, and killed descendants (only possible with
  `allow_subprocesses=True`) are orphans that the system's init must reap (in a container, use an init process,
  e.g. `docker run --init`).
- CPU and memory are per process (`RLIMIT_CPU`, `RLIMIT_AS`), not per run; there are no cgroups.
- Inside the PID namespace the program is process 1: signals it sends to itself (`os.kill(os.getpid(), ...)`)
  are ignored by the kernel, and `SIGXCPU`/`SIGXFSZ` do not kill it (writes past `RLIMIT_FSIZE` fail with
  `OSError` instead; the CPU limit is enforced by `SIGKILL` at the hard limit, equal to the soft one).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

__all__ = ["SandboxLimits", "SandboxResult", "isolation_support", "run_many", "run_python"]


@dataclass(frozen=True)
class SandboxLimits:
    """Limits and permissions of one sandboxed run.

    Attributes:
        timeout_s: wall-clock limit; at the deadline the whole process group is killed.
        cpu_time_s: `RLIMIT_CPU` in seconds (soft = hard); None means `ceil(timeout_s) + 1`.
        memory_bytes: `RLIMIT_AS` (address space) of each process.
        max_file_bytes: `RLIMIT_FSIZE`, the largest file the program may write.
        max_open_files: `RLIMIT_NOFILE`.
        max_processes: processes/threads the program may add (`RLIMIT_NPROC`; see the module docstring for
            where Linux enforces it).
        max_output_bytes: bytes kept from each of stdout, stderr and the report channel; more kills the run.
        allow_network: do not block sockets in the audit hook and do not isolate the network namespace.
        allow_subprocesses: allow fork/exec/spawn, signals to other processes and `ctypes`.
        restrict_writes: block file writes outside the run's temporary directory (audit hook).
        site_packages: let the program import installed third-party packages (drops `-S`).
        use_namespaces: use `unshare` network/PID namespaces where the OS permits.
    """

    timeout_s: float = 10.0
    cpu_time_s: int | None = None
    memory_bytes: int = 1 << 30
    max_file_bytes: int = 16 << 20
    max_open_files: int = 256
    max_processes: int = 64
    max_output_bytes: int = 1 << 20
    allow_network: bool = False
    allow_subprocesses: bool = False
    restrict_writes: bool = True
    site_packages: bool = False
    use_namespaces: bool = True

    def __post_init__(self):
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_output_bytes <= 0:
            raise ValueError(f"max_output_bytes must be > 0, got {self.max_output_bytes}")


@dataclass
class SandboxResult:
    """What came out of one run.

    Attributes:
        returncode: exit status of the launched process (negative: killed by that signal), or None when it
            could not be started.
        stdout, stderr: the program's output, decoded as UTF-8 with replacement, at most
            `max_output_bytes` each.
        report: the lines the program wrote with `__sandbox_report__`, at most `max_output_bytes`.
        timed_out: the wall-clock deadline was reached and the run was killed.
        output_overflow: stdout, stderr or the report exceeded `max_output_bytes` and the run was killed.
        duration_s: wall-clock seconds from launch to the end of the kill/reap.
        isolation: the namespaces used, e.g. `("net", "pid")`, or `()`.
        error: why the run could not be started, else None.
    """

    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    report: str = ""
    timed_out: bool = False
    output_overflow: bool = False
    duration_s: float = 0.0
    isolation: tuple[str, ...] = field(default_factory=tuple)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 on its own, within its limits."""
        return self.returncode == 0 and not self.timed_out and not self.output_overflow and self.error is None


# --------------------------------------------------------------------------------------------------------------
# Namespace support, probed once per process.

_PROBE_LOCK = threading.Lock()
_PROBED: tuple[list[str], tuple[str, ...]] | None = None


def isolation_support() -> tuple[list[str], tuple[str, ...]]:
    """The `unshare` command prefix this machine permits, and the namespaces it gives (`()` when none)."""
    global _PROBED
    with _PROBE_LOCK:
        if _PROBED is None:
            _PROBED = _probe_unshare()
        return _PROBED


def _probe_unshare() -> tuple[list[str], tuple[str, ...]]:
    exe = shutil.which("unshare")
    if exe is None or not sys.platform.startswith("linux"):
        return [], ()
    common = ["--net", "--pid", "--fork", "--kill-child"]
    for prefix, kinds in (
        ([exe, *common], ("net", "pid")),
        ([exe, "--user", "--map-root-user", *common], ("user", "net", "pid")),
    ):
        try:
            done = subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return prefix, kinds
    return [], ()


# --------------------------------------------------------------------------------------------------------------
# The bootstrap: runs in the child before the program (passed with -c; its config is argv[1]).

_BOOTSTRAP = r"""
import builtins, json, os, resource, sys
_cfg = json.loads(sys.argv[1])
sys.argv = ["main.py"]
try:
    sys.stdout.reconfigure(errors="backslashreplace")
    sys.stderr.reconfigure(errors="backslashreplace")
except Exception:
    pass

def _count_user_tasks(uid):
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/status") as f:
                st = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in st.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            n += int(fields.get("Threads", "1").strip() or 1)
    return n

def _limit(which, value):
    try:
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))
    except (ValueError, OSError):
        pass

_limit(resource.RLIMIT_CORE, 0)
_limit(resource.RLIMIT_CPU, _cfg["cpu_time_s"])
_limit(resource.RLIMIT_AS, _cfg["memory_bytes"])
_limit(resource.RLIMIT_FSIZE, _cfg["max_file_bytes"])
_limit(resource.RLIMIT_NOFILE, _cfg["max_open_files"])
if hasattr(resource, "RLIMIT_NPROC"):
    _nproc = _cfg["max_processes"]
    if "user" not in _cfg["isolation"] and os.getuid() != 0:
        try:
            _nproc += _count_user_tasks(os.getuid())
        except OSError:
            _nproc = None
    if _nproc is not None:
        _limit(resource.RLIMIT_NPROC, _nproc)

_report_fd = _cfg["report_fd"]

def __sandbox_report__(text):
    data = (str(text).replace("\n", " ") + "\n").encode("utf-8", "backslashreplace")
    while data:
        data = data[os.write(_report_fd, data):]

_TMP = os.path.realpath(os.getcwd())
_DEV_OK = {"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/fd/1", "/dev/fd/2"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PROC_EVENTS = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
                "subprocess.Popen", "pty.spawn"}
# event -> indices of path arguments (with the dir_fd argument index, or None)
_FS_EVENTS = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
              "os.chown": ((0, 3),), "os.truncate": ((0, None),), "os.utime": ((0, 3),),
              "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),),
              "shutil.rmtree": ((0, 1),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
              "os.chflags": ((0, None),), "os.lchflags": ((0, None),)}
_in_hook = [False]

def _inside(path, dir_fd=None):
    if isinstance(path, int):
        return True
    p = os.fsdecode(path)
    if p in _DEV_OK:
        return True
    if not os.path.isabs(p) and dir_fd is not None:
        try:
            p = os.path.join(os.readlink("/proc/self/fd/%d" % dir_fd), p)
        except OSError:
            return False
    real = os.path.realpath(p)
    return real == _TMP or real.startswith(_TMP + os.sep) or real in _DEV_OK

def _deny(event):
    raise PermissionError("%s is not allowed in the trl_marl sandbox" % event)

def _hook(event, args):
    if _in_hook[0]:
        return
    _in_hook[0] = True
    try:
        if not _cfg["allow_network"] and event.startswith("socket."):
            _deny(event)
        if not _cfg["allow_subprocesses"]:
            if event in _PROC_EVENTS or event.startswith("ctypes."):
                _deny(event)
            if event in ("os.kill", "os.killpg") and args[0] not in (0, os.getpid(), os.getpgrp()):
                _deny(event)
        if _cfg["restrict_writes"]:
            if event == "open" and len(args) >= 3:
                path, mode, flags = args[0], args[1], args[2]
                writing = (isinstance(flags, int) and flags & _WRITE_FLAGS) or (
                    isinstance(mode, str) and any(c in mode for c in "wax+"))
                if writing and path is not None and not _inside(path):
                    _deny("writing to %r" % (path,))
            elif event in _FS_EVENTS:
                for i, fd_i in _FS_EVENTS[event]:
                    dir_fd = args[fd_i] if fd_i is not None and fd_i < len(args) else None
                    if i < len(args) and not _inside(args[i], dir_fd if isinstance(dir_fd, int) else None):
                        _deny("%s on %r" % (event, args[i]))
    finally:
        _in_hook[0] = False

if not _cfg["allow_subprocesses"]:
    try:
        import _posixsubprocess
        def _no_fork_exec(*a, **k):
            _deny("_posixsubprocess.fork_exec")
        _posixsubprocess.fork_exec = _no_fork_exec
    except ImportError:
        pass
sys.addaudithook(_hook)

with open("main.py", encoding="utf-8") as _f:
    _code = compile(_f.read(), "main.py", "exec")
_g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins,
      "__sandbox_report__": __sandbox_report__}
del _f
exec(_code, _g)
"""


# --------------------------------------------------------------------------------------------------------------
# Running one program.


def _child_env(tmp: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": tmp,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc; empty when unknown)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def _terminate(proc: subprocess.Popen, isolation: tuple[str, ...]) -> None:
    """SIGKILL the run. With a PID namespace, first kill the namespace's init (the child of `unshare`): the kernel
    then kills and reaps everything inside, and `unshare` reaps its child and exits, so nothing is left as an
    orphan for the system's init to reap. Then SIGKILL the whole process group."""
    if "pid" in isolation and proc.returncode is None and not _wait_exit_no_reap(proc, 0.0):
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        _wait_exit_no_reap(proc, time.monotonic() + 1.0)
    _kill_group(proc.pid)


def _wait_exit_no_reap(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until `proc` has exited (False at `deadline`), without reaping it where the OS has `waitid`, so that
    its process-group id stays reserved until the group is killed."""
    while True:
        if not hasattr(os, "waitid"):
            if proc.poll() is not None:
                return True
        else:
            try:
                if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return True
            except ChildProcessError:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def run_python(source: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run the Python program `source` in a fresh sandboxed process (see the module docstring).

    Never raises for anything the program does; a launch failure is reported in `SandboxResult.error`.
    """
    limits = limits or SandboxLimits()
    prefix, isolation = isolation_support() if limits.use_namespaces else ([], ())
    if limits.allow_network and "net" in isolation:
        prefix = [a for a in prefix if a != "--net"]
        isolation = tuple(k for k in isolation if k != "net")
    start = time.monotonic()
    deadline = start + limits.timeout_s
    try:
        tmp = tempfile.mkdtemp(prefix="trl_marl_sandbox_")
    except OSError as e:
        return SandboxResult(
            returncode=None, error=f"could not create the sandbox directory: {e}", isolation=isolation
        )
    report_r = report_w = -1
    proc: subprocess.Popen | None = None
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": [], "report": []}
    sizes = dict.fromkeys(chunks, 0)
    timed_out = overflow = False
    try:
        try:
            with open(os.path.join(tmp, "main.py"), "w", encoding="utf-8") as f:
                f.write(source)
            report_r, report_w = os.pipe()
            config = {
                **{k: v for k, v in asdict(limits).items() if k != "timeout_s"},
                "cpu_time_s": limits.cpu_time_s or int(limits.timeout_s + 0.999) + 1,
                "isolation": list(isolation),
                "report_fd": report_w,
            }
            flags = ["-I", "-B"] if limits.site_packages else ["-I", "-B", "-S"]
            cmd = [*prefix, sys.executable, *flags, "-c", _BOOTSTRAP, json.dumps(config)]
            proc = subprocess.Popen(
                cmd,
                cwd=tmp,
                env=_child_env(tmp),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(report_w,),
                start_new_session=True,
            )
        except (OSError, ValueError) as e:
            return SandboxResult(returncode=None, error=f"could not start the sandbox: {e}", isolation=isolation)
        os.close(report_w)
        report_w = -1
        streams = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", report_r: "report"}
        with selectors.DefaultSelector() as sel:
            for fd in streams:
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            while streams:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(min(remaining, 0.25)):
                    try:
                        data = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    name = streams.get(key.fd)
                    if not data:
                        sel.unregister(key.fd)
                        streams.pop(key.fd, None)
                        continue
                    room = limits.max_output_bytes - sizes[name]
                    chunks[name].append(data[: max(room, 0)])
                    sizes[name] += len(data)
                    if sizes[name] > limits.max_output_bytes:
                        overflow = True
                if overflow:
                    break
        if not timed_out and not overflow and not _wait_exit_no_reap(proc, deadline):
            timed_out = True
        _terminate(proc, isolation)
        returncode = proc.wait()
    finally:
        if proc is not None and proc.returncode is None:
            _terminate(proc, isolation)
            proc.wait()
        for fd in (report_r, report_w):
            if fd >= 0:
                os.close(fd)
        if proc is not None:
            proc.stdout.close()
            proc.stderr.close()
        shutil.rmtree(tmp, ignore_errors=True)

    def text(name: str) -> str:
        return b"".join(chunks[name]).decode("utf-8", "replace")

    return SandboxResult(
        returncode=returncode,
        stdout=text("stdout"),
        stderr=text("stderr"),
        report=text("report"),
        timed_out=timed_out,
        output_overflow=overflow,
        duration_s=time.monotonic() - start,
        isolation=isolation,
    )


def run_many(
    sources: Sequence[str], limits: SandboxLimits | None = None, max_workers: int | None = None
) -> list[SandboxResult]:
    """Run every program of `sources` with `run_python`, at most `max_workers` at a time; results in order.

    `max_workers` defaults to the number of CPUs (at most 8). Each worker thread waits on one subprocess
    that is killed at its deadline, so the call returns within about
    `ceil(len(sources) / max_workers) * limits.timeout_s` seconds plus start-up time.
    """
    if not sources:
        return []
    workers = max(1, min(max_workers or min(os.cpu_count() or 1, 8), len(sources)))
    if workers == 1:
        return [run_python(s, limits) for s in sources]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trl_marl_sandbox") as pool:
        return list(pool.map(lambda s: run_python(s, limits), sources))
