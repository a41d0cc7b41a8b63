"""The `trl-marl vllm-serve` client and protocol without vLLM: retries, deadlines and clear errors against a dead
port and a scripted stand-in server, request checks, the weight payload, and the command's flags.

The real server (a separate process with vLLM engines) is tested in tests/test_vllm_server.py.
"""

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from trl_marl.cli.main import main as cli_main
from trl_marl.generation.vllm_client import VLLMServerClient, VLLMServerError
from trl_marl.generation.vllm_protocol import (
    GenerateRequest,
    RequestError,
    decode_weights,
    encode_weights,
    payload_metadata,
)

INFO = {
    "api_version": 1,
    "layout": "per_agent",
    "num_agents": 2,
    "agents": [{"vocab_size": 512, "max_model_len": 64}, {"vocab_size": 512, "max_model_len": 64}],
}


def dead_url() -> str:
    """A localhost URL where nothing listens (a port the OS just handed out and took back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class Scripted:
    """A stand-in server on 127.0.0.1: each path answers from its script, one (status, json, delay) per request
    (the last one repeats); `hits` counts the requests per path."""

    def __init__(self, script: dict[str, list[tuple[int, dict, float]]]):
        self.script, self.hits = script, {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                path = self.path.split("?")[0]
                if self.headers.get("Content-Length"):
                    self.rfile.read(int(self.headers["Content-Length"]))
                n = owner.hits.get(path, 0)
                owner.hits[path] = n + 1
                answers = owner.script.get(path, [(404, {"error": "no"}, 0.0)])
                status, data, delay = answers[min(n, len(answers) - 1)]
                time.sleep(delay)
                body = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    servers = []

    def make(script):
        servers.append(Scripted(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


READY = {"/health": [(200, {"status": "ready"}, 0.0)], "/info": [(200, INFO, 0.0)]}


# ---------------------------------------------------------------------------------------------- a dead server
def test_dead_server_is_a_clear_error_within_the_retry_budget_naming_server_and_agent():
    url = dead_url()
    client = VLLMServerClient(url, wait=False, max_retries=2, backoff_base=0.1, agent_offset=1)
    start = time.monotonic()
    with pytest.raises(VLLMServerError) as err:
        client.generate(1, [[5, 6]], max_tokens=4)
    assert time.monotonic() - start < 5  # 2 backoffs of 0.1 s and 0.2 s, 3 refused connections
    message = str(err.value)
    assert f"vLLM server {url} (agent 2) did not answer POST /generate after 3 attempt(s)" in message
    assert "ConnectionRefusedError" in message and "trl-marl vllm-serve" in message
    assert err.value.url == url and err.value.agent == 1


def test_waiting_for_a_server_that_never_comes_up_stops_at_the_timeout():
    url = dead_url()
    start = time.monotonic()
    with pytest.raises(VLLMServerError, match=rf"vLLM server {url} was not ready within 1.5 s .*ConnectionRefused"):
        VLLMServerClient(url, timeout=1.5)
    assert 1.4 < time.monotonic() - start < 5


# ---------------------------------------------------------------------------------------------- a scripted server
def test_health_wait_rides_out_the_loading_answers(scripted):
    loading = (503, {"status": "loading"}, 0.0)
    server = scripted({**READY, "/health": [loading, loading, (200, {"status": "ready"}, 0.0)]})
    client = VLLMServerClient(server.url, timeout=30)
    assert client.info == INFO and server.hits["/health"] == 3


def test_a_server_that_is_not_trl_marls_is_named_as_such(scripted):
    server = scripted({"/health": [(200, {}, 0.0)], "/info": [(404, {"detail": "Not Found"}, 0.0)]})
    with pytest.raises(VLLMServerError, match="answers /health but has no /info: it is not `trl-marl vllm-serve`"):
        VLLMServerClient(server.url)
    newer = scripted({**READY, "/info": [(200, {**INFO, "api_version": 2}, 0.0)]})
    with pytest.raises(VLLMServerError, match="speaks API version 2, this client 1"):
        VLLMServerClient(newer.url)


def test_a_hung_server_times_out_each_attempt_then_fails(scripted):
    server = scripted({**READY, "/generate": [(200, {"completion_ids": [[1]]}, 30.0)]})
    client = VLLMServerClient(server.url, request_timeout=0.5, max_retries=1, backoff_base=0.1)
    start = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"\(agent 1\) did not answer .* 2 attempt\(s\).*request_timeout=0.5 s"):
        client.generate(0, [[5]])
    assert time.monotonic() - start < 5 and server.hits["/generate"] == 2


def test_server_errors_are_retried_and_refusals_are_not(scripted):
    answer = {"completion_ids": [[7, 8], [9]], "logprobs": None}
    server = scripted(
        {
            **READY,
            "/generate": [(500, {"error": "busy"}, 0.0), (200, answer, 0.0)],
            "/update_weights": [(400, {"error": "agent 1's weights: missing: ['x']"}, 0.0)],
        }
    )
    client = VLLMServerClient(server.url, backoff_base=0.05)
    result = client.generate(0, [[5]], n=2)
    assert result.completion_ids == [[7, 8], [9]] and server.hits["/generate"] == 2
    with pytest.raises(VLLMServerError, match=r"\(agent 2\) refused POST /update_weights: HTTP 400: agent 1's weig"):
        client.push_weights(1, [("x", torch.zeros(2))], step=3)
    assert server.hits["/update_weights"] == 1


def test_a_malformed_answer_is_an_error_not_data(scripted):
    server = scripted({**READY, "/generate": [(200, {"completion_ids": [[1]]}, 0.0)]})
    client = VLLMServerClient(server.url)
    with pytest.raises(VLLMServerError, match="malformed answer: the answer has 1 completions, expected 3"):
        client.generate(0, [[5]], n=3)


def test_bad_settings_fail_in_the_client_before_anything_is_sent(scripted):
    server = scripted(READY)
    client = VLLMServerClient(server.url)
    with pytest.raises(ValueError, match=r"\(agent 1\): generate: top_p must be in \(0, 1\], got 1.5"):
        client.generate(0, [[5]], top_p=1.5)
    with pytest.raises(ValueError, match="must be below the model's vocab_size 512"):
        client.generate(0, [[600]])
    with pytest.raises(ValueError, match="serves agents 1..2, not agent 3"):
        client.generate(2, [[5]])
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        client.push_weights(0, [("x", torch.zeros(1))], step=-1)
    assert "/generate" not in server.hits and "/update_weights" not in server.hits


def test_push_model_to_a_multi_lora_server_needs_an_adapter(scripted):
    server = scripted({**READY, "/info": [(200, {**INFO, "layout": "multi_lora"}, 0.0)]})
    client = VLLMServerClient(server.url)
    with pytest.raises(ValueError, match="multi-LoRA team: it takes the agent's LoRA adapter, and Linear has none"):
        client.push_model(0, torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(base_url="127.0.0.1:8000"), "base_url must be an http"),
        (dict(timeout=0), "timeout and request_timeout must be > 0"),
        (dict(max_retries=-1), "max_retries, backoff_base and backoff_max must be >= 0"),
    ],
)
def test_client_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VLLMServerClient(**{"wait": False, **kwargs})


# ---------------------------------------------------------------------------------------------- the protocol
@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(agent=2), r"agent must be in 0..1 \(the server serves 2\), got 2"),
        (dict(agent=True), "agent must be an integer, got True"),
        (dict(prompt_ids=[[]]), r"prompt_ids\[0\] must be a non-empty list of token ids"),
        (dict(prompt_ids=[[1, 512]]), r"prompt_ids\[0\]\[1\] is 512: token ids must be below .* 512"),
        (dict(prompt_ids=[list(range(64))]), r"prompt_ids\[0\] has 64 tokens: .* shorter than .* max_model_len 64"),
        (dict(n=0), "n must be >= 1, got 0"),
        (dict(temperature=-0.5), r"temperature must be >= 0 \(0: greedy\)"),
        (dict(temperature=float("nan")), "temperature must be a finite number"),
        (dict(top_k=-2), r"top_k must be -1 or 0 \(off\) or >= 1"),
        (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
        (dict(repetition_penalty=0), r"repetition_penalty must be > 0 \(1: off\)"),
        (dict(max_tokens=1.5), "max_tokens must be an integer"),
        (dict(stop_token_ids=[1, -1]), r"stop_token_ids\[1\] must be >= 0"),
        (dict(seed="7"), "seed must be an integer"),
        (dict(logprobs=1), "logprobs must be true or false"),
    ],
)
def test_generate_request_checks_name_the_field_and_the_allowed_values(fields, message):
    request = GenerateRequest(**{"agent": 0, "prompt_ids": [[1, 2]], **fields})
    with pytest.raises(RequestError, match=message):
        request.validate(2, [512, 512], [64, 64])


def test_generate_request_from_json_refuses_unknown_and_missing_fields():
    with pytest.raises(RequestError, match=r"unknown field\(s\) \['temp'\]; a generate request has \['agent'"):
        GenerateRequest.from_json({"agent": 0, "prompt_ids": [[1]], "temp": 1.0})
    with pytest.raises(RequestError, match="missing field 'prompt_ids'"):
        GenerateRequest.from_json({"agent": 0})
    with pytest.raises(RequestError, match="the body must be a JSON object, got list"):
        GenerateRequest.from_json([1])


def test_weight_payload_round_trips_with_its_metadata():
    weights = {"a.weight": torch.randn(3, 2), "b.bias": torch.arange(4, dtype=torch.bfloat16)}
    config = {"peft_type": "LORA", "r": 8, "target_modules": {"v_proj", "q_proj"}}
    payload = encode_weights(weights.items(), "lora", config)
    metadata, entries = payload_metadata(payload)
    assert metadata["kind"] == "lora"
    assert json.loads(metadata["adapter_config"])["target_modules"] == ["q_proj", "v_proj"]
    assert entries == {"a.weight": ("F32", [3, 2]), "b.bias": ("BF16", [4])}
    decoded = decode_weights(payload)
    assert all(torch.equal(decoded[k], v) for k, v in weights.items())
    with pytest.raises(RequestError, match="not a safetensors payload"):
        payload_metadata(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(ValueError, match="adapter_config is required for kind='lora'"):
        encode_weights(weights.items(), "lora")


# ---------------------------------------------------------------------------------------------- the command
def test_vllm_serve_help_lists_its_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["vllm-serve", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--num_agents", "--agent_models", "--enable_lora", "--max_lora_rank", "--host", "--port"):
        assert flag in out
    assert cli_main(["--help"]) == 0 and "vllm-serve" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_agents", "2"], "--model is required"),
        (["--model", "m", "--num_agents", "0"], "--num_agents must be >= 1, got 0"),
        (["--model", "m", "--num_agents", "2", "--agent_models", "a"], "names 1 models for --num_agents 2"),
        (["--agent_models", "a", "b", "--enable_lora"], "--agent_models and --enable_lora exclude each other"),
        (["--model", "m", "--num_agents", "2", "--max_lora_rank", "7"], r"--max_lora_rank must be one of \[1, 8"),
        (["--model", "m", "--num_agents", "2", "--dtype", "fp8"], "--dtype must be one of"),
        (["--model", "m", "--num_agents", "2", "--gpu_memory_utilization", "0.6"], r"0.6 x 2 engine\(s\)"),
    ],
)
def test_vllm_serve_refuses_bad_flags_naming_them(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["vllm-serve", *argv])
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)
