"""Where a preference pair collection is, so that a failure in its middle loses none of its finished chunks.

MADPO's and MARLHF's collection before the training loop, and each round's collection of the iterative trainers,
roll out the task items chunk after chunk (`data_parallel.collection_chunks`). While one runs, `collecting` keeps
its `CollectionProgress` on the trainer (`trainer._collection`): how many chunks are finished and this process's
results of each (`(item index, results)` entries: the pairs and the candidates' rewards the candidate-reward metric
averages). A chunk that raises leaves no trace: the random streams and `env_step` are put back where the chunk
began (`RNGStreams.scoped` already leaves the rollout stream there; a comparator's stream or scores drawn after it
are undone too) and its results are dropped. The trainer then holds the state of a collection that stopped after
its last finished chunk, which is what the checkpoint written before the error is raised keeps
(`trainers.checkpoints.save_after_failure`: the progress in the trainer's extra resume state, the streams and
`env_step` in its resume state); a run resumed from it continues at the failed chunk and builds the pairs, and
makes the random draws, of a run that never failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CollectionProgress", "collecting"]


@dataclass
class CollectionProgress:
    """A pair collection under way: `what` it is (for messages), its random-stream `round`, its `chunks` (this
    process's item indices of each), how many are `finished`, and this process's `results` of those (in chunk
    order, as the collection appends them)."""

    what: str
    round: int
    chunks: list[list[int]]
    finished: int = 0
    results: list = field(default_factory=list)
    _start: tuple | None = field(default=None, repr=False)  # (streams, env_step, results kept) at the chunk's start

    def remaining(self, trainer: Any, chunks: Sequence) -> Iterator:
        """The entries of `chunks` not finished yet, in order; each counts as finished once the caller asks for the
        next one (or the loop ends)."""
        for k in range(self.finished, len(chunks)):
            self._start = (trainer.rng_streams.state_dict(), trainer.env_step, len(self.results))
            yield chunks[k]
            self.finished, self._start = k + 1, None

    def rewind(self, trainer: Any) -> None:
        """Undo the chunk in progress: the random streams and `env_step` as it found them, its results dropped."""
        if self._start is None:
            return
        streams, env_step, kept = self._start
        trainer.rng_streams.load_state_dict(streams)
        trainer.env_step = env_step
        del self.results[kept:]
        self._start = None

    def describe(self) -> str:
        """Where it stopped, e.g. "the preference pair collection after 2 of its 5 chunks"."""
        return f"{self.what} after {self.finished} of its {len(self.chunks)} chunks"

    def state_dict(self) -> dict:
        return {
            "what": self.what,
            "round": self.round,
            "chunks": self.chunks,
            "finished": self.finished,
            "results": self.results,
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> CollectionProgress:
        return cls(state["what"], state["round"], state["chunks"], state["finished"], list(state["results"]))


@contextlib.contextmanager
def collecting(
    trainer: Any, what: str, round: int, chunks: Sequence[tuple[list[int], bool]], resumable: bool = True
) -> Iterator[CollectionProgress]:
    """Run a collection of `chunks` (`collection_chunks`' entries) with a `CollectionProgress`. `resumable` (the
    trainer's own task items): it is `trainer._collection`, the one restored from a checkpoint when it is this
    collection's (the same round and chunks), else a new one; dropped on success; on an exception the chunk in
    progress is undone (`CollectionProgress.rewind`) and the progress stays for the checkpoint written before the
    error is raised. Not `resumable`: a new progress, never kept."""
    indices = [list(c) for c, _ in chunks]
    progress = trainer._collection if resumable else None
    if progress is not None and progress.round == round and progress.chunks != indices:
        raise ValueError(
            f"{type(trainer).__name__}: the checkpoint resumed from stopped {progress.what} over other chunks of "
            f"items ({len(progress.chunks)} chunks, this run cuts {len(indices)}): resume with the task items and "
            "rollout_buffer_size of the run that wrote it"
        )
    if progress is None or progress.round != round:
        progress = CollectionProgress(what, round, indices)
    if resumable:
        trainer._collection = progress
    try:
        yield progress
    except BaseException:
        progress.rewind(trainer)
        raise
    if resumable:
        trainer._collection = None
