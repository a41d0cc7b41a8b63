"""The digest (XXH3-128) a checkpoint's marker records for each file is the digest of the bytes on disk: for files hashed while
they are written (`HashingWriter`, the optimizer and scheduler states), for files read back, and for files changed
after they were hashed; a file whose bytes change after the checkpoint is committed is refused when it is resumed."""

import hashlib
import io
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import xxhash

from trl_marl.checkpointing import durable
from trl_marl.checkpointing.checkpoint import COMPLETE_MARKER, CheckpointError, resolve_resume_checkpoint
from trl_marl.checkpointing.durable import FolderSyncer, HashingWriter

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
import resume_run  # noqa: E402


def _xxh3(path) -> str:  # the reference: xxhash itself on the file's bytes
    return xxhash.xxh3_128(Path(path).read_bytes()).hexdigest()


def _sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_hashing_writer_records_the_digest_of_the_bytes_on_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(durable, "_FOLLOW_BYTES", 1000)  # the follower wakes and reads many times
    path = tmp_path / "f.bin"
    pieces = [os.urandom(n) for n in (7, 3000, 1, 999, 12_345, 0, 64)]
    with HashingWriter(str(path)) as writer:
        for piece in pieces:
            writer.write(memoryview(piece))
        with pytest.raises(io.UnsupportedOperation):
            writer.seek(0)  # front to back only: the digest is of the file's bytes in order
    stat = path.stat()
    assert path.read_bytes() == b"".join(pieces)
    assert writer.record == (_xxh3(path), stat.st_size, stat.st_mtime_ns)
    assert writer._follower is not None  # it followed the writer


def test_a_small_file_is_hashed_when_closed_without_a_thread(tmp_path):
    """Under one chunk (`_FOLLOW_BYTES`) nothing starts a follower thread: the file is hashed when it is closed."""
    path = tmp_path / "scheduler.pt"
    with HashingWriter(str(path)) as writer:
        for piece in (b"a", os.urandom(100_000), b"", b"z"):
            writer.write(piece)
    assert writer._follower is None
    stat = path.stat()
    assert writer.record == (_xxh3(path), stat.st_size, stat.st_mtime_ns)


def test_a_file_changed_while_written_has_no_record_and_is_read_back(tmp_path):
    path = tmp_path / "f.bin"
    syncer = FolderSyncer(str(tmp_path))
    with HashingWriter(str(path)) as writer:
        writer.write(b"written through the writer")
        with open(path, "ab") as other:  # not through the writer: its digest would not be the file's
            other.write(b", and by someone else")
    assert writer.record is None
    syncer.futures[str(path)] = syncer.pool.submit(durable._fsync_written, str(path), writer.record)
    [entry] = syncer.finish()
    assert entry == {"path": "f.bin", "size": path.stat().st_size, "xxh3_128": _xxh3(path)}


def test_torch_save_is_hashed_as_written_not_read_back(tmp_path, monkeypatch):
    """A file written by `FolderSyncer.torch_save` gets its digest from the writer (the read-back is never used);
    it loads with `torch.load` although its zip records carry no CRC-32."""
    state = {"exp_avg": torch.randn(300_000), "step": torch.tensor(3.0)}
    syncer = FolderSyncer(str(tmp_path))
    syncer.torch_save(state, str(tmp_path / "optimizer.pt"))

    def no_read_back(path):
        raise AssertionError(f"{path} was read back")

    monkeypatch.setattr(durable, "_fsync_file", no_read_back)
    [entry] = syncer.finish()
    path = tmp_path / "optimizer.pt"
    assert entry == {"path": "optimizer.pt", "size": path.stat().st_size, "xxh3_128": _xxh3(path)}
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["exp_avg"], state["exp_avg"]) and torch.serialization.get_crc32_options()


def test_a_file_changed_after_it_was_hashed_as_written_is_hashed_again(tmp_path):
    syncer = FolderSyncer(str(tmp_path))
    path = tmp_path / "scheduler.pt"
    syncer.torch_save({"lr": 1.0}, str(path))
    syncer.futures[str(path)].result()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, a later modification time
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    [entry] = syncer.finish()
    assert entry["xxh3_128"] == _xxh3(path)


def test_a_checkpoints_marker_holds_the_digest_of_every_file_and_a_changed_byte_is_refused(tmp_path, tiny_path):
    out = tmp_path / "run"
    t = resume_run.build("magrpo", str(out), tiny_path)
    t.args.max_steps = 1
    t.train()
    folder = out / "checkpoint-1"
    files = json.loads((folder / COMPLETE_MARKER).read_text())["files"]
    on_disk = sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER
    )
    assert [f["path"] for f in files] == on_disk
    assert all(f["xxh3_128"] == _xxh3(folder / f["path"]) and "sha256" not in f for f in files)
    assert resolve_resume_checkpoint(True, str(out)) == str(folder)
    optimizer = folder / "optimizer.pt"
    data = bytearray(optimizer.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside a tensor: torch.load itself would not notice
    optimizer.write_bytes(bytes(data))
    torch.load(optimizer, weights_only=True)
    with pytest.raises(CheckpointError, match=r"damaged file\(s\): optimizer.pt \(its bytes changed"):
        resolve_resume_checkpoint(True, str(out))


def test_a_checkpoint_of_an_earlier_version_is_checked_with_its_sha256(tmp_path, tiny_path):
    """Markers and `checksums.json` written before XXH3-128 recorded SHA-256 under "sha256": such a checkpoint
    resumes, and a changed byte is still refused, named with the digest it was checked with."""
    from trl_marl.checkpointing.checksums import mismatched_files

    out = tmp_path / "run"
    t = resume_run.build("magrpo", str(out), tiny_path)
    t.args.max_steps = 1
    t.train()
    folder = out / "checkpoint-1"
    marker = json.loads((folder / COMPLETE_MARKER).read_text())
    for f in marker["files"]:  # the earlier format
        del f["xxh3_128"]
        f["sha256"] = _sha256(folder / f["path"])
    (folder / COMPLETE_MARKER).write_text(json.dumps(marker))
    assert resolve_resume_checkpoint(True, str(out)) == str(folder)
    state = folder / "trainer_state.json"
    state.write_text(state.read_text().replace('"global_step": 1', '"global_step": 7'))  # same size, other bytes
    with pytest.raises(CheckpointError, match=r"trainer_state.json \(its bytes changed after it was written: SHA-256"):
        resolve_resume_checkpoint(True, str(out))
    # an entry without any digest (written before checksums) is checked by its size only
    assert mismatched_files(str(folder), [{"path": "trainer_state.json", "size": state.stat().st_size}]) == []
