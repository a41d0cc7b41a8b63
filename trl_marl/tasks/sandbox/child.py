"""The sandboxed process's configuration and what its launcher's child does before `exec` (the uid drop, staging,
`no_new_privs`, the parent-death signal); the uids a root trainer drops to, leased one per running sandbox."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trl_marl.tasks.sandbox.policy import SandboxLimits

__all__ = [
    "STAGE_PARENTS",
    "Launched",
    "weak_child_setup",
    "child_env",
    "child_setup",
    "config",
    "interpreter",
    "lease_uid",
    "pipes",
    "release_uid",
]

logger = logging.getLogger("trl_marl.tasks.sandbox")
_LOCK = threading.Lock()


@dataclass
class Launched:
    """A started sandboxed process: its launcher (bwrap, unshare or the interpreter), the backend, its namespaces,
    its host directory (weak backends) and its leased uid (a root trainer's strong sandbox)."""

    proc: subprocess.Popen
    backend: str
    isolation: tuple[str, ...]
    host_dir: str | None
    lease: tuple[int, int | None] | None = None


def child_env(home: str) -> dict[str, str]:
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


def interpreter(limits: SandboxLimits) -> list[str]:
    if limits.site_packages:
        return [sys.executable, "-I", "-B"]
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return [os.path.realpath(exe), "-I", "-B", "-S"]


def config(limits: SandboxLimits, backend: str, isolation, serve, cpu_time_s, proxies) -> dict[str, Any]:
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


def pipes(serve: str | None) -> dict[str, Any]:
    return {
        "stdin": subprocess.PIPE if serve else subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,  # a session's program writes to /dev/null; only launch errors come here
    }


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
        logger.warning("trl_marl sandbox: no private lock directory; sandbox uids are unique per process only")
    with _LOCK:
        _LOCK_DIR[:] = [found]
    return found


def lease_uid(uids: range) -> tuple[int, int | None]:
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


def release_uid(lease: tuple[int, int | None]) -> None:
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
STAGE_PARENTS = ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var/tmp")


def _libc():
    if not _LIBC:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _LIBC.append((libc.prctl, libc.unshare, libc.mount))
    return _LIBC[0]


def child_setup(uid: int | None, stage_root: str | None, staged: Sequence[str], parent_pid: int):
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


def weak_child_setup(parent_pid: int):
    prctl = _libc()[0]

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(126)

    return setup
