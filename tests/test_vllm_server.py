"""`trl-marl vllm-serve` as a separate process on 127.0.0.1, driven by its client (marker `vllm`; skipped where vLLM
is not importable).

Four servers start at once when the module's first test needs one (engine starts are the cost): a 2-agent team
with one engine per agent, a 2-agent LoRA team on one multi-LoRA engine, a 1-agent server that one test kills, and a
2-agent team a trainer samples through until a test kills it (section (e): the trainer with `vllm_mode="server"`).
The tiny Llama has head_dim 64 (vLLM's CPU attention needs >= 32). Tests that change a server's weights put the
original weights back, so the tests do not depend on their order.
"""

import gc
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from transformers import TrainerCallback

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per engine (vLLM's CPU build)

import httpx  # noqa: E402

from trl_marl.data_types.batches import collate_agent_batch  # noqa: E402
from trl_marl.generation.vllm_client import VLLMServerClient, VLLMServerError  # noqa: E402
from trl_marl.generation.vllm_protocol import encode_weights, prompt_seeds  # noqa: E402
from trl_marl.models.team import agent_token_logprobs  # noqa: E402
from trl_marl.testing import tiny_model_path  # noqa: E402

CERTAIN = 100  # the token the edited agent emits with probability ~1
MAX_MODEL_LEN = 64
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
START_TIMEOUT = 300  # seconds for a server's engines to load on a busy 2-core machine


@pytest.fixture(scope="module")
def vllm_path() -> str:
    return tiny_model_path(hidden_size=128, num_attention_heads=2, num_key_value_heads=2)


@pytest.fixture(scope="module")
def launched(vllm_path, tmp_path_factory):
    """Start the three servers together (`--port 0`: each prints the port the OS gave it); stop them at the end."""
    common = ["--model", vllm_path, "--dtype", "float32", "--max_model_len", str(MAX_MODEL_LEN), "--seed", "0"]
    flags = {
        "team": ["--num_agents", "2", "--gpu_memory_utilization", "0.05"],
        "lora": ["--num_agents", "2", "--enable_lora", "--max_lora_rank", "8", "--gpu_memory_utilization", "0.05"],
        "doomed": ["--num_agents", "1", "--gpu_memory_utilization", "0.05"],
        "trainee": ["--num_agents", "2", "--gpu_memory_utilization", "0.05"],  # a trainer's, killed mid-run
    }
    folder = tmp_path_factory.mktemp("servers")
    servers = {}
    for name, extra in flags.items():
        log = folder / f"{name}.log"
        command = [sys.executable, "-m", "trl_marl.cli.main", "vllm-serve", *common, *extra, "--port", "0"]
        scratch = folder / f"{name}-tmp"  # the server's temporary files (adapters) stay in pytest's folder
        scratch.mkdir()
        with open(log, "w") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(scratch)}
            )
        servers[name] = {"proc": proc, "log": log, "url": None}
    yield servers
    running = [server for server in servers.values() if server["proc"].poll() is None]
    for server in running:
        server["proc"].send_signal(signal.SIGTERM)  # the server closes its engines and its scratch folder
    deadline = time.monotonic() + 10
    for server in running:
        # once closed, the interpreter's exit spends seconds in vLLM's and torch's native teardown: skipped here
        while "trl-marl vllm-serve: closed" not in server["log"].read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        server["proc"].kill()
        server["proc"].wait()


def connect(server: dict, **client_kwargs) -> VLLMServerClient:
    """Read the server's URL from its log, then wait for its engines (the client's health wait)."""
    deadline = time.monotonic() + START_TIMEOUT
    while server["url"] is None:
        text = server["log"].read_text()
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
        if found:
            server["url"] = found.group(1)
        elif server["proc"].poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the server did not start:\n{text[-3000:]}")
        else:
            time.sleep(0.2)
    try:
        return VLLMServerClient(server["url"], timeout=max(1.0, deadline - time.monotonic()), **client_kwargs)
    except VLLMServerError:
        pytest.fail(f"the server did not get ready:\n{server['log'].read_text()[-3000:]}")


@pytest.fixture(scope="module")
def team(launched):
    return connect(launched["team"])


@pytest.fixture(scope="module")
def lora(launched):
    return connect(launched["lora"])


@pytest.fixture(scope="module")
def hf_model(vllm_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(vllm_path).eval()


def make_certain(agent, token: int) -> None:
    """Edit a tiny Llama so that it emits `token` with probability ~1 whatever the prompt (as tests/test_vllm.py):
    attention and MLP outputs zeroed, every embedding row all ones except `token`'s (ten times it); with the tied
    head the logits are 128 for every token and 1280 for `token`."""
    with torch.no_grad():
        body = agent.model
        for layer in body.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        body.norm.weight.fill_(1.0)
        body.embed_tokens.weight.fill_(1.0)
        body.embed_tokens.weight[token].fill_(10.0)


def scored(model, prompts: list[list[int]], result, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the model's log-probs of the server's completions, the server's sampled log-probs, the completion mask)."""
    prompt_ids = [torch.tensor(p) for p in prompts for _ in range(n)]
    completion_ids = [torch.tensor(c) for c in result.completion_ids]
    batch = collate_agent_batch(prompt_ids, completion_ids, pad_token_id=0)
    with torch.no_grad():
        ours = agent_token_logprobs(model, batch)
    theirs = torch.zeros_like(ours)
    for r, lps in enumerate(result.logprobs):
        theirs[r, : len(lps)] = torch.tensor(lps)
    return ours, theirs, batch.completion_mask.bool()


# ---------------------------------------------------------------------------------------------- (a) equality
@pytest.fixture(scope="module")
def reference(launched, vllm_path):
    """An in-process `vllm.LLM` with the servers' engine settings (it loads while the servers load)."""
    from vllm import LLM

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    llm = LLM(
        model=vllm_path,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        skip_tokenizer_init=True,
        enforce_eager=True,
        distributed_executor_backend="external_launcher",
        logprobs_mode="processed_logprobs",
        gpu_memory_utilization=0.05,
    )
    yield llm
    del llm
    gc.collect()


def test_server_generation_equals_in_process_vllm_for_the_same_seed(reference, team):
    """Completion token ids through the server equal an in-process `vllm.LLM` on the same model and settings, for a
    per-request seed (each prompt seeded from it, `prompt_seeds`) and greedy; the seed, not the server's history,
    decides the samples."""
    from vllm import SamplingParams

    settings = dict(n=3, max_tokens=8, temperature=1.0, top_p=0.9, top_k=50, seed=11)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    for agent in (0, 1):
        served = team.generate(agent, PROMPTS, **settings, logprobs=True)
        params = [  # the server seeds each prompt (`prompt_seeds`): prompt r gets seed + r * n
            SamplingParams(**{**settings, "seed": seed}, logprobs=0) for seed in prompt_seeds(11, len(PROMPTS), 3)
        ]
        local = reference.generate(prompts, params, use_tqdm=False)
        assert served.completion_ids == [list(s.token_ids) for r in local for s in r.outputs]
        expected = [[s.logprobs[k][t].logprob for k, t in enumerate(s.token_ids)] for r in local for s in r.outputs]
        assert torch.allclose(torch.tensor(served.logprobs), torch.tensor(expected), atol=1e-5)
    greedy = team.generate(0, PROMPTS, temperature=0.0, max_tokens=8)
    local = reference.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    assert greedy.completion_ids == [list(r.outputs[0].token_ids) for r in local] and greedy.logprobs is None
    again = team.generate(1, PROMPTS, **settings)  # `served` is agent 2's: the same request samples the same
    assert again.completion_ids == served.completion_ids
    assert team.generate(1, PROMPTS, **{**settings, "seed": 12}).completion_ids != served.completion_ids


# ---------------------------------------------------------------------------------------------- (b) pushes
def test_pushed_full_weights_are_what_the_agent_samples_next(team, hf_model):
    import copy

    before = {a["agent"]: a["version"] for a in team.server_info()["agents"]}
    edited = copy.deepcopy(hf_model)
    make_certain(edited, CERTAIN)
    try:
        assert team.push_model(0, edited, step=7) == {"agent": 0, "version": before[0] + 1, "step": 7}
        out = team.generate(0, PROMPTS, n=2, max_tokens=6, seed=1)
        assert out.completion_ids == [[CERTAIN] * 6] * 6  # agent 1 follows the pushed weights
        other = team.generate(1, PROMPTS, n=2, max_tokens=6, seed=1)
        assert not any(c == [CERTAIN] * 6 for c in other.completion_ids)  # agent 2's engine is its own
        agents = team.server_info()["agents"]
        assert (agents[0]["version"], agents[0]["step"], agents[1]["version"]) == (before[0] + 1, 7, before[1])
    finally:
        team.push_model(0, hf_model)
    restored = team.generate(0, PROMPTS, n=2, max_tokens=8, seed=1, logprobs=True)
    ours, theirs, mask = scored(hf_model, PROMPTS, restored, n=2)
    assert (ours - theirs).abs()[mask].max() < 1e-4  # the original weights are back


def lora_agent(vllm_path, seed: int):
    """A PEFT LoRA model (r=8) whose adapter moves the tiny model's log-probs well away from the base's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(vllm_path), config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    return model


def test_lora_team_samples_from_each_pushed_adapter_and_its_new_version(lora, vllm_path, hf_model):
    """Only the adapters travel; each agent then samples like its own adapter (not the base, not the other
    agent's), and a second push of agent 1 replaces its adapter under a new LoRA request version."""
    before = [a["version"] for a in lora.server_info()["agents"]]
    agents = [lora_agent(vllm_path, seed) for seed in (1, 2)]
    for i, model in enumerate(agents):
        assert lora.push_model(i, model, step=1)["version"] == before[i] + 1
    for i, model in enumerate(agents):
        out = lora.generate(i, PROMPTS, n=2, max_tokens=8, seed=3, logprobs=True)
        ours, theirs, mask = scored(model, PROMPTS, out, n=2)
        assert (ours - theirs).abs()[mask].max() < 1e-3  # the engine ran agent i's adapter
        base, _, _ = scored(hf_model, PROMPTS, out, n=2)
        assert (base - theirs).abs()[mask].max() > 5e-2  # ... which is not the bare base
        mate, _, _ = scored(agents[1 - i], PROMPTS, out, n=2)
        assert (mate - theirs).abs()[mask].max() > 5e-2  # ... nor the other agent's adapter
    newer = lora_agent(vllm_path, 3)
    assert lora.push_model(0, newer, step=2) == {"agent": 0, "version": before[0] + 2, "step": 2}
    out = lora.generate(0, PROMPTS, n=2, max_tokens=8, seed=3, logprobs=True)
    ours, theirs, mask = scored(newer, PROMPTS, out, n=2)
    assert (ours - theirs).abs()[mask].max() < 1e-3


# ---------------------------------------------------------------------------------------------- (c) a dead server
def test_a_stopped_then_killed_server_gives_the_clear_error_within_the_budget(launched):
    """One server per agent: this one serves team agent 2 (`agent_offset=1`). Stopped (SIGSTOP: connections are
    accepted, nothing answers), each attempt times out; killed, connections are refused. Both end in an error that
    names the server and the agent, within the retry budget."""
    server = launched["doomed"]
    client = connect(server, request_timeout=2.0, max_retries=1, backoff_base=0.5, agent_offset=1)
    assert len(client.generate(1, PROMPTS, max_tokens=4, seed=0).completion_ids) == 3
    url, proc = server["url"], server["proc"]
    proc.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(VLLMServerError) as err:
            client.generate(1, PROMPTS, max_tokens=4)
        assert time.monotonic() - start < 2 * 2.0 + 0.5 + 3  # 2 attempts of 2 s, one backoff, slack
        assert re.search(
            rf"vLLM server {url} \(agent 2\) did not answer .* 2 attempt\(s\).*request_timeout=2.0 s", str(err.value)
        )
    finally:
        proc.kill()  # SIGKILL ends a stopped process too
        proc.wait(30)
    start = time.monotonic()
    with pytest.raises(VLLMServerError) as err:
        client.push_weights(1, [("model.norm.weight", torch.ones(128))], step=3)
    assert time.monotonic() - start < 0.5 + 3
    message = str(err.value)
    assert f"vLLM server {url} (agent 2) did not answer POST /update_weights after 2 attempt(s)" in message
    assert "ConnectionRefusedError" in message and "is `trl-marl vllm-serve` running there?" in message


# ---------------------------------------------------------------------------------------------- (d) bad requests
@pytest.mark.parametrize(
    "body, message",
    [
        ({"agent": 2, "prompt_ids": [[1]]}, r"agent must be in 0..1 \(the server serves 2\), got 2"),
        ({"agent": 0, "prompt_ids": [[1, 512]]}, r"prompt_ids\[0\]\[1\] is 512: .* below the model's vocab_size 512"),
        ({"agent": 0, "prompt_ids": [list(range(64))]}, r"has 64 tokens: .*max_model_len 64 .*--max_model_len"),
        ({"agent": 0, "prompt_ids": [[1]], "temp": 0.5}, r"unknown field\(s\) \['temp'\]"),
        ({"agent": 0}, "missing field 'prompt_ids'"),
        ({"agent": 0, "prompt_ids": [[1]], "n": 0}, "n must be >= 1, got 0"),
        ({"agent": 0, "prompt_ids": [[1]], "top_p": 2}, r"top_p must be in \(0, 1\], got 2"),
    ],
)
def test_bad_generate_requests_get_a_clear_400(team, body, message):
    response = httpx.post(team.base_url + "/generate", json=body)
    assert response.status_code == 400 and re.search(message, response.json()["error"])


def test_bad_weight_pushes_are_refused_before_the_engine_sees_them(team, lora, hf_model):
    """A wrong name or shape would break vLLM's in-place reload for good: refused with a 400, and both engines
    still serve the same samples afterwards."""
    before = team.generate(0, PROMPTS, max_tokens=6, seed=5).completion_ids
    weights = {n: p.detach() for n, p in hf_model.named_parameters()}

    def push(client, payload, query="agent=0"):
        return httpx.post(f"{client.base_url}/update_weights?{query}", content=payload)

    cases = [
        (team, b"garbage", "agent=0", "not a safetensors payload"),
        (team, encode_weights(weights.items(), "full"), "agent=5", r"agent must be in 0..1"),
        (team, encode_weights(weights.items(), "full"), "step=1", r"needs \?agent=I"),
        (team, encode_weights(weights.items(), "full"), "agent=0&version=2", r"unknown query parameter\(s\)"),
        (team, encode_weights([("model.norm.weight", weights["model.norm.weight"])], "full"), "agent=0", "missing:"),
        (team, encode_weights({**weights, "model.extra": torch.ones(1)}.items(), "full"), "agent=0", "unknown:"),
        (
            team,
            encode_weights({**weights, "model.norm.weight": torch.ones(5)}.items(), "full"),
            "agent=0",
            r"model.norm.weight has shape \[5\], the model's is \[128\]",
        ),
        (team, encode_weights({}.items(), "lora", {"peft_type": "LORA"}), "agent=0", "takes full weights"),
        (lora, encode_weights(weights.items(), "full"), "agent=0", "takes LoRA adapters .* push only the agent's"),
        (
            lora,
            encode_weights([("a.lora_A.weight", torch.ones(16, 4))], "lora", {"peft_type": "LORA", "r": 16}),
            "agent=0",
            r"rank r=16 must be in 1..8 \(the server's --max_lora_rank\)",
        ),
        (
            lora,
            encode_weights([("lm_head.weight", torch.ones(2))], "lora", {"peft_type": "LORA", "r": 8}),
            "agent=0",
            r"LoRA matrices only .*\['lm_head.weight'\]",
        ),
    ]
    for client, payload, query, message in cases:
        response = push(client, payload, query)
        assert response.status_code == 400 and re.search(message, response.json()["error"]), (query, message)
    assert team.generate(0, PROMPTS, max_tokens=6, seed=5).completion_ids == before
    assert all(a["failed"] is None for a in team.server_info()["agents"] + lora.server_info()["agents"])
    assert httpx.get(team.base_url + "/nope").status_code == 404
    assert httpx.get(team.base_url + "/generate").status_code == 405


# ---------------------------------------------------------------------------------------------- (e) the trainer
def train_args(output_dir, **overrides):
    """A 2-agent MAGRPO run of 3 optimizer steps on colocated engines with the servers' engine settings (the
    `launched` servers' --gpu_memory_utilization 0.05 and --max_model_len MAX_MODEL_LEN)."""
    return _magrpo_args(output_dir, vllm_gpu_memory_utilization=0.05, vllm_max_model_length=MAX_MODEL_LEN, **overrides)


def _magrpo_args(output_dir, **overrides):
    """The run's settings with use_vllm=True, no engine setting: each mode adds what it reads."""
    from trl_marl import MAGRPOConfig

    settings = dict(
        output_dir=str(output_dir),
        num_agents=2,
        num_generations=2,
        max_completion_length=6,
        rollout_buffer_size=2,
        learning_rate=1e-2,
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        use_vllm=True,
    )
    return MAGRPOConfig(**{**settings, **overrides})


def served_args(server: dict, output_dir, **overrides):
    """`train_args`'s run sampling through `server` (`vllm_mode="server"`): the engine settings are the server's
    flags (server mode refuses the colocated engines' fields)."""
    connect(server)  # its URL, once its engines are ready
    return _magrpo_args(output_dir, vllm_mode="server", vllm_server_base_url=server["url"], **overrides)


def recorder(seen: list):
    def length_reward(c1, c2):
        seen.append((list(c1), list(c2)))
        return [float(len(a) - len(b)) / 10 for a, b in zip(c1, c2)]

    return length_reward


def team_weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.team.parameters()])


@pytest.fixture(scope="module")
def items():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": f"Write about topic {i}."} for i in range(8)])


@pytest.fixture(scope="module")
def colocated_run(vllm_path, items, tmp_path_factory):
    """The 3-step run on colocated engines: what it sampled at each step, and its final weights."""
    from trl_marl import MAGRPOTrainer

    seen = []
    args = train_args(tmp_path_factory.mktemp("colocated"))
    trainer = MAGRPOTrainer(model=vllm_path, reward_funcs=recorder(seen), args=args, train_dataset=items)
    trainer.train()
    trainer.generation.close()
    weights = team_weights(trainer)
    del trainer
    gc.collect()
    return seen, weights


def test_a_run_through_the_server_equals_the_colocated_run(launched, colocated_run, vllm_path, items, tmp_path):
    """The same seed, the same samples: every step's completions through a team server (per-agent engines, weights
    pushed after each optimizer step) equal the colocated engines', and so do the final weights (vLLM's CPU engine
    is deterministic for a request's seeds)."""
    from trl_marl import MAGRPOTrainer
    from trl_marl.generation.vllm_server_engine import VLLMServerGeneration

    seen = []
    args = served_args(launched["trainee"], tmp_path)
    trainer = MAGRPOTrainer(model=vllm_path, reward_funcs=recorder(seen), args=args, train_dataset=items)
    assert isinstance(trainer.generation, VLLMServerGeneration)
    trainer.train()
    expected, weights = colocated_run
    assert len(seen) == 3 and len({str(s) for s in seen}) == 3  # three different rollouts
    assert seen == expected
    assert torch.allclose(team_weights(trainer), weights, atol=1e-6)
    assert trainer.generation.num_syncs == 3  # one push of the team before each rollout
    agents = connect(launched["trainee"]).server_info()["agents"]
    assert [a["step"] for a in agents] == [2, 2]


class KillServerAfter(TrainerCallback):
    """SIGKILL a server process after optimizer step `step`."""

    def __init__(self, proc, step: int):
        self.proc, self.step = proc, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.proc.kill()
            self.proc.wait(30)


def test_a_killed_server_stops_the_run_with_a_checkpoint_and_the_resume_loses_nothing(
    launched, colocated_run, vllm_path, items, tmp_path, hf_model
):
    """The trainer's server is killed after step 2 (save_strategy="no"): the push before step 3 fails after the
    client's retries with an error naming the server and the agent, and the run wrote checkpoint-2 first. Resumed
    from it through another server, the run ends with the weights of the run that never lost its server."""
    from trl_marl import MAGRPOTrainer

    server = launched["trainee"]
    args = served_args(server, tmp_path / "run")
    trainer = MAGRPOTrainer(
        model=vllm_path,
        reward_funcs=recorder([]),
        args=args,
        train_dataset=items,
        callbacks=[KillServerAfter(server["proc"], 2)],
    )
    start = time.monotonic()
    with pytest.raises(VLLMServerError) as err:
        trainer.train()
    assert time.monotonic() - start < 120
    message, note = str(err.value), " ".join(err.value.__notes__)
    assert f"vLLM server {server['url']} (agent 1) did not answer POST /update_weights after 3 attempt(s)" in message
    assert "ConnectionRefusedError" in message
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert f"the run stopped after step 2: {checkpoint} holds it" in note and "resume_from_checkpoint" in note
    assert trainer.state.global_step == 2

    team = launched["team"]
    try:
        resumed = MAGRPOTrainer(
            model=vllm_path,
            reward_funcs=recorder([]),
            args=served_args(team, tmp_path / "run"),
            train_dataset=items,
        )
        resumed.train(resume_from_checkpoint=True)
    finally:  # the other tests expect the team server's original weights
        client = connect(team)
        client.push_model(0, hf_model)
        client.push_model(1, hf_model)
    assert resumed.state.global_step == 3
    assert torch.allclose(team_weights(resumed), colocated_run[1], atol=1e-6)
