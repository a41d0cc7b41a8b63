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
from safetensors.torch import load_file

from trl_marl.algorithms import group_advantages

ROOT = Path(__file__).resolve().parents[1]


def launch(config: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    env["HF_HUB_OFFLINE"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "accelerate_configs" / f"{config}.yaml"),
        str(ROOT / "tests" / "scripts" / "dist_run.py"),
        str(out),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return proc


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
    # MADPO: the pairs of both processes were gathered, so both trained on the same set
    assert json.loads((out / "madpo" / "run_info.json").read_text())["num_pairs"] > 0
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
