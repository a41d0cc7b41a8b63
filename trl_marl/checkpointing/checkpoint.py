"""Crash-safe checkpoints, finding the checkpoint to resume from, and preemption (SIGTERM / SIGUSR1).

A checkpoint is complete or invisible:

1. everything is written into a staging folder `output_dir/.tmp-checkpoint-N` (invisible to transformers'
   `get_last_checkpoint` and checkpoint rotation, whose pattern is `^checkpoint-N$`);
2. every file is fsynced and `checkpoint_complete.json` (the file list with sizes) is written last;
3. the staging folder is renamed to `checkpoint-N` (atomic on POSIX), and only then are older checkpoints rotated.

`resume_from_checkpoint=True` resumes from the latest COMPLETE checkpoint; incomplete ones (a staging folder left by
a crash, or a `checkpoint-N` without the marker) are skipped with one warning naming them.

Fault injection for tests: `TRL_MARL_CRASH_AT_WRITE=k` SIGKILLs the process at the k-th write point of the
checkpoint routine (counted over the process's lifetime); `set_write_hook(fn)` calls `fn(name)` at every write point.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import signal
import warnings
from collections.abc import Callable, Iterator, Sequence

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from trl_marl.checkpointing.checksums import mismatched_files
from trl_marl.checkpointing.durable import FolderSyncer, fsync_dir

__all__ = [
    "COMPLETE_MARKER",
    "PREEMPTED_EXIT_CODE",
    "CheckpointError",
    "checkpoint_identity",
    "checkpoint_status",
    "damaged_files",
    "is_staging_folder",
    "commit_checkpoint",
    "latest_complete_checkpoint",
    "resolve_resume_checkpoint",
    "set_write_hook",
    "staging_folder",
    "write_point",
]

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "checkpoint_complete.json"
STAGING_PREFIX = ".tmp-"
CRASH_ENV = "TRL_MARL_CRASH_AT_WRITE"
# EX_TEMPFAIL (sysexits.h): "a temporary failure; the user is invited to retry" -- what a preempted run is.
PREEMPTED_EXIT_CODE = 75
PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1")

_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
_STAGING_RE = re.compile(rf"^{re.escape(STAGING_PREFIX)}{PREFIX_CHECKPOINT_DIR}-(\d+)$")

_write_count = 0
_write_hook: Callable[[str], None] | None = None


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (incomplete, missing, or with a corrupted file)."""


def set_write_hook(hook: Callable[[str], None] | None) -> None:
    """Call `hook(name)` at every write point of the checkpoint routine (tests inject failures with it)."""
    global _write_hook
    _write_hook = hook


def write_point(name: str) -> None:
    """Mark a write point: the fault-injection hooks (see the module docstring) may kill the process here."""
    global _write_count
    _write_count += 1
    if _write_hook is not None:
        _write_hook(name)
    crash_at = os.environ.get(CRASH_ENV)
    if crash_at and int(crash_at) == _write_count:
        os.kill(os.getpid(), signal.SIGKILL)


def is_staging_folder(path: str) -> bool:
    """Whether `path` is a checkpoint's staging folder (`.tmp-checkpoint-N`)."""
    return bool(_STAGING_RE.match(os.path.basename(os.path.normpath(path))))


def staging_folder(final: str) -> str:
    """The staging folder of checkpoint folder `final` (same parent, so the rename is atomic)."""
    parent, name = os.path.split(os.path.normpath(final))
    return os.path.join(parent, STAGING_PREFIX + name)


def commit_checkpoint(
    staging: str, final: str, step: int, syncer: FolderSyncer | None = None, identity: dict | None = None
) -> None:
    """Make the checkpoint in `staging` visible as `final`: fsync its files, write the completion marker (every file
    with its size and digest, and the writer's `identity`: trainer, algorithm, team), fsync, rename. A `final` left
    from an earlier run (same step) is moved aside and removed after the rename."""
    files = (syncer or FolderSyncer(staging)).finish()
    write_point("fsync")
    marker = os.path.join(staging, COMPLETE_MARKER)
    with open(marker, "w", encoding="utf-8") as f:
        json.dump({"global_step": step, "files": files, "identity": identity or {}}, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(staging)
    write_point("marker")
    old = None
    if os.path.exists(final):
        old = staging_folder(final) + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staging, final)
    fsync_dir(os.path.dirname(os.path.abspath(final)))
    write_point("rename")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def checkpoint_status(folder: str) -> str | None:
    """None when `folder` is a complete checkpoint, else what is wrong with it (one phrase)."""
    if not os.path.isdir(folder):
        return "the folder does not exist"
    if _STAGING_RE.match(os.path.basename(os.path.normpath(folder))):
        return "it is a staging folder: the process died while writing it"
    marker = os.path.join(folder, COMPLETE_MARKER)
    if not os.path.isfile(marker):
        return f"it has no {COMPLETE_MARKER}: the process died while writing it"
    try:
        with open(marker, encoding="utf-8") as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its {COMPLETE_MARKER} is unreadable ({exc})"
    for entry in files:
        path = os.path.join(folder, entry["path"])
        if not os.path.isfile(path):
            return f"{entry['path']} is missing"
        if os.path.getsize(path) != entry["size"]:
            return f"{entry['path']} has {os.path.getsize(path)} bytes, {entry['size']} were written"
    return None


def _step_of(name: str) -> int | None:
    m = _CHECKPOINT_RE.match(name) or _STAGING_RE.match(name)
    return int(m.group(1)) if m else None


def latest_complete_checkpoint(output_dir: str, warn: bool = True) -> str | None:
    """The complete checkpoint of `output_dir` with the highest step, or None. With `warn`, ONE warning names every
    incomplete checkpoint skipped (staging folders, `checkpoint-N` without the completion marker)."""
    if not os.path.isdir(output_dir):
        return None
    found = []
    for name in os.listdir(output_dir):
        step = _step_of(name)
        if step is not None and os.path.isdir(os.path.join(output_dir, name)):
            found.append((step, name))
    skipped = []
    best = None
    for _step, name in sorted(found, reverse=True):
        path = os.path.join(output_dir, name)
        problem = checkpoint_status(path)
        if problem is None:
            if best is None:
                best = path
        elif best is None or _CHECKPOINT_RE.match(name):
            skipped.append(f"{path} ({problem})")
    if skipped and warn:
        logger.warning(
            "skipping incomplete checkpoint(s): %s; resuming from %s",
            "; ".join(skipped),
            best or "nothing (no complete checkpoint)",
        )
    return best


def checkpoint_identity(folder: str) -> dict:
    """What wrote the complete checkpoint `folder` (its marker's `identity`: trainer, algorithm, team); `{}` for a
    checkpoint of an earlier version."""
    try:
        with open(os.path.join(folder, COMPLETE_MARKER), encoding="utf-8") as f:
            identity = json.load(f).get("identity") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return identity if isinstance(identity, dict) else {}


def damaged_files(folder: str) -> list[str]:
    """The files of the complete checkpoint `folder` whose bytes differ from what its marker recorded (XXH3-128,
    or SHA-256 in a checkpoint of an earlier version; one without digests is checked by size)."""
    with open(os.path.join(folder, COMPLETE_MARKER), encoding="utf-8") as f:
        return mismatched_files(folder, json.load(f)["files"])


def _describe(identity: dict) -> str:
    team = identity.get("agents")
    agents = f" with {len(team)} agent(s) ({', '.join(map(str, team))})" if isinstance(team, list) else ""
    return f"{identity.get('trainer', 'an unknown trainer')} (algorithm {identity.get('algorithm', '?')}){agents}"


def _check_identity(path: str, expected: dict | None) -> None:
    """A valid checkpoint of another trainer or another team is refused as such (it is not damaged)."""
    found = checkpoint_identity(path)
    if not expected or not found:
        return
    differ = [k for k in ("trainer", "algorithm", "num_agents") if k in found and found[k] != expected.get(k)]
    if differ:
        raise CheckpointError(
            f"cannot resume from {path}: it was written by {_describe(found)} and this run is "
            f"{_describe(expected)} (different {', '.join(differ)}); the checkpoint is intact: resume it with the "
            "trainer and team that wrote it, or give this run another output_dir"
        )


def resolve_resume_checkpoint(
    resume_from_checkpoint: str | bool | None, output_dir: str, identity: dict | None = None
) -> str | None:
    """The checkpoint folder to resume from: `True` means the latest complete one in `output_dir` (an error when
    there is none); a path must be a complete checkpoint (an error naming it and the latest complete one if not).
    The chosen checkpoint's files are checked against their recorded digests (an error naming every damaged file and
    the intact checkpoint to resume from instead), and against `identity` (the resuming trainer, algorithm and team:
    a checkpoint of another trainer or team is refused as such, never called damaged)."""
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        path = latest_complete_checkpoint(output_dir)
        if path is None:
            raise CheckpointError(
                f"resume_from_checkpoint=True but {output_dir} holds no complete checkpoint "
                f"({PREFIX_CHECKPOINT_DIR}-N with {COMPLETE_MARKER}); start without resume_from_checkpoint"
            )
    else:
        path = os.fspath(resume_from_checkpoint)
        problem = checkpoint_status(path)
        if problem is not None:
            parent = os.path.dirname(os.path.normpath(path)) or "."
            latest = latest_complete_checkpoint(parent, warn=False)
            hint = (
                f"resume from {latest} (the latest complete one)" if latest else "start without resume_from_checkpoint"
            )
            if not os.path.isdir(path):
                raise CheckpointError(f"cannot resume from {path}: no such folder; check the path, or {hint}")
            raise CheckpointError(f"cannot resume from {path}: {problem}; {hint} (this one cannot be resumed)")
    _check_identity(path, identity)
    damaged = damaged_files(path)
    if damaged:
        parent = os.path.dirname(os.path.normpath(path)) or "."
        intact = [
            c
            for c in _complete_checkpoints(parent)
            if _step_of(os.path.basename(c)) < (_step_of(os.path.basename(os.path.normpath(path))) or 0)
            and not damaged_files(c)
        ]
        hint = (
            f"resume from {intact[0]} (the latest intact one before it)"
            if intact
            else "no intact checkpoint precedes it: start without resume_from_checkpoint"
        )
        raise CheckpointError(f"cannot resume from {path}: damaged file(s): {'; '.join(damaged)}; {hint}")
    return path


def _complete_checkpoints(output_dir: str) -> list[str]:
    """The complete checkpoints of `output_dir`, highest step first."""
    found = sorted(
        (
            (step, name)
            for name in os.listdir(output_dir)
            if (step := _step_of(name)) is not None and _CHECKPOINT_RE.match(name)
        ),
        reverse=True,
    )
    return [os.path.join(output_dir, n) for _s, n in found if checkpoint_status(os.path.join(output_dir, n)) is None]


class PreemptionHandler:
    """Turns SIGTERM / SIGUSR1 into a flag the trainer reads at its safe points (the end of each optimizer step, the
    end of each phase before the training loop), while a `covering()` block runs (all of `train()`; the CLI adds its
    final evaluation and save); the previous handlers are restored afterwards."""

    def __init__(self) -> None:
        self.signal_name: str | None = None  # the signal this process received
        self.stop_now = False  # set at a safe point when any process received one (every process stops there)
        self._previous: dict[int, object] = {}
        self._depth = 0

    def _handle(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name
        logger.warning(
            "received %s: finishing the current step, then saving and exiting with status %d",
            self.signal_name,
            PREEMPTED_EXIT_CODE,
        )

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    @property
    def nested(self) -> bool:
        """Whether the current `covering()` block runs inside another one (whose end handles a late signal)."""
        return self._depth > 1

    @contextlib.contextmanager
    def covering(self) -> Iterator[PreemptionHandler]:
        """Handle the signals for the block. Re-entrant: a block inside another keeps the outer block's handlers and
        flags (a signal received in the inner block is still seen by the outer one)."""
        if self._depth == 0:
            self.install()
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.uninstall()

    def install(self) -> None:
        import threading

        self.signal_name, self.stop_now = None, False
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for name in PREEMPTION_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


# ----------------------------------------------------------------------------------------------- the trainer side
RESUME_STATE_FILE = "trl_marl_state_rank{rank}.pt"
TRUSTED_ENV = "TRL_MARL_TRUSTED_CHECKPOINTS"


def save_checkpoint_atomically(
    trainer,
    trial=None,
    identity: dict | None = None,
    with_optimizer: bool = True,
    save_model: Callable[[str], None] | None = None,
) -> str:
    """`transformers.Trainer._save_checkpoint`, made crash-safe (see the module docstring).

    Reuses the Trainer's own pieces (`save_model`, `_save_optimizer_and_scheduler`, `_save_scaler`,
    `_save_rng_state`, `TrainerState.save_to_json`, `rotate_checkpoints`), into the staging folder, the optimizer
    first: its state (twice the weights under AdamW) is the largest flush, which then overlaps the writing of the
    team (model-shaped team: 1.09-1.15x a plain save against 1.27-1.34x team first, `benchmarks/checkpoint_cost.py`);
    adds each process's resume state (`trainer._resume_state()`) and the trainer's `_save_checkpoint_extra(folder)`;
    commits (fsync, marker with every file's digest and the writer's `identity`, rename); only then pushes and
    rotates. Returns the final folder.

    `with_optimizer=False` leaves the optimizer and scheduler out (a checkpoint written before the first optimizer
    step, which also is not pushed); `save_model(folder)` replaces `trainer.save_model` for the team. A save that
    fails (a full disk) removes its staging folder and raises `SaveError` naming the path, the bytes needed and free,
    and the checkpoint left intact.
    """
    from transformers.trainer_utils import rotate_checkpoints

    args, state = trainer.args, trainer.state
    run_dir = trainer._get_output_dir(trial=trial)
    final = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
    staging = staging_folder(final)
    if args.should_save and os.path.exists(staging):
        shutil.rmtree(staging)  # left by a crash at this very step
    trainer.accelerator.wait_for_everyone()
    if trainer.hp_search_backend is None and trial is None:
        trainer.store_flos()
    syncer = FolderSyncer(staging)
    try:
        os.makedirs(staging, exist_ok=True)  # every process: after the main one removed a leftover (the barrier above)
        if with_optimizer and not args.save_only_model:
            _save_optimizer_and_scheduler(trainer, staging, syncer)
            trainer._save_scaler(staging)
            write_point("optimizer")
            syncer.submit_new()  # the files not written through `syncer.torch_save` (a scaler; DeepSpeed, FSDP) too
        if save_model is None:
            trainer.save_model(staging, _internal_call=True)
        else:
            save_model(staging)
        write_point("model")
        syncer.submit_new()  # the team's files
        if not args.save_only_model or not with_optimizer:
            trainer._save_rng_state(staging)
            write_point("rng")
        _save_rest(trainer, staging, final, syncer, identity)
    except Exception as exc:
        syncer.abandon()
        if args.should_save:
            shutil.rmtree(staging, ignore_errors=True)  # a partial checkpoint must not fill the disk
        if isinstance(exc, CheckpointError):
            raise
        raise _checkpoint_save_error(trainer, run_dir, final, exc, with_optimizer) from exc
    except BaseException:
        syncer.abandon()
        raise
    trainer.accelerator.wait_for_everyone()
    state = trainer.state
    if state.best_global_step and os.path.exists(
        os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.best_global_step}")
    ):
        state.best_model_checkpoint = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.best_global_step}")
    if args.push_to_hub and with_optimizer:
        trainer._push_from_checkpoint(final)
    if args.should_save:
        rotate_checkpoints(
            output_dir=run_dir,
            save_total_limit=args.save_total_limit,
            best_model_checkpoint=state.best_model_checkpoint,
            use_mtime=True,
        )
        write_point("rotate")
    return final


def _save_optimizer_and_scheduler(trainer, folder: str, syncer: FolderSyncer) -> None:
    """`Trainer._save_optimizer_and_scheduler`. In its plain case (one process or DDP: no DeepSpeed, FSDP, XLA or
    SageMaker, and a trainer that does not override it) the optimizer and scheduler states are written through
    `syncer.torch_save` (hashed as written) instead of `torch.save` to a path (read back to be hashed)."""
    from transformers import Trainer
    from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME
    from transformers.trainer_pt_utils import reissue_pt_warnings
    from transformers.utils import is_sagemaker_mp_enabled, is_torch_xla_available

    special = trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled or is_torch_xla_available()
    # overridden by a subclass or on the instance: theirs is used
    overridden = getattr(trainer._save_optimizer_and_scheduler, "__func__", None) is not (
        Trainer._save_optimizer_and_scheduler
    )
    if special or is_sagemaker_mp_enabled() or overridden:
        trainer._save_optimizer_and_scheduler(folder)
        return
    if not trainer.args.should_save:
        return
    syncer.torch_save(trainer.optimizer.state_dict(), os.path.join(folder, OPTIMIZER_NAME))
    with warnings.catch_warnings(record=True) as caught:
        syncer.torch_save(trainer.lr_scheduler.state_dict(), os.path.join(folder, SCHEDULER_NAME))
    reissue_pt_warnings(caught)


def _checkpoint_save_error(trainer, run_dir: str, final: str, exc: Exception, with_optimizer: bool) -> Exception:
    """A failed checkpoint write as a `SaveError` (path, bytes needed and free, the checkpoint left intact); errors
    that are not about writing (a bug in a trainer's extra state) pass through unchanged."""
    from trl_marl.checkpointing.space import failed_save, is_write_failure, save_sizes

    if not is_write_failure(exc):
        return exc
    latest = latest_complete_checkpoint(run_dir, warn=False)
    intact = (
        f"The partial checkpoint was removed; {latest}, the latest complete checkpoint, is intact."
        if latest
        else "The partial checkpoint was removed; there is no earlier complete checkpoint."
    )
    sizes = save_sizes(trainer.team, trainer.is_deepspeed_enabled)
    return failed_save(final, exc, sizes, with_optimizer, intact + " Free some space, then resume.")


def _save_rest(trainer, staging: str, final: str, syncer: FolderSyncer, identity: dict | None) -> None:
    """The resume state, the trainer's extra files and the trainer state; then commit."""
    from transformers.trainer_callback import ExportableState

    args, state = trainer.args, trainer.state
    _atomic_torch_save(
        trainer._resume_state(),
        os.path.join(staging, RESUME_STATE_FILE.format(rank=trainer.accelerator.process_index)),
    )
    write_point("resume_state")
    trainer._save_checkpoint_extra(staging)
    if args.should_save:
        for cb in [
            c for c in trainer.callback_handler.callbacks + [trainer.control] if isinstance(c, ExportableState)
        ]:
            name = cb.__class__.__name__
            if isinstance(state.stateful_callbacks.get(name), list):
                state.stateful_callbacks[name].append(cb.state())
            else:
                state.stateful_callbacks[name] = cb.state()
        state.save_to_json(os.path.join(staging, "trainer_state.json"))
        write_point("trainer_state")
    if not args.should_save:
        syncer.finish()  # this process's files (rng, resume state) are on disk before the main process commits
    trainer.accelerator.wait_for_everyone()
    if args.should_save:
        commit_checkpoint(staging, final, state.global_step, syncer, identity)


def _atomic_torch_save(obj, path: str) -> None:
    import torch

    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_resume_state(folder: str, rank: int, safe_types: Sequence[type] = ()) -> dict:
    """This process's resume state from a checkpoint (a clear error naming the file when it is missing or
    unreadable). `safe_types` are the classes it may hold besides tensors and plain containers: the trainer's
    `resume_types` (its rollout, critic data or preference pairs); anything else is refused unless the user sets
    `TRL_MARL_TRUSTED_CHECKPOINTS=1`."""
    import torch

    path = os.path.join(folder, RESUME_STATE_FILE.format(rank=rank))
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{folder} has no {os.path.basename(path)} (the state of process {rank}: step inside the rollout, "
            "buffered rollout, env_step, random streams): it was written by an older trl_marl or by a run with "
            "fewer processes; resume with the same number of processes from a checkpoint of this version"
        )
    if os.environ.get(TRUSTED_ENV, "").lower() in ("1", "true", "yes"):
        return torch.load(path, weights_only=False)  # the user vouches for this checkpoint
    try:
        # weights_only: only tensors, plain containers and the trainer's resume types are unpickled
        with torch.serialization.safe_globals(_resume_state_globals(safe_types)):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
        if found:
            raise CheckpointError(
                f"{path} holds an object of type {found.group(1)}, outside the trainer's resume types "
                f"(probably a value in your dataset items); if you trust this checkpoint, set {TRUSTED_ENV}=1 to "
                "load it with full pickle"
            ) from exc
        raise CheckpointError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}); delete {folder} and resume from the checkpoint "
            "before it"
        ) from exc
    except Exception as exc:  # noqa: BLE001 -- a truncated / damaged file
        raise CheckpointError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}); delete {folder} and resume from the checkpoint "
            "before it"
        ) from exc


def _resume_state_globals(safe_types: Sequence[type]) -> list:
    """The `torch.load(weights_only=True)` allowlist: the trainer's own resume types plus the containers they use."""
    import collections

    return [*safe_types, collections.defaultdict, collections.OrderedDict]
