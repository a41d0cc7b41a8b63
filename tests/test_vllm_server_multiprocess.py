"""`vllm_mode="server"` under two training processes (DDP over gloo, DeepSpeed ZeRO-3 on CPU): both ranks sample from
one stand-in team server (`test_vllm_server_engine.FakeServer`, listening in this test's process) and push to it.

What must hold: every rank finishes every step; every prompt a rank samples is answered by the server; before each
rollout the server receives the trained weights, whole (not a ZeRO-3 shard) and the same from both ranks: a checksum of
what the server received equals the one each rank computes from its gathered agent after the optimizer step.
"""

import hashlib
import json
import re
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch
from test_vllm_server_engine import FakeServer, FakeTeam

from trl_marl.generation.vllm_protocol import RequestError, decode_weights

ROOT = Path(__file__).resolve().parents[1]


def checksum(weights: dict[str, torch.Tensor]) -> str:
    """sha256 of the weights in name order (names, shapes and float32 bytes): equal only for identical weights."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{name}:{list(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


class ChecksummingTeam(FakeTeam):
    """A `FakeTeam` that also records each push's checksum and size, and each request's prompts, under a lock (two
    ranks' requests arrive on the server's threads at once)."""

    def __init__(self, num_agents: int):
        super().__init__(num_agents)
        self.lock = threading.Lock()
        self.held: list[int | None] = []

    def generate(self, body: dict) -> dict:
        with self.lock:
            answer = super().generate(body)
            self.held.append(self.steps[self.requests[-1].agent])  # the step of the weights that sampled it
            return answer

    def update_weights(self, agent: int, step: int | None, payload: bytes) -> dict:
        with self.lock:
            answer = super().update_weights(agent, step, payload)
            self.pushes[-1].update(checksum=checksum(decode_weights(payload)), bytes=len(payload))
            return answer


class RefusingTeam(ChecksummingTeam):
    """Refuses every push from step `step` on (HTTP 400: the client does not retry)."""

    def __init__(self, num_agents: int, step: int):
        super().__init__(num_agents)
        self.refuse_from = step

    def update_weights(self, agent: int, step: int | None, payload: bytes) -> dict:
        if step is not None and step >= self.refuse_from:
            raise RequestError(f"refusing step {step}")
        return super().update_weights(agent, step, payload)


SCRIPT = """
import json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from conftest import cpu_args, letters_reward
from test_vllm_server_multiprocess import checksum
from transformers import TrainerCallback
from trl_marl import MAGRPOConfig, MAGRPOTrainer
from trl_marl.generation.vllm_client import VLLMServerClient
from datasets import Dataset

sent = []  # (agent, seed, prompt ids, the trainer's step) of each /generate this rank sends
real_generate = VLLMServerClient.generate
def generate(self, agent, prompt_ids, **kwargs):
    sent.append([agent, kwargs.get("seed"), [list(p) for p in prompt_ids], trainer.state.global_step])
    return real_generate(self, agent, prompt_ids, **kwargs)
VLLMServerClient.generate = generate

def gathered_checksum(model):
    params = list(model.parameters())
    if any(hasattr(p, "ds_id") for p in params):  # ZeRO-3: the full weights, gathered (a collective)
        import deepspeed
        with deepspeed.zero.GatheredParameters(params):
            return checksum(dict(model.named_parameters()))
    return checksum(dict(model.named_parameters()))

class Checksums(TrainerCallback):
    # the agents' full weights after each optimizer step: what the server must receive before the next rollout
    def __init__(self):
        self.sums = {{}}
    def record(self, step):
        self.sums[step] = [gathered_checksum(agent) for agent in trainer.team.agents]
    def on_train_begin(self, args, state, control, **kwargs):
        self.record(0)
    def on_step_end(self, args, state, control, **kwargs):
        self.record(state.global_step)

items = Dataset.from_list([dict(prompt=f"Write about topic {{i}}.") for i in range(8)])
args = cpu_args(MAGRPOConfig, Path({out!r}), use_vllm=True, vllm_mode="server", vllm_server_base_url={url!r},
                vllm_server_timeout=30.0, max_steps={steps}, max_completion_length=4, learning_rate=1e-2)
checksums = Checksums()
trainer = MAGRPOTrainer(model={tiny!r}, reward_funcs=letters_reward, args=args, train_dataset=items,
                        callbacks=[checksums])
trainer.train()
engine = trainer.generation
info = dict(rank=trainer.accelerator.process_index, steps=trainer.state.global_step, collective=engine.collective,
            engine=type(engine).__name__, sent=sent, checksums=checksums.sums, num_syncs=engine.num_syncs,
            sync_seconds=engine.sync_seconds, generate_seconds=engine.generate_seconds)
Path({out!r}).mkdir(parents=True, exist_ok=True)
Path({out!r}, f"result-{{info['rank']}}.json").write_text(json.dumps(info))  # too long for one line of stdout
trainer.accelerator.wait_for_everyone()  # as every other multi-process script: both ranks done before the teardown
trainer.accelerator.end_training()  # as a script may; trl_marl's exit hook still lets gloo's workers run out
"""

STEPS = 3


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["multi_cpu", "zero3_cpu"])
def test_two_processes_sample_from_one_server_and_push_the_trained_weights(tiny_path, tmp_path, engine):
    if engine.startswith("zero3"):
        pytest.importorskip("deepspeed")
    from conftest import launch_failure

    server = FakeServer(ChecksummingTeam(2))
    try:
        proc = launch(engine, tiny_path, tmp_path, server)
    finally:
        server.kill()
    assert proc.returncode == 0, launch_failure(proc)
    results = [json.loads(path.read_text()) for path in sorted((tmp_path / "out").glob("result-*.json"))]
    assert [r["rank"] for r in results] == [0, 1], proc.stdout[-3000:]
    assert all(r["steps"] == STEPS and r["engine"] == "VLLMServerGeneration" for r in results)
    assert all(r["collective"] == engine.startswith("zero3") for r in results)
    team = server.team

    # every prompt of every rank was sampled by the server, with the weights of the rank's step: one request per agent
    # and step on each rank
    sent = [(a, seed, json.dumps(ids), step) for r in results for a, seed, ids, step in r["sent"]]
    received = [(r.agent, r.seed, json.dumps(r.prompt_ids), s) for r, s in zip(team.requests, team.held, strict=True)]
    assert Counter(sent) == Counter(received)
    for r in results:
        assert sorted((a, step) for a, _, _, step in r["sent"]) == [(a, s) for a in (0, 1) for s in range(STEPS)]
    prompts = [{json.dumps(ids) for _, _, ids, _ in r["sent"]} for r in results]
    assert not prompts[0] & prompts[1]  # each rank samples its own share of the data

    # before each rollout the server holds the trained weights: whole, and equal to each rank's gathered agent
    sums = [{int(step): s for step, s in r["checksums"].items()} for r in results]
    assert sums[0] == sums[1]  # the ranks hold the same agents after every step
    assert len({s[0] for s in sums[0].values()}) == STEPS + 1  # and the weights move
    names = sorted(n for n, _ in _tiny_parameters(tiny_path))
    for push in team.pushes:
        assert push["names"] == names and push["kind"] == "full"
        assert push["checksum"] == sums[0][push["step"]][push["agent"]], push
    # one push per agent and step, from the main rank (DDP: at the start of the rollout, the other rank waiting for
    # its answer; ZeRO-3: the other rank joining the gathers); the old code pushed from both ranks under DDP
    by_step = Counter((p["agent"], p["step"]) for p in team.pushes)
    assert by_step == {(a, s): 1 for a in (0, 1) for s in range(STEPS)}
    assert all(r["num_syncs"] == STEPS for r in results)  # every rank recorded the main rank's pushes


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["multi_cpu", "zero3_cpu"])
def test_a_refused_push_stops_both_ranks_at_the_step_boundary(tiny_path, tmp_path, engine):
    """The main rank alone pushes: when the server refuses the push after step 2, the other rank learns of it (no
    rank waits for a push that never comes) and both stop with `VLLMServerError` at the step boundary."""
    if engine.startswith("zero3"):
        pytest.importorskip("deepspeed")
    server = FakeServer(RefusingTeam(2, step=2))
    try:
        proc = launch(engine, tiny_path, tmp_path, server)
    finally:
        server.kill()
    assert proc.returncode != 0
    errors = {rank: re.findall(rf"\[rank{rank}\]: \S*VLLMServerError: (.*)", proc.stderr) for rank in (0, 1)}
    assert errors[0] and "refusing step 2" in errors[0][0], proc.stderr[-3000:]
    assert errors[1] == [f"the main process's push failed: {errors[0][0]}"], proc.stderr[-3000:]
    assert all(f"[rank{rank}]: trl_marl: the run stopped at step 2" in proc.stderr for rank in (0, 1))
    assert [(p["agent"], p["step"]) for p in server.team.pushes] == [(a, s) for s in range(2) for a in (0, 1)]


def launch(engine, tiny_path, tmp_path, server, timeout=300):
    """`SCRIPT` under `accelerate launch` with the config `engine`, against `server`; the completed process."""
    import os
    import subprocess
    import sys

    script = tmp_path / "run.py"
    out = str(tmp_path / "out")
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests"), tiny=tiny_path, out=out, url=server.url, steps=STEPS))
    config = ROOT / "accelerate_configs" / f"{engine}.yaml"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), str(script)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def _tiny_parameters(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).named_parameters()
