"""API comparator clients against a real local HTTP server (127.0.0.1, an ephemeral port, one thread per request)."""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from trl_marl.plugins.api_clients import (
    ANTHROPIC_VERSION,
    APIClient,
    APIClientConfig,
    APIComparatorError,
    backoff_delay,
    candidate_chunks,
    normalize_format,
    parse_completions,
)

KEY_ENV = "TRL_MARL_TEST_API_KEY"
FAST = {"backoff_base": 0.001, "backoff_max": 0.01, "timeout": 5.0}


class Server:
    """Records every POST (path, lower-cased headers, JSON body) and answers with `respond(request, number)`,
    which returns `(status, body)` or `(status, body, headers)`; `body` is JSON-dumped unless it is a str."""

    def __init__(self):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.respond = lambda request, number: (200, {})
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = {
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": json.loads(raw),
                }
                with server.lock:
                    server.requests.append(request)
                    number = len(server.requests)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    result = server.respond(request, number)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                if callable(result):  # the test writes the raw response itself (slow drip, huge body)
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        result(self)
                    return
                status, body, *rest = result
                payload = (body if isinstance(body, str) else json.dumps(body)).encode()
                try:
                    self.send_response(status)
                    for name, value in (rest[0] if rest else {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def log_message(self, *args):  # keep the test output quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture
def key(monkeypatch, caplog):
    """A unique key in the environment; after the test, it must appear in no log record."""
    secret = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv(KEY_ENV, secret)
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    caplog.set_level(logging.DEBUG)  # every logger, httpx and httpcore included
    yield secret
    assert secret not in caplog.text
    for record in caplog.records:
        assert secret not in record.getMessage()
        assert secret not in repr(record.args)


def client_for(server, path, **settings) -> APIClient:
    return APIClient(APIClientConfig(url=server.base + path, key_env=KEY_ENV, **{**FAST, **settings}))


# --- pure functions ---------------------------------------------------------------------------------------------


def test_formats_and_chunks():
    assert normalize_format("responses") == normalize_format("codex") == "openai_responses"
    with pytest.raises(ValueError, match=r"comparator_kwargs\['format'\] must be one of .*'anthropic'.* got 'claude'"):
        normalize_format("claude")
    assert candidate_chunks("openai", 7, 3) == [3, 3, 1]
    assert candidate_chunks("openai", 6, 3) == [3, 3]
    assert candidate_chunks("openai", 5, None) == [5]
    assert candidate_chunks("generic", 4, 8) == [4]
    assert candidate_chunks("anthropic", 3, None) == [1, 1, 1]
    assert candidate_chunks("codex", 2, None) == [1, 1]
    assert candidate_chunks("openai", 0, 2) == []


def test_backoff_delay():
    assert [backoff_delay(r, 0.5, 3.0) for r in range(4)] == [0.5, 1.0, 2.0, 3.0]
    assert backoff_delay(0, 0.5, 3.0, retry_after="2") == 2.0
    assert backoff_delay(0, 0.5, 3.0, retry_after="60") == 3.0
    assert backoff_delay(1, 0.5, 3.0, retry_after="Wed, 21 Oct 2015 07:28:00 GMT") == 1.0


def test_parse_completions_shapes():
    assert parse_completions("generic", {"completions": ["a", "b"]}) == ["a", "b"]
    assert parse_completions("generic", {"data": {"outputs": [{"text": "x"}]}}, "data.outputs") == ["x"]
    assert parse_completions("generic", {"choices": [{"texts": ["y", "z"]}]}, "choices.0.texts") == ["y", "z"]
    assert parse_completions("generic", {"completion": "one"}, "completion") == ["one"]
    with pytest.raises(ValueError, match=r"no field 'outputs' \(top-level keys: \['completions'\]\)"):
        parse_completions("generic", {"completions": []}, "outputs")
    openai = {"choices": [{"index": 1, "message": {"content": "b"}}, {"index": 0, "message": {"content": "a"}}]}
    assert parse_completions("openai", openai) == ["a", "b"]
    anthropic = {"content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "hi"}]}
    assert parse_completions("anthropic", anthropic) == ["hi"]
    responses = {
        "output": [{"type": "reasoning"}, {"type": "message", "content": [{"type": "output_text", "text": "r"}]}]
    }
    assert parse_completions("responses", responses) == ["r"]
    assert parse_completions("codex", {"output_text": "t", "output": []}) == ["t"]


# --- formats against the server ------------------------------------------------------------------------------------


def test_generic_request_and_chunking(server, key):
    def respond(request, number):
        body = request["body"]
        return 200, {
            "completions": [
                f"{body['prompt']}|{body['num_return_sequences']}|{i}" for i in range(body["num_return_sequences"])
            ]
        }

    server.respond = respond
    items = [{"id": 1, "tags": np.array([1, 2]), "score": np.float32(0.5)}, {"id": 2, "tags": ("a",)}]
    with client_for(
        server,
        "/generate",
        max_n_per_request=2,
        headers={"X-Trace": "abc"},
        extra_body={"stop": ["\n"]},
    ) as client:
        out = client.generate(
            ["p0", "p1"], 3, agent_indices=[0, 1], items=items, max_new_tokens=8, temperature=0.7, top_p=None
        )
    assert out == [["p0|2|0", "p0|2|1", "p0|1|0"], ["p1|2|0", "p1|2|1", "p1|1|0"]]
    assert len(server.requests) == 4
    by_prompt = sorted((r["body"]["prompt"], r["body"]["num_return_sequences"]) for r in server.requests)
    assert by_prompt == [("p0", 1), ("p0", 2), ("p1", 1), ("p1", 2)]
    for request in server.requests:
        assert request["path"] == "/generate"
        assert request["headers"]["authorization"] == f"Bearer {key}"
        assert request["headers"]["x-trace"] == "abc"
        assert request["headers"]["content-type"] == "application/json"
        body = request["body"]
        agent = 0 if body["prompt"] == "p0" else 1
        assert body["agent_idx"] == agent
        assert body["batch_item"] == (
            {"id": 1, "tags": [1, 2], "score": 0.5} if agent == 0 else {"id": 2, "tags": ["a"]}
        )
        assert body["max_new_tokens"] == 8 and body["temperature"] == 0.7 and body["stop"] == ["\n"]
        assert "top_p" not in body and "model" not in body


def test_generic_response_field_and_model(server, key):
    server.respond = lambda request, number: (200, {"data": {"outputs": [{"text": "x"}, {"text": "y"}]}})
    client = client_for(server, "/g", response_field="data.outputs", model="my-model")
    assert client.generate(["p"], 2) == [["x", "y"]]
    assert server.requests[0]["body"]["model"] == "my-model"
    server.respond = lambda request, number: (200, {"data": {}})
    with pytest.raises(APIComparatorError, match=r"/g \(format 'generic'\): the response has no field 'data.outputs'"):
        client.generate(["p"], 2)
    server.respond = lambda request, number: (200, {"data": {"outputs": ["only one"]}})
    with pytest.raises(APIComparatorError, match="returned 1 completion\\(s\\) for a request of 2"):
        client.generate(["p"], 2)


def test_openai_chat_completions_with_n_chunking(server, key):
    def respond(request, number):
        body = request["body"]
        prompt = body["messages"][0]["content"]
        choices = [
            {"index": i, "message": {"role": "assistant", "content": f"{prompt}#{number}.{i}"}}
            for i in range(body["n"])
        ]
        return 200, {"choices": list(reversed(choices))}  # out of order: the client sorts by index

    server.respond = respond
    client = client_for(server, "/v1/chat/completions", format="openai", model="gpt-test", max_n_per_request=3)
    out = client.generate(["hello"], 7, max_new_tokens=16, temperature=1.0, top_p=0.9, top_k=5)
    assert len(out) == 1 and len(out[0]) == 7
    assert sorted(r["body"]["n"] for r in server.requests) == [1, 3, 3]
    # candidates come chunk by chunk, each chunk in index order
    assert [c.split(".")[1] for c in out[0]] == ["0", "1", "2", "0", "1", "2", "0"]
    for request in server.requests:
        body = request["body"]
        assert request["path"] == "/v1/chat/completions"
        assert request["headers"]["authorization"] == f"Bearer {key}"
        assert body["model"] == "gpt-test"
        assert body["messages"] == [{"role": "user", "content": "hello"}]
        assert body["max_tokens"] == 16 and body["temperature"] == 1.0 and body["top_p"] == 0.9
        assert "top_k" not in body


def test_openai_extra_body_can_replace_a_default_field(server, key):
    server.respond = lambda request, number: (200, {"choices": [{"index": 0, "message": {"content": "ok"}}]})
    client = client_for(
        server,
        "/v1/chat/completions",
        format="openai",
        model="o-test",
        extra_body={"max_tokens": None, "max_completion_tokens": 64, "reasoning_effort": "low"},
    )
    assert client.generate(["q"], 1, max_new_tokens=16) == [["ok"]]
    body = server.requests[0]["body"]
    assert "max_tokens" not in body and body["max_completion_tokens"] == 64 and body["reasoning_effort"] == "low"


def test_anthropic_messages_one_request_per_candidate(server, key):
    def respond(request, number):
        return 200, {
            "content": [{"type": "text", "text": f"{request['body']['messages'][0]['content']}-{number}"}],
            "stop_reason": "end_turn",
        }

    server.respond = respond
    client = client_for(server, "/v1/messages", format="anthropic", model="claude-test")
    out = client.generate(["a", "b"], 3, max_new_tokens=32, temperature=0.5, top_k=10)
    assert len(server.requests) == 6
    assert [len(cands) for cands in out] == [3, 3]
    assert all(c.startswith("a-") for c in out[0]) and all(c.startswith("b-") for c in out[1])
    assert len(set(out[0] + out[1])) == 6  # six separate requests
    for request in server.requests:
        headers, body = request["headers"], request["body"]
        assert request["path"] == "/v1/messages"
        assert headers["x-api-key"] == key
        assert headers["anthropic-version"] == ANTHROPIC_VERSION == "2023-06-01"
        assert "authorization" not in headers
        assert body["model"] == "claude-test" and body["max_tokens"] == 32
        assert body["temperature"] == 0.5 and body["top_k"] == 10
        assert "n" not in body and "top_p" not in body


def test_anthropic_needs_max_new_tokens(server, key):
    client = client_for(server, "/v1/messages", format="anthropic", model="claude-test")
    with pytest.raises(ValueError, match="needs max_new_tokens"):
        client.generate(["a"], 1)
    assert server.requests == []


@pytest.mark.parametrize("fmt", ["openai_responses", "responses", "codex"])
def test_openai_responses_one_request_per_candidate(server, key, fmt):
    def respond(request, number):
        text = f"{request['body']['input']}-{number}"
        return 200, {
            "output": [
                {"type": "reasoning", "summary": []},
                {"type": "message", "content": [{"type": "output_text", "text": text}]},
            ]
        }

    server.respond = respond
    client = client_for(server, "/v1/responses", format=fmt, model="gpt-test")
    assert client.config.format == "openai_responses"
    out = client.generate(["x"], 2, max_new_tokens=12, temperature=0.3, top_k=4)
    assert len(server.requests) == 2 and len(set(out[0])) == 2
    for request in server.requests:
        body = request["body"]
        assert request["headers"]["authorization"] == f"Bearer {key}"
        assert body == {"model": "gpt-test", "input": "x", "max_output_tokens": 12, "temperature": 0.3}


def test_requests_are_concurrent_and_bounded(server, key):
    def respond(request, number):
        time.sleep(0.1)
        return 200, {"completions": ["c"]}

    server.respond = respond
    client = client_for(server, "/g", max_concurrency=3)
    started = time.perf_counter()
    assert client.generate([f"p{i}" for i in range(6)], 1) == [["c"]] * 6
    elapsed = time.perf_counter() - started
    assert server.max_in_flight == 3
    assert elapsed < 0.55  # 2 waves of 0.1 s, not 6


# --- retries and errors ------------------------------------------------------------------------------------------


def test_retry_on_503_then_success(server, key, caplog):
    def respond(request, number):
        if number == 1:
            return 503, {"error": "overloaded"}, {"Retry-After": "0"}
        return 200, {"choices": [{"index": 0, "message": {"content": "fine"}}]}

    server.respond = respond
    client = client_for(server, "/v1/chat/completions", format="openai", model="m", max_retries=3)
    assert client.generate(["p"], 1) == [["fine"]]
    assert len(server.requests) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("attempt 1/4 failed (HTTP 503" in w and "retrying" in w for w in warnings)


def test_repeated_500_gives_a_clear_error_without_the_key(server, key, caplog):
    # the server echoes the key in its error body: the client must scrub it
    server.respond = lambda request, number: (500, f"internal error for {request['headers']['authorization']}")
    client = client_for(server, "/v1/chat/completions?api-version=1", format="openai", model="m", max_retries=2)
    with pytest.raises(APIComparatorError) as err:
        client.generate(["p"], 1)
    message = str(err.value)
    assert len(server.requests) == 3
    assert message.startswith(f"POST {server.base}/v1/chat/completions failed after 3 attempt(s): HTTP 500")
    assert "api-version" not in message  # no query string in messages
    assert "Bearer ***" in message
    assert err.value.status_code == 500 and err.value.url == f"{server.base}/v1/chat/completions"
    assert key not in message and key not in repr(err.value)
    assert sum("failed (HTTP 500" in r.getMessage() for r in caplog.records) == 2


def test_client_error_is_not_retried(server, key):
    server.respond = lambda request, number: (401, {"error": {"message": "invalid x-api-key"}})
    client = client_for(server, "/v1/messages", format="anthropic", model="m", max_retries=3)
    with pytest.raises(APIComparatorError, match=rf"HTTP 401 Unauthorized.*check the key in \${KEY_ENV}") as err:
        client.generate(["p"], 1, max_new_tokens=4)
    assert len(server.requests) == 1 and err.value.status_code == 401
    assert key not in str(err.value)


def test_timeout_is_retried(server, key):
    def respond(request, number):
        if number == 1:
            time.sleep(0.5)
        return 200, {"completions": ["late but fine"]}

    server.respond = respond
    client = client_for(server, "/g", timeout=0.15, max_retries=1)
    assert client.generate(["p"], 1) == [["late but fine"]]
    assert len(server.requests) == 2


def test_connection_errors_are_retried_then_reported(key):
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = APIClient(APIClientConfig(url=f"http://127.0.0.1:{port}/g", key_env=KEY_ENV, max_retries=1, **FAST))
    with pytest.raises(
        APIComparatorError, match=rf"POST http://127.0.0.1:{port}/g failed after 2 attempt\(s\): connection error"
    ):
        client.generate(["p"], 1)


def test_non_json_success_body(server, key):
    server.respond = lambda request, number: (200, "<html>proxy page</html>")
    with pytest.raises(APIComparatorError, match="not JSON"):
        client_for(server, "/g").generate(["p"], 1)


# --- keys and configuration ----------------------------------------------------------------------------------------


def test_key_never_in_repr_dict_or_pickle(server, key):
    client = client_for(server, "/v1/messages", format="anthropic", model="m")
    config = client.config
    for text in (
        repr(client),
        repr(config),
        json.dumps(client.to_dict()),
        json.dumps(config.to_dict()),
        str(vars(client)),
    ):
        assert key not in text
    assert key.encode() not in pickle.dumps(client)
    assert KEY_ENV in repr(client) and config.to_dict()["key_env"] == KEY_ENV
    restored = pickle.loads(pickle.dumps(client))
    assert restored.config == config


def test_default_key_env_and_missing_keys(server, monkeypatch, caplog):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    caplog.set_level(logging.WARNING)
    server.respond = lambda request, number: (200, {"choices": [{"index": 0, "message": {"content": "ok"}}]})
    client = APIClient(APIClientConfig(url=server.base + "/v1/chat/completions", format="openai", model="m", **FAST))
    assert client.config.resolved_key_env == "OPENAI_API_KEY"
    assert client.generate(["p"], 1) == [["ok"]]  # a local server without a key: allowed, with a warning
    assert "authorization" not in server.requests[0]["headers"]
    assert "$OPENAI_API_KEY is not set" in caplog.text
    secret = f"sk-default-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    client.generate(["p"], 1)
    assert server.requests[1]["headers"]["authorization"] == f"Bearer {secret}"  # read at request time
    # an explicitly named variable must exist
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=f"'{KEY_ENV}', which is not set"):
        APIClient(APIClientConfig(url=server.base, key_env=KEY_ENV))
    # generic has no default key variable
    assert APIClientConfig(url=server.base).resolved_key_env is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"url": "ftp://x"}, r"comparator_kwargs\['url'\] must be an http"),
        (
            {"format": "openai"},
            r"comparator_kwargs\['model'\] is required when comparator_kwargs\['format'\]='openai'",
        ),
        ({"format": "anthropic", "model": "m", "max_n_per_request": 4}, "always sends one request per candidate"),
        ({"max_n_per_request": 0}, r"comparator_kwargs\['max_n_per_request'\] must be >= 1"),
        ({"headers": {"Authorization": "Bearer sk-123"}}, r"carry a secret \(the header 'Authorization'\)"),
        (
            {"headers": {"X-API-Key": "sk-123"}},
            r"carry a secret.*environment variable named by comparator_kwargs\['key_env'\]",
        ),
        ({"headers": {"X-Auth-Token": "sk-123"}}, "the header 'X-Auth-Token'"),
        ({"headers": {"Cookie": "session=sk-123"}}, "the header 'Cookie'"),
        ({"url": "http://127.0.0.1:1/x?api-key=sk-123"}, "the URL query parameter 'api-key'"),
        ({"url": "http://user:sk-123@127.0.0.1:1/x"}, "user info"),
        ({"extra_body": {"auth": {"api_key": "sk-123"}}}, "the extra_body field 'auth'"),
        ({"key_env": "sk-live-abc123"}, "must be the NAME of an environment variable"),
        ({"timeout": 0}, r"comparator_kwargs\['timeout'\] must be > 0"),
        ({"max_concurrency": 0}, r"comparator_kwargs\['max_concurrency'\] must be >= 1"),
    ],
)
def test_config_validation(kwargs, message):
    kwargs = {"url": "http://127.0.0.1:1/x", **kwargs}
    with pytest.raises(ValueError, match=message) as err:
        APIClientConfig(**kwargs)
    assert "sk-123" not in str(err.value) and "sk-live-abc123" not in str(err.value)


def test_api_comparator_options_from_comparator_kwargs():
    """The `api` comparator's options (`comparator_kwargs`): the client's settings plus `generation_mode`; a literal
    key is refused without being quoted."""
    from trl_marl.plugins.comparator_options import APIComparatorOptions, build_options

    kwargs = {"url": "https://api.example.com/v1/responses", "format": "codex", "model": "m", "timeout": 30.0}
    options = build_options(APIComparatorOptions, "api", {**kwargs, "extra_body": {"store": False}})
    config = options.client_config()
    assert type(config) is APIClientConfig and options.generation_mode == "decentralized"
    assert config.format == "openai_responses" and config.timeout == 30.0 and config.response_field == "completions"
    assert config.resolved_key_env == "OPENAI_API_KEY" and config.max_retries == 3
    with pytest.raises(ValueError, match=r"\['api_key'\] is not an option of the 'api' comparator.*key_env") as err:
        build_options(APIComparatorOptions, "api", {**kwargs, "api_key": "sk-literal"})
    assert "sk-literal" not in str(err.value)


def test_unknown_generation_setting(server, key):
    with pytest.raises(TypeError, match=r"unsupported generation settings \['beam_width'\]"):
        client_for(server, "/g").generate(["p"], 1, beam_width=4)


def test_invalid_unicode_in_a_prompt_is_sent_as_replacement_characters(server, key):
    # old code: UnicodeEncodeError ('utf-8' codec can't encode character '\ud800': surrogates not allowed) in
    # httpx, encoding the JSON body; the comparator's round stopped the run
    server.respond = lambda request, number: (200, '{"completions": ["answer \\ud800", "caf\u00e9"]}')
    with client_for(server, "/generate") as client:
        out = client.generate(["bad \udfff prompt", "café 中文 😀"], 2, items=[{"text": "x\ud800"}, {"text": "é"}])
    bodies = sorted((r["body"]["prompt"], r["body"]["batch_item"]["text"]) for r in server.requests)
    assert bodies == [("bad \ufffd prompt", "x\ufffd"), ("café 中文 😀", "é")]
    assert out == [["answer \ud800", "café"]] * 2  # the API's answer is returned as it is; whatever writes it fixes it


# --- limits: total deadline, response size, redaction before truncation, no key in frame locals -------------------


def _headers(handler, status=200, length=None, reason=None):
    handler.send_response(status, reason)
    handler.send_header("Content-Type", "application/json")
    if length is not None:
        handler.send_header("Content-Length", str(length))
    handler.end_headers()
    handler.wfile.flush()


def test_slow_drip_is_cut_at_the_total_deadline(server, key):
    """A server that drips one byte every 0.1 s (each read well inside httpx's per-read timeout) is cut off at the
    wall-clock deadline of the request, not after the whole body."""
    body = json.dumps({"completions": ["x" * 200]}).encode()

    def drip(handler):
        _headers(handler, length=len(body))
        for b in body:
            handler.wfile.write(bytes([b]))
            handler.wfile.flush()
            time.sleep(0.1)

    server.respond = lambda request, number: drip
    client = client_for(server, "/g", timeout=0.8, max_retries=0)
    start = time.monotonic()
    with pytest.raises(APIComparatorError, match=r"timed out after 0.8 s"):
        client.generate(["p"], 1)
    assert time.monotonic() - start < 3.0  # the whole body would take 21 s


def test_stalled_body_is_cut_at_the_deadline(server, key):
    """Headers, then silence: the watchdog ends the blocked read at the deadline."""

    def stall(handler):
        _headers(handler, length=100)
        handler.wfile.write(b'{"completions"')
        handler.wfile.flush()
        time.sleep(6)

    server.respond = lambda request, number: stall
    client = client_for(server, "/g", timeout=0.8, max_retries=0)
    start = time.monotonic()
    with pytest.raises(APIComparatorError, match="timed out"):
        client.generate(["p"], 1)
    assert time.monotonic() - start < 3.0


@pytest.mark.parametrize("declared", [True, False])
def test_huge_body_is_refused_while_streaming(server, key, declared):
    """A 50 MB body (with or without Content-Length) is refused once past the cap, without reading it all, and
    without retrying."""
    sent = []

    def huge(handler):
        total = 50 * 1024 * 1024
        _headers(handler, length=total if declared else None)
        chunk = b"x" * 65536
        for _ in range(total // len(chunk)):
            handler.wfile.write(chunk)
            sent.append(len(chunk))

    server.respond = lambda request, number: huge
    client = client_for(server, "/g", max_response_bytes=100_000, max_retries=2)
    with pytest.raises(APIComparatorError, match="larger than max_response_bytes=100000"):
        client.generate(["p"], 1)
    assert len(server.requests) == 1
    time.sleep(0.2)
    assert sum(sent) < 20 * 1024 * 1024  # the client hung up long before the end


def test_401_echoing_the_header_is_redacted_before_truncation(server, key):
    """The server echoes the Authorization header so that the key straddles the 300-character cut: redacting after
    cutting would leave a fragment of it; redacting first leaves none."""
    prefix = "e" * 280

    def respond(request, number):
        return 401, prefix + request["headers"]["authorization"] + " was rejected"

    server.respond = respond
    client = client_for(server, "/v1/chat/completions", format="openai", model="m")
    with pytest.raises(APIComparatorError) as err:
        client.generate(["p"], 1)
    message = str(err.value)
    assert "Bearer ***" in message
    for k in range(8, len(key)):  # no fragment of the key (8+ characters) survives
        assert key[:k] not in message and key[-k:] not in message


def test_key_is_not_in_any_frame_local(server, key):
    """Traceback-with-locals tools print every local of every frame: none may hold the key."""
    import traceback

    server.respond = lambda request, number: (400, {"error": "bad"})
    client = client_for(server, "/v1/chat/completions", format="openai", model="m")
    try:
        client.generate(["p"], 1)
    except APIComparatorError as exc:
        tb = traceback.TracebackException.from_exception(exc, capture_locals=True)
        frames = exc.__traceback__
    else:
        raise AssertionError("expected a failure")
    ours = [f for f in tb.stack if "trl_marl" in f.filename]  # (this test's own frame holds the fixture's key)
    assert len(ours) >= 3
    text = "".join(f"{f.filename}:{f.lineno} {f.locals}" for f in ours)
    assert "<redacted>" in text  # the key object is there, redacted
    assert key not in text
    while frames is not None:
        if "trl_marl" in frames.tb_frame.f_code.co_filename:
            for name, value in frames.tb_frame.f_locals.items():
                assert key not in repr(value), name
        frames = frames.tb_next


def test_config_limits_validation():
    with pytest.raises(ValueError, match=r"comparator_kwargs\['max_response_bytes'\] must be >= 1"):
        APIClientConfig(url="http://127.0.0.1:1/x", max_response_bytes=0)
