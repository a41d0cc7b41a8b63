"""MADPO under data parallelism, without a launcher: the trainer's processes simulated one after the other (a view of
its accelerator as rank r of 2, and `gather_object` replaced by the shares those ranks produced). N processes must
build the pairs one process builds, in its order, and train on the batches one process trains on with N times the
per-process batch. The real 2-process runs are `tests/test_distributed.py::test_fsdp2_and_zero3_init_equal_single_process`."""

import copy
import math

import pytest
import torch
from conftest import iterative_args
from datasets import Dataset
from transformers import AutoModelForCausalLM

import trl_marl.trainers.preference.madpo as madpo_module
import trl_marl.trainers.preference.rounds as rounds_module
from trl_marl import MADPOConfig, MADPOIterConfig, MADPOIterTrainer, MADPOTrainer
from trl_marl.data_types.rng import keyed_rng
from trl_marl.testing import prompt_seeded_generation
from trl_marl.trainers.preference.data_parallel import (
    collection_chunks,
    global_batch_slices,
    merge_item_shares,
    reference_chunks,
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


def test_reference_chunks_split_the_missing_pairs_over_processes():
    missing = [0, 2, 3, 5, 6]  # pairs 1 and 4 already hold reference log-probs
    # one process: consecutive batches of 2 (what the unsharded precompute ran)
    assert reference_chunks(missing, 2) == [([0, 2], False), ([3, 5], False), ([6], False)]
    # 2 processes, 2 per process: chunks of 4 missing pairs; rank 1 has none in the last chunk
    assert reference_chunks(missing, 2, 0, 2) == [([0, 3], False), ([6], False)]
    assert reference_chunks(missing, 2, 1, 2) == [([2, 5], False)]  # DDP: no filler
    assert reference_chunks(missing, 2, 1, 2, synced=True) == [([2, 5], False), ([6], True)]
    missing = [0, 2, 3, 5, 6, 8, 9, 11]
    for world, per in ((2, 2), (3, 1), (3, 2), (4, 3)):
        shares = [reference_chunks(missing, per, r, world, synced=True) for r in range(world)]
        assert len({len(s) for s in shares}) == 1  # the same number of forwards on every process
        assert all(len(ks) <= per for s in shares for ks, _ in s)
        assert sorted(k for s in shares for ks, filler in s if not filler for k in ks) == missing  # each once
        unsynced = [reference_chunks(missing, per, r, world) for r in range(world)]
        assert [[c for c in s if not c[1]] for s in shares] == unsynced
    assert reference_chunks([], 2, 1, 2, synced=True) == []


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
        MADPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=ITEMS)
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
    t = MADPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=ITEMS)
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
    t = MADPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=ITEMS)
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
        model=tiny_path,
        reward_funcs=length_reward,
        args=args,
        train_dataset=ITEMS,
        comparator=PromptComparator(),
    )
    prompt_seeded_generation(t)
    single = t.rounds.collect(1)
    assert single
    double, calls = as_ranks(t, rounds_module, monkeypatch, lambda: t.rounds.collect(1))
    assert records(double) == records(single)
    assert calls == [2, 2]


# ---------------------------------------------------------------- precompute_ref_log_probs
@pytest.mark.parametrize("synced", [False, True])
def test_madpo_reference_precompute_is_split_over_processes(make_args, tiny_path, monkeypatch, synced):
    """Each of 2 processes runs the reference forward on its half of the pairs (batches of
    `per_device_train_batch_size`); after the gather every process holds the values one process computes. `synced`
    (ZeRO-3 / FSDP2): both ranks run the same number of forwards, rank 1 a filler in the last chunk."""
    ref = AutoModelForCausalLM.from_pretrained(tiny_path)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a reference that differs from the agents
    args = make_args(MADPOConfig, preference_num_candidates=3, precompute_ref_log_probs=True, train_batch_size=2)
    t = MADPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=ITEMS, ref_model=ref)
    pairs = t.collect_preference_pairs()[:14]  # 13 missing: the last chunk of 2 x 2 holds one (a filler on rank 1)
    pairs[1].ref_chosen_logps, pairs[1].ref_rejected_logps = [0.5, 0.5], [0.25, 0.25]  # already there: kept
    n = len(pairs)
    assert n == 14
    rows: list[list[int]] = [[]]  # per call of the precompute: the pairs in each reference forward
    forward = t._reference_forward

    def counted(batch):
        rows[-1].append(len(batch))
        return forward(batch)

    def precompute():
        rows.append([])
        ps = copy.deepcopy(pairs)
        t.precompute_reference_logps(ps)
        return ps

    t._reference_forward = counted
    monkeypatch.setattr(type(t), "collective_generation", property(lambda self: synced))
    single = precompute()
    m = n - 1  # pairs missing their reference log-probs
    assert sum(rows[-1]) == m and max(rows[-1]) <= 2
    double, _ = as_ranks(t, madpo_module, monkeypatch, precompute)
    rank0, rank1 = rows[-3], rows[-2]  # then rank 0 again, with every share gathered
    last = m % 4 or 4  # missing pairs in the last global chunk of 2 x 2
    filler = int(synced and last == 1)  # rank 1 scores the chunk's first pair and drops it
    assert last == 1
    assert max(rank0 + rank1) <= 2
    assert (sum(rank0), sum(rank1)) == (math.ceil(m / 2), m // 2 + filler)  # about half each (one process: m)
    if synced:
        assert len(rank0) == len(rank1) == math.ceil(m / 4)
    assert double[1].ref_chosen_logps == [0.5, 0.5]
    got = torch.tensor([p.ref_chosen_logps + p.ref_rejected_logps for p in double])
    want = torch.tensor([p.ref_chosen_logps + p.ref_rejected_logps for p in single])

    # float batching only (the ranks pad their batches differently than one process); measured 0.0 on CPU
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_madpoiter_round_precomputes_its_pairs_split_over_processes(tmp_path, tiny_path, monkeypatch):
    """`precompute_ref_log_probs` with a `ref_model`: a round's training pairs get their reference log-probs when
    the round starts, each of 2 processes scoring its half; every batch of the round then holds them."""
    args = iterative_args(
        tmp_path,
        MADPOIterConfig,
        max_completion_length=6,
        rollout_buffer_size=2,
        preference_num_candidates=3,
        preference_pairs_per_sample=2,
        precompute_ref_log_probs=True,
        train_batch_size=2,
    )
    t = MADPOIterTrainer(
        model=tiny_path,
        reward_funcs=length_reward,
        args=args,
        train_dataset=ITEMS,
        comparator=PromptComparator(),
        ref_model=tiny_path,
    )
    rows: list[int] = []
    forward = t._reference_forward
    t._reference_forward = lambda batch: rows.append(len(batch)) or forward(batch)
    batches = t.rounds.start_round(1)
    assert batches and all(p.ref_chosen_logps is not None for b in batches for p in b)
    n = sum(rows)
    assert n == len({id(p) for b in batches for p in b})  # every pair of the round, once, at its start
    pairs = list({id(p): p for b in batches for p in b}.values())
    for p in pairs:
        p.ref_chosen_logps = p.ref_rejected_logps = None
    rows.clear()
    t.accelerator = RankView(t.accelerator, 1, 2)
    monkeypatch.setattr(madpo_module, "gather_object", lambda obj: obj)  # this rank's share only
    t.round_batches(1, pairs)
    assert sum(rows) == n // 2  # rank 1 of 2: half of the round's pairs


@pytest.mark.parametrize("per_process, rank, world", [(0, 0, 1), (2, 2, 2), (2, -1, 2), (2, 0, 0)])
def test_collection_chunks_reject_impossible_shares(per_process, rank, world):
    with pytest.raises(ValueError, match="need per_process >= 1 and 0 <= rank < world"):
        collection_chunks(5, per_process, rank, world)
