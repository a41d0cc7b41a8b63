"""A failure in the middle of a preference pair collection (docs/failures.md): a reward function that raises, an
unusable prompt or a dead generation server while MADPO / MARLHF collect their pairs before the training loop, or
while an iterative trainer collects a round's. On one process the checkpoint written before the error is raised
holds the pairs of the finished chunks; the resumed run continues at the failed chunk (it rolls out no finished
chunk again) and ends as the run that never failed."""

from __future__ import annotations

import pytest
import torch
from test_resume import _assert_same_run, resume_run

from trl_marl.rewards import RewardFunctionError


@pytest.fixture
def flaky(monkeypatch):
    """`use(fail_at)`: `resume_run`'s trainers built from now on score with its reward, except that call number
    `fail_at` raises; returns the call counter (`{"n": calls}`)."""
    original = resume_run.reward

    def use(fail_at: int | None = None) -> dict:
        calls = {"n": 0}

        def reward(c1, c2):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise TimeoutError("the reward API did not answer")
            return original(c1, c2)

        monkeypatch.setattr(resume_run, "reward", reward)  # `build` passes it by name
        return calls

    return use


def _ids(pairs):
    return [[ids.tolist() for ids in (*p.prompt_ids, *p.winner_ids, *p.loser_ids)] for p in pairs]


def _fail_then_resume(family, out, tiny_path, flaky, fail_at, save=False, num_rounds=3):
    """Run `family` with a reward that raises at its call `fail_at`; then resume from the latest checkpoint with the
    reward fixed. Returns (the error, the calls before it, the resumed trainer, the calls the resumed run made)."""
    failing = flaky(fail_at)
    run = resume_run.build(family, str(out), tiny_path, save=save, num_rounds=num_rounds)
    with pytest.raises(RewardFunctionError) as err:
        run.train()
    assert isinstance(err.value.__cause__, TimeoutError)
    fixed = flaky()
    resumed = resume_run.build(family, str(out), tiny_path, save=save, num_rounds=num_rounds)
    resumed.train(resume_from_checkpoint=True)
    return err.value, failing["n"] - 1, resumed, fixed["n"]


@pytest.mark.parametrize("family", ["madpo", "marlhf"])
def test_a_reward_that_raises_during_the_pair_collection_keeps_the_finished_chunks_and_the_resumed_run_is_the_same(
    family, tmp_path, tiny_path, flaky
):
    """8 items in 2 chunks of 4; the reward raises on the second chunk (save_strategy="no"): `checkpoint-0` is
    written first and named, the resumed run rolls out the second chunk only and ends with the pairs, weights,
    logged rewards and env_step of the run whose reward never raised. On the old code nothing was saved: the error
    named no checkpoint and `resume_from_checkpoint=True` found none."""
    reference = flaky()
    full = resume_run.build(family, str(tmp_path / "full"), tiny_path, save=False)
    full.train()
    assert reference["n"] >= 2  # one call per chunk, then what the run does after the collection

    out = tmp_path / "run"
    error, done, resumed, calls = _fail_then_resume(family, out, tiny_path, flaky, fail_at=2)
    note = " ".join(error.__notes__)
    checkpoint = out / "checkpoint-0"
    assert (
        f"the run stopped at step 0 in the preference pair collection after 1 of its 2 chunks: {checkpoint} holds "
        "their pairs; fix the reward function, then resume with train(resume_from_checkpoint=True)" in note
    )
    assert done == 1 and calls == reference["n"] - 1  # the finished chunk was not rolled out again
    assert _ids(resumed.pairs) == _ids(full.pairs) and len(full.pairs) > 0
    assert [p.winner_reward for p in resumed.pairs] == [p.winner_reward for p in full.pairs]
    _assert_same_run(full, resumed)
    assert resumed._collection is None


@pytest.mark.parametrize(
    "save, fail_at",
    [
        (False, 3),  # round 1, the second chunk's rollout (step 0, inside the training loop): checkpoint-0
        (False, 8),  # round 2, the second chunk's comparator scores, after its rollout drew from the stream
        (True, 8),  # the same with round-end checkpoints: the round-1 checkpoint is replaced by one holding more
    ],
)
def test_an_iterative_round_stopped_in_its_collection_resumes_at_the_failed_chunk(
    save, fail_at, tmp_path, tiny_path, flaky
):
    """MADPOIter, 2 rounds of 2 chunks; the task reward is called twice per chunk (the agents' candidates, then the
    comparator's). The checkpoint written before the error holds the round's finished chunk; the resumed run rolls
    out only the rest and ends as the run that never failed. On the old code: in round 1 nothing was saved; in round
    2 the checkpoint either lost the finished chunk or (save_strategy="no") held the random streams and env_step
    advanced by it, so the resumed round drew other candidates."""
    reference = flaky()
    full = resume_run.build("madpoiter", str(tmp_path / "full"), tiny_path, save=save, num_rounds=2)
    full.train()
    assert reference["n"] == 8

    out = tmp_path / "run"
    error, done, resumed, calls = _fail_then_resume("madpoiter", out, tiny_path, flaky, fail_at, save, num_rounds=2)
    nu = 1 if fail_at <= 4 else 2
    note = " ".join(error.__notes__)
    assert f"in round {nu}'s pair collection after 1 of its 2 chunks" in note
    assert calls == reference["n"] - (2 if nu == 1 else 6)  # neither the earlier rounds nor the finished chunk again
    stored = [r["num_pairs"] for r in resumed.rounds.stored]
    assert stored == [r["num_pairs"] for r in full.rounds.stored]
    _assert_same_run(full, resumed)


def test_the_chunk_in_progress_is_undone_and_the_finished_ones_kept(tmp_path, tiny_path):
    """`collecting`: an exception in a chunk puts the random streams and env_step back where the chunk began and
    drops its results; the progress stays on the trainer, and a collection of other chunks is refused."""
    from trl_marl.trainers.preference.collection import CollectionProgress, collecting

    t = resume_run.build("madpo", str(tmp_path / "run"), tiny_path, save=False)
    assert "comparator/0" not in t.rng_streams.state_dict()["streams"]
    chunks = [([0, 1], False), ([2, 3], False)]
    with pytest.raises(KeyError), collecting(t, "the preference pair collection", 0, chunks) as progress:
        for k, _ in enumerate(progress.remaining(t, chunks)):
            progress.results.append(k)
            if k == 1:
                t.env_step += 5
                with t.rng_streams.scoped("comparator", 0):
                    torch.rand(3)
                raise KeyError("chunk 2")
            t.env_step += 1
    assert isinstance(t._collection, CollectionProgress)
    assert (t._collection.finished, t._collection.results, t.env_step) == (1, [0], 1)
    assert "comparator/0" not in t.rng_streams.state_dict()["streams"]  # created inside the failed chunk: undone
    with pytest.raises(ValueError, match="over other chunks of items"), collecting(t, "x", 0, chunks[:1]):
        pass


def test_with_several_processes_a_stopped_collection_is_not_saved_and_the_error_says_so(tmp_path):
    """Several processes (the others may be inside a collective of the chunk and could not join a save): no
    checkpoint is written, the error says there is none and to start again (docs/failures.md)."""
    from types import SimpleNamespace

    from trl_marl.trainers.checkpoints import save_after_failure

    trainer = SimpleNamespace(
        args=SimpleNamespace(output_dir=str(tmp_path), gradient_accumulation_steps=1),
        state=SimpleNamespace(global_step=0),
        accelerator=SimpleNamespace(num_processes=2),
        _step=0,
        _unsaved_collection=lambda: "the preference pair collection after 1 of its 2 chunks",
    )
    error = RewardFunctionError("f", 4, TimeoutError("the reward API did not answer"))
    save_after_failure(trainer, error)
    assert list(tmp_path.iterdir()) == []
    assert error.__notes__ == [
        "trl_marl: the run stopped at step 0 with no checkpoint to resume from; fix the reward function, then start "
        "it again"
    ]
