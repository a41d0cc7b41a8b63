"""Content checksums written with the files a trainer saves, and checked when they are read back.

Checkpoints (their completion marker lists every file with its size and digest), saved teams (`checksums.json`
beside `team.json`) and round files (a digest of their records) carry the checksums of what was written, so a file
whose bytes changed afterwards (a flipped bit, a partial copy, an edit) is named when it is loaded instead of
training on it. Saved teams are hashed by reading the files back once, on a small thread pool (the hashes release
the GIL), after they are complete; checkpoints hash the optimizer state while it is written
(`trl_marl.checkpointing.durable`); the cost is measured by `benchmarks/checkpoint_cost.py`.

The file digest is XXH3-128 (`xxhash`, already a dependency of `datasets`): these checksums catch accidents (a torn
or partial copy, a flipped bit, a file edited by hand), for which a 128-bit non-cryptographic hash is as good as
SHA-256 at about ten times its speed (15-20 GB/s against 1.8 GB/s with SHA-NI here; at 1.8 GB/s hashing was 0.2-0.5x
of a plain save's time). They are not a defence against someone who can write the folder: they could rewrite the
list as well. Files listed by an earlier version with `"sha256"` are still checked with SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import xxhash

from trl_marl.checkpointing.state_files import CorruptedStateError

__all__ = [
    "CHECKSUM_FILE",
    "DIGEST",
    "digest_records",
    "file_digest",
    "file_digests",
    "mismatched_files",
    "new_hasher",
    "verify_folder_checksums",
    "verify_saved_agent",
    "write_folder_checksums",
]

CHECKSUM_FILE = "checksums.json"
DIGEST = "xxh3_128"  # the key of a file's digest in the lists written now
# every digest a list may hold: the current one, and SHA-256 (what earlier lists recorded, as "sha256")
_HASHERS: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
_LABELS = {"xxh3_128": "XXH3-128", "sha256": "SHA-256"}
_WORKERS = min(8, os.cpu_count() or 1)


def new_hasher(algorithm: str = DIGEST) -> Any:
    """A fresh hash object of `algorithm` (`update(bytes)`, `hexdigest()`)."""
    return _HASHERS[algorithm]()


def file_digest(path: str, algorithm: str = DIGEST) -> str:
    """The digest of a file's bytes (hex), XXH3-128 unless `algorithm` says otherwise."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, _HASHERS[algorithm]).hexdigest()


def file_digests(paths: Sequence[str], workers: int = _WORKERS, algorithms: Sequence[str] | None = None) -> list[str]:
    """`file_digest` of every path (with `algorithms[i]` when given), computed in parallel; in the order of `paths`."""
    algorithms = list(algorithms) if algorithms is not None else [DIGEST] * len(paths)
    if len(paths) <= 1 or workers <= 1:
        return [file_digest(p, a) for p, a in zip(paths, algorithms)]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="checksum") as pool:
        return list(pool.map(file_digest, paths, algorithms))


def digest_records(records: object) -> str:
    """The SHA-256 of JSON data in a canonical form (sorted keys, no spaces, UTF-8): what a round file's `digest`
    field holds for its records."""
    text = json.dumps(records, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _recorded_digest(entry: dict) -> tuple[str, str] | None:
    """`(algorithm, hex digest)` an entry records, or None (an entry written before checksums: size only)."""
    for algorithm in _HASHERS:
        if isinstance(entry.get(algorithm), str):
            return algorithm, entry[algorithm]
    return None


def mismatched_files(folder: str, entries: Iterable[dict]) -> list[str]:
    """The entries (`{"path", "size", "xxh3_128"}` or, written by an earlier version, `"sha256"`; paths relative to
    `folder`) whose file is missing, has another size or another digest; each as `"<path> (<what differs>)"`. Entries
    without a digest are checked by size only."""
    entries = list(entries)
    problems, to_hash = [], []
    for entry in entries:
        path = os.path.join(folder, entry["path"])
        if not os.path.isfile(path):
            problems.append(f"{entry['path']} (missing)")
        elif os.path.getsize(path) != entry["size"]:
            problems.append(f"{entry['path']} ({os.path.getsize(path)} bytes, {entry['size']} were written)")
        elif (recorded := _recorded_digest(entry)) is not None:
            to_hash.append((entry["path"], *recorded))
    digests = file_digests([os.path.join(folder, p) for p, _, _ in to_hash], algorithms=[a for _, a, _ in to_hash])
    problems += [
        f"{p} (its bytes changed after it was written: {_LABELS[a]} {d[:12]}..., {written[:12]}... written)"
        for (p, a, written), d in zip(to_hash, digests)
        if d != written
    ]
    return problems


def write_folder_checksums(folder: str, entries: Sequence[str], exclude_names: Sequence[str] = ()) -> str:
    """Write `folder/checksums.json`: the size and digest (XXH3-128) of every file of the top-level `entries` of
    `folder` (files, or folders walked recursively), except files named in `exclude_names` (e.g. `README.md`: the
    model cards are rewritten at push time). Returns its path."""
    skip = {CHECKSUM_FILE, *exclude_names}
    paths = []
    for entry in entries:
        top = os.path.join(folder, entry)
        if os.path.isfile(top):
            paths.append(entry)
            continue
        for root, _dirs, names in os.walk(top):
            paths += [os.path.relpath(os.path.join(root, n), folder) for n in names if n not in skip]
    paths = sorted(p for p in paths if os.path.basename(p) not in skip and not p.endswith(".tmp"))
    digests = file_digests([os.path.join(folder, p) for p in paths])
    entries = [
        {"path": p, "size": os.path.getsize(os.path.join(folder, p)), DIGEST: d} for p, d in zip(paths, digests)
    ]
    target = os.path.join(folder, CHECKSUM_FILE)
    tmp = target + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"algorithm": DIGEST, "files": entries}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def verify_folder_checksums(folder: str, fix: str, subfolders: Sequence[str] | None = None) -> bool:
    """Check the files listed in `folder/checksums.json` (only those under `subfolders`, when given): a
    `CorruptedStateError` naming every damaged file and `fix` when one differs. Returns False when the folder has no
    `checksums.json` (written by an earlier version: nothing to check), True when every file matched."""
    path = os.path.join(folder, CHECKSUM_FILE)
    if not os.path.isfile(path):
        return False
    from trl_marl.checkpointing.state_files import read_json_state

    data = read_json_state(path, fix)
    entries = data.get("files")
    if not isinstance(entries, list):
        raise CorruptedStateError(path, "the field 'files' is missing or not a list", fix)
    if subfolders is not None:
        prefixes = tuple(s.rstrip("/") + "/" for s in subfolders)
        entries = [e for e in entries if str(e.get("path", "")).startswith(prefixes)]
    problems = mismatched_files(folder, entries)
    if problems:
        raise CorruptedStateError(folder, "damaged file(s): " + "; ".join(problems), fix)
    return True


def verify_saved_agent(folder: str | os.PathLike) -> bool:
    """Check an agent folder of a saved team (`team/agent_i`) against the team's `checksums.json`, when it has one:
    a `CorruptedStateError` naming the damaged files. Returns whether anything was checked."""
    root, name = os.path.split(os.path.normpath(os.fspath(folder)))
    fix = (
        f"the saved team in {root} is damaged: save it again (trainer.save_model), or load it from a checkpoint or "
        "the Hub copy"
    )
    return verify_folder_checksums(root, fix, subfolders=[name])
