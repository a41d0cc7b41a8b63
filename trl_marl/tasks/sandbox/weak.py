"""The weak backends (unsafe for reinforcement learning, see the package docstring): `unshare` namespaces from
util-linux, or a plain subprocess; each run in an owner-marked host temporary directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence

from trl_marl.tasks.sandbox.bootstrap import bootstrap_command
from trl_marl.tasks.sandbox.child import Launched, child_env, config, interpreter, pipes, weak_child_setup
from trl_marl.tasks.sandbox.policy import SandboxLimits

__all__ = ["WEAK_NAMESPACES", "cleanup_stale_dirs", "launch_weak", "probe_weak"]

_DIR_PREFIX = "trl_marl_sandbox_"
_OWNER_FILE = "owner.json"
WEAK_NAMESPACES = {"unshare": ("mount", "net", "pid"), "none": ()}
_LOCK = threading.Lock()
_PROBED: dict[str, list[str] | None] = {}


def probe_weak(backend: str) -> list[str] | None:
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


def launch_weak(
    source: str,
    limits: SandboxLimits,
    backend: str,
    prefix: list[str],
    serve: str | None,
    cpu_time_s: int,
    proxies: Sequence[str],
) -> Launched:
    """Start the bootstrap on `source` under a weak backend (`prefix`: its command prefix, from `probe_weak`)."""
    isolation = WEAK_NAMESPACES[backend]
    if "--user" in prefix:
        isolation = ("user", *isolation)
    python = bootstrap_command(
        interpreter(limits),
        config(limits, backend, isolation, serve, cpu_time_s, proxies),
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
            env=child_env(work),
            start_new_session=True,
            preexec_fn=weak_child_setup(os.getpid()),
            **pipes(serve),
        )
    except BaseException:
        shutil.rmtree(host_dir, ignore_errors=True)
        raise
    return Launched(proc, backend, isolation, host_dir)


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
