"""Run untrusted, model-generated Python code in a separate, isolated, resource-limited process.

Two ways to run code:

- `run_python(source, limits)` runs one program to its end; `run_many(sources, limits, max_workers)` runs many
  in parallel (a bounded `ThreadPoolExecutor` whose threads each launch and babysit one subprocess).
- `SandboxSession(source, function, limits)` defines a program once and then calls one of its functions
  (`session.call(args, kwargs, timeout_s)`) any number of times. Arguments go to the sandboxed process and the
  return value comes back as plain data (see `encode_value` / `decode_value`: `None`, `bool`, `int`, `float`,
  `complex`, `str`, `bytes`, `list`, `tuple`, `dict`, `set`, `frozenset`, recursively), so the caller compares
  values in its own, trusted process. The `code` task's reward uses it: nothing that can produce a verdict ever
  exists in the sandboxed process.

Neither ever raises because of what the program does: a crash, a hang, a fork bomb, unbounded output or a network
call ends as a `SandboxResult` / `CallOutcome` (`timed_out`, `output_overflow`, an error) and the caller carries on.

## Isolation backends

The backend is `SandboxLimits.backend` (`"auto"` by default); the environment variable `TRL_MARL_SANDBOX_BACKEND`
(`bwrap`, `unshare` or `none`) overrides `"auto"`. `"auto"` takes bubblewrap where it works, else the `unshare`
fallback (with ONE warning per process saying how to install bubblewrap), else no isolation (also warned).

**bubblewrap** (`bwrap`, Debian/Ubuntu package `bubblewrap`; the strong path). Every run gets:

- a new mount namespace that shows only the interpreter and the standard library, read-only (`/usr`, the
  interpreter's prefix, `/etc/ld.so.cache`; the prefix's `site-packages` is hidden unless `site_packages=True`,
  which also binds the active environment read-only); nothing else of the host's files exists inside;
- its own size-limited `tmpfs` at `/tmp` (`max_disk_bytes`) as the only writable path, which is also its working
  directory and `HOME` (the program is copied there as `main.py`); it vanishes with the run, so even a SIGKILL of
  the trainer leaves nothing on disk;
- a fresh `/proc` of its own PID namespace (it sees only its own processes), a minimal `/dev`;
- new user, IPC, UTS, cgroup and network namespaces (no network at all unless `allow_network`);
- a cleared environment (only `PATH`, `HOME`, `TMPDIR`, locale and thread-count variables are set);
- its own session (`--new-session`, so it cannot inject keystrokes into the trainer's terminal) and
  `--die-with-parent`: it is SIGKILLed when the thread that launched it, or the trainer, dies.

**unshare** (fallback, weaker). `unshare --mount --mount-proc --net --pid --fork --kill-child` (plus `--user
--map-root-user` when unprivileged): the `/proc` shows only the sandbox's processes (the trainer's environment in
`/proc/<pid>/environ` is out of reach), no network, a PID namespace whose processes all die with its first one,
and a parent-death signal (`PR_SET_PDEATHSIG`, set before `unshare` starts) so that nothing outlives the trainer.
The program runs in a fresh host temporary directory (`trl_marl_sandbox_*/work`, owner-marked and removed at
the end of the run; directories left by a SIGKILLed trainer are removed by the next run in any process of the
same user, checked by their owner marker, never by name alone). In the run's mount namespace the bootstrap binds
that directory onto itself and remounts every other mount read-only (best effort), so the kernel refuses writes
elsewhere; the audit hook (below) also checks write paths.

**none**: a plain subprocess with the audit hook and the resource limits only.

## In every backend

- A bootstrap that runs before the program sets `RLIMIT_CPU`, `RLIMIT_AS`, `RLIMIT_FSIZE`, `RLIMIT_NOFILE`,
  `RLIMIT_NPROC`, `RLIMIT_CORE=0`, and installs a Python audit hook (`sys.addaudithook`, which cannot be removed)
  whose settings are literal constants of its code (no data structure of the process switches a check off, and
  replacing a function's `__code__` is refused). It raises `PermissionError` on: every `socket.*` event (unless
  `allow_network`); process creation (`os.fork`, `os.exec*`, `os.posix_spawn*`, `os.system`, `subprocess.Popen`,
  and `_posixsubprocess.fork_exec`, which has no audit event and is replaced), signals to other processes and
  `ctypes` (unless `allow_subprocesses`). Outside bubblewrap, also writes outside the working directory (`open`
  for writing, `sqlite3.connect`, remove, rename, mkdir, chmod, chown, link, symlink, truncate, utime,
  `shutil.rmtree`, and `os.mkfifo` / `os.mknod` / `os.open(..., dir_fd=...)`, which are wrapped to raise a checked
  event) unless `restrict_writes=False`.
- The interpreter runs isolated (`-I -B`, plus `-S` unless `site_packages`), stdin is `/dev/null`.
- stdout and stderr (and a session's replies) are read concurrently and bounded by `max_output_bytes`; more kills
  the run. At the wall-clock deadline, on overflow and after every normal exit the whole process group is
  SIGKILLed (with a PID namespace, its first process first, so the kernel kills everything inside).

## What is NOT protected against

- Every backend: a kernel exploit (there is no seccomp filter); CPU and memory are bounded per process (rlimits),
  not per run (no cgroups); as root (uid 0 outside), Linux does not enforce `RLIMIT_NPROC`, so process creation is
  stopped only by the audit hook (the default `allow_subprocesses=False`) and by the PID namespace's end at the
  deadline. The audit hook is a Python-level guard: native code, or a program that patches the builtins and the
  modules the hook calls (`os`, `os.path`), can get past it; the namespaces and mounts are the boundary.
- bubblewrap: reading what the read-only view shows (the interpreter, the standard library, `/usr`).
- unshare fallback: the program can READ every file the trainer's user can read (e.g. the HumanEval data with its
  canonical solutions, or credential files in `$HOME`); the read-only remount is best effort (a mount that cannot
  be remounted keeps its mode, guarded by the hook's path check only); disk usage is bounded per file
  (`RLIMIT_FSIZE`), not in total.
- none: no filesystem, network or process isolation other than the audit hook.
- Inside a PID namespace the program is process 1: signals it sends itself are ignored by the kernel and
  `SIGXCPU` / `SIGXFSZ` do not kill it (writes past `RLIMIT_FSIZE` fail with `OSError`; the CPU limit kills with
  `SIGKILL` at the hard limit, equal to the soft one).
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
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BACKENDS",
    "CallOutcome",
    "SandboxLimits",
    "SandboxResult",
    "SandboxSession",
    "cleanup_stale_dirs",
    "decode_value",
    "encode_value",
    "isolation_support",
    "run_many",
    "run_python",
]

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "bwrap", "unshare", "none")
BACKEND_ENV = "TRL_MARL_SANDBOX_BACKEND"
_DIR_PREFIX = "trl_marl_sandbox_"
_OWNER_FILE = "owner.json"


@dataclass(frozen=True)
class SandboxLimits:
    """Limits and permissions of one sandboxed run.

    Attributes:
        timeout_s: wall-clock limit; at the deadline the whole process group is killed (for a session: the
            limit of starting it and defining the program; each call has its own limit).
        cpu_time_s: `RLIMIT_CPU` in seconds (soft = hard); None means `ceil(timeout_s) + 1` (for a session, the
            caller sets it).
        memory_bytes: `RLIMIT_AS` (address space) of each process.
        max_file_bytes: `RLIMIT_FSIZE`, the largest file the program may write.
        max_disk_bytes: size of the private `/tmp` (bubblewrap only; other backends bound each file only).
        max_open_files: `RLIMIT_NOFILE`.
        max_processes: processes/threads the program may add (`RLIMIT_NPROC`; not enforced by Linux for root).
        max_output_bytes: bytes kept from each of stdout and stderr (a session: bytes of one reply); more kills
            the run.
        allow_network: do not block sockets in the audit hook and keep the network namespace.
        allow_subprocesses: allow fork/exec/spawn, signals to other processes and `ctypes`.
        restrict_writes: outside bubblewrap, refuse file writes outside the working directory (audit hook);
            bubblewrap's read-only view enforces this always.
        site_packages: let the program import installed third-party packages (drops `-S`; with bubblewrap, binds
            the active environment and `sys.path` read-only).
        backend: "auto", "bwrap", "unshare" or "none" (see the module docstring); with "auto" the environment
            variable `TRL_MARL_SANDBOX_BACKEND` decides when set.
    """

    timeout_s: float = 10.0
    cpu_time_s: int | None = None
    memory_bytes: int = 1 << 30
    max_file_bytes: int = 16 << 20
    max_disk_bytes: int = 64 << 20
    max_open_files: int = 256
    max_processes: int = 64
    max_output_bytes: int = 1 << 20
    allow_network: bool = False
    allow_subprocesses: bool = False
    restrict_writes: bool = True
    site_packages: bool = False
    backend: str = "auto"

    def __post_init__(self):
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_output_bytes <= 0:
            raise ValueError(f"max_output_bytes must be > 0, got {self.max_output_bytes}")
        if self.max_disk_bytes <= 0:
            raise ValueError(f"max_disk_bytes must be > 0, got {self.max_disk_bytes}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")


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
# Plain-data codec. The same source runs in the trusted process (exec'd below) and in the sandboxed one (embedded
# in the bootstrap), so both sides agree on the format: JSON where JSON is exact (None, bool, int, float, str,
# list), tagged one-key objects for the rest: {"t": [...]} tuple, {"s": [...]} set, {"f": [...]} frozenset,
# {"d": [[k, v], ...]} dict, {"b": "hex"} bytes, {"c": [re, im]} complex.

_CODEC = r'''
def encode_value(value):
    """`value` as JSON-ready plain data; TypeError for anything but exact built-in plain types."""
    t = type(value)
    if value is None or t is bool or t is int or t is float or t is str:
        return value
    if t is list:
        return [encode_value(v) for v in value]
    if t is tuple:
        return {"t": [encode_value(v) for v in value]}
    if t is set:
        return {"s": [encode_value(v) for v in value]}
    if t is frozenset:
        return {"f": [encode_value(v) for v in value]}
    if t is dict:
        return {"d": [[encode_value(k), encode_value(v)] for k, v in value.items()]}
    if t is bytes:
        return {"b": value.hex()}
    if t is complex:
        return {"c": [value.real, value.imag]}
    raise TypeError("a value of type %s; only plain built-in values are accepted" % t.__name__)


def decode_value(data):
    """The value `encode_value` encoded; ValueError for anything else (never calls code of the data)."""
    t = type(data)
    if data is None or t is bool or t is int or t is float or t is str:
        return data
    if t is list:
        return [decode_value(v) for v in data]
    if t is dict and len(data) == 1:
        (tag, body), = data.items()
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "c" and type(body) is list and len(body) == 2 and all(type(x) is float for x in body):
            return complex(body[0], body[1])
        if type(body) is list:
            if tag == "t":
                return tuple(decode_value(v) for v in body)
            if tag in ("s", "f"):
                try:
                    items = set(decode_value(v) for v in body)
                except TypeError as e:
                    raise ValueError("unhashable set element") from e
                return items if tag == "s" else frozenset(items)
            if tag == "d":
                out = {}
                for pair in body:
                    if type(pair) is not list or len(pair) != 2:
                        raise ValueError("malformed dict item")
                    try:
                        out[decode_value(pair[0])] = decode_value(pair[1])
                    except TypeError as e:
                        raise ValueError("unhashable dict key") from e
                return out
    raise ValueError("not an encoded plain value")
'''
_codec_ns: dict[str, Any] = {}
exec(compile(_CODEC, "trl_marl/sandbox.py:_CODEC", "exec"), _codec_ns)
encode_value = _codec_ns["encode_value"]
decode_value = _codec_ns["decode_value"]


# --------------------------------------------------------------------------------------------------------------
# Backends, probed once per process.

_PROBE_LOCK = threading.Lock()
_PROBED: dict[str, list[str] | None] = {}
_WARNED: set[str] = set()


def _probe(backend: str) -> list[str] | None:
    """The command prefix of `backend` on this machine, or None when it does not work here (cached)."""
    with _PROBE_LOCK:
        if backend not in _PROBED:
            _PROBED[backend] = _probe_uncached(backend)
        return _PROBED[backend]


def _probe_uncached(backend: str) -> list[str] | None:
    if not sys.platform.startswith("linux"):
        return None
    if backend == "bwrap":
        exe = shutil.which("bwrap")
        candidates = [[exe]] if exe else []
        check = ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "--die-with-parent"]
    elif backend == "unshare":
        exe = shutil.which("unshare")
        common = ["--mount", "--mount-proc", "--net", "--pid", "--fork", "--kill-child"]
        candidates = [[exe, *common], [exe, "--user", "--map-root-user", *common]] if exe else []
        check = []
    else:
        return []
    for prefix in candidates:
        try:
            done = subprocess.run([*prefix, *check, "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return prefix
    return None


def _warn_once(key: str, message: str) -> None:
    with _PROBE_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    logger.warning(message)


_INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`) for the strong sandbox"


def _resolve_backend(requested: str) -> tuple[str, list[str] | None]:
    """(backend name, command prefix) for a requested backend; prefix None when the backend is unavailable."""
    if requested == "auto":
        env = os.environ.get(BACKEND_ENV, "").strip().lower()
        if env and env != "auto":
            if env not in BACKENDS:
                raise ValueError(f"{BACKEND_ENV} must be one of {BACKENDS}, got {env!r}")
            requested = env
    if requested != "auto":
        return requested, _probe(requested)
    if (prefix := _probe("bwrap")) is not None:
        return "bwrap", prefix
    if (prefix := _probe("unshare")) is not None:
        _warn_once(
            "unshare",
            "trl_marl sandbox: bubblewrap (bwrap) is not available, falling back to `unshare` namespaces: the "
            "sandboxed code can read the trainer user's files and writes are restricted by a Python-level check "
            f"only; {_INSTALL_HINT}.",
        )
        return "unshare", prefix
    _warn_once(
        "none",
        "trl_marl sandbox: neither bubblewrap nor `unshare` namespaces work here; sandboxed code runs as a plain "
        f"subprocess limited only by rlimits and a Python audit hook; {_INSTALL_HINT}.",
    )
    return "none", []


_NAMESPACES = {
    "bwrap": ("mount", "user", "ipc", "uts", "cgroup", "net", "pid"),
    "unshare": ("mount", "net", "pid"),
    "none": (),
}


def isolation_support(backend: str = "auto") -> tuple[str, tuple[str, ...]]:
    """The backend a run with `SandboxLimits(backend=backend)` gets here, and its namespaces (`()` when none).

    Raises ValueError when an explicitly requested backend does not work on this machine.
    """
    name, prefix = _resolve_backend(backend)
    if prefix is None:
        raise ValueError(f"the sandbox backend {name!r} does not work on this machine")
    kinds = _NAMESPACES[name]
    if name == "unshare" and "--user" in prefix:
        kinds = ("user", *kinds)
    return name, kinds


# --------------------------------------------------------------------------------------------------------------
# The bootstrap: runs in the child before the program (passed with -c; its config is argv[1]).

_BOOTSTRAP = (
    r"""
import builtins, json, os, resource, sys
_cfg = json.loads(sys.argv[1])
sys.argv = ["main.py"]
try:
    sys.stdout.reconfigure(errors="backslashreplace")
    sys.stderr.reconfigure(errors="backslashreplace")
except Exception:
    pass

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

if hasattr(resource, "RLIMIT_NPROC"):
    # Without a user namespace the limit counts every process of the user: add the ones that already exist.
    _nproc = _cfg["max_processes"]
    if "user" not in _cfg["isolation"] and os.getuid() != 0:
        try:
            _nproc += _count_user_tasks(os.getuid())
        except OSError:
            _nproc = None
    if _nproc is not None:
        _limit(resource.RLIMIT_NPROC, _nproc)

def _readonly_root(work):
    # The unshare fallback: in the run's own mount namespace, make every mount read-only except the working
    # directory (bound onto itself first), so that the kernel refuses writes elsewhere whatever Python-level trick
    # the program tries. Best effort: a mount that cannot be remounted stays as it was (the audit hook still checks).
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    ms = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
    ms_rdonly, ms_remount, ms_bind, ms_rec = 1, 32, 4096, 16384
    if libc.mount(work.encode(), work.encode(), None, ms_bind | ms_rec, None) != 0:
        return
    os.chdir(work)  # the working directory must resolve through the new mount
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    for line in lines:
        fields = line.split(" ")
        point = fields[4].encode().decode("unicode_escape").encode("latin-1")
        if point.decode("utf-8", "replace") == work:
            continue
        flags = ms_remount | ms_bind | ms_rdonly
        for opt in fields[5].split(","):
            flags |= ms.get(opt, 0)
        libc.mount(None, point, None, flags, None)
    for name in [m for m in sys.modules if m == "_ctypes" or m == "ctypes" or m.startswith("ctypes.")]:
        del sys.modules[name]

_WORK = os.path.realpath(os.getcwd())
if _cfg["readonly_root"]:
    try:
        _readonly_root(_WORK)
    except Exception:
        pass
del _readonly_root

def _inside(path, dir_fd):
    if isinstance(path, int):
        return True
    p = os.fsdecode(path)
    if p in ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/fd/1", "/dev/fd/2", ":memory:", ""):
        return True
    if not p.startswith("/") and dir_fd is not None:
        try:
            p = os.readlink("/proc/self/fd/%d" % dir_fd) + "/" + p
        except OSError:
            return False
    real = os.path.realpath(p)
    return real == _WORK or real.startswith(_WORK + "/") or real in ("/dev/null", "/dev/stdout", "/dev/stderr")

# The hook's settings are literal constants of its code (substituted for @NAME@ when the bootstrap is built), so
# no data structure of this process can switch a check off; replacing a function's __code__ is refused.
def _hook(event, args):
    if event == "object.__setattr__" and args[1] == "__code__":
        raise PermissionError("changing __code__ is not allowed in the trl_marl sandbox")
    if @BLOCK_NETWORK@ and event.startswith("socket."):
        raise PermissionError("%s is not allowed in the trl_marl sandbox" % event)
    if @BLOCK_PROCESSES@:
        if event.startswith("ctypes.") or event in {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
                                                    "os.system", "os.startfile", "subprocess.Popen", "pty.spawn"}:
            raise PermissionError("%s is not allowed in the trl_marl sandbox" % event)
        if event in {"os.kill", "os.killpg"} and args[0] not in (0, os.getpid(), os.getpgrp()):
            raise PermissionError("%s is not allowed in the trl_marl sandbox" % event)
    if @CHECK_WRITES@:
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writing = (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC |
                                                           os.O_APPEND)) or (
                isinstance(mode, str) and any(c in mode for c in "wax+"))
            if writing and path is not None and not _inside(path, None):
                raise PermissionError("writing to %r is not allowed in the trl_marl sandbox" % (path,))
        elif event in {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
                       "os.rename", "os.link", "os.symlink", "shutil.rmtree", "os.setxattr", "os.removexattr",
                       "os.chflags", "os.lchflags", "sqlite3.connect", "os.mkfifo", "os.mknod",
                       "trl_marl.open_at"}:
            # event -> (index of a path argument, index of its dir_fd argument or -1)
            where = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
                     "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.rename": ((0, 2), (1, 3)),
                     "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),), "shutil.rmtree": ((0, 1),),
                     "os.mkfifo": ((0, 1),), "os.mknod": ((0, 1),), "trl_marl.open_at": ((0, 1),)}
            for i, fd_i in where.get(event, ((0, -1),)):
                dir_fd = args[fd_i] if 0 <= fd_i < len(args) else None
                if i < len(args) and not _inside(args[i], dir_fd if isinstance(dir_fd, int) else None):
                    raise PermissionError("%s on %r is not allowed in the trl_marl sandbox" % (event, args[i]))

def _deny(name):
    def denied(*a, **k):
        raise PermissionError("%s is not allowed in the trl_marl sandbox" % name)
    return denied

if not _cfg["allow_subprocesses"]:
    try:
        import _posixsubprocess
        _posixsubprocess.fork_exec = _deny("_posixsubprocess.fork_exec")
    except ImportError:
        pass
if _cfg["restrict_writes"]:
    import posix
    # os.mkfifo / os.mknod raise no audit event, and os.open's "open" event omits dir_fd: route them through an
    # event that the hook checks (with its dir_fd).
    def _with_event(name, fn, flagged):
        def checked(path, *a, _fn=fn, _name=name, _audit=sys.audit, _flagged=flagged,
                    _w=os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, **k):
            if not _flagged or (k.get("dir_fd") is not None and (a[0] if a else k.get("flags", 0)) & _w):
                _audit(_name, path, k.get("dir_fd"))
            return _fn(path, *a, **k)
        return checked
    for _name, _event, _flagged in (("mkfifo", "os.mkfifo", False), ("mknod", "os.mknod", False),
                                    ("open", "trl_marl.open_at", True)):
        if hasattr(posix, _name):
            _w = _with_event(_event, getattr(posix, _name), _flagged)
            setattr(posix, _name, _w)
            setattr(os, _name, _w)
sys.addaudithook(_hook)
del _deny

"""
    + _CODEC
    + r"""

def _fmt(e):
    try:
        msg = str(e)
    except BaseException:
        msg = ""
    return type(e).__name__ + (": " + msg[:300] if msg else "")

def _serve(name):
    # A session: requests arrive on fd 0, replies leave on fd 1 (one JSON line each); the program's own stdin,
    # stdout and stderr are /dev/null.
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)

    def send(obj):
        try:
            data = (json.dumps(obj) + "\n").encode("utf-8", "backslashreplace")
        except BaseException as e:
            data = (json.dumps({"e": "the reply could not be encoded: " + _fmt(e)}) + "\n").encode()
        while data:
            data = data[os.write(wfd, data):]

    ns = {"__name__": "solution", "__file__": "main.py", "__builtins__": builtins}
    try:
        with open("main.py", encoding="utf-8") as f:
            exec(compile(f.read(), "main.py", "exec"), ns)
        fn = ns.get(name)
        if not callable(fn):
            raise NameError("%s is not defined" % name)
    except BaseException as e:
        send({"load_error": _fmt(e)})
        os._exit(0)
    send({"ready": True})
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(rfd, 65536)
            if not chunk:
                os._exit(0)
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        try:
            args, kwargs = json.loads(line)
            reply = {"v": encode_value(fn(*decode_value(args), **decode_value(kwargs)))}
        except BaseException as e:
            reply = {"e": _fmt(e)}
        send(reply)

if _cfg["serve"] is None:
    with open("main.py", encoding="utf-8") as _f:
        _code = compile(_f.read(), "main.py", "exec")
    del _f
    exec(_code, {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins})
else:
    _serve(_cfg["serve"])
"""
)


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


_PDEATHSIG: Any = None


def _set_parent_death_signal() -> None:
    """preexec_fn: SIGKILL this child when the thread that started it dies (Linux `PR_SET_PDEATHSIG`; kept across
    `exec`). The libc function is looked up in the parent, so the child only calls it."""
    if _PDEATHSIG is not None:
        _PDEATHSIG(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def _load_prctl() -> None:
    global _PDEATHSIG
    if _PDEATHSIG is None and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            _PDEATHSIG = ctypes.CDLL(None, use_errno=True).prctl


def _bwrap_filesystem(limits: SandboxLimits) -> list[str]:
    """bwrap arguments of the read-only view: /usr, the usr-merge links, the interpreter's prefix."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for f in ("/etc/ld.so.cache", "/etc/localtime"):
        args += ["--ro-bind-try", f, f]
    base = os.path.realpath(sys.base_prefix)
    roots = ["/usr"]
    if not base.startswith("/usr/"):
        args += ["--ro-bind", base, base]
        roots.append(base)
    if limits.site_packages:
        for path in [sys.prefix, *sys.path]:
            real = os.path.realpath(path) if path else ""
            if real and os.path.isdir(real) and not any(real == r or real.startswith(r + "/") for r in roots):
                args += ["--ro-bind", real, real]
                roots.append(real)
    else:
        ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
        for site in (os.path.join(base, "lib", ver, "site-packages"), os.path.join(base, "local", "lib", ver)):
            if os.path.isdir(site):
                args += ["--tmpfs", site]
    return args


def _interpreter(limits: SandboxLimits) -> list[str]:
    if limits.site_packages:
        return [sys.executable, "-I", "-B"]
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return [os.path.realpath(exe), "-I", "-B", "-S"]


@dataclass
class _Launched:
    proc: subprocess.Popen
    backend: str
    isolation: tuple[str, ...]
    host_dir: str | None


def _launch(source: str, limits: SandboxLimits, serve: str | None, cpu_time_s: int) -> _Launched:
    """Start the bootstrap on `source` under the limits' backend. Raises OSError/ValueError when it cannot start."""
    backend, prefix = _resolve_backend(limits.backend)
    if prefix is None:
        raise ValueError(f"the sandbox backend {backend!r} does not work on this machine")
    _, isolation = isolation_support(backend)
    config = {
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
    }
    bootstrap = (
        _BOOTSTRAP.replace("@BLOCK_NETWORK@", repr(not limits.allow_network))
        .replace("@BLOCK_PROCESSES@", repr(not limits.allow_subprocesses))
        .replace("@CHECK_WRITES@", repr(config["restrict_writes"]))
    )
    python = [*_interpreter(limits), "-c", bootstrap, json.dumps(config)]
    cleanup_stale_dirs()  # directories a SIGKILLed fallback run left behind (once per process)
    pipes = {
        "stdin": subprocess.PIPE if serve else subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,  # a session's program writes to /dev/null; only launch errors come here
    }
    if backend == "bwrap":
        memfd = os.memfd_create("trl_marl_main", os.MFD_CLOEXEC)
        try:
            data = source.encode("utf-8")
            while data:
                data = data[os.write(memfd, data) :]
            os.lseek(memfd, 0, os.SEEK_SET)
            cmd = [*prefix, "--die-with-parent", "--new-session", "--unshare-all"]
            if limits.allow_network:
                cmd.append("--share-net")
            cmd.append("--clearenv")
            for k, v in _child_env("/tmp").items():
                cmd += ["--setenv", k, v]
            cmd += _bwrap_filesystem(limits)
            cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.max_disk_bytes), "--tmpfs", "/tmp"]
            cmd += ["--file", str(memfd), "/tmp/main.py", "--remount-ro", "/", "--chdir", "/tmp", "--", *python]
            proc = subprocess.Popen(
                cmd, env={}, pass_fds=(memfd,), start_new_session=True, preexec_fn=_set_parent_death_signal, **pipes
            )
        finally:
            os.close(memfd)
        return _Launched(proc, backend, isolation, None)
    host_dir = _make_owned_dir()
    try:
        work = os.path.join(host_dir, "work")
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(source)
        proc = subprocess.Popen(
            [*prefix, *python],
            cwd=work,
            env=_child_env(work),
            start_new_session=True,
            preexec_fn=_set_parent_death_signal,
            **pipes,
        )
    except BaseException:
        shutil.rmtree(host_dir, ignore_errors=True)
        raise
    return _Launched(proc, backend, isolation, host_dir)


# --------------------------------------------------------------------------------------------------------------
# Host temporary directories (unshare / none): owner-marked, removed after the run, and, when a SIGKILLed trainer
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
    with _PROBE_LOCK:
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
        time.sleep(0.002)


def _terminate(launched: _Launched) -> None:
    """SIGKILL the run. With a PID namespace, first kill the launcher's children (bwrap's / unshare's): the
    namespace's first process, whose death makes the kernel kill everything inside. Then the process group."""
    proc = launched.proc
    if "pid" in launched.isolation and proc.returncode is None and not _wait_exit_no_reap(proc, 0.0):
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        _wait_exit_no_reap(proc, time.monotonic() + 1.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _finish(launched: _Launched) -> int:
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
    return returncode


# --------------------------------------------------------------------------------------------------------------
# Running one program.


def run_python(source: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run the Python program `source` in a fresh sandboxed process (see the module docstring).

    Never raises for anything the program does; a launch failure is reported in `SandboxResult.error`.
    """
    limits = limits or SandboxLimits()
    _load_prctl()
    start = time.monotonic()
    deadline = start + limits.timeout_s
    try:
        launched = _launch(source, limits, None, limits.cpu_time_s or int(limits.timeout_s + 0.999) + 1)
    except (OSError, ValueError) as e:
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
        if not timed_out and not overflow and not _wait_exit_no_reap(proc, deadline):
            timed_out = True
    finally:
        returncode = _finish(launched)

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


# --------------------------------------------------------------------------------------------------------------
# Sessions: define a program once, call one of its functions many times.


@dataclass(frozen=True)
class CallOutcome:
    """The outcome of one `SandboxSession.call`.

    Attributes:
        status: "value" (the function returned `value`), "error" (it raised, or returned something that is not
            plain data; `error` says what), "timeout" (no reply in time: the session was killed), or "lost" (the
            sandboxed process ended or broke the protocol: the session was killed; `error` says how).
        value: the decoded return value (status "value").
        error: a bounded description for every other status.
    """

    status: str
    value: Any = None
    error: str = ""


class SandboxSession:
    """A sandboxed process that defines `source` and then serves calls of its function `function`.

    The constructor starts the process and waits (at most `limits.timeout_s`) until the program is defined;
    `load_error` is then None, or why defining it failed (the session is closed). Each `call` sends the encoded
    arguments and waits for one reply line; a reply is decoded by `decode_value` in this (trusted) process, so the
    sandboxed program can only ever hand back plain values. Use as a context manager or call `close()`; a timed-out
    or broken session is killed at once and stays closed. Not thread-safe: one thread drives one session, and the
    process is SIGKILLed when the thread that created it exits (the parent-death signal follows the thread).
    """

    def __init__(self, source: str, function: str, limits: SandboxLimits | None = None, cpu_time_s: int = 60):
        self.limits = limits or SandboxLimits()
        self.load_error: str | None = None
        self.backend: str | None = None
        self.isolation: tuple[str, ...] = ()
        self._buf = b""
        self._ready = False
        self._launch_stderr = ""
        self._launched: _Launched | None = None
        _load_prctl()
        try:
            self._launched = _launch(source, self.limits, function, cpu_time_s)
        except (OSError, ValueError) as e:
            self.load_error = f"could not start the sandbox: {e}"
            return
        self.backend, self.isolation = self._launched.backend, self._launched.isolation
        for fd in (self._launched.proc.stdin.fileno(), self._launched.proc.stdout.fileno()):
            os.set_blocking(fd, False)
        first = self._read_reply(time.monotonic() + self.limits.timeout_s)
        if isinstance(first, CallOutcome):
            self.load_error = "defining the functions took too long" if first.status == "timeout" else first.error
            if self._launch_stderr.strip():
                self.load_error += ": " + _bounded(self._launch_stderr.strip().splitlines()[-1], 300)
            self.close()
        elif first.get("ready") is not True:
            self.load_error = _bounded(str(first.get("load_error", "the program could not be defined")))
            self.close()
        else:
            self._ready = True

    @property
    def alive(self) -> bool:
        return self._launched is not None

    def call(self, args: Sequence[Any], kwargs: dict[str, Any] | None = None, timeout_s: float = 1.0) -> CallOutcome:
        """Call the function with `args` / `kwargs` (plain values); wait at most `timeout_s` for the reply."""
        if self._launched is None:
            return CallOutcome("lost", error="the sandboxed process is not running")
        try:
            line = json.dumps([encode_value(list(args)), encode_value(dict(kwargs or {}))]) + "\n"
        except (TypeError, ValueError, RecursionError) as e:
            return CallOutcome("error", error=f"the arguments cannot be sent to the sandbox: {e}")
        deadline = time.monotonic() + timeout_s
        if not self._write(line.encode(), deadline):
            return self._lost("timeout", "no reply within the time limit")
        reply = self._read_reply(deadline)
        if isinstance(reply, CallOutcome):
            return reply
        if set(reply) == {"v"}:
            try:
                return CallOutcome("value", value=decode_value(reply["v"]))
            except (ValueError, RecursionError):
                return self._lost("lost", "the reply was not a plain value")
        if set(reply) == {"e"} and isinstance(reply["e"], str):
            return CallOutcome("error", error=_bounded(reply["e"]))
        return self._lost("lost", "the reply was not a plain value")

    def close(self) -> None:
        """Kill the process (if running) and release everything."""
        if self._launched is not None:
            launched, self._launched = self._launched, None
            _finish(launched)

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _lost(self, status: str, error: str) -> CallOutcome:
        returncode = None
        if self._launched is not None:
            wait = time.monotonic() + (0.5 if error.startswith("the program exited") else 0.0)
            if _wait_exit_no_reap(self._launched.proc, wait):
                returncode = self._launched.proc.poll()
            if self.load_error is None and not self._ready:  # not started: say why, from the launcher's stderr
                self._launch_stderr = _read_available(self._launched.proc.stderr.fileno(), 4096)
        self.close()
        if status == "lost" and returncode is not None and error.startswith("the program exited"):
            error = f"the program exited (status {returncode})"
        return CallOutcome(status, error=error)

    def _write(self, data: bytes, deadline: float) -> bool:
        fd = self._launched.proc.stdin.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while data:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    return False
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    continue
                except OSError:  # the process is gone: the read below reports it
                    return True
        return True

    def _read_reply(self, deadline: float) -> dict | CallOutcome:
        fd = self._launched.proc.stdout.fileno()
        limit = self.limits.max_output_bytes
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                if len(self._buf) > limit:
                    return self._lost("lost", f"the reply exceeded {limit} bytes")
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    return self._lost("timeout", "no reply within the time limit")
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return self._lost("lost", "the program exited")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        if len(line) > limit:
            return self._lost("lost", f"the reply exceeded {limit} bytes")
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):
            return self._lost("lost", "the reply was not a plain value")
        if not isinstance(reply, dict):
            return self._lost("lost", "the reply was not a plain value")
        return reply


def _read_available(fd: int, limit: int) -> str:
    """What can be read from `fd` now, without waiting (at most `limit` bytes)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _bounded(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 15] + "... (truncated)"
