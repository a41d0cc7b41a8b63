"""Round files of iterative preference training: one JSON file per round, `{"iteration", "num_pairs", "sha256",
"pairs"}`.

`write_round_file` writes atomically (temp file in the same folder, fsync, rename), so a crash never leaves a
half-written round; `read_round_file` validates what it reads (the content checksum first: a flipped digit in a
reward or a character in a completion still parses), and any damage is a `CorruptedStateError` naming the
file, what is wrong and what to do. `StoredRound` is a stored round read lazily, as the replay modes index it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence

from trl_marl.checkpointing.state_files import CorruptedStateError, read_json_state, require
from trl_marl.data_types.text import valid_texts
from trl_marl.trainers.preference.pair_checks import record_problem

__all__ = [
    "ROUND_RECORD_KEYS",
    "StoredRound",
    "read_round_file",
    "round_file_name",
    "round_pairs_sha256",
    "write_round_file",
]

ROUND_RECORD_KEYS = (
    "prompts",
    "winner_completions",
    "loser_completions",
    "winner_reward",
    "loser_reward",
    "candidate_reward_mean",
)
_ROUND_FIX = "delete it and resume from a checkpoint written before that round (its copy of the round is restored)"


def round_file_name(iteration: int) -> str:
    """`iteration_{iteration:04d}.json`: the file of round `iteration` in the replay folder."""
    return f"iteration_{iteration:04d}.json"


def round_pairs_sha256(records: list) -> str:
    """SHA-256 of a round's pairs in one canonical JSON form (sorted keys, no spaces, non-ASCII kept): the same for
    the records written and for the records `json` reads back (Python's floats round-trip exactly)."""
    canonical = json.dumps(records, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def write_round_file(path: str, iteration: int, records: list[dict]) -> None:
    """Write `{"iteration", "num_pairs", "sha256", "pairs"}` to `path` atomically (temp file in the same folder,
    fsync, rename), so a crash never leaves a half-written round; `sha256` is `round_pairs_sha256` of the pairs
    written. The file is UTF-8 with non-ASCII text as it is, so it reads back equal to `records`, except that a lone
    surrogate in a text (invalid unicode, e.g. from an API's JSON) is written as U+FFFD (`valid_text`), the text
    `completion_token_ids` tokenizes for it: a comparator's completion read back gives the ids its pair trained on."""
    records = valid_texts(records)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".round-", suffix=".json.tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            header = {"iteration": iteration, "num_pairs": len(records), "sha256": round_pairs_sha256(records)}
            json.dump({**header, "pairs": records}, f, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_round_file(
    path: str, expected_iteration: int | None = None, num_agents: int | None = None, fix: str = _ROUND_FIX
) -> dict:
    """Read and validate a round file: `{"iteration", "num_pairs", "sha256", "pairs"}`, the pairs match the checksum
    written with them (files written before checksums, without the key, are read unverified), the pair count and
    (when given) the round number agree with the header, every pair has the record fields (with `num_agents` entries per list) and
    passes `pair_checks.record_problem` (string completions, finite rewards, a winner whose recorded reward is not
    below the loser's: a pair whose winner and loser were swapped is refused). Any damage is a
    `CorruptedStateError` naming the file, the pair's index, what is wrong and `fix`."""
    data = read_json_state(path, fix)
    iteration = require(data, "iteration", int, path, fix)
    num_pairs = require(data, "num_pairs", int, path, fix)
    pairs = require(data, "pairs", list, path, fix)
    if expected_iteration is not None and iteration != expected_iteration:
        raise CorruptedStateError(path, f"its header says round {iteration}, expected round {expected_iteration}", fix)
    if num_pairs != len(pairs):
        raise CorruptedStateError(path, f"its header says {num_pairs} pairs but it holds {len(pairs)}", fix)
    for k, rec in enumerate(pairs):
        if not isinstance(rec, dict):
            raise CorruptedStateError(path, f"pair {k} is a {type(rec).__name__}, not a JSON object", fix)
        missing = [key for key in ROUND_RECORD_KEYS if key not in rec]
        if missing:
            raise CorruptedStateError(path, f"pair {k} lacks {missing}", fix)
        if num_agents is not None:
            for key in ROUND_RECORD_KEYS[:3]:
                if not isinstance(rec[key], list) or len(rec[key]) != num_agents:
                    raise CorruptedStateError(path, f"pair {k}'s {key!r} should list {num_agents} entries", fix)
        problem = record_problem(rec)
        if problem is not None:
            raise CorruptedStateError(path, f"pair {k}: {problem}", fix)
    # last: a change the checks above name gets their message; a change that still reads as a valid pair gets this
    if "sha256" in data:
        written = require(data, "sha256", str, path, fix)
        try:
            actual = round_pairs_sha256(pairs)
        except ValueError:  # a NaN or inf the writer never writes (allow_nan=False)
            actual = None
        if actual != written:
            raise CorruptedStateError(
                path, "its pairs do not match the SHA-256 written with them (changed on disk)", fix
            )
    return data


class StoredRound(Sequence):
    """A stored round, read from its file on first access (a replay mode only indexes the rounds it selects from)."""

    def __init__(self, path: str, size: int, iteration: int | None = None, num_agents: int | None = None):
        self.path, self.size, self._pairs = path, size, None
        self.iteration, self.num_agents = iteration, num_agents

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        if self._pairs is None:
            data = read_round_file(self.path, self.iteration, self.num_agents)
            if data["num_pairs"] != self.size:
                raise CorruptedStateError(
                    self.path,
                    f"it holds {data['num_pairs']} pairs but this run's replay index recorded {self.size}",
                    _ROUND_FIX,
                )
            self._pairs = data["pairs"]
        return self._pairs[index]
