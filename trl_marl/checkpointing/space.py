"""What a save needs from the output folder, found out before training instead of at the end: whether it can be
written, and whether its disk holds what a save writes (`check_output_dir`, with the sizes of `save_sizes`); and the
error a failed save raises (`SaveError`: the path, the bytes needed and free, what is left intact).

The sizes come from the loaded team itself (exact parameter counts and dtypes, ZeRO-3 partitions counted whole): a
team save writes the weights (a PEFT model only its adapters), a checkpoint adds the optimizer state (Adam: two
fp32 moments per trainable parameter; DeepSpeed also keeps fp32 master weights).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from dataclasses import dataclass

from torch import nn

__all__ = [
    "SaveError",
    "SaveSizes",
    "save_sizes",
    "check_output_dir",
    "failed_save",
    "is_write_failure",
    "free_bytes",
    "human_bytes",
]

# what a checkpoint writes beside the weights and the optimizer (trainer / resume / random states, configs, cards)
_SLACK_BYTES = 16 * 2**20


class SaveError(OSError):
    """A save that could not be written (disk full, read-only folder, ...); what was saved before is intact."""


@dataclass(frozen=True)
class SaveSizes:
    """Bytes a save of the team writes: `weights` (a team save), `checkpoint` (weights + optimizer state)."""

    weights: int
    optimizer: int

    @property
    def checkpoint(self) -> int:
        return self.weights + self.optimizer + _SLACK_BYTES

    def describe(self, with_optimizer: bool) -> str:
        if not with_optimizer:
            return f"about {human_bytes(self.weights)} (the weights)"
        return (
            f"about {human_bytes(self.checkpoint)} (weights {human_bytes(self.weights)} + optimizer state "
            f"{human_bytes(self.optimizer)})"
        )


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"  # pragma: no cover


def _nbytes(p) -> int:
    return int(getattr(p, "ds_numel", p.numel())) * p.element_size()  # a ZeRO-3 partition counts whole


def save_sizes(module: nn.Module, deepspeed: bool = False) -> SaveSizes:
    """What saving `module` (the team, with its critics / value heads) writes: every parameter and buffer once (tied
    weights once), a PEFT model's trainable parameters only; and the optimizer state of its trainable parameters."""
    seen: set[int] = set()

    def weights(m: nn.Module) -> int:
        if hasattr(m, "peft_config"):  # save_pretrained writes the adapters only
            tensors = [p for p in m.parameters() if p.requires_grad]
        else:
            tensors = [*m.parameters(recurse=False), *m.buffers(recurse=False)]
        total = 0
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                total += _nbytes(t)
        if not hasattr(m, "peft_config"):
            total += sum(weights(c) for c in m.children())
        return total

    total = weights(module)
    trainable = sum(int(getattr(p, "ds_numel", p.numel())) for p in module.parameters() if p.requires_grad)
    per_param = 12 if deepspeed else 8  # two fp32 moments (+ fp32 master weights under DeepSpeed)
    return SaveSizes(weights=total, optimizer=trainable * per_param)


def free_bytes(path: str) -> int:
    """Free bytes on the disk of `path` (of its nearest existing ancestor)."""
    return shutil.disk_usage(_existing_ancestor(path)).free


def _existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _probe_writable(folder: str) -> None:
    """Create `folder` (as the Trainer does) and a file in it, then remove the file; raise the OSError that a save
    would meet."""
    os.makedirs(folder, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
    os.close(fd)
    os.remove(probe)


def check_output_dir(output_dir: str, needed: int, what: str) -> None:
    """Refuse (`SaveError`, naming the folder) an `output_dir` that cannot be written, or whose disk has fewer free
    bytes than `needed` (`what` says what that is)."""
    path = os.path.abspath(output_dir)
    try:
        _probe_writable(path)
    except OSError as exc:
        raise SaveError(
            exc.errno,
            f"output_dir {path} cannot be written ({exc.strerror or exc}): the run could not save anything there. "
            "Choose a writable output_dir, or fix the folder's permissions",
        ) from exc
    free = free_bytes(path)
    if free < needed:
        raise SaveError(
            errno.ENOSPC,
            f"output_dir {path} is on a disk with {human_bytes(free)} free, and a save of this team needs {what}. "
            "Free some space or choose an output_dir on another disk",
        )


def is_write_failure(exc: BaseException) -> bool:
    """Whether `exc` is a failure to write (a full disk, a read-only or vanished folder) rather than a bug: an
    OSError, or the error a serializer wraps one in (torch's `inline_container.cc`, safetensors' `IoError`)."""
    text = str(exc).lower()
    return isinstance(exc, OSError) or any(w in text for w in ("inline_container", "ioerror", "writ", "no space"))


def failed_save(
    path: str, exc: BaseException, sizes: SaveSizes | None, with_optimizer: bool, intact: str
) -> SaveError:
    """The error of a save to `path` that raised `exc` (a full disk shows as an OSError, or as torch's
    `inline_container.cc` RuntimeError): the path, the original error, the bytes needed and free, and what was left
    intact (`intact`, one sentence)."""
    code = getattr(exc, "errno", None) or errno.EIO
    need = f" It needs {sizes.describe(with_optimizer)};" if sizes is not None else ""
    return SaveError(
        code,
        f"could not save to {os.path.abspath(path)}: {type(exc).__name__}: {exc}.{need} {human_bytes(free_bytes(path))} "
        f"are free on that disk. {intact}",
    )
