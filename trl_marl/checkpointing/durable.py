"""A checkpoint's files made durable and listed with their digest (XXH3-128, `checksums.DIGEST`): fsync on a small
thread pool while the rest of the checkpoint is still being written, and the digest of every file, for the
completion marker.

Two ways a file gets its digest:

- written through `FolderSyncer.torch_save` (the optimizer and scheduler states): hashed while it is written, by a
  thread that follows the writer, so its digest is ready when the last byte is written (no read-back afterwards);
- any other file (the agents' `save_pretrained` folders, the random states, other processes' files): found by a walk
  of the folder, fsynced and read back by a worker of the pool while the checkpoint goes on.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from trl_marl.checkpointing.checksums import DIGEST, new_hasher

__all__ = ["FileRecord", "FolderSyncer", "HashingWriter", "fsync_dir"]

# (digest hex, size, mtime_ns): a file's digest and its size and modification time when it was taken
FileRecord = tuple[str, int, int]

_BUFFER_BYTES = 256 << 10  # `torch_save` joins writes smaller than this (zip headers, the pickle), larger ones pass
_FOLLOW_BYTES = 4 << 20  # the hashing thread of a `HashingWriter` is woken (and reads) in chunks of 4 MiB
_hasher: Callable[[], Any] = new_hasher  # the checkpoints' digest (`benchmarks/checkpoint_cost.py` replaces it)


def _fsync(fd: int) -> None:
    os.fsync(fd)


def fsync_dir(folder: str) -> None:
    """fsync a folder (its entries: new names, renames); nothing where the filesystem refuses it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        _fsync(fd)
    except OSError:  # some filesystems refuse fsync on folders
        pass
    finally:
        os.close(fd)


class HashingWriter(io.RawIOBase):
    """A new file, written front to back only, hashed (XXH3-128) while it is being written.

    A helper thread, started once the first 4 MiB are written, follows the writer: it reads back from the page cache
    and hashes the bytes already written, while the next ones are written (the writer never waits for it, and the
    hash releases the GIL), so the digest is ready shortly after the last write instead of needing a read-back of the
    whole file afterwards. A smaller file (a scheduler's state, a tiny model's optimizer) is hashed from the page
    cache when it is closed, without a thread (starting one cost about 1 ms of a 2 MB, 8 ms `torch.save`: the new
    thread waits for the GIL the pickler holds), and the read buffer is sized to what is read (a 4 MiB buffer for
    each file cost 2.6 ms). The file cannot seek:
    what was written is never rewritten, so the bytes hashed are the file's. `record` (after `close`) is
    the digest with the file's size and modification time; None when the file does not hold exactly the bytes
    written (a failed write) or they could not be read back: it is then hashed again when listed."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.record: FileRecord | None = None
        self.error: OSError | None = None  # the write that failed (a full disk)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        self._written = 0  # bytes in the file (published to the follower under `_more`)
        self._published = 0
        self._finished = False
        self._more = threading.Condition()
        self._digest: str | None = None
        self._follower: threading.Thread | None = None  # started by the first chunk (`_publish`)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        try:
            return self._write(data)
        except OSError as exc:  # torch.save reports it as "unexpected pos": `FolderSyncer.torch_save` raises it
            self.error = exc
            raise

    def _write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        while view.nbytes:
            view = view[os.write(self._fd, view) :]
        self._written += size
        if self._written - self._published >= _FOLLOW_BYTES:
            self._publish()
        return size

    def _publish(self, finished: bool = False) -> None:
        with self._more:
            self._published, self._finished = self._written, finished
            self._more.notify()
        if self._follower is None and not finished:
            self._follower = threading.Thread(target=self._follow, name="ckpt-hash", daemon=True)
            self._follower.start()

    def _follow(self) -> None:
        digest, hashed = _hasher(), 0
        chunk = memoryview(bytearray(0))  # grown to what is read at once (a small file's size, else a chunk)
        try:
            while True:
                with self._more:
                    while hashed >= self._published and not self._finished:
                        self._more.wait()
                    end, finished = self._published, self._finished
                while hashed < end:
                    size = min(_FOLLOW_BYTES, end - hashed)
                    if len(chunk) < size:
                        chunk = memoryview(bytearray(size))
                    n = os.preadv(self._fd, [chunk[:size]], hashed)
                    if n <= 0:
                        return  # shorter than what was written: no digest
                    digest.update(chunk[:n])
                    hashed += n
                if finished:
                    self._digest = digest.hexdigest()
                    return
        except OSError:
            return  # unreadable: no digest, the file is read back when listed

    def close(self) -> None:
        """Close the file once its digest is taken (`record`)."""
        if self.closed:
            return
        try:
            self._publish(finished=True)
            if self._follower is None:  # under one chunk: hashed here
                self._follow()
            else:
                self._follower.join()
            stat = os.fstat(self._fd)
            if self._digest is not None and stat.st_size == self._written:
                self.record = (self._digest, stat.st_size, stat.st_mtime_ns)
        finally:
            os.close(self._fd)
            super().close()


class FolderSyncer:
    """fsyncs a checkpoint's files on a small thread pool while the rest of the checkpoint is still being written
    (fsync releases the GIL, and concurrent fsyncs share the filesystem's journal commits): the disk flush of the
    agents overlaps the serialization of the optimizer, instead of adding to it.

    Every process walks the same staging folder while the others are still writing into it, so a walk can meet
    another process's temporary file (safetensors writes `.tmpXXXXXX` beside its target, then renames it): names
    starting or ending with `.tmp` are skipped, and a file gone by the time it is fsynced or listed (renamed or
    removed by the process that wrote it, which fsyncs its own files) is left out instead of failing the save."""

    def __init__(self, folder: str, workers: int = 8):
        self.folder = folder
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-fsync")
        self.futures: dict[str, Future] = {}

    def torch_save(self, obj: object, path: str) -> None:
        """`torch.save(obj, path)` through a `HashingWriter`: its digest is known when it is written (no read-back),
        and its fsync is under way. The zip CRC-32 of each record is not computed: `torch.load` never checks it,
        and the marker's digest covers every byte of the file (checked before a checkpoint is resumed)."""
        import torch

        crc32 = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        writer = HashingWriter(path)
        try:
            with writer:
                buffered = io.BufferedWriter(writer, buffer_size=_BUFFER_BYTES)  # torch's many small writes, joined
                torch.save(obj, buffered)
                buffered.flush()
        except RuntimeError as exc:
            if writer.error is not None:
                raise writer.error from exc
            raise
        finally:
            torch.serialization.set_crc32_options(crc32)
        self.futures[path] = self.pool.submit(_fsync_written, path, writer.record)

    def submit_new(self) -> None:
        """Start fsyncing the files written since the last call (those already submitted are skipped)."""
        for root, _dirs, names in os.walk(self.folder):
            for name in names:
                path = os.path.join(root, name)
                if path not in self.futures and not (name.endswith(".tmp") or name.startswith(".tmp")):
                    self.futures[path] = self.pool.submit(_fsync_file, path)

    def finish(self) -> list[dict]:
        """fsync everything (files, then folders); return the file list with sizes and digests.

        Each file was hashed as it was written (`torch_save`) or by the worker that fsynced it, while its pages
        were in memory (`_fsync_file`), so the hashing overlaps the writing of the rest of the checkpoint. A file
        whose size or modification time changed since it was hashed (another process's file still growing when the
        walk met it) is fsynced and hashed again here, after every process has finished writing: the marker holds
        the digest of the final bytes."""
        self.submit_new()
        try:
            done = {path: future.result() for path, future in self.futures.items()}
            dirs = [root for root, _dirs, _names in os.walk(self.folder)]
            for future in [self.pool.submit(fsync_dir, d) for d in dirs]:
                future.result()
            files, again = [], []
            for path, hashed in done.items():
                if not os.path.isfile(path):  # another process's renamed temporary file
                    continue
                stat = os.stat(path)
                if hashed is None or hashed[1:] != (stat.st_size, stat.st_mtime_ns):
                    again.append(path)
                else:
                    files.append((path, hashed[0], hashed[1]))
            for path, hashed in zip(again, self.pool.map(_fsync_file, again)):
                if hashed is not None:
                    files.append((path, hashed[0], hashed[1]))
        finally:
            self.pool.shutdown(wait=True)
        entries = [{"path": os.path.relpath(p, self.folder), "size": size, DIGEST: d} for p, d, size in files]
        return sorted(entries, key=lambda f: f["path"])

    def abandon(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _fsync_file(path: str) -> FileRecord | None:
    """fsync a file, then hash it while its pages are in memory: `(digest, size, mtime_ns)`, size and time as they
    were before the hashing began (`FolderSyncer.finish` hashes again a file that changed since); None when the file
    is gone (renamed or removed by the process that wrote it, see `FolderSyncer`)."""
    try:
        with open(path, "rb") as f:
            _fsync(f.fileno())
            stat = os.fstat(f.fileno())
            return hashlib.file_digest(f, _hasher).hexdigest(), stat.st_size, stat.st_mtime_ns
    except FileNotFoundError:
        return None


def _fsync_path(path: str) -> bool:
    """fsync a file by its path; False when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        _fsync(fd)
    finally:
        os.close(fd)
    return True


def _fsync_written(path: str, record: FileRecord | None) -> FileRecord | None:
    """fsync a file written through a `HashingWriter`: its `record`, or None (read it back) when the file is gone
    or its writer had no record."""
    return record if _fsync_path(path) else None
