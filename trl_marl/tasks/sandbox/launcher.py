"""Starting, watching and killing sandboxed processes: which backend, the bubblewrap command line, `run_python` and
`run_many`.

The strong launch, step by step (see the package docstring for why):

1. `fork` (Python's `subprocess`); `child.child_setup` runs in the child before `exec`:
   - when the trainer is root and a bound directory is not reachable by others (e.g. an interpreter under
     `/root`): a private mount namespace in which those directories are bound under a fresh tmpfs ("staging"), so
     that the unprivileged bubblewrap can bind them from there; the host's mounts are untouched;
   - when the trainer is root: drop to a leased uid/gid with no supplementary groups (`setgroups([])`,
     `setresgid`, `setresuid`), so no capability survives and the user namespace maps to a uid that owns nothing;
   - `PR_SET_NO_NEW_PRIVS`, and `PR_SET_PDEATHSIG` (SIGKILL when the launching thread dies; set after the uid
     change, which would clear it).
2. `exec bwrap`: new user (every capability dropped, nested user namespaces disabled), mount, PID, IPC, UTS,
   cgroup and network namespaces; the read-only view of `policy.filesystem_view`; a fresh `/proc` (bubblewrap
   keeps `/proc/sys` read-only); a minimal read-only `/dev` (null, zero, full, random, urandom) with a size-limited
   `/dev/shm`; a size-limited `/tmp`; the seccomp filter of `policy.seccomp_filter`; `--die-with-parent`,
   `--new-session`, a cleared environment.
3. bubblewrap execs the interpreter on the bootstrap (`bootstrap`), which sets the rlimits and runs the program.

The weak backends are in `weak`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trl_marl.tasks.sandbox.bootstrap import bootstrap_command
from trl_marl.tasks.sandbox.child import (
    STAGE_PARENTS,
    Launched,
    child_env,
    child_setup,
    config,
    interpreter,
    lease_uid,
    pipes,
    release_uid,
)
from trl_marl.tasks.sandbox.policy import (
    BACKEND_ENV,
    BACKENDS,
    WEAK_BACKENDS,
    SandboxLimits,
    SandboxUnavailable,
    filesystem_view,
    reachable_by_others,
    seccomp_filter,
)
from trl_marl.tasks.sandbox.weak import WEAK_NAMESPACES, cleanup_stale_dirs, launch_weak, probe_weak

__all__ = [
    "Launched",
    "SandboxResult",
    "cleanup_stale_dirs",
    "finish",
    "isolation_support",
    "launch",
    "run_many",
    "run_python",
    "strong_sandbox_problem",
]

logger = logging.getLogger("trl_marl.tasks.sandbox")

_INSIDE_UID = 1000
_STRONG_NAMESPACES = ("mount", "user", "ipc", "uts", "cgroup", "net", "pid")
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`), libseccomp (`apt-get install libseccomp2`) "
    "and the `code` extra (`pip install 'trl-marl[code]'`, which brings `pyseccomp`), on a kernel that allows "
    "unprivileged user namespaces (sysctl `user.max_user_namespaces` > 0; Ubuntu 24.04+: "
    "`kernel.apparmor_restrict_unprivileged_userns=0`)"
)


@dataclass
class SandboxResult:
    """What came out of one run.

    Attributes:
        returncode: exit status of the launched process (negative: killed by that signal), or None when it
            could not be started.
        stdout, stderr: the program's output, decoded as UTF-8 with replacement, at most `max_output_bytes` each.
        timed_out: the wall-clock deadline was reached and the run was killed.
        output_overflow: stdout or stderr exceeded `max_output_bytes` and the run was killed.
        duration_s: wall-clock seconds from launch to the end of the kill/reap.
        backend: the backend used ("bwrap", "unshare" or "none").
        isolation: the namespaces used, e.g. `("mount", "net", "pid")`, or `()`.
        error: why the run could not be started, else None.
    """

    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    output_overflow: bool = False
    duration_s: float = 0.0
    backend: str = "none"
    isolation: tuple[str, ...] = field(default_factory=tuple)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 on its own, within its limits."""
        return self.returncode == 0 and not self.timed_out and not self.output_overflow and self.error is None


# --------------------------------------------------------------------------------------------------------------
# Which backend: the strong sandbox is probed once per process (a real run that checks itself from inside).

_LOCK = threading.Lock()
_PROBED: dict[str, Any] = {}
_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    with _LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    logger.warning(message)


_PROBE_SOURCE = r"""
import json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
try:
    os.close(os.open("/proc/sys/kernel/printk_ratelimit", os.O_WRONLY))
    procsys = "writable"
except OSError:
    procsys = "refused"
tmp, shm = os.statvfs("/tmp"), os.statvfs("/dev/shm")
print(json.dumps({k.strip(): v.strip() for k, v in status.items() if k.startswith(("Cap", "NoNewPrivs", "Seccomp"))}
                 | {"procsys": procsys, "tmp": tmp.f_blocks * tmp.f_frsize, "shm": shm.f_blocks * shm.f_frsize}))
"""


def strong_sandbox_problem() -> str | None:
    """None when the strong sandbox runs here with every property the package docstring promises (checked once per
    process by a real run that inspects itself from inside); else what is missing and how to install it."""
    with _LOCK:
        if "strong" in _PROBED:
            return _PROBED["strong"]
    problem = _probe_strong()
    with _LOCK:
        _PROBED["strong"] = problem
    return problem


def _probe_strong() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"the strong sandbox needs Linux (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return f"bubblewrap (`bwrap`) is not installed; {INSTALL_HINT}"
    limits = SandboxLimits(timeout_s=20.0, max_disk_bytes=8 << 20, max_shm_bytes=4 << 20)
    try:
        seccomp_filter(limits.allow_network, limits.allow_subprocesses)
    except SandboxUnavailable as e:
        return str(e)
    try:
        launched = _launch_strong(_PROBE_SOURCE, limits, None, 20, ())
    except (OSError, ValueError, RuntimeError) as e:
        return f"bubblewrap could not be started ({e}); {INSTALL_HINT}"
    try:  # the uid the sandbox's user namespace maps to: bubblewrap's own, seen from here
        with open(f"/proc/{launched.proc.pid}/status") as f:
            host_uid = next(line.split()[1] for line in f if line.startswith("Uid:"))
    except (OSError, StopIteration, IndexError):
        host_uid = "?"
    try:
        out, err = launched.proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        out, err = b"", b"timed out"
    finally:
        finish(launched)
    try:
        facts = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = err.decode("utf-8", "replace").strip()[-500:]
        return f"bubblewrap could not start the sandbox: {tail or 'no output'}; {INSTALL_HINT}"
    failed = []
    if facts.get("NoNewPrivs") != "1":
        failed.append("no_new_privs is not set")
    if facts.get("Seccomp") != "2":
        failed.append("the seccomp filter is not active")
    if any(int(facts.get(k, "1"), 16) != 0 for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")):
        failed.append("the process holds capabilities")
    if host_uid in ("0", "?"):
        failed.append("the process maps to host uid 0")
    if facts.get("procsys") != "refused":
        failed.append("/proc/sys is writable")
    if not 0 < facts.get("tmp", 0) <= limits.max_disk_bytes or not 0 < facts.get("shm", 0) <= limits.max_shm_bytes:
        failed.append("/tmp or /dev/shm is not size-limited")
    if failed:
        return f"bubblewrap runs, but the sandbox is not sound here: {'; '.join(failed)}"
    return None


def _resolve(limits: SandboxLimits) -> tuple[str, list[str] | None]:
    """(backend, weak-backend command prefix: None for the strong sandbox). Raises SandboxUnavailable or
    ValueError when the backend the limits ask for cannot run here."""
    requested = limits.backend
    if requested == "auto":
        env = os.environ.get(BACKEND_ENV, "").strip().lower()
        if env and env != "auto":
            if env not in BACKENDS:
                raise ValueError(f"{BACKEND_ENV} must be one of {BACKENDS}, got {env!r}")
            if env in WEAK_BACKENDS and not limits.allow_weak_sandbox:
                raise SandboxUnavailable(
                    f"{BACKEND_ENV}={env} selects a weak sandbox: pass allow_weak_sandbox=True to accept it"
                )
            requested = env
    if requested in ("auto", "bwrap"):
        problem = strong_sandbox_problem()
        if problem is None:
            return "bwrap", None
        if requested == "bwrap" or not limits.allow_weak_sandbox:
            raise SandboxUnavailable(problem)
        for weak in WEAK_BACKENDS:
            if (prefix := probe_weak(weak)) is not None:
                _warn_once(
                    "weak",
                    f"trl_marl sandbox: the strong sandbox is not available ({problem}); running model code under "
                    f"the weak `{weak}` backend because allow_weak_sandbox=True: it is NOT a boundary against a "
                    f"program that runs native code, so it is unsafe for reinforcement learning; {INSTALL_HINT}.",
                )
                return weak, prefix
    prefix = probe_weak(requested)
    if prefix is None:
        raise ValueError(f"the sandbox backend {requested!r} does not work on this machine")
    _warn_once(
        "weak",
        f"trl_marl sandbox: running model code under the weak `{requested}` backend (allow_weak_sandbox=True): it is "
        "NOT a boundary against a program that runs native code, so it is unsafe for reinforcement learning.",
    )
    return requested, prefix


def isolation_support(backend: str = "auto", allow_weak_sandbox: bool = False) -> tuple[str, tuple[str, ...]]:
    """The backend a run with `SandboxLimits(backend=backend, allow_weak_sandbox=...)` gets here, and its
    namespaces. Raises `SandboxUnavailable` (or ValueError for a weak backend) when it cannot run here."""
    name, prefix = _resolve(SandboxLimits(backend=backend, allow_weak_sandbox=allow_weak_sandbox))
    if prefix is None:
        return name, _STRONG_NAMESPACES
    kinds = WEAK_NAMESPACES[name]
    return name, ("user", *kinds) if "--user" in prefix else kinds


# --------------------------------------------------------------------------------------------------------------
# Launching one sandboxed process.


def _fd_with(data: bytes, name: str) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _bwrap_args(limits: SandboxLimits, stage_root: str | None, staged: Sequence[str]) -> list[str]:
    view = filesystem_view(limits.site_packages)
    args = ["--die-with-parent", "--new-session", "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--disable-userns", "--cap-drop", "ALL", "--hostname", "sandbox"]
    args += ["--uid", str(_INSIDE_UID), "--gid", str(_INSIDE_UID)]
    if not limits.allow_network:
        args.append("--unshare-net")
    args.append("--clearenv")
    for k, v in child_env("/tmp").items():
        args += ["--setenv", k, v]
    for source, target in view.binds:
        host = f"{stage_root}/{staged.index(source)}" if stage_root and source in staged else source
        args += ["--ro-bind", host, target]
    for target, link in view.symlinks:
        args += ["--symlink", target, link]
    for path in view.file_binds:
        args += ["--ro-bind-try", path, path]
    for mask in view.masks:
        args += ["--size", "4096", "--tmpfs", mask, "--remount-ro", mask]
    args += ["--proc", "/proc", "--tmpfs", "/dev"]
    for dev in ("null", "zero", "full", "random", "urandom"):
        args += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        args += ["--symlink", target, f"/dev/{link}"]
    args += ["--symlink", "/proc/self/fd/2", "/dev/stderr"]
    args += ["--size", str(limits.max_shm_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    args += ["--size", str(limits.max_disk_bytes), "--tmpfs", "/tmp"]
    return args


def _launch_strong(
    source: str, limits: SandboxLimits, serve: str | None, cpu_time_s: int, proxies: Sequence[str]
) -> Launched:
    python = bootstrap_command(
        interpreter(limits),
        config(limits, "bwrap", _STRONG_NAMESPACES, serve, cpu_time_s, proxies),
        block_network=not limits.allow_network,
        block_processes=not limits.allow_subprocesses,
        check_writes=False,
    )
    seccomp = seccomp_filter(limits.allow_network, limits.allow_subprocesses)
    root = os.geteuid() == 0
    view = filesystem_view(limits.site_packages)
    staged = [s for s, _ in view.binds if root and not reachable_by_others(s)]
    stage_root = next((p for p in STAGE_PARENTS if os.path.isdir(p)), None) if staged else None
    if staged and stage_root is None:
        raise OSError(f"no directory to stage {staged} in (looked for {STAGE_PARENTS})")
    lease = lease_uid(limits.sandbox_uids) if root else None
    fds: list[int] = []
    try:
        fds.append(_fd_with(source.encode("utf-8", "surrogatepass"), "trl_marl_main"))
        fds.append(_fd_with(seccomp, "trl_marl_seccomp"))
        cmd = [shutil.which("bwrap") or "bwrap", *_bwrap_args(limits, stage_root, staged)]
        cmd += ["--file", str(fds[0]), "/tmp/main.py", "--remount-ro", "/", "--chdir", "/tmp"]
        cmd += ["--seccomp", str(fds[1]), "--", *python]
        setup = child_setup(lease[0] if lease else None, stage_root, staged, os.getpid())
        proc = subprocess.Popen(
            cmd, env={}, cwd="/", pass_fds=fds, start_new_session=True, preexec_fn=setup, **pipes(serve)
        )
    except BaseException:
        if lease is not None:
            release_uid(lease)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return Launched(proc, "bwrap", _STRONG_NAMESPACES, None, lease)


def launch(
    source: str, limits: SandboxLimits, serve: str | None, cpu_time_s: int, proxies: Sequence[str] = ()
) -> Launched:
    """Start the bootstrap on `source` under the limits' backend (`serve`: the function a session serves, None to
    run the program). Raises OSError, ValueError or `SandboxUnavailable` when it cannot start."""
    backend, prefix = _resolve(limits)
    if prefix is None:
        return _launch_strong(source, limits, serve, cpu_time_s, proxies)
    return launch_weak(source, limits, backend, prefix, serve, cpu_time_s, proxies)


# --------------------------------------------------------------------------------------------------------------
# Killing.


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc; empty when unknown)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def wait_exit_no_reap(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until `proc` has exited (False at `deadline`), without reaping it, so that its process-group id stays
    reserved until the group is killed."""
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
        time.sleep(0.002)


def _terminate(launched: Launched) -> None:
    """SIGKILL the run. With a PID namespace, first kill the launcher's children (bwrap's / unshare's): the
    namespace's first process, whose death makes the kernel kill everything inside. Then the process group."""
    proc = launched.proc
    if "pid" in launched.isolation and proc.returncode is None and not wait_exit_no_reap(proc, 0.0):
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        wait_exit_no_reap(proc, time.monotonic() + 1.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def finish(launched: Launched) -> int:
    """Kill, reap and clean up; the return code."""
    if launched.proc.returncode is None:
        _terminate(launched)
    returncode = launched.proc.wait()
    for stream in (launched.proc.stdin, launched.proc.stdout, launched.proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    if launched.host_dir is not None:
        shutil.rmtree(launched.host_dir, ignore_errors=True)
    if launched.lease is not None:
        lease, launched.lease = launched.lease, None
        release_uid(lease)
    return returncode


def read_available(fd: int, limit: int) -> str:
    """What can be read from `fd` now, without waiting (at most `limit` bytes)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------------------------
# Running one program.


def run_python(source: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run the Python program `source` in a fresh sandboxed process (see the package docstring).

    Never raises for anything the program does; a launch failure (including `SandboxUnavailable`) is reported in
    `SandboxResult.error`.
    """
    limits = limits or SandboxLimits()
    start = time.monotonic()
    deadline = start + limits.timeout_s
    try:
        launched = launch(source, limits, None, limits.cpu_time_s or int(limits.timeout_s + 0.999) + 1)
    except (OSError, ValueError, RuntimeError) as e:
        return SandboxResult(returncode=None, error=f"could not start the sandbox: {e}")
    proc = launched.proc
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    sizes = dict.fromkeys(chunks, 0)
    timed_out = overflow = False
    try:
        streams = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
        with selectors.DefaultSelector() as sel:
            for fd in streams:
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            while streams and not overflow:
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
                    overflow = overflow or sizes[name] > limits.max_output_bytes
        if not timed_out and not overflow and not wait_exit_no_reap(proc, deadline):
            timed_out = True
    finally:
        returncode = finish(launched)

    def text(name: str) -> str:
        return b"".join(chunks[name]).decode("utf-8", "replace")

    return SandboxResult(
        returncode=returncode,
        stdout=text("stdout"),
        stderr=text("stderr"),
        timed_out=timed_out,
        output_overflow=overflow,
        duration_s=time.monotonic() - start,
        backend=launched.backend,
        isolation=launched.isolation,
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
