"""`vllm_mode="server"` through the trainer, against a stand-in team server (no vLLM): the real HTTP layer of
`trl-marl vllm-serve` (`vllm_server._Handler`) and its client, with a fake team behind them that samples each
completion from its request's seeds and the weights' step it was pushed, and records every push.

The real server (vLLM engines in a separate process) is driven by the same trainer in tests/test_vllm_server.py.
"""

import contextlib
import socket
import threading

import pytest
import torch
from transformers import TrainerCallback

from trl_marl import MAGRPOTrainer
from trl_marl.generation.vllm_client import VLLMServerError
from trl_marl.generation.vllm_protocol import API_VERSION, GenerateRequest, payload_metadata, prompt_seeds
from trl_marl.generation.vllm_server import _Handler, _TeamHTTPServer
from trl_marl.generation.vllm_server_engine import VLLMServerGeneration

VOCAB = 512


class FakeTeam:
    """What `trl-marl vllm-serve` answers, without vLLM. Completion j of prompt r is drawn from the request's seed for
    it (`prompt_seeds`, + j) and the step of the weights the agent holds, so a sample is reproducible and changes when
    the weights do; some completions end with the first stop token (as vLLM stops after it)."""

    def __init__(self, num_agents: int, layout: str = "per_agent", vocab_size: int = VOCAB, max_model_len: int = 128):
        self.num_agents, self.layout = num_agents, layout
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self.versions = [0] * num_agents
        self.steps: list[int | None] = [None] * num_agents
        self.pushes: list[dict] = []
        self.requests: list[GenerateRequest] = []

    def info(self) -> dict:
        agents = [
            {
                "agent": i,
                "model": "fake",
                "version": self.versions[i],
                "step": self.steps[i],
                "failed": None,
                "vocab_size": self.vocab_size,
                "max_model_len": self.max_model_len,
            }
            for i in range(self.num_agents)
        ]
        return {
            "api_version": API_VERSION,
            "status": "ready",
            "layout": self.layout,
            "num_agents": self.num_agents,
            "model": "fake",
            "agents": agents,
        }

    def generate(self, body: dict) -> dict:
        n = self.num_agents
        req = GenerateRequest.from_json(body).validate(n, [self.vocab_size] * n, [self.max_model_len] * n)
        self.requests.append(req)
        step = self.steps[req.agent]
        ids, logprobs = [], []
        for seed in prompt_seeds(req.seed, len(req.prompt_ids), req.n):
            for j in range(req.n):
                g = torch.Generator().manual_seed(((seed or 0) + j) * 1000 + (-1 if step is None else step))
                tokens = torch.randint(3, self.vocab_size, (req.max_tokens,), generator=g).tolist()
                stop = int(torch.randint(1, 2 * req.max_tokens, (1,), generator=g))
                if stop < req.max_tokens and req.stop_token_ids:
                    tokens = tokens[:stop] + [req.stop_token_ids[0]]
                ids.append(tokens)
                logprobs.append([-1.0] * len(tokens))
        return {"completion_ids": ids, "logprobs": logprobs if req.logprobs else None}

    def update_weights(self, agent: int, step: int | None, payload: bytes) -> dict:
        metadata, entries = payload_metadata(payload)
        self.pushes.append({"agent": agent, "step": step, "kind": metadata["kind"], "names": sorted(entries)})
        self.versions[agent] += 1
        self.steps[agent] = step
        return {"agent": agent, "version": self.versions[agent], "step": step}


class _KillableHTTPServer(_TeamHTTPServer):
    """Keeps its open connections, so `kill` can drop the kept-alive ones too (as a killed process does)."""

    def process_request(self, request, client_address):
        self.connections.append(request)
        super().process_request(request, client_address)


class FakeServer:
    """A `FakeTeam` behind `trl-marl vllm-serve`'s HTTP layer on 127.0.0.1 (a port the OS picks)."""

    def __init__(self, team: FakeTeam):
        self.team = team
        self.httpd = _KillableHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.connections = []
        self.httpd.team, self.httpd.closing = team, threading.Event()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def kill(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        for connection in self.httpd.connections:
            with contextlib.suppress(OSError):  # already closed
                connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def servers():
    started = []

    def start(num_agents: int = 2, **kwargs) -> FakeServer:
        started.append(FakeServer(FakeTeam(num_agents, **kwargs)))
        return started[-1]

    yield start
    for server in started:
        server.kill()


def server_args(make_args, urls, **overrides):
    settings = dict(
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=urls,
        vllm_server_timeout=5.0,
        max_steps=3,
        max_completion_length=6,
        learning_rate=1e-2,
    )
    return make_args(**{**settings, **overrides})


def letters(c1, c2):
    return [float(sum(ch in "aeiou" for ch in a + b)) for a, b in zip(c1, c2)]


def weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.team.parameters()])


def test_pushes_are_lazy_one_per_optimizer_step_and_samples_follow_the_seeds(make_args, tiny_path, items, servers):
    """3 optimizer steps: before each rollout every agent is pushed once (full weights, with the trainer's step);
    each sampling request carries a seed drawn from the rollout stream; completions are cut after their EOS and the
    log-prob gap is logged. The same run again samples the same completions."""
    server = servers(2)
    seen = []

    def reward(c1, c2):
        seen.append((list(c1), list(c2)))
        return letters(c1, c2)

    trainer = MAGRPOTrainer(
        model=tiny_path, reward_funcs=reward, args=server_args(make_args, server.url), train_dataset=items
    )
    assert isinstance(trainer.generation, VLLMServerGeneration)
    trainer.train()
    pushes = server.team.pushes
    assert [(p["agent"], p["step"], p["kind"]) for p in pushes] == [(a, s, "full") for s in range(3) for a in (0, 1)]
    expected = sorted(n for n, _ in trainer.team.agents[0].named_parameters())
    assert pushes[0]["names"] == expected  # every weight under its checkpoint name (the tied head once)
    requests = server.team.requests
    assert len(requests) == 6 and len({r.seed for r in requests}) == 6  # one request per agent and step
    assert all(r.n == 2 and r.max_tokens == 6 and r.temperature == 1.0 for r in requests)
    eos = trainer.eos_ids[0]
    for r in requests:
        assert r.stop_token_ids == eos
    log = trainer.state.log_history[0]
    assert log["sampling/sampling_logp_difference/mean"] > 0
    again = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=lambda c1, c2: (seen.append((list(c1), list(c2))), letters(c1, c2))[1],
        args=server_args(make_args, servers(2).url),
        train_dataset=items,
    )
    first = list(seen)
    seen.clear()
    again.train()
    assert seen == first


def test_a_restarted_server_gets_the_weights_again_before_it_samples(make_args, tiny_path, items, servers):
    """A server that lost what was pushed (a restart: version 0, no step) is pushed again on the next sampling call,
    even without an optimizer step since (`GET /info`)."""
    server = servers(2)
    trainer = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=letters,
        args=server_args(make_args, server.url, max_steps=1),
        train_dataset=items,
        eval_dataset=items,
    )
    trainer.train()
    assert [p["step"] for p in server.team.pushes] == [0, 0]
    trainer.evaluate_reward()  # the step moved: pushed with step 1
    assert [p["step"] for p in server.team.pushes] == [0, 0, 1, 1]
    trainer.evaluate_reward()  # the server still holds step 1: nothing pushed
    assert len(server.team.pushes) == 4
    server.team.versions, server.team.steps = [0, 0], [None, None]
    trainer.evaluate_reward()
    assert [p["step"] for p in server.team.pushes] == [0, 0, 1, 1, 1, 1]


def test_one_server_per_agent(make_args, tiny_path, tiny_qwen_path, items, servers):
    """A list of URLs: server k serves team agent k only (a heterogeneous team here), each receiving its agent's
    weights and requests."""
    one, two = servers(1), servers(1)
    trainer = MAGRPOTrainer(
        model=[tiny_path, tiny_qwen_path],
        reward_funcs=letters,
        args=server_args(make_args, [one.url, two.url], max_steps=2),
        train_dataset=items,
    )
    trainer.train()
    for server, agent in ((one, 0), (two, 1)):
        assert [(p["agent"], p["step"]) for p in server.team.pushes] == [(0, 0), (0, 1)]
        names = sorted(n for n, _ in trainer.team.agents[agent].named_parameters())
        assert server.team.pushes[0]["names"] == names
        assert len(server.team.requests) == 2 and all(r.agent == 0 for r in server.team.requests)


def test_a_lora_team_pushes_only_its_adapters_to_a_multi_lora_server(make_args, tiny_path, items, servers):
    from peft import LoraConfig

    server = servers(2, layout="multi_lora")
    trainer = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=letters,
        args=server_args(make_args, server.url, max_steps=1, share_base_model=True),
        train_dataset=items,
        peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
    )
    trainer.train()
    assert [(p["agent"], p["kind"]) for p in server.team.pushes] == [(0, "lora"), (1, "lora")]
    assert all(".lora_" in n for p in server.team.pushes for n in p["names"])


@pytest.mark.parametrize(
    "fake, model, message",
    [
        (dict(num_agents=3), None, r"serves 3 agent\(s\); one server for the team must serve 2: .*--num_agents 2"),
        (dict(num_agents=2, vocab_size=600), None, r"\(agent 1\) serves fake with vocab_size 600; agent 1's .* 512"),
        (dict(num_agents=2, max_model_len=6), None, r"max_model_len 6, which must exceed max_completion_length \(6\)"),
        (dict(num_agents=2, layout="multi_lora"), None, r"multi-LoRA team .* agent 1 has no LoRA adapter"),
    ],
)
def test_a_server_that_does_not_serve_this_team_is_refused_at_construction(
    make_args, tiny_path, items, servers, fake, model, message
):
    server = servers(**fake)
    with pytest.raises(ValueError, match=message):
        MAGRPOTrainer(
            model=tiny_path, reward_funcs=letters, args=server_args(make_args, server.url), train_dataset=items
        )


class KillAfter(TrainerCallback):
    def __init__(self, server: FakeServer, step: int):
        self.server, self.step = server, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.server.kill()


def test_a_dead_server_stops_the_run_with_a_checkpoint_and_the_resumed_run_loses_nothing(
    make_args, tiny_path, items, servers, tmp_path, monkeypatch
):
    """The server dies after step 2 (save_strategy="no"): the push before the third rollout fails after the client's
    retries with an error naming the server and the agent; the run wrote checkpoint-2 first and says so. Resumed
    against a new server, the run ends with the weights of a run that never lost its server (the samples depend on
    the pushed weights and the checkpointed seeds only)."""
    import trl_marl.generation.vllm_server_engine as engine_module

    real = engine_module.VLLMServerClient
    monkeypatch.setattr(  # shorter retries than the trainer's 1 s / 2 s backoff, same logic
        engine_module, "VLLMServerClient", lambda *a, **kw: real(*a, **{**kw, "backoff_base": 0.05})
    )
    reference = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=letters,
        args=server_args(make_args, servers(2).url, output_dir=str(tmp_path / "reference")),
        train_dataset=items,
    )
    reference.train()

    dying = servers(2)
    out = str(tmp_path / "run")
    trainer = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=letters,
        args=server_args(make_args, dying.url, output_dir=out),
        train_dataset=items,
        callbacks=[KillAfter(dying, 2)],
    )
    with pytest.raises(VLLMServerError) as err:
        trainer.train()
    message = str(err.value)
    assert f"vLLM server {dying.url} (agent 1) did not answer POST /update_weights after 3 attempt(s)" in message
    assert "ConnectionRefusedError" in message
    note = " ".join(err.value.__notes__)
    assert f"the run stopped after step 2: {out}/checkpoint-2 holds it" in note and "resume_from_checkpoint" in note

    resumed = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=letters,
        args=server_args(make_args, servers(2).url, output_dir=out),
        train_dataset=items,
    )
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3
    assert torch.allclose(weights(resumed), weights(reference), atol=1e-6)
    assert not torch.allclose(weights(resumed), weights(trainer))  # step 3 did happen after the resume


def test_a_server_that_never_comes_up_fails_the_construction_naming_it(make_args, tiny_path, items):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(VLLMServerError, match=rf"vLLM server {url} was not ready within 1.0 s"):
        MAGRPOTrainer(
            model=tiny_path,
            reward_funcs=letters,
            args=server_args(make_args, url, vllm_server_timeout=1.0),
            train_dataset=items,
        )


class RecordingGathers:
    """A `dist` that gathers nothing and records the parameters of each `gather_params` call."""

    def __init__(self):
        self.calls = []

    def gather_params(self, params):
        self.calls.append([id(p) for p in params])
        return contextlib.nullcontext()


@pytest.mark.parametrize("layout", ["per_agent", "multi_lora"])
def test_gather_model_makes_the_gathers_of_a_push_and_sends_nothing(tiny_path, servers, layout):
    """Under ZeRO-3 the main process pushes while the others only gather (`VLLMServerClient.gather_model`): each
    gather is a collective, so both must gather the same parameters in the same order."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trl_marl.generation.vllm_client import VLLMServerClient

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    if layout == "multi_lora":
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    server = servers(1, layout=layout)
    pushed, gathered = RecordingGathers(), RecordingGathers()
    with VLLMServerClient(server.url, timeout=5.0) as client:
        client.push_model(0, model, step=0, dist=pushed)
        assert len(server.team.pushes) == 1
        client.gather_model(0, model, dist=gathered)
    assert len(server.team.pushes) == 1 and gathered.calls == pushed.calls and pushed.calls
