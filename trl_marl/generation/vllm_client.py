"""The trainer's side of `trl-marl vllm-serve`: one `VLLMServerClient` per server (no vLLM needed here).

    client = VLLMServerClient(host="127.0.0.1", port=8000, timeout=240)   # waits until the server is ready
    client.push_model(0, agent_model, step=3)                             # full weights, or only the adapter
    result = client.generate(0, [[1, 2, 3]], n=4, max_tokens=64, stop_token_ids=[2], seed=7, logprobs=True)

Fields as TRL's `VLLMClient` and `GRPOConfig` name them: `base_url` (wins over `host` + `port`), `host`, `port`
(`vllm_server_base_url`, `vllm_server_host`, `vllm_server_port`), and `timeout` (`vllm_server_timeout`: how long to
wait for the server at start).

**It never waits forever.** Every request has a deadline (`request_timeout`, default `timeout`); a connection error,
a timeout or an HTTP 5xx (503 while the server loads) is retried `max_retries` times after `min(backoff_max,
backoff_base * 2**r)` seconds (as `trl_marl.plugins.api_clients` retries), then raises `VLLMServerError` naming the
server and the agent. A refused request (HTTP 4xx: the message names the field) raises at once. Retrying is safe:
a generate request with a `seed` samples the same tokens again, and a push replaces the same weights.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import torch
from torch import nn

from trl_marl.generation.engine import GenerationUnavailable
from trl_marl.generation.vllm_protocol import (
    API_VERSION,
    GenerateRequest,
    GenerateResult,
    RequestError,
    encode_weights,
)

logger = logging.getLogger(__name__)

__all__ = ["VLLMServerClient", "VLLMServerError"]

_HINT = (
    "is `trl-marl vllm-serve` running there? Start it with `trl-marl vllm-serve --model MODEL --num_agents N "
    "--port PORT`, or point vllm_server_base_url / vllm_server_host / vllm_server_port at it"
)


class VLLMServerError(GenerationUnavailable):
    """A vLLM server did not answer, or refused a request. `url` is the server's, `agent` the 0-based team index
    the request was for (None: a request about the whole server), `status` the HTTP status when one came back."""

    def __init__(self, message: str, *, url: str, agent: int | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.url, self.agent, self.status = url, agent, status


def _root_cause(exc: BaseException) -> str:
    """The innermost exception of a transport error (e.g. `ConnectionRefusedError: [Errno 111] ...`)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return f"{type(exc).__name__}: {exc}"


class _NoGather:
    """`iter_vllm_weights`'s `dist` for an unsharded model: nothing to gather."""

    @staticmethod
    def gather_params(params: list) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class VLLMServerClient:
    """The client of one `trl-marl vllm-serve` server.

    Args:
        base_url: the server's URL (`http://host:port`); wins over `host` and `port`.
        host, port: the server's address when `base_url` is None (TRL's defaults).
        timeout: seconds to wait for the server to be ready at construction (`vllm_server_timeout`).
        request_timeout: seconds one request may take (default: `timeout`).
        max_retries: retries of a request that failed with a connection error, a timeout or an HTTP 5xx.
        backoff_base, backoff_max: the first retry's delay in seconds (doubled each retry) and the cap on a delay.
        agent_offset: the team index of the server's first agent (one server per agent: that agent's index). Methods
            take team indices; the server is sent `agent - agent_offset`.
        wait: wait for the server at construction (False: call `wait_until_ready` later).
    """

    def __init__(
        self,
        base_url: str | None = None,
        host: str = "0.0.0.0",
        port: int = 8000,
        timeout: float = 240.0,
        *,
        request_timeout: float | None = None,
        max_retries: int = 2,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        agent_offset: int = 0,
        wait: bool = True,
    ) -> None:
        if base_url is None:
            base_url = f"http://{host}:{port}"
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000, got {base_url!r}")
        if timeout <= 0 or (request_timeout is not None and request_timeout <= 0):
            raise ValueError(f"timeout and request_timeout must be > 0 seconds, got {timeout}, {request_timeout}")
        if max_retries < 0 or backoff_base < 0 or backoff_max < 0:
            raise ValueError("max_retries, backoff_base and backoff_max must be >= 0")
        if agent_offset < 0:
            raise ValueError(f"agent_offset must be >= 0, got {agent_offset}")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.request_timeout = float(request_timeout if request_timeout is not None else timeout)
        self.max_retries, self.backoff_base, self.backoff_max = int(max_retries), backoff_base, backoff_max
        self.agent_offset = int(agent_offset)
        self._http = httpx.Client(timeout=self.request_timeout)
        self.info: dict[str, Any] | None = None  # `GET /info`, read once the server is ready
        if wait:
            self.wait_until_ready()

    def __repr__(self) -> str:
        return f"VLLMServerClient({self.base_url!r}, agent_offset={self.agent_offset})"

    def __enter__(self) -> VLLMServerClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close this client's connections (the server keeps running)."""
        self._http.close()

    # ------------------------------------------------------------------ requests
    def _who(self, agent: int | None) -> str:
        return f"vLLM server {self.base_url}" + (f" (agent {agent + 1})" if agent is not None else "")

    def _request(self, method: str, path: str, agent: int | None = None, **kwargs: Any) -> Any:
        """One request with retries; returns the JSON answer."""
        attempts, start = self.max_retries + 1, time.monotonic()
        failure, status = "", None
        for attempt in range(attempts):
            try:
                response = self._http.request(method, self.base_url + path, **kwargs)
            except httpx.TimeoutException as exc:
                failure, status = (
                    f"no answer within request_timeout={self.request_timeout} s ({_root_cause(exc)})",
                    None,
                )
            except httpx.TransportError as exc:
                failure, status = _root_cause(exc), None
            else:
                status = response.status_code
                if status == 200:
                    try:
                        return response.json()
                    except ValueError:
                        raise VLLMServerError(
                            f"{self._who(agent)} answered {method} {path} with a body that is not JSON: "
                            f"{response.text[:200]!r}",
                            url=self.base_url,
                            agent=agent,
                            status=status,
                        ) from None
                try:
                    message = response.json().get("error", response.text)
                except ValueError:
                    message = response.text[:500]
                if status < 500:
                    raise VLLMServerError(
                        f"{self._who(agent)} refused {method} {path}: HTTP {status}: {message}",
                        url=self.base_url,
                        agent=agent,
                        status=status,
                    )
                failure = f"HTTP {status}: {message}"
            if attempt + 1 < attempts:
                delay = min(self.backoff_max, self.backoff_base * 2.0**attempt)
                logger.warning(
                    "%s: %s %s attempt %d/%d failed (%s); retrying in %.1f s",
                    self._who(agent),
                    method,
                    path,
                    attempt + 1,
                    attempts,
                    failure,
                    delay,
                )
                time.sleep(delay)
        raise VLLMServerError(
            f"{self._who(agent)} did not answer {method} {path} after {attempts} attempt(s) over "
            f"{time.monotonic() - start:.1f} s: {failure}; {_HINT}",
            url=self.base_url,
            agent=agent,
            status=status,
        )

    def wait_until_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """Poll `GET /health` until the server is ready (it answers 503 while its engines load), at most `timeout`
        seconds (default: the client's); then read and return `GET /info`."""
        timeout = self.timeout if timeout is None else timeout
        deadline, last = time.monotonic() + timeout, "no attempt"
        while True:
            try:
                response = self._http.get(self.base_url + "/health", timeout=min(self.request_timeout, 10.0))
                if response.status_code == 200:
                    break
                last = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.TransportError as exc:  # timeouts included
                last = _root_cause(exc)
            if time.monotonic() >= deadline:
                raise VLLMServerError(
                    f"vLLM server {self.base_url} was not ready within {timeout} s (last: {last}); {_HINT}, or raise "
                    "vllm_server_timeout if its engines take longer to load",
                    url=self.base_url,
                )
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        try:
            info = self.server_info()
        except VLLMServerError as exc:
            if exc.status != 404:
                raise
            raise VLLMServerError(
                f"{self.base_url} answers /health but has no /info: it is not `trl-marl vllm-serve` (TRL's `trl "
                "vllm-serve` and `vllm serve` serve one model, without a team's weight pushes); start `trl-marl "
                "vllm-serve --model MODEL --num_agents N` there",
                url=self.base_url,
                status=404,
            ) from None
        if info.get("api_version") != API_VERSION:
            raise VLLMServerError(
                f"vLLM server {self.base_url} speaks API version {info.get('api_version')}, this client "
                f"{API_VERSION}: run the same trl_marl version on both sides",
                url=self.base_url,
            )
        self.info = info
        return info

    def server_info(self) -> dict[str, Any]:
        """`GET /info`: the layout, each agent's model, vocab size, context length and weight version, versions."""
        return self._request("GET", "/info")

    def _local(self, agent: int) -> int:
        """The server's index of team agent `agent`, checked against what the server serves."""
        local = agent - self.agent_offset
        served = self.info["num_agents"] if self.info else None
        if local < 0 or (served is not None and local >= served):
            last = self.agent_offset + (served or 1) - 1
            raise ValueError(
                f"{self._who(None)} serves agents {self.agent_offset + 1}..{last + 1}, not agent {agent + 1}"
            )
        return local

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        agent: int,
        prompt_ids: Sequence[Sequence[int]],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        max_tokens: int = 16,
        stop_token_ids: Sequence[int] = (),
        seed: int | None = None,
        logprobs: bool = False,
    ) -> GenerateResult:
        """`n` completions of each prompt (token ids) by agent `agent` (a team index); rows prompt-major.

        The request is checked here first (the same checks as the server's, `GenerateRequest.validate`): a bad
        setting fails before anything is sent, naming the field."""
        local = self._local(agent)
        request = GenerateRequest(
            agent=local,
            prompt_ids=[list(p) for p in prompt_ids],
            n=n,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            max_tokens=max_tokens,
            stop_token_ids=list(stop_token_ids),
            seed=seed,
            logprobs=logprobs,
        )
        info = self.info or {}
        agents = info.get("agents")
        try:
            request = request.validate(
                info.get("num_agents", local + 1),
                [a["vocab_size"] for a in agents] if agents else None,
                [a["max_model_len"] for a in agents] if agents else None,
            )
        except RequestError as exc:
            raise ValueError(f"{self._who(agent)}: generate: {exc}") from None
        data = self._request("POST", "/generate", agent, json=request.to_json())
        try:
            return GenerateResult.from_json(data, len(request.prompt_ids) * request.n)
        except ValueError as exc:
            raise VLLMServerError(
                f"{self._who(agent)}: malformed answer: {exc}", url=self.base_url, agent=agent
            ) from None

    # ------------------------------------------------------------------ weights
    def push_weights(
        self, agent: int, weights: Iterable[tuple[str, torch.Tensor]], *, step: int | None = None
    ) -> dict[str, Any]:
        """Replace agent `agent`'s full weights (a `per_agent` server): every weight of the model under its
        checkpoint name (`vllm_backend.iter_vllm_weights` yields them). `step` (the trainer's `global_step`) is
        recorded with the agent's new version (`GET /info`). Returns `{"agent", "version", "step"}`."""
        return self._push(agent, encode_weights(weights, "full"), step)

    def push_adapter(
        self,
        agent: int,
        adapter_weights: Mapping[str, torch.Tensor],
        adapter_config: Mapping[str, Any],
        *,
        step: int | None = None,
    ) -> dict[str, Any]:
        """Replace agent `agent`'s LoRA adapter (a `multi_lora` server): its PEFT state dict
        (`peft.get_peft_model_state_dict`) and PEFT config as a dict. Returns `{"agent", "version", "step"}`."""
        return self._push(agent, encode_weights(adapter_weights.items(), "lora", adapter_config), step)

    def push_model(self, agent: int, model: nn.Module, *, step: int | None = None, dist: Any = None) -> dict[str, Any]:
        """Push agent `agent`'s current policy as the server's layout wants it: only the adapter on a `multi_lora`
        server (a shared-base team's `AdapterAgent`, or a PEFT model's active adapter), else the full weights (a
        PEFT model's adapter merged into its base). `dist`: TRL's `DistributedBackend` to gather ZeRO-3 shards first
        (None: an unsharded model)."""
        from trl_marl.generation.vllm_backend import iter_vllm_weights

        dist = dist or _NoGather()
        if self.info is None:
            self.wait_until_ready()
        if self.info["layout"] == "multi_lora":
            return self.push_adapter(agent, *_adapter_of(model, dist, self._who(agent)), step=step)
        source, adapter = _merge_source(model)
        return self.push_weights(agent, iter_vllm_weights(source, dist, adapter), step=step)

    def gather_model(self, agent: int, model: nn.Module, *, dist: Any) -> None:
        """Take part in the gathers `push_model` makes for `model`, sending nothing: a ZeRO-3 / FSDP2 process whose
        push another process sends (every process must join a gather)."""
        from trl_marl.generation.vllm_backend import iter_vllm_weights

        if self.info is None:
            self.wait_until_ready()
        if self.info["layout"] == "multi_lora":
            _adapter_of(model, dist, self._who(agent))
            return
        source, adapter = _merge_source(model)
        for _ in iter_vllm_weights(source, dist, adapter):
            pass

    def _push(self, agent: int, payload: bytes, step: int | None) -> dict[str, Any]:
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"step must be a non-negative integer or None, got {step!r}")
        params = {"agent": self._local(agent)} | ({"step": step} if step is not None else {})
        headers = {"Content-Type": "application/octet-stream"}
        return self._request("POST", "/update_weights", agent, params=params, content=payload, headers=headers)

    def close_server(self) -> None:
        """Ask the server to stop (`POST /close`); no retry."""
        with contextlib.suppress(httpx.TransportError):
            self._http.post(self.base_url + "/close")


def _merge_source(model: nn.Module) -> tuple[nn.Module, str | None]:
    """(the model whose weights a full push walks, the adapter merged into them): a shared-base team's `AdapterAgent`
    merges its own adapter only."""
    shared = getattr(model, "shared", None)
    return (shared, model.adapter) if shared is not None else (model, None)


def _adapter_of(model: nn.Module, dist: Any, who: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(PEFT state dict, PEFT config dict) of an `AdapterAgent` or of a PEFT model's active adapter."""
    shared = getattr(model, "shared", None)
    peft_model, name = (
        (shared, model.adapter) if shared is not None else (model, getattr(model, "active_adapter", None))
    )
    if not hasattr(peft_model, "peft_config") or name not in peft_model.peft_config:
        raise ValueError(
            f"{who} serves a multi-LoRA team: it takes the agent's LoRA adapter, and {type(model).__name__} has none "
            "(push a PEFT model, or start a per-agent server without --enable_lora for full weights)"
        )
    from peft import get_peft_model_state_dict

    with dist.gather_params(list(model.parameters())):
        state = get_peft_model_state_dict(peft_model, adapter_name=name)
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}, peft_model.peft_config[name].to_dict()
