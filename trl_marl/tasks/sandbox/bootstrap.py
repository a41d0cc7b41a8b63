"""The bootstrap: Python source that runs inside the sandbox before the program (passed with `-c`; its settings are
`argv[1]`, JSON).

It sets the resource limits, installs the Python audit hook (defence in depth only: the kernel is the boundary,
see the package docstring), then either runs the program (`run_python`) or serves calls of one of its functions
(`SandboxSession`, see `protocol`). Nothing in this process is trusted by the trainer: every reply is decoded there
as plain data.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SANDBOX_CODEC", "bootstrap_command"]

# The plain-data codec of the sandboxed side (the trainer has its own, bounded decoder in `protocol`): JSON where
# JSON is exact (None, bool, int, float, str, list), tagged one-key objects for the rest: {"t": [...]} tuple,
# {"s": [...]} set, {"f": [...]} frozenset, {"d": [[k, v], ...]} dict, {"b": "hex"} bytes, {"c": [re, im]} complex.
SANDBOX_CODEC = r'''
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
    """The value `encode_value` encoded; ValueError for anything else."""
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
                items = set(decode_value(v) for v in body)
                return items if tag == "s" else frozenset(items)
            if tag == "d":
                return {decode_value(k): decode_value(v) for k, v in body}
    raise ValueError("not an encoded plain value")
'''

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
    # directory (bound onto itself first). Best effort: a mount that cannot be remounted stays as it was.
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

# Defence in depth only (the kernel is the boundary). The hook's settings are literal constants of its code
# (substituted for @NAME@ when the bootstrap is built); replacing a function's __code__ is refused.
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
    + SANDBOX_CODEC
    + r"""

def _fmt(e):
    try:
        msg = str(e)
    except BaseException:
        msg = ""
    return type(e).__name__ + (": " + msg[:300] if msg else "")

class _Channel:
    # A session's pipe pair: requests arrive on fd 0, replies leave on fd 1 (one JSON line each); the program's own
    # stdin, stdout and stderr are /dev/null.
    def __init__(self):
        self.rfd, self.wfd = os.dup(0), os.dup(1)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        self.buf = b""

    def send(self, obj):
        try:
            data = (json.dumps(obj) + "\n").encode("utf-8", "backslashreplace")
        except BaseException as e:
            data = (json.dumps({"e": "the reply could not be encoded: " + _fmt(e)}) + "\n").encode()
        while data:
            data = data[os.write(self.wfd, data):]

    def receive(self):
        while b"\n" not in self.buf:
            chunk = os.read(self.rfd, 65536)
            if not chunk:
                os._exit(0)
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

def _proxy(channel, name):
    # A function of the trainer's: each call goes out as a request, the trainer answers with its value or error.
    def proxy(*args, **kwargs):
        channel.send({"q": name, "a": encode_value(list(args)), "k": encode_value(dict(kwargs))})
        reply = channel.receive()
        if type(reply) is dict and set(reply) == {"v"}:
            return decode_value(reply["v"])
        text = reply.get("e") if type(reply) is dict else None
        if type(text) is not str:
            raise RuntimeError("the trainer's reply to %s() was malformed" % name)
        kind, _, message = text.partition(": ")
        exc = getattr(builtins, kind, None)
        if isinstance(exc, type) and issubclass(exc, Exception) and not issubclass(exc, OSError):
            raise exc(message)
        raise RuntimeError(text)
    proxy.__name__ = proxy.__qualname__ = name
    return proxy

def _serve(name, proxies):
    channel = _Channel()
    ns = {"__name__": "solution", "__file__": "main.py", "__builtins__": builtins}
    for proxied in proxies:
        ns[proxied] = _proxy(channel, proxied)
    try:
        with open("main.py", encoding="utf-8") as f:
            exec(compile(f.read(), "main.py", "exec"), ns)
        fn = ns.get(name)
        if not callable(fn):
            raise NameError("%s is not defined" % name)
    except BaseException as e:
        channel.send({"load_error": _fmt(e)})
        os._exit(0)
    channel.send({"ready": True})
    while True:
        try:
            args, kwargs = channel.receive()
            reply = {"v": encode_value(fn(*decode_value(args), **decode_value(kwargs)))}
        except BaseException as e:
            reply = {"e": _fmt(e)}
        channel.send(reply)

if _cfg["serve"] is None:
    with open("main.py", encoding="utf-8") as _f:
        _code = compile(_f.read(), "main.py", "exec")
    del _f
    exec(_code, {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins})
else:
    _serve(_cfg["serve"], _cfg["proxies"])
"""
)


def bootstrap_command(
    interpreter: list[str], config: dict[str, Any], *, block_network: bool, block_processes: bool, check_writes: bool
) -> list[str]:
    """The interpreter command line that runs the bootstrap with `config` (see `_BOOTSTRAP`)."""
    source = (
        _BOOTSTRAP.replace("@BLOCK_NETWORK@", repr(block_network))
        .replace("@BLOCK_PROCESSES@", repr(block_processes))
        .replace("@CHECK_WRITES@", repr(check_writes))
    )
    return [*interpreter, "-c", source, json.dumps(config)]
