"""Replay modes: which stored preference pairs an iterative trainer trains on in each round.

The iterative trainers store each round's pairs as one dataset D(1), D(2), ... (the current round's dataset is
stored first, so it is part of the history it selects from), then ask the configured replay mode for the round's
training set B(nu). A replay mode is a plugin (entry-point group `trl_marl.replay_modes`, see
`trl_marl.plugins.registry` and docs/plugins.md); the four built-ins are:

| name | datasets available | weight of an available dataset |
|---|---|---|
| `current` | the current round only | (no sampling: every pair, once) |
| `nearest_k` | the latest `k` non-empty datasets, the current one included | `1 / n_available` |
| `all_history` | every non-empty dataset | `1 / n_available` |
| `lambda_decay` | every non-empty dataset, or the latest `k` of them | `lambda ** a / sum_b lambda ** b` |

In `lambda_decay`, `a` is the dataset's age counted over NON-EMPTY datasets (`a = 0` for the newest), so
`lambda = 0` keeps only the newest dataset and `lambda = 1` weights all of them equally. Weights never depend on the
datasets' sizes.

Sampling in the historical modes (`nearest_k`, `all_history`, `lambda_decay`), with `N` the sample size:

1. the `N` draws are allocated to the datasets by weight with the largest-remainder rule (`allocate_draws`);
2. inside a dataset of size `s` that got `c` draws, `c <= s` samples without repetition, and `c > s` cycles through
   fresh shuffled copies of the dataset (every pair appears `c // s` or `c // s + 1` times) (`sample_within`);
3. the combined sample is shuffled.

`N` is `sample_size` when set, else the current round's pair count, or, when the current round is empty, the size of
the latest non-empty dataset (`default_sample_size`). All randomness comes from the `numpy.random.Generator` passed
to `select`, so a selection is reproducible from the generator's state (which the trainer checkpoints).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from trl_marl.plugins.registry import REPLAY_GROUP, load_plugin

__all__ = [
    "Record",
    "ReplayMode",
    "CurrentReplay",
    "NearestKReplay",
    "AllHistoryReplay",
    "LambdaDecayReplay",
    "make_replay_mode",
    "equal_weights",
    "lambda_decay_weights",
    "allocate_draws",
    "sample_within",
    "default_sample_size",
    "latest_non_empty",
]

Record = Mapping[str, Any]
"""One preference pair, in the record format of the spec (`prompts`, `winner_completions`, ...)."""


@runtime_checkable
class ReplayMode(Protocol):
    """What a replay mode is: one class, constructed once per trainer, asked once per round.

    Construction. The trainer builds the mode from its config as

        mode = ModeClass(k=args.preference_replay_k, lam=args.preference_replay_lambda,
                         sample_size=args.preference_replay_sample_size)

    with each keyword `None` when the option is unset. The constructor validates them and raises `ValueError`
    naming the config field for any value the mode does not accept (a mode that has no use for an option must
    reject it when it is set, rather than ignore it silently).

    Selection. Once per round, after the round's pairs are stored:

        batch = mode.select(rounds, rng)

    - `rounds[j]` is round j+1's dataset, oldest first; `rounds[-1]` is the CURRENT round's dataset, possibly empty
      (a round whose comparisons were all ties). Only `len()` and integer indexing are used, so the trainer may pass
      lazy sequences that read pairs from the stored round files.
    - `rng` is a `numpy.random.Generator`, the ONLY source of randomness; the same generator state and the same
      round sizes must give the same selection.
    - The return value is the list of records to train on this round (repetitions allowed, order = training order
      before the trainer's own shuffling). An empty list means "nothing to train on this round"; it is not an error.
    - `select` must not modify `rounds`.

    Attributes:
        name: the entry-point name the mode is registered under (used in logs and error messages).
    """

    name: ClassVar[str]

    def select(self, rounds: Sequence[Sequence[Record]], rng: np.random.Generator) -> list[Record]: ...


# ---------------------------------------------------------------------------------------------------------------
# Pure functions: sizes and weights in, numbers out.
# ---------------------------------------------------------------------------------------------------------------


def latest_non_empty(sizes: Sequence[int], k: int | None = None) -> list[int]:
    """Indices of the latest `k` non-empty datasets (all of them when `k` is None), in chronological order.

    `sizes[j]` is the number of pairs of round j+1's dataset; the current round is `sizes[-1]`.
    """
    non_empty = [j for j, size in enumerate(sizes) if size > 0]
    return non_empty if k is None else non_empty[-k:]


def equal_weights(n: int) -> list[float]:
    """`w_j = 1 / n` for each of `n` datasets (the `nearest_k` and `all_history` rule)."""
    return [1.0 / n] * n if n > 0 else []


def lambda_decay_weights(n: int, lam: float) -> list[float]:
    """Weights of `n` datasets in chronological order (oldest first) under lambda decay.

    With `a_j = n - 1 - j` the age of dataset j (`a = 0` for the newest):

        w_j = lam ** a_j / sum_{b=0}^{n-1} lam ** b

    `lam = 0` gives `[0, ..., 0, 1]` (Python's `0 ** 0 == 1`), `lam = 1` gives `1 / n` each.
    """
    if n <= 0:
        return []
    raw = [lam ** (n - 1 - j) for j in range(n)]
    total = sum(raw)
    return [w / total for w in raw]


def allocate_draws(n: int, weights: Sequence[float], rng: np.random.Generator) -> list[int]:
    """Allocate `n` draws to datasets by weight with the largest-remainder (Hamilton) rule.

    With `w` normalized to sum 1, dataset j first gets `floor(n * w_j)` draws; the `n - sum_j floor(n * w_j)` draws
    left over go one each to the datasets with the largest remainders `n * w_j - floor(n * w_j)`. Ties between equal
    remainders are broken by a random permutation drawn from `rng` (so no dataset is favoured by its position). Each
    count is within 1 of its expected value `n * w_j`, the counts sum to `n`, and a zero-weight dataset gets none.
    """
    if n < 0:
        raise ValueError(f"the number of draws must be >= 0, got {n}")
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0:
        if n:
            raise ValueError("cannot allocate draws: no dataset has a positive weight")
        return []
    if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero, got {list(weights)}")
    expected = n * (w / w.sum())
    counts = np.floor(expected).astype(np.int64)
    remainders = expected - counts
    remainders[w == 0] = -1.0  # never top up a dataset that has no weight
    left = n - int(counts.sum())
    if left > 0:
        tie_break = rng.permutation(w.size)
        order = tie_break[np.argsort(-remainders[tie_break], kind="stable")]
        counts[order[:left]] += 1
    return [int(c) for c in counts]


def sample_within(size: int, count: int, rng: np.random.Generator) -> list[int]:
    """Indices of `count` pairs drawn from a dataset of `size` pairs.

    `count <= size`: `count` distinct indices (sampling without repetition). `count > size`: the first `count`
    entries of concatenated independent shuffles of `range(size)`, so every index appears `count // size` or
    `count // size + 1` times.
    """
    if count < 0 or size < 0:
        raise ValueError(f"size and count must be >= 0, got size={size}, count={count}")
    if count == 0:
        return []
    if size == 0:
        raise ValueError(f"cannot draw {count} pairs from an empty dataset")
    if count <= size:
        return [int(i) for i in rng.choice(size, size=count, replace=False)]
    copies = math.ceil(count / size)
    cycled = np.concatenate([rng.permutation(size) for _ in range(copies)])
    return [int(i) for i in cycled[:count]]


def default_sample_size(sizes: Sequence[int]) -> int:
    """The sample size when none is configured: `sizes[-1]` (the current round's pair count) when it is positive,
    else the size of the latest non-empty dataset, else 0."""
    for size in reversed(sizes):
        if size > 0:
            return int(size)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Validation helpers: messages name the config field and the allowed values.
# ---------------------------------------------------------------------------------------------------------------

_K = "preference_replay_k"
_LAM = "preference_replay_lambda"
_SIZE = "preference_replay_sample_size"
_HISTORICAL = "'nearest_k', 'all_history' or 'lambda_decay'"


def _positive_int(field: str, value: Any, mode: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(
            f"{field} must be an integer >= 1 (or None) when preference_replay_mode={mode!r}, got {value!r}"
        )
    return int(value)


def _reject(field: str, value: Any, mode: str, valid_in: str) -> None:
    if value is not None:
        raise ValueError(
            f"{field} is not used by preference_replay_mode={mode!r} and must be None, got {value!r}; "
            f"it is valid with preference_replay_mode={valid_in}"
        )


def _lambda(value: Any, mode: str) -> float:
    if value is None:
        raise ValueError(
            f"{_LAM} is required when preference_replay_mode={mode!r}: a number in [0, 1] "
            "(0 keeps only the newest dataset, 1 weights all datasets equally)"
        )
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{_LAM} must be a number in [0, 1] when preference_replay_mode={mode!r}, got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------------------------------------------
# The built-in modes.
# ---------------------------------------------------------------------------------------------------------------


class _HistoricalReplay:
    """Shared machinery of the sampling modes: subclasses define `weights(sizes)`, this class does the sampling."""

    name: ClassVar[str]

    def __init__(self, *, k: int | None = None, lam: float | None = None, sample_size: int | None = None) -> None:
        self.k = k
        self.lam = lam
        self.sample_size = None if sample_size is None else _positive_int(_SIZE, sample_size, self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k!r}, lam={self.lam!r}, sample_size={self.sample_size!r})"

    def weights(self, sizes: Sequence[int]) -> list[float]:
        """One weight per round (same order as `sizes`, oldest first), 0 for rounds that are not available;
        the weights of the available rounds sum to 1 (all zeros when no round is available)."""
        raise NotImplementedError

    def num_draws(self, sizes: Sequence[int]) -> int:
        """`sample_size` when configured, else `default_sample_size(sizes)`; 0 when every round is empty."""
        if not any(size > 0 for size in sizes):
            return 0
        return self.sample_size if self.sample_size is not None else default_sample_size(sizes)

    def plan(self, sizes: Sequence[int], rng: np.random.Generator) -> list[tuple[int, int]]:
        """The selection as `(round index, pair index)` tuples, in training order.

        RNG use, in this order: the tie-break of `allocate_draws`, then `sample_within` for each available round,
        oldest first, then one permutation of the combined sample.
        """
        n = self.num_draws(sizes)
        weights = self.weights(sizes)
        rounds = [j for j, w in enumerate(weights) if w > 0]
        if n == 0 or not rounds:
            return []
        counts = allocate_draws(n, [weights[j] for j in rounds], rng)
        picked = [(j, i) for j, c in zip(rounds, counts) for i in sample_within(sizes[j], c, rng)]
        return [picked[p] for p in rng.permutation(len(picked))]

    def select(self, rounds: Sequence[Sequence[Record]], rng: np.random.Generator) -> list[Record]:
        """The training records of this round (see `ReplayMode.select` and `plan`)."""
        return [rounds[j][i] for j, i in self.plan([len(r) for r in rounds], rng)]


class CurrentReplay(_HistoricalReplay):
    """`current`: every pair of the current round, once, in stored order; no historical sampling.

    Rejects `preference_replay_sample_size` and `preference_replay_lambda`; accepts `preference_replay_k` only as
    None or 1 (one round: the current one).
    """

    name: ClassVar[str] = "current"

    def __init__(self, *, k: int | None = None, lam: float | None = None, sample_size: int | None = None) -> None:
        if k is not None and (isinstance(k, bool) or k != 1):
            raise ValueError(f"{_K} must be None or 1 when preference_replay_mode='current', got {k!r}")
        _reject(_LAM, lam, self.name, "'lambda_decay'")
        if sample_size is not None:
            raise ValueError(
                f"{_SIZE} is not used by preference_replay_mode='current' (it trains on every pair of the current "
                f"round) and must be None, got {sample_size!r}; it is valid with preference_replay_mode={_HISTORICAL}"
            )
        super().__init__(k=None if k is None else 1)

    def weights(self, sizes: Sequence[int]) -> list[float]:
        """`[0, ..., 0, 1]` when the current round is non-empty, else all zeros."""
        return [0.0] * (len(sizes) - 1) + [1.0] if sizes and sizes[-1] > 0 else [0.0] * len(sizes)

    def num_draws(self, sizes: Sequence[int]) -> int:
        """The current round's pair count."""
        return int(sizes[-1]) if sizes else 0

    def plan(self, sizes: Sequence[int], rng: np.random.Generator) -> list[tuple[int, int]]:
        """`[(last, 0), (last, 1), ...]`: every pair of the current round in stored order; `rng` is not used."""
        return [(len(sizes) - 1, i) for i in range(self.num_draws(sizes))]


class NearestKReplay(_HistoricalReplay):
    """`nearest_k`: the latest `k` NON-EMPTY datasets, the current one included, with equal weights `1 / n`
    whatever their sizes (n = the number of such datasets, at most k). Requires `preference_replay_k >= 1`; rejects
    `preference_replay_lambda`."""

    name: ClassVar[str] = "nearest_k"

    def __init__(self, *, k: int | None = None, lam: float | None = None, sample_size: int | None = None) -> None:
        if k is None:
            raise ValueError(
                f"{_K} is required when preference_replay_mode='nearest_k': an integer >= 1, the number of latest "
                "non-empty round datasets to sample from"
            )
        k = _positive_int(_K, k, self.name)
        _reject(_LAM, lam, self.name, "'lambda_decay'")
        super().__init__(k=k, sample_size=sample_size)

    def weights(self, sizes: Sequence[int]) -> list[float]:
        """`1 / n` for each of the latest `k` non-empty rounds (n of them), 0 elsewhere."""
        chosen = latest_non_empty(sizes, self.k)
        out = [0.0] * len(sizes)
        for j, w in zip(chosen, equal_weights(len(chosen))):
            out[j] = w
        return out


class AllHistoryReplay(_HistoricalReplay):
    """`all_history`: every non-empty dataset of the run, with equal weights `1 / n` whatever their sizes.
    Rejects `preference_replay_k` and `preference_replay_lambda`."""

    name: ClassVar[str] = "all_history"

    def __init__(self, *, k: int | None = None, lam: float | None = None, sample_size: int | None = None) -> None:
        _reject(_K, k, self.name, "'nearest_k' or 'lambda_decay'")
        _reject(_LAM, lam, self.name, "'lambda_decay'")
        super().__init__(sample_size=sample_size)

    def weights(self, sizes: Sequence[int]) -> list[float]:
        """`1 / n` for each of the n non-empty rounds, 0 for empty ones."""
        chosen = latest_non_empty(sizes)
        out = [0.0] * len(sizes)
        for j, w in zip(chosen, equal_weights(len(chosen))):
            out[j] = w
        return out


class LambdaDecayReplay(_HistoricalReplay):
    """`lambda_decay`: the latest `k` non-empty datasets (all of them when `k` is None), weighted by
    `lambda ** a / sum_b lambda ** b` with `a = 0` for the newest. Requires `preference_replay_lambda` in [0, 1];
    `preference_replay_k`, when set, is an integer >= 1."""

    name: ClassVar[str] = "lambda_decay"

    def __init__(self, *, k: int | None = None, lam: float | None = None, sample_size: int | None = None) -> None:
        k = None if k is None else _positive_int(_K, k, self.name)
        super().__init__(k=k, lam=_lambda(lam, self.name), sample_size=sample_size)

    def weights(self, sizes: Sequence[int]) -> list[float]:
        """`lambda_decay_weights` over the latest `k` non-empty rounds (ages counted over non-empty rounds only),
        0 elsewhere."""
        chosen = latest_non_empty(sizes, self.k)
        out = [0.0] * len(sizes)
        for j, w in zip(chosen, lambda_decay_weights(len(chosen), self.lam)):
            out[j] = w
        return out


def make_replay_mode(
    name: str, *, k: int | None = None, lam: float | None = None, sample_size: int | None = None, **options: Any
) -> ReplayMode:
    """Load the replay mode registered as `name` (entry-point group `trl_marl.replay_modes`) and construct it with
    the config values `k`, `lam`, `sample_size` (`preference_replay_k`, `_lambda`, `_sample_size`) and the plugin's
    own `options` (`replay_kwargs`).

    Raises the registry's errors for unknown or broken plugins, the mode's own `ValueError` for invalid options, and
    `TypeError` when the registered object does not build something with a `select` method.
    """
    factory = load_plugin(REPLAY_GROUP, name)
    mode = factory(k=k, lam=lam, sample_size=sample_size, **options)
    if not callable(getattr(mode, "select", None)):
        raise TypeError(
            f"The replay mode {name!r} ({factory!r}) built {type(mode).__name__!r}, which has no select(rounds, rng) "
            "method; see trl_marl.plugins.replay.ReplayMode"
        )
    return mode
