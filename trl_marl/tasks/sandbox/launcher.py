"""Starting, watching and killing sandboxed processes: the bubblewrap command line, the uid drop, the weak backends,
`run_python` and `run_many`.

The strong launch, step by step (see the package docstring for why):

1. `fork` (Python's `subprocess`, `preexec_fn` below runs in the child before `exec`):
   - when the trainer is root and a bound directory is not reachable by others (e.g. an interpreter under
     `/root`): a private mount namespace in which those directories are bound under a fresh tmpfs (`staging`),
     so that the unprivileged bubblewrap can bind them from there; the host's mounts are untouched;
   - when the trainer is root: drop to a leased uid/gid with no supplementary groups (`setgroups([])`,
     `setresgid`, `setresuid`), so no capability survives and the user namespace maps to a uid that owns nothing;
   - `PR_SET_NO_NEW_PRIVS`, and `PR_SET_PDEATHSIG` (SIGKILL when the launching thread dies; set after the uid
     change, which would clear it).
2. `exec bwrap`: new user (every capability dropped, nested user namespaces disabled), mount, PID, IPC, UTS,
   cgroup and network namespaces; the read-only view of `policy.filesystem_view`; a fresh `/proc` (bubblewrap
   makes `/proc/sys` read-only); a minimal `/dev` (null, zero, full, random, urandom; read-only) with a
   size-limited `/dev/shm`; a size-limited `/tmp`; the seccomp filter of `policy.seccomp_filter`;
   `--die-with-parent`, `--new-session`, a cleared environment.
3. bubblewrap execs the interpreter on the bootstrap (`bootstrap`), which sets the rlimits and runs the program.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .bootstrap import bootstrap_command
from .policy import (
    BACKEND_ENV,
    BACKENDS,
    WEAK_BACKENDS,
    SandboxLimits,
    SandboxUnavailable,
    filesystem_view,
    reachable_by_others,
    seccomp_filter,
)

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

_DIR_PREFIX = "trl_marl_sandbox_"
_OWNER_FILE = "owner.json"
_INSIDE_UID = 1000
_STRONG_NAMESPACES = ("mount", "user", "ipc", "uts", "cgroup", "net", "pid")
_WEAK_NAMESPACES = {"unshare": ("mount", "net", "pid"), "none": ()}
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


def _probe_weak(backend: str) -> list[str] | None:
    """The command prefix of a weak backend on this machine, or None when it does not work here (cached)."""
    with _LOCK:
        if backend in _PROBED:
            return _PROBED[backend]
    prefix: list[str] | None = None
    if backend == "none":
        prefix = []
    elif sys.platform.startswith("linux") and (exe := shutil.which("unshare")):
        common = ["--mount", "--mount-proc", "--net", "--pid", "--fork", "--kill-child"]
        for candidate in ([exe, *common], [exe, "--user", "--map-root-user", *common]):
            try:
                done = subprocess.run([*candidate, "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode == 0:
                prefix = candidate
                break
    with _LOCK:
        _PROBED[backend] = prefix
    return prefix


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
            if (prefix := _probe_weak(weak)) is not None:
                _warn_once(
                    "weak",
                    f"trl_marl sandbox: the strong sandbox is not available ({problem}); running model code under "
                    f"the weak `{weak}` backend because allow_weak_sandbox=True: it is NOT a boundary against a "
                    f"program that runs native code, so it is unsafe for reinforcement learning; {INSTALL_HINT}.",
                )
                return weak, prefix
    prefix = _probe_weak(requested)
    if prefix is None:
        raise ValueError(f"the sandbox backend {requested!r} does not work on this machine")
    return requested, prefix


def isolation_support(backend: str = "auto", allow_weak_sandbox: bool = False) -> tuple[str, tuple[str, ...]]:
    """The backend a run with `SandboxLimits(backend=backend, allow_weak_sandbox=...)` gets here, and its
    namespaces. Raises `SandboxUnavailable` (or ValueError for a weak backend) when it cannot run here."""
    name, prefix = _resolve(SandboxLimits(backend=backend, allow_weak_sandbox=allow_weak_sandbox))
    if prefix is None:
        return name, _STRONG_NAMESPACES
    kinds = _WEAK_NAMESPACES[name]
    return name, ("user", *kinds) if "--user" in prefix else kinds


# --------------------------------------------------------------------------------------------------------------
# The uid a root trainer drops to: one per running sandbox of the host, locked across processes with flock.

_LEASED: set[int] = set()
_LOCK_DIR: list[str | None] = []


def _uid_lock_dir() -> str | None:
    with _LOCK:
        if _LOCK_DIR:
            return _LOCK_DIR[0]
    found = None
    for parent in ("/run", tempfile.gettempdir()):
        path = os.path.join(parent, "trl_marl_uid_locks")
        with contextlib.suppress(OSError):
            os.mkdir(path, 0o700)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            found = path
            break
    if found is None:
        _warn_once(
            "uid_locks", "trl_marl sandbox: no private lock directory; sandbox uids are unique per process only"
        )
    with _LOCK:
        _LOCK_DIR[:] = [found]
    return found


def _lease_uid(uids: range) -> tuple[int, int | None]:
    lock_dir = _uid_lock_dir()
    with _LOCK:
        for uid in uids:
            if uid in _LEASED:
                continue
            fd = None
            if lock_dir is not None:
                try:
                    fd = os.open(
                        os.path.join(lock_dir, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
                    )
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    if fd is not None:
                        os.close(fd)
                    continue
            _LEASED.add(uid)
            return uid, fd
    raise OSError(f"every sandbox uid of {uids} is in use")


def _release_uid(lease: tuple[int, int | None]) -> None:
    uid, fd = lease
    with _LOCK:
        _LEASED.discard(uid)
    if fd is not None:
        os.close(fd)


# --------------------------------------------------------------------------------------------------------------
# The child's set-up before exec (preexec_fn): libc functions are looked up in the parent, the child only calls.

_LIBC: list[Any] = []
_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x20000, 4096, 16384, 1 << 18, 2, 4
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_STAGE_PARENTS = ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var/tmp")


def _libc():
    if not _LIBC:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _LIBC.append((libc.prctl, libc.unshare, libc.mount))
    return _LIBC[0]


def _child_setup(uid: int | None, stage_root: str | None, staged: Sequence[str], parent_pid: int):
    """The preexec_fn of a launch (see the module docstring). Reports a failure on the child's stderr and exits
    126, so that the caller's error names it."""
    prctl, unshare, mount = _libc()
    stage = [(s.encode(), f"{stage_root}/{i}".encode()) for i, s in enumerate(staged)] if stage_root else []
    root = stage_root.encode() if stage_root else b""

    def fail(what: str) -> None:
        os.write(2, f"trl_marl sandbox launch: {what} failed\n".encode())
        os._exit(126)

    def setup() -> None:
        if stage:
            if unshare(_CLONE_NEWNS) != 0 or mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
                fail("a private mount namespace for staging")
            if mount(b"tmpfs", root, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=65536") != 0:
                fail("the staging tmpfs")
            for source, target in stage:
                os.mkdir(target, 0o755)
                if mount(source, target, None, _MS_BIND | _MS_REC, None) != 0:
                    fail(f"staging {source.decode()}")
        if uid is not None:
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            except OSError:
                fail(f"dropping to uid {uid}")
        if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            fail("no_new_privs")
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the trainer died before the death signal was armed
            os._exit(126)

    return setup


def _weak_child_setup(parent_pid: int):
    prctl = _libc()[0]

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(126)

    return setup


# --------------------------------------------------------------------------------------------------------------
# Launching one sandboxed process.


def _child_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _interpreter(limits: SandboxLimits) -> list[str]:
    if limits.site_packages:
        return [sys.executable, "-I", "-B"]
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return [os.path.realpath(exe), "-I", "-B", "-S"]


@dataclass
class Launched:
    proc: subprocess.Popen
    backend: str
    isolation: tuple[str, ...]
    host_dir: str | None
    lease: tuple[int, int | None] | None = None


def _config(limits: SandboxLimits, backend: str, isolation, serve, cpu_time_s, proxies) -> dict[str, Any]:
    return {
        "cpu_time_s": cpu_time_s,
        "memory_bytes": limits.memory_bytes,
        "max_file_bytes": limits.max_file_bytes,
        "max_open_files": limits.max_open_files,
        "max_processes": limits.max_processes,
        "allow_network": limits.allow_network,
        "allow_subprocesses": limits.allow_subprocesses,
        "restrict_writes": limits.restrict_writes and backend != "bwrap",
        "readonly_root": limits.restrict_writes and backend == "unshare",
        "isolation": list(isolation),
        "serve": serve,
        "proxies": list(proxies),
    }


def _pipes(serve: str | None) -> dict[str, Any]:
    return {
        "stdin": subprocess.PIPE if serve else subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,  # a session's program writes to /dev/null; only launch errors come here
    }


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
    for k, v in _child_env("/tmp").items():
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
    config = _config(limits, "bwrap", _STRONG_NAMESPACES, serve, cpu_time_s, proxies)
    python = bootstrap_command(
        _interpreter(limits),
        config,
        block_network=not limits.allow_network,
        block_processes=not limits.allow_subprocesses,
        check_writes=False,
    )
    seccomp = seccomp_filter(limits.allow_network, limits.allow_subprocesses)
    root = os.geteuid() == 0
    view = filesystem_view(limits.site_packages)
    staged = [s for s, _ in view.binds if root and not reachable_by_others(s)]
    stage_root = next((p for p in _STAGE_PARENTS if os.path.isdir(p)), None) if staged else None
    if staged and stage_root is None:
        raise OSError(f"no directory to stage {staged} in (looked for {_STAGE_PARENTS})")
    lease = _lease_uid(limits.sandbox_uids) if root else None
    fds: list[int] = []
    try:
        fds.append(_fd_with(source.encode("utf-8", "surrogatepass"), "trl_marl_main"))
        fds.append(_fd_with(seccomp, "trl_marl_seccomp"))
        cmd = [shutil.which("bwrap") or "bwrap", *_bwrap_args(limits, stage_root, staged)]
        cmd += ["--file", str(fds[0]), "/tmp/main.py", "--remount-ro", "/", "--chdir", "/tmp"]
        cmd += ["--seccomp", str(fds[1]), "--", *python]
        setup = _child_setup(lease[0] if lease else None, stage_root, staged, os.getpid())
        proc = subprocess.Popen(
            cmd, env={}, cwd="/", pass_fds=fds, start_new_session=True, preexec_fn=setup, **_pipes(serve)
        )
    except BaseException:
        if lease is not None:
            _release_uid(lease)
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
    isolation = _WEAK_NAMESPACES[backend]
    if "--user" in prefix:
        isolation = ("user", *isolation)
    python = bootstrap_command(
        _interpreter(limits),
        _config(limits, backend, isolation, serve, cpu_time_s, proxies),
        block_network=not limits.allow_network,
        block_processes=not limits.allow_subprocesses,
        check_writes=limits.restrict_writes,
    )
    cleanup_stale_dirs()  # directories a SIGKILLed weak run left behind (once per process)
    host_dir = _make_owned_dir()
    try:
        work = os.path.join(host_dir, "work")
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(source)
        proc = subprocess.Popen(
            [*prefix, *python],
            cwd=work,
            env=_child_env(work),
            start_new_session=True,
            preexec_fn=_weak_child_setup(os.getpid()),
            **_pipes(serve),
        )
    except BaseException:
        shutil.rmtree(host_dir, ignore_errors=True)
        raise
    return Launched(proc, backend, isolation, host_dir)


# --------------------------------------------------------------------------------------------------------------
# Host temporary directories (weak backends): owner-marked, removed after the run, and, when a SIGKILLed trainer
# could not remove them, by the next run of the same user.


def _process_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _make_owned_dir() -> str:
    host_dir = tempfile.mkdtemp(prefix=_DIR_PREFIX)
    owner = {"pid": os.getpid(), "start": _process_start_time(os.getpid()), "uid": os.geteuid()}
    with open(os.path.join(host_dir, _OWNER_FILE), "w") as f:
        json.dump(owner, f)
    os.mkdir(os.path.join(host_dir, "work"), 0o700)
    return host_dir


_CLEANED: set[str] = set()


def cleanup_stale_dirs(root: str | None = None, force: bool = False) -> list[str]:
    """Remove sandbox directories under `root` (default: the temp dir) whose owner process is gone.

    A directory is removed only if its name starts with `trl_marl_sandbox_`, it is a real directory owned by this
    user, and its `owner.json` marker names a process (pid and start time) that no longer exists. Runs once per
    process and root unless `force`. Returns the removed paths.
    """
    root = root or tempfile.gettempdir()
    with _LOCK:
        if root in _CLEANED and not force:
            return []
        _CLEANED.add(root)
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        if not name.startswith(_DIR_PREFIX):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
            if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.geteuid():
                continue
            fd = os.open(os.path.join(path, _OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                owner = json.loads(f.read(4096))
            pid, start = int(owner["pid"]), owner["start"]
            if owner.get("uid") != os.geteuid():
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid == os.getpid() or (_process_start_time(pid) is not None and _process_start_time(pid) == start):
            continue  # the owner is alive
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


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
        _release_uid(lease)
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
