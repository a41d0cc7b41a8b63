"""Replay modes: weights, draw allocation, in-dataset sampling and validation, against hand-computed cases."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from trl_marl.plugins.replay import (
    AllHistoryReplay,
    CurrentReplay,
    LambdaDecayReplay,
    NearestKReplay,
    ReplayMode,
    allocate_draws,
    default_sample_size,
    equal_weights,
    lambda_decay_weights,
    latest_non_empty,
    sample_within,
)


def make_rounds(sizes: Sequence[int]) -> list[list[dict]]:
    """Round j holds records tagged with (round, index)."""
    return [[{"round": j, "index": i} for i in range(size)] for j, size in enumerate(sizes)]


def per_round(batch: list[dict]) -> dict[int, int]:
    return dict(sorted(Counter(r["round"] for r in batch).items()))


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- pure functions ---------------------------------------------------------------------------------------------


def test_latest_non_empty_and_default_sample_size():
    assert latest_non_empty([3, 0, 5, 2]) == [0, 2, 3]
    assert latest_non_empty([3, 0, 5, 2], k=2) == [2, 3]
    assert latest_non_empty([3, 5, 0], k=2) == [0, 1]  # empty current round: the latest non-empty ones
    assert latest_non_empty([0, 0]) == []
    assert default_sample_size([3, 5, 7]) == 7  # the current round's count
    assert default_sample_size([3, 5, 0]) == 5  # current empty: the latest non-empty dataset
    assert default_sample_size([3, 0, 0]) == 3
    assert default_sample_size([0, 0]) == 0
    assert default_sample_size([]) == 0


def test_equal_and_lambda_decay_weights():
    assert equal_weights(4) == [0.25] * 4
    assert equal_weights(0) == []
    # lam = 0.5, ages 2, 1, 0: 0.25, 0.5, 1 over 1.75
    assert lambda_decay_weights(3, 0.5) == pytest.approx([1 / 7, 2 / 7, 4 / 7])
    assert lambda_decay_weights(3, 0.0) == [0.0, 0.0, 1.0]
    assert lambda_decay_weights(4, 1.0) == [0.25] * 4
    assert lambda_decay_weights(1, 0.3) == [1.0]
    assert lambda_decay_weights(0, 0.3) == []


def test_allocate_draws_largest_remainder():
    # 10 * [1/7, 2/7, 4/7] = 1.43, 2.86, 5.71: floors 1, 2, 5; the 2 left go to the remainders .86 and .71
    assert allocate_draws(10, [1 / 7, 2 / 7, 4 / 7], rng()) == [1, 3, 6]
    assert allocate_draws(7, [1, 2, 4], rng()) == [1, 2, 4]  # unnormalized weights are fine
    assert allocate_draws(5, [0.0, 0.0, 1.0], rng()) == [0, 0, 5]
    assert allocate_draws(0, [0.5, 0.5], rng()) == [0, 0]
    # equal weights: 10 / 3 each, the one left over goes to a random dataset
    seen = set()
    for seed in range(20):
        counts = allocate_draws(10, [1 / 3] * 3, rng(seed))
        assert sum(counts) == 10 and sorted(counts) == [3, 3, 4]
        seen.add(counts.index(4))
    assert seen == {0, 1, 2}  # ties are not broken by position
    # a zero-weight dataset never gets a leftover draw
    for seed in range(10):
        assert allocate_draws(3, [0.5, 0.0, 0.5], rng(seed))[1] == 0


def test_allocate_draws_rejects_bad_weights():
    with pytest.raises(ValueError, match="not all zero"):
        allocate_draws(3, [0.0, 0.0], rng())
    with pytest.raises(ValueError, match="non-negative"):
        allocate_draws(3, [1.0, -0.5], rng())
    with pytest.raises(ValueError, match="no dataset"):
        allocate_draws(3, [], rng())


def test_sample_within_without_then_with_repetition():
    idx = sample_within(5, 5, rng())
    assert sorted(idx) == [0, 1, 2, 3, 4]
    idx = sample_within(10, 4, rng())
    assert len(set(idx)) == 4 and all(0 <= i < 10 for i in idx)
    idx = sample_within(3, 7, rng())  # two full shuffled copies, then one more
    assert sorted(Counter(idx).values()) == [2, 2, 3]
    assert sorted(idx[:3]) == [0, 1, 2] and sorted(idx[3:6]) == [0, 1, 2]
    idx = sample_within(1, 4, rng())
    assert idx == [0, 0, 0, 0]
    assert sample_within(0, 0, rng()) == []
    with pytest.raises(ValueError, match="empty dataset"):
        sample_within(0, 2, rng())


# --- weights per mode --------------------------------------------------------------------------------------------


def test_mode_weights():
    sizes = [4, 0, 2, 6]
    assert CurrentReplay().weights(sizes) == [0, 0, 0, 1]
    assert CurrentReplay().weights([4, 0]) == [0, 0]
    assert NearestKReplay(k=2).weights(sizes) == [0, 0, 0.5, 0.5]
    assert NearestKReplay(k=2).weights([3, 5, 0]) == [0.5, 0.5, 0]  # empty current round is skipped
    assert NearestKReplay(k=9).weights(sizes) == pytest.approx([1 / 3, 0, 1 / 3, 1 / 3])
    assert NearestKReplay(k=1).weights(sizes) == [0, 0, 0, 1]
    assert AllHistoryReplay().weights(sizes) == pytest.approx([1 / 3, 0, 1 / 3, 1 / 3])
    # ages over non-empty datasets: round 3 -> 0, round 2 -> 1, round 0 -> 2
    assert LambdaDecayReplay(lam=0.5).weights(sizes) == pytest.approx([1 / 7, 0, 2 / 7, 4 / 7])
    assert LambdaDecayReplay(lam=0.5, k=2).weights(sizes) == pytest.approx([0, 0, 1 / 3, 2 / 3])
    assert LambdaDecayReplay(lam=0.0).weights(sizes) == [0, 0, 0, 1]
    assert LambdaDecayReplay(lam=1.0).weights(sizes) == pytest.approx([1 / 3, 0, 1 / 3, 1 / 3])
    assert LambdaDecayReplay(lam=0.5).weights([4, 2, 0]) == pytest.approx([1 / 3, 2 / 3, 0])
    assert AllHistoryReplay().weights([0, 0]) == [0, 0]


# --- selection ---------------------------------------------------------------------------------------------------


def test_current_returns_the_current_round_in_order():
    rounds = make_rounds([4, 3])
    assert CurrentReplay().select(rounds, rng()) == rounds[-1]
    assert CurrentReplay(k=1).select(rounds, rng()) == rounds[-1]
    assert CurrentReplay().select(make_rounds([4, 0]), rng()) == []
    assert CurrentReplay().select([], rng()) == []


def test_lambda_decay_counts_and_in_dataset_sampling():
    rounds = make_rounds([4, 0, 2, 6])
    batch = LambdaDecayReplay(lam=0.5, sample_size=10).select(rounds, rng(3))
    assert len(batch) == 10
    # 10 draws over [1/7, 2/7, 4/7] -> 1, 3, 6 (see test_allocate_draws_largest_remainder)
    assert per_round(batch) == {0: 1, 2: 3, 3: 6}
    # round 3: 6 draws from 6 pairs -> each pair once; round 2: 3 draws from 2 pairs -> counts 1 and 2
    assert sorted(r["index"] for r in batch if r["round"] == 3) == list(range(6))
    assert sorted(Counter(r["index"] for r in batch if r["round"] == 2).values()) == [1, 2]


def test_lambda_zero_keeps_only_newest_and_default_size():
    rounds = make_rounds([5, 5, 3])
    batch = LambdaDecayReplay(lam=0.0).select(rounds, rng())
    assert per_round(batch) == {2: 3}  # default size = current round's 3 pairs
    assert sorted(r["index"] for r in batch) == [0, 1, 2]


def test_nearest_k_equal_weights_whatever_the_sizes():
    rounds = make_rounds([9, 1, 7])
    batch = NearestKReplay(k=2, sample_size=8).select(rounds, rng())
    assert per_round(batch) == {1: 4, 2: 4}
    assert [r["index"] for r in batch if r["round"] == 1] == [0, 0, 0, 0]  # cycles through its one pair
    assert len({r["index"] for r in batch if r["round"] == 2}) == 4  # without repetition


def test_default_sample_size_with_empty_current_round():
    rounds = make_rounds([5, 3, 0])  # current round empty -> default size = 3 (latest non-empty)
    for seed in range(5):
        batch = NearestKReplay(k=2).select(rounds, rng(seed))
        counts = per_round(batch)
        assert sum(counts.values()) == 3 and sorted(counts.values()) == [1, 2] and set(counts) <= {0, 1}
    batch = AllHistoryReplay().select(make_rounds([2, 4, 6]), rng())
    assert per_round(batch) == {0: 2, 1: 2, 2: 2}  # default size = current round's 6


def test_all_history_counts():
    batch = AllHistoryReplay(sample_size=9).select(make_rounds([1, 2, 3]), rng())
    assert per_round(batch) == {0: 3, 1: 3, 2: 3}
    assert [r["index"] for r in batch if r["round"] == 0] == [0, 0, 0]
    assert sorted(Counter(r["index"] for r in batch if r["round"] == 1).values()) == [1, 2]
    assert sorted(r["index"] for r in batch if r["round"] == 2) == [0, 1, 2]


def test_empty_history_selects_nothing():
    for mode in (NearestKReplay(k=2), AllHistoryReplay(sample_size=4), LambdaDecayReplay(lam=0.5)):
        assert mode.select(make_rounds([0, 0]), rng()) == []
        assert mode.select([], rng()) == []


def test_selection_is_reproducible_shuffled_and_does_not_mutate():
    rounds = make_rounds([6, 6, 6])
    snapshot = [list(r) for r in rounds]
    mode = AllHistoryReplay(sample_size=12)
    first = mode.select(rounds, rng(7))
    assert first == mode.select(rounds, rng(7))
    assert rounds == snapshot
    order = [r["round"] for r in first]
    assert order != sorted(order)  # the combined sample is shuffled, not grouped by round


def test_select_reads_only_selected_pairs_from_lazy_rounds():
    class LazyRound(Sequence):
        def __init__(self, j, size):
            self.j, self.size, self.reads = j, size, []

        def __len__(self):
            return self.size

        def __getitem__(self, i):
            self.reads.append(i)
            return {"round": self.j, "index": i}

    rounds = [LazyRound(0, 100), LazyRound(1, 100)]
    batch = NearestKReplay(k=2, sample_size=4).select(rounds, rng())
    assert len(batch) == 4
    assert sum(len(r.reads) for r in rounds) == 4


def test_builtins_satisfy_the_protocol_and_have_readable_reprs():
    for mode in (CurrentReplay(), NearestKReplay(k=1), AllHistoryReplay(), LambdaDecayReplay(lam=0.9)):
        assert isinstance(mode, ReplayMode)
    assert repr(LambdaDecayReplay(lam=0.8, sample_size=256)) == "LambdaDecayReplay(k=None, lam=0.8, sample_size=256)"
    assert [m.name for m in (CurrentReplay, NearestKReplay, AllHistoryReplay, LambdaDecayReplay)] == [
        "current",
        "nearest_k",
        "all_history",
        "lambda_decay",
    ]


# --- validation --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, kwargs, message",
    [
        (
            CurrentReplay,
            {"sample_size": 8},
            "preference_replay_sample_size is not used by preference_replay_mode='current'",
        ),
        (CurrentReplay, {"lam": 0.5}, "preference_replay_lambda is not used by preference_replay_mode='current'"),
        (
            CurrentReplay,
            {"k": 2},
            "preference_replay_k must be None or 1 when preference_replay_mode='current', got 2",
        ),
        (CurrentReplay, {"k": True}, "preference_replay_k must be None or 1"),
        (NearestKReplay, {}, "preference_replay_k is required when preference_replay_mode='nearest_k'"),
        (NearestKReplay, {"k": 0}, "preference_replay_k must be an integer >= 1 .* got 0"),
        (NearestKReplay, {"k": 2.5}, "preference_replay_k must be an integer >= 1"),
        (
            NearestKReplay,
            {"k": 2, "lam": 0.5},
            "preference_replay_lambda is not used by preference_replay_mode='nearest_k'",
        ),
        (AllHistoryReplay, {"k": 3}, "preference_replay_k is not used by preference_replay_mode='all_history'"),
        (
            AllHistoryReplay,
            {"lam": 0.5},
            "preference_replay_lambda is not used by preference_replay_mode='all_history'",
        ),
        (AllHistoryReplay, {"sample_size": 0}, "preference_replay_sample_size must be an integer >= 1"),
        (LambdaDecayReplay, {}, r"preference_replay_lambda is required when preference_replay_mode='lambda_decay'"),
        (LambdaDecayReplay, {"lam": 1.5}, r"preference_replay_lambda must be a number in \[0, 1\] .* got 1.5"),
        (LambdaDecayReplay, {"lam": -0.1}, r"preference_replay_lambda must be a number in \[0, 1\]"),
        (LambdaDecayReplay, {"lam": 0.5, "k": 0}, "preference_replay_k must be an integer >= 1"),
        (LambdaDecayReplay, {"lam": 0.5, "sample_size": -3}, "preference_replay_sample_size must be an integer >= 1"),
    ],
)
def test_validation_errors(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_validation_messages_point_to_the_valid_modes():
    with pytest.raises(ValueError) as err:
        CurrentReplay(sample_size=8)
    assert "'nearest_k', 'all_history' or 'lambda_decay'" in str(err.value)
    with pytest.raises(ValueError) as err:
        AllHistoryReplay(lam=0.3)
    assert "valid with preference_replay_mode='lambda_decay'" in str(err.value)


def test_valid_options_are_accepted():
    assert NearestKReplay(k=np.int64(3)).k == 3
    assert LambdaDecayReplay(lam=1, k=4, sample_size=16).lam == 1.0
    assert AllHistoryReplay(sample_size=5).sample_size == 5
