"""Ranks with uneven work under ZeRO-3 and FSDP2, where generation and the forwards of sharded models (agents,
critics, the joint reward model) are collectives: a rank whose multi-turn branches all ended early, whose share of
an evaluation set is shorter, or that has nothing to generate or score, takes part in the others' calls with empty
ones (trl_marl.distributed.collective) instead of leaving them waiting forever. 2 CPU processes through `accelerate launch`
(tests/scripts/dist_run.py, mode `uneven`); a hang fails at the subprocess timeout with every rank's stack.
About 16 s (ZeRO-3) and 20 s (FSDP2) each here: in the default suite, as the only guard against these hangs."""

import json
from pathlib import Path

import pytest
import torch
from conftest import accelerate_launch

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300


def launch_uneven(config: str, out: Path, mode: str = "uneven") -> list[dict]:
    config_file = ROOT / "accelerate_configs" / f"{config}.yaml"
    # a hung rank prints every thread's stack, then exits
    hang = {"DIST_RUN_HANG_TIMEOUT": str(TIMEOUT_S - 60)}
    accelerate_launch(config_file, ROOT / "tests" / "scripts" / "dist_run.py", out, mode, timeout=TIMEOUT_S, env=hang)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def check_uneven(ranks: list[dict]) -> None:
    r0, r1 = ranks
    # 1. rank 1 generated nothing while rank 0 sampled what one process alone samples from the same seed
    assert r1["generated"] == [[], []]
    assert r0["generated"] == r0["generated_alone"] and len(r0["generated"][0]) == 4
    # 3. the sharded reward model scored 3 batches on rank 0, 1 on rank 1: the scores of a full local copy
    assert r0["rm_collective"] and r1["rm_collective"]
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r["scores"]), torch.tensor(r["scores_alone"]), rtol=1e-5, atol=1e-5)
    assert len(r0["scores"]) == 3 and len(r1["scores"]) == 1
    # 4. the step ran; rank 0's branches all ended after turn 1: it took part in turn 2 with no prompts
    assert r0["global_step"] == r1["global_step"] == 1
    assert r0["train_generate_calls"] == [[2, 2], [0, 0]]
    assert r1["train_generate_calls"] == [[2, 2], [2, 2]]
    # 5. evaluation: rank 0 (items 0, 2) ran 2 one-turn batches, rank 1 (item 1) one two-turn batch and an empty one;
    # every item counted once
    assert r0["eval_generate_calls"] == [[1, 1], [0, 0], [1, 1]]
    assert r1["eval_generate_calls"] == [[1, 1], [1, 1], [0, 0]]
    first = r0["eval_first_turn_rewards"] + r1["eval_first_turn_rewards"]
    assert sorted(first) == [-1.0, 1.0, 1.0]
    for r in ranks:
        assert r["eval_turn_1_reward_mean"] == pytest.approx(sum(first) / 3)
    # 6. a LoRA team on one base (one mixed-adapter generate): rank 1 without prompts; rank 0 sampled what it samples
    # when both ranks generate
    assert r1["lora_generated"] == [[], []]
    assert r0["lora_generated"] == r0["lora_generated_both"] and [len(g) for g in r0["lora_generated"]] == [4, 2]
    # 7. MADPO pair collection, one item per batch: rank 0 items 0 and 2, rank 1 item 1 and then a filler item
    # (rolled out to join rank 0's collectives, its pairs discarded: trainers/preference/data_parallel.py)
    prompts = [f"Item {i}: say something about {w}." for i, w in enumerate(["rain", "snow", "wind"])]
    assert r0["madpo_collect_batches"] == [[prompts[0]], [prompts[2]]]
    assert r1["madpo_collect_batches"] == [[prompts[1]], [prompts[2]]]  # the filler: the last chunk's first item
    assert r0["madpo_num_pairs"] == r1["madpo_num_pairs"]  # every rank's pairs gathered on every rank


def test_zero3_ranks_with_uneven_work_stay_in_step(tmp_path):
    ranks = launch_uneven("zero3_cpu", tmp_path)
    assert all(r["distributed_type"] == "DistributedType.DEEPSPEED" for r in ranks)
    check_uneven(ranks)


def test_fsdp2_ranks_with_uneven_work_stay_in_step(tmp_path):
    ranks = launch_uneven("fsdp2_cpu", tmp_path)
    assert all(r["distributed_type"] == "DistributedType.FSDP" for r in ranks)
    check_uneven(ranks)
    # 2. trl_marl.distributed.fsdp.full_state_dict: the full weights on every rank by default, on rank 0 only with rank0_only
    t0, t1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    initial = t0["initial"]
    for t in (t0, t1):
        assert t["every_rank"].keys() == initial.keys()
        for k, v in initial.items():
            torch.testing.assert_close(t["every_rank"][k], v, msg=k)
    assert t0["rank0_only"].keys() == initial.keys() and t1["rank0_only"] == {}
    for k, v in initial.items():
        torch.testing.assert_close(t0["rank0_only"][k], v, msg=k)


@pytest.mark.slow  # about 45 s here (2 processes, a pair collection first)
def test_zero3_reference_precompute_is_split_and_every_rank_holds_every_value(tmp_path):
    """MADPO `precompute_ref_log_probs` with a ZeRO-3 `ref_model`: 3 pairs, one per forward; rank 0 scores pairs 0
    and 2, rank 1 pair 1 and a filler (the forward is a collective); after the gather both ranks hold every pair's
    values, those of a full local copy of the reference."""
    ranks = launch_uneven("zero3_cpu", tmp_path, "refprecompute")
    assert all(r["distributed_type"] == "DistributedType.DEEPSPEED" for r in ranks)
    assert [r["num_pairs"] for r in ranks] == [3, 3]
    assert [r["forwards"] for r in ranks] == [[1, 1], [1, 1]]
    assert ranks[0]["ref"] == ranks[1]["ref"]
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r["ref"]), torch.tensor(r["ref_alone"]), rtol=1e-4, atol=1e-4)
