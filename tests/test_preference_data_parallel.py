"""MADPO under data parallelism, without a launcher: the trainer's processes simulated one after the other (a view of
its accelerator as rank r of 2, and `gather_object` replaced by the shares those ranks produced). N processes must
build the pairs one process builds, in its order, and train on the batches one process trains on with N times the
per-process batch. The real 2-process runs are `tests/test_distributed.py::test_fsdp2_and_zero3_init_equal_single_process`."""

import pytest
import torch
from conftest import iterative_args
from datasets import Dataset

import trl_marl.trainers.preference.iterative as iterative_module
import trl_marl.trainers.preference.madpo as madpo_module
from trl_marl import MADPOConfig, MADPOIterConfig, MADPOIterTrainer, MADPOTrainer
from trl_marl.rng import keyed_rng
from trl_marl.testing import prompt_seeded_generation
from trl_marl.trainers.preference.data_parallel import (
    collection_chunks,
    global_batch_slices,
    merge_item_shares,
)

ITEMS = Dataset.from_list([{"prompt": f"Say something about {w}."} for w in ["rain", "snow", "wind", "fire", "sea"]])


def length_reward(c1, c2):
    return [float(len(a) - len(b)) for a, b in zip(c1, c2)]


class RankView:
    """The trainer's (single-process) accelerator seen as process `rank` of `world`."""

    def __init__(self, accelerator, rank: int, world: int):
        self._acc, self.process_index, self.num_processes = accelerator, rank, world
        self.is_main_process = self.is_local_main_process = rank == 0

    def __getattr__(self, name):
        return getattr(self._acc, name)


def as_ranks(trainer, module, monkeypatch, collect, world: int = 2) -> list:
    """`collect()` run as each of `world` processes: a first pass records every rank's share at its gather, a second
    returns (as every rank would see it) the result of rank 0 with every share gathered. Also returns the number of
    `generate` calls each rank made (collectives under ZeRO-3 / FSDP2: they must match)."""
    real, shares, calls = trainer.accelerator, [], []
    generate = trainer.generate

    def counted(*a, **k):
        calls[-1] += 1
        return generate(*a, **k)

    trainer.generate = counted
    monkeypatch.setattr(module, "gather_object", lambda obj: shares.append(obj) or obj)
    for rank in range(world):
        trainer.accelerator = RankView(real, rank, world)
        calls.append(0)
        collect()
    monkeypatch.setattr(module, "gather_object", lambda obj: [x for share in shares for x in share])
    trainer.accelerator = RankView(real, 0, world)
    calls.append(0)
    try:
        return collect(), calls[:world]
    finally:
        trainer.accelerator, trainer.generate = real, generate


def records(pairs) -> list:
    return [(p.to_record(), [t.tolist() for t in p.winner_ids + p.loser_ids]) for p in pairs]


# ---------------------------------------------------------------- pure pieces
def test_collection_chunks_give_every_process_the_same_number_of_chunks():
    # 5 items, 2 per process, 2 processes: chunks [0..3] and [4]; rank 1 has no item of the second: a filler
    assert collection_chunks(5, 2, 0, 2) == [([0, 2], False), ([4], False)]
    assert collection_chunks(5, 2, 1, 2) == [([1, 3], False), ([4], True)]
    assert collection_chunks(5, 2) == [([0, 1], False), ([2, 3], False), ([4], False)]
    covered = sorted(
        j for r in range(3) for chunk, filler in collection_chunks(7, 2, r, 3) if not filler for j in chunk
    )
    assert covered == list(range(7))
    assert merge_item_shares([[(1, "b"), (3, "d")], [(0, "a"), (2, "c")]]) == ["a", "b", "c", "d"]
    with pytest.raises(RuntimeError, match="more than one process"):
        merge_item_shares([[(0, "a")], [(0, "a")]])


def test_global_batch_slices_cut_one_processs_batches():
    order = [4, 0, 6, 2, 5, 1, 3]
    one = global_batch_slices(order, 4)
    two = [global_batch_slices(order, 2, r, 2) for r in (0, 1)]
    assert one == [[4, 0, 6, 2], [5, 1, 3, 4]]  # the last batch filled up from the start
    assert [a + b for a, b in zip(*two)] == one
    # fewer pairs than one global batch: every process still gets a full slice (wrapping around repeatedly)
    assert [global_batch_slices([7, 8, 9], 2, r, 2) for r in (0, 1)] == [[[7, 8]], [[9, 7]]]


def test_keyed_rng_depends_on_the_key_only():
    draws = [keyed_rng(0, "pair_selection", 1, item).random() for item in (3, 3, 4)]
    assert draws[0] == draws[1] != draws[2]
    assert keyed_rng(1, "pair_selection", 1, 3).random() != draws[0]  # the seed
    assert keyed_rng(0, "pair_selection", 2, 3).random() != draws[0]  # the round


# ---------------------------------------------------------------- MADPO
def test_madpo_pairs_of_two_processes_equal_one_processs(make_args, tiny_path, monkeypatch):
    """5 items, 2 per process: the random pair selection, the order of the pairs and the candidates' mean reward
    are those of one process; both ranks call generate equally often (rank 1 rolls out a filler)."""
    args = make_args(
        MADPOConfig,
        preference_num_candidates=3,
        pair_selection="random",
        preference_pairs_per_sample=1,
        rollout_buffer_size=2,
    )
    t = prompt_seeded_generation(
        MADPOTrainer(agent_model=tiny_path, reward_func=length_reward, args=args, train_dataset=ITEMS)
    )
    single = t.collect_preference_pairs()
    assert len(single) == len(ITEMS)  # one pair per item (no item tied on every candidate)
    double, calls = as_ranks(t, madpo_module, monkeypatch, t.collect_preference_pairs)
    assert records(double) == records(single)
    assert calls == [2, 2]
    means = t._metrics["train"]["turn_1/reward_mean"]
    assert means[-1] == means[0]


def test_madpo_batches_of_two_processes_are_one_processs_batches(make_args, tiny_path):
    """11 pairs: with 4 per step one process trains [b0, b1, b2]; with 2 per process each rank trains its half of
    each of them, every epoch."""
    args = make_args(MADPOConfig, preference_num_candidates=3, train_batch_size=4)
    t = MADPOTrainer(agent_model=tiny_path, reward_func=length_reward, args=args, train_dataset=ITEMS)
    t.pairs = list(range(11))  # the loader only counts them
    real = t.accelerator

    def batches(epoch: int) -> list:
        loader = t.get_train_dataloader()
        loader.set_epoch(epoch)
        return list(loader)

    one = [batches(e) for e in (0, 1)]
    t.args.per_device_train_batch_size = 2
    halves = []
    for rank in (0, 1):
        t.accelerator = RankView(real, rank, 2)
        halves.append([batches(e) for e in (0, 1)])
    t.accelerator = real
    for e in (0, 1):
        assert len(one[e]) == 3 and all(len(b) == 4 for b in one[e])
        assert [a + b for a, b in zip(halves[0][e], halves[1][e])] == one[e]
    assert one[0] != one[1]  # each epoch its own shuffle
    assert sorted(set(one[0][0] + one[0][1] + one[0][2])) == list(range(11))


def test_madpo_mean_of_the_processes_losses_is_the_global_batch_loss(make_args, tiny_path):
    """What the engine does with 2 processes (the mean of their gradients) is the gradient of one process's loss on
    the whole global batch."""
    args = make_args(MADPOConfig, preference_num_candidates=3, train_batch_size=4)
    t = MADPOTrainer(agent_model=tiny_path, reward_func=length_reward, args=args, train_dataset=ITEMS)
    pairs = t.collect_preference_pairs()[:4]
    team = t.team
    whole = t.compute_loss(team, {"pairs": pairs})
    whole.backward()
    want = [p.grad.clone() for p in team.parameters() if p.grad is not None]
    team.zero_grad()
    halves = [t.compute_loss(team, {"pairs": pairs[:2]}), t.compute_loss(team, {"pairs": pairs[2:]})]
    ((halves[0] + halves[1]) / 2).backward()
    got = [p.grad for p in team.parameters() if p.grad is not None]
    assert ((halves[0] + halves[1]) / 2).item() == pytest.approx(whole.item(), rel=1e-5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)


class PromptComparator:
    """A comparator whose candidates depend only on the item (deterministic in every process)."""

    def generate(self, items, prompts_per_agent, num_candidates, trainer):
        return [
            [[f"{item['prompt'][: c + 2]} {i}" for i in range(trainer.num_agents)] for c in range(num_candidates)]
            for item in items
        ]


def test_madpoiter_round_pairs_of_two_processes_equal_one_processs(tmp_path, tiny_path, monkeypatch):
    args = iterative_args(
        tmp_path,
        MADPOIterConfig,
        max_completion_length=6,
        rollout_buffer_size=2,
        preference_num_candidates=3,
        pair_selection="random",
        preference_pairs_per_sample=2,
    )
    t = MADPOIterTrainer(
        agent_model=tiny_path,
        reward_func=length_reward,
        args=args,
        train_dataset=ITEMS,
        comparator=PromptComparator(),
    )
    prompt_seeded_generation(t)
    single = t._collect_round(1)
    assert single
    double, calls = as_ranks(t, iterative_module, monkeypatch, lambda: t._collect_round(1))
    assert records(double) == records(single)
    assert calls == [2, 2]
