"""Real multi-process runs on this CPU machine: 2-process DDP (gloo), DeepSpeed ZeRO-2 and ZeRO-3 through
`accelerate launch` with the shipped CPU configs. Each launch trains MAGRPO, then MADPO, in the same processes
(tests/scripts/dist_run.py). The first DeepSpeed launch on a machine JIT-builds DeepSpeed's shm comm op (~1 min)."""

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from conftest import accelerate_launch, launch_failure
from safetensors.torch import load_file

from trl_marl.algorithms import group_advantages

ROOT = Path(__file__).resolve().parents[1]


def launch(config: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    config_file = ROOT / "accelerate_configs" / f"{config}.yaml"
    return accelerate_launch(config_file, ROOT / "tests" / "scripts" / "dist_run.py", out, *extra)


def check_run(out: Path, distributed_type: str, num_agents: int = 2, trainers=("magrpo", "madpo")) -> None:
    for which in trainers:
        info = json.loads((out / which / "run_info.json").read_text())
        assert info["num_processes"] == 2 and info["distributed_type"] == distributed_type, info
        if which in ("madpoiter", "marlhfiter"):
            assert info["completed_rounds"] == 2 and info["global_step"] > 0
        else:
            assert info["global_step"] == 2
        gathered = torch.load(out / which / "gathered.pt")
        team = json.loads((out / which / "team.json").read_text())
        assert len(team["agents"]) == num_agents
        for i in range(num_agents):
            saved = load_file(out / which / f"agent_{i + 1}" / "model.safetensors")
            for k, v in saved.items():
                torch.testing.assert_close(v.float(), gathered[f"agents.{i}.{k}"], msg=f"{which} agent {i + 1} {k}")
    if "madpo" in trainers:  # the pairs of both processes were gathered, so both trained on the same set
        assert json.loads((out / "madpo" / "run_info.json").read_text())["num_pairs"] > 0
    if "magrpo" in trainers:
        check_advantages(out / "magrpo" / "trace")


def check_advantages(trace: Path) -> None:
    """Each process rolled out its own items; every group's advantages are the group baseline of THAT item's
    rewards (what a single-process run computes with the same function), never mixed across processes."""
    files = sorted(trace.glob("trace_rank*.jsonl"))
    assert [f.name for f in files] == ["trace_rank0.jsonl", "trace_rank1.jsonl"]
    prompts_by_step = defaultdict(list)
    for f in files:
        groups = defaultdict(list)
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            groups[(rec["step"], rec["item"], rec["node"])].append(rec)
        for (step, _, _), recs in groups.items():
            prompts_by_step[step].append((f.name, recs[0]["prompts"][0]))
            rewards = torch.tensor([r["reward"] for r in recs])
            expected = group_advantages(rewards, "mean", normalize=True)
            for r, e in zip(recs, expected.tolist()):
                assert r["advantages"] == pytest.approx([e, e], abs=1e-5)
    for step, entries in prompts_by_step.items():
        ranks = {p: name for name, p in entries}
        assert len(ranks) == len(entries), f"an item was rolled out by both processes at step {step}"


def test_two_process_ddp_on_cpu(tmp_path, tiny_path, tiny_qwen_path):
    """Every trainer under DDP: MAGRPO, MADPO, MAAC, IAC, MAPPO, MARLHF and both iterative trainers."""
    launch("multi_cpu", tmp_path, "all")
    trainers = ("magrpo", "madpo", "maac", "iac", "mappo", "marlhf", "madpoiter", "marlhfiter")
    check_run(tmp_path, "DistributedType.MULTI_CPU", trainers=trainers)
    for which, folder in [("maac", "critic"), ("mappo", "critic"), ("iac", "critic_1"), ("marlhf", "reward_model")]:
        assert (tmp_path / which / folder).is_dir(), which
    rounds = sorted((tmp_path / "madpoiter" / "preference_replay").glob("iteration_*.json"))
    assert [r.name for r in rounds] == ["iteration_0001.json", "iteration_0002.json"]


def test_deepspeed_zero2_on_cpu(tmp_path, tiny_path, tiny_qwen_path):
    launch("zero2_cpu", tmp_path)
    check_run(tmp_path, "DistributedType.DEEPSPEED")


def test_deepspeed_zero3_heterogeneous_team_on_cpu(tmp_path, tiny_path, tiny_qwen_path):
    launch("zero3_cpu", tmp_path, "hetero")
    check_run(tmp_path, "DistributedType.DEEPSPEED")
    qwen = json.loads((tmp_path / "madpo" / "agent_2" / "config.json").read_text())
    assert qwen["model_type"] == "qwen2"


def run_single(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """tests/scripts/dist_run.py in ONE plain process (no launcher): the baseline of the equivalence tests."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, str(ROOT / "tests" / "scripts" / "dist_run.py"), str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, launch_failure(proc)
    return proc


def assert_same_weights(a: Path, b: Path, atol: float = 2e-5) -> int:
    """Every safetensors file under `a` exists under `b` with the same tensors (tied duplicates aside)."""
    files = sorted(a.rglob("*.safetensors"))
    assert files
    for f in files:
        x, y = load_file(f), load_file(b / f.relative_to(a))
        for k, v in x.items():
            torch.testing.assert_close(y[k].float(), v.float(), atol=atol, rtol=0, msg=f"{f.relative_to(a)} {k}")
    return len(files)


@pytest.mark.slow
def test_fsdp2_and_zero3_init_equal_single_process(tmp_path, tiny_path):
    """FSDP2, 2 CPU processes (one launch): MAGRPO with reference KL, MAPPO (separate critic), MADPO and a LoRA
    team on one shared base, two steps each on 4 items (MADPO: 4 pairs) per step, 2 per process, with prompt-seeded
    sampling. The saved weights equal a plain single-process run's on the same 4 items (pairs) per step, and so do
    ZeRO-3's with zero3_init_flag; MADPO's pairs (random pair selection) are those of one process, in its order;
    under FSDP2 the team is cut into per-layer and per-agent units; generation holds the full weights of exactly ONE
    agent at a time."""
    launch("fsdp2_cpu", tmp_path / "fsdp", "equiv")
    run_single(tmp_path / "single", "equiv")
    # ZeRO-3 with zero3_init_flag (the shipped zero3_cpu.yaml): agents, critic and references built partitioned,
    # one agent gathered per generate call
    launch("zero3_cpu", tmp_path / "zero3", "equiv")
    # MAPPO z-scores its advantages over the global batch: dividing by a small group std amplifies float-order
    # differences, and Adam's g / (sqrt(v) + eps) turns them into up to ~2e-5 on a few near-zero-gradient embedding
    # entries (measured: 2 of 32768). Per-process z-scoring (the old bug) differs by 3.0e-3 (measured): it fails.
    atol = {"mappo": 1e-4}
    pairs = json.loads((tmp_path / "single" / "madpo" / "pairs.json").read_text())
    assert len(pairs) >= 8, len(pairs)  # at least two steps of 4 pairs
    for engine in ("fsdp", "zero3"):
        # every process collected its share of the items; gathered, they are one process's pairs in its order
        assert json.loads((tmp_path / engine / "madpo" / "pairs.json").read_text()) == pairs, engine
    for which in ("magrpo", "mappo", "madpo", "magrpo_lora"):
        assert_same_weights(tmp_path / "single" / which, tmp_path / "zero3" / which, atol.get(which, 2e-5))
        assert_same_weights(tmp_path / "single" / which, tmp_path / "fsdp" / which, atol.get(which, 2e-5))
        info = json.loads((tmp_path / "fsdp" / which / "run_info.json").read_text())
        assert info["num_processes"] == 2 and info["sharded_at_start"], info
        # tiny model: 2 decoder layers + the agent's own unit (one shared base for the LoRA team)
        assert info["units_per_agent"] == ([3] if which == "magrpo_lora" else [3, 3]), info
        assert info["generating"], "no generation was recorded"
        for full in info["generating"]:
            assert sum(full) == (1 if which != "magrpo_lora" else len(full)), info["generating"]
        if which != "magrpo_lora":  # each agent gathered in turn
            assert {full.index(True) for full in info["generating"]} == {0, 1}
    # what was saved loads back with from_pretrained (full weights; the LoRA team's adapters through PEFT)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    agent = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp" / "magrpo" / "agent_2")
    saved = load_file(tmp_path / "fsdp" / "magrpo" / "agent_2" / "model.safetensors")
    torch.testing.assert_close(agent.model.embed_tokens.weight, saved["model.embed_tokens.weight"])
    lora = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_path), tmp_path / "fsdp" / "magrpo_lora" / "agent_1"
    )
    assert any("lora_A" in k for k, _ in lora.named_parameters())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_machines_on_one_box(tmp_path, tiny_path):
    """2 "machines" x 1 process: two `accelerate launch --num_machines 2 --machine_rank {0,1}` launchers meeting at
    127.0.0.1, writing to one output_dir (the shared storage of a real cluster). MAGRPO trains two steps as ONE
    2-process job: the same saved weights as gathered, one trace per rank, and only machine 0 writes the team."""
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = []
    for rank in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "accelerate_configs" / "multi_cpu.yaml"),
            "--num_machines",
            "2",
            "--num_processes",
            "2",
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
            str(ROOT / "tests" / "scripts" / "dist_run.py"),
            str(tmp_path),
            "only=magrpo",
        ]
        log = tmp_path / f"machine{rank}.log"
        procs.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT), log))
    for p, log in procs:
        out, _ = p.communicate(timeout=600)
        log.write_bytes(out)
        assert p.returncode == 0, launch_failure(subprocess.CompletedProcess(cmd, p.returncode, out, b""))
    check_run(tmp_path, "DistributedType.MULTI_CPU", trainers=("magrpo",))


@pytest.mark.slow
def test_fsdp2_critics_and_reward_model(tmp_path, tiny_path):
    """FSDP2, 2 CPU processes: MAAC (one centralized critic), IAC (a critic per agent) and MARLHF (joint reward
    model) train two steps, MARLHFIter two rounds; each critic is an FSDP unit of the team; the saved agents equal
    the gathered weights and the critics / reward model are saved beside them."""
    launch("fsdp2_cpu", tmp_path, "only=maac,iac,marlhf,marlhfiter")
    check_run(tmp_path, "DistributedType.FSDP", trainers=("maac", "iac", "marlhf", "marlhfiter"))
    for which, folder in [("maac", "critic"), ("iac", "critic_1"), ("iac", "critic_2"), ("marlhf", "reward_model")]:
        assert (tmp_path / which / folder).is_dir(), (which, folder)
    # the joint reward model (MARLHF; MARLHFIter refits one per round) is sharded while it scores
    for which in ("marlhf", "marlhfiter"):
        check_reward_model_sharded(tmp_path / which, tiny_path)


@pytest.mark.slow
def test_zero3_marlhf_reward_model_is_partitioned(tmp_path, tiny_path):
    """ZeRO-3 (zero3_init_flag), 2 CPU processes: MARLHF fits its joint reward model in the RewardTrainer stage,
    then trains two RL steps scoring with it; iterative MARLHF refits a new one each of its 2 rounds (a stage engine
    next to the RL engine) and collects its pairs with the live agents as comparator. During RL each rank holds only
    its partition of the reward model (gathered layer by layer inside each scoring forward), and the saved reward
    model is the full gathered one."""
    launch("zero3_cpu", tmp_path, "only=marlhf,marlhfiter")
    check_run(tmp_path, "DistributedType.DEEPSPEED", trainers=("marlhf", "marlhfiter"))
    for which in ("marlhf", "marlhfiter"):
        check_reward_model_sharded(tmp_path / which, tiny_path)


def check_reward_model_sharded(out: Path, tiny_path: str) -> None:
    """Every scoring call of the RL phase found each rank holding about half of the reward model (its shard), and
    `reward_model/` holds the full weights (they load with from_pretrained and have the backbone's shapes)."""
    from transformers import AutoModelForSequenceClassification

    for rank in (0, 1):
        records = json.loads((out / f"reward_model_shards_rank{rank}.json").read_text())
        assert records, "the reward model never scored"
        for held in records:
            assert held["shard"] <= held["full"] // 2 + 64 and held["held"] <= held["full"] // 2 + 64, held
    saved = AutoModelForSequenceClassification.from_pretrained(out / "reward_model")
    fresh = AutoModelForSequenceClassification.from_pretrained(tiny_path, num_labels=1)
    shapes = {k: v.shape for k, v in fresh.state_dict().items()}
    assert {k: v.shape for k, v in saved.state_dict().items()} == shapes
    assert sum(v.numel() for v in saved.parameters()) == records[0]["full"]
