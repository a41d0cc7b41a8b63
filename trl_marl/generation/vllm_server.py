"""`trl-marl vllm-serve`: a vLLM server for a whole team, in its own process (`vllm_mode="server"`).

    trl-marl vllm-serve --model Qwen/Qwen2.5-0.5B-Instruct --num_agents 2 --port 8000
    trl-marl vllm-serve --model base --num_agents 3 --enable_lora --max_lora_rank 16
    trl-marl vllm-serve --num_agents 2 --agent_models coder reviewer

Layouts, chosen at start:

- **one engine per agent** (`per_agent`, the default): engine i holds agent i's full weights (from `--agent_models`, or
  `--model` for every agent); a push replaces them in place, as the colocated engines do
  (`trl_marl.generation.vllm_backend`);
- **one multi-LoRA engine** (`multi_lora`, `--enable_lora`): ONE engine holds the frozen shared base (`--model`) and
  serves agent i as a LoRA request; a push sends only agent i's adapter, served under a new LoRA request id (vLLM
  caches adapters by id). Until its first push an agent samples from the bare base.

The HTTP API is `trl_marl.generation.vllm_protocol`; the trainer side is `trl_marl.generation.vllm_client`. The
server binds first and answers `/health` with 503 while the engines load, so a client can tell "loading" from "not
running". The engines run in this process (vLLM's `external_launcher` executor, as in colocate mode) behind one lock:
vLLM's `LLM` is not thread-safe, so requests are served one at a time while `/health` and `/info` always answer.

Built on the standard library's `ThreadingHTTPServer` (no web framework to install beside vLLM). The arguments are a
dataclass parsed by TRL's `TrlParser`, as TRL's `trl vllm-serve` parses its `ScriptArguments` (every field is a flag
and a `--config` YAML key).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import traceback
from argparse import RawDescriptionHelpFormatter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import torch

from trl_marl.generation.vllm_backend import VLLM_LORA_RANKS, check_vllm_available, refresh_tied_lm_head
from trl_marl.generation.vllm_protocol import (
    API_VERSION,
    ENDPOINTS,
    GenerateRequest,
    RequestError,
    decode_weights,
    payload_metadata,
    prompt_seeds,
)

logger = logging.getLogger(__name__)

__all__ = ["VLLMServeArguments", "TeamEngines", "main", "serve"]

DTYPES = ("auto", "float32", "float16", "bfloat16")
_MAX_JSON_BYTES = 64 * 2**20
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors' names of the dtypes a weight push may carry


@dataclass
class VLLMServeArguments:
    """Arguments of `trl-marl vllm-serve` (TRL's `trl vllm-serve` names where they exist).

    Args:
        model: the model (id or folder) every agent starts from; the shared base with `enable_lora`.
        num_agents: agents served.
        agent_models: one model per agent (a heterogeneous team); not with `enable_lora`.
        enable_lora: one engine with the shared base, every agent a LoRA adapter pushed by the trainer.
        max_lora_rank: the largest adapter rank the LoRA engine accepts (one of vLLM's ranks).
        host / port: where to listen (port 0: a free port, printed at start).
        dtype: the engines' dtype (`auto`: the model config's).
        max_model_len: engine context length (prompt + completion); None: the model config's.
        gpu_memory_utilization: device memory fraction per engine; None: 0.9 shared over the engines. On vLLM's CPU
            build it is a fraction of CPU memory unless `VLLM_CPU_KVCACHE_SPACE` (GiB) is set.
        seed: every engine's seed (as the colocated engines: the same for every agent); requests may bring their own.
    """

    model: str | None = field(default=None, metadata={"help": "Model id or folder every agent starts from."})
    num_agents: int | None = field(
        default=None, metadata={"help": "Agents served (unset: one per --agent_models entry)."}
    )
    agent_models: list[str] | None = field(default=None, metadata={"help": "One model per agent (not with LoRA)."})
    enable_lora: bool = field(default=False, metadata={"help": "One multi-LoRA engine on the shared base `model`."})
    max_lora_rank: int = field(default=16, metadata={"help": f"Largest adapter rank: one of {list(VLLM_LORA_RANKS)}."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on."})
    port: int = field(default=8000, metadata={"help": "Port to listen on (0: a free port, printed at start)."})
    dtype: str = field(default="auto", metadata={"help": f"Engine dtype: one of {list(DTYPES)}."})
    max_model_len: int | None = field(default=None, metadata={"help": "Context length (prompt + completion)."})
    gpu_memory_utilization: float | None = field(
        default=None, metadata={"help": "Memory fraction per engine (unset: 0.9 shared over the engines)."}
    )
    seed: int = field(default=0, metadata={"help": "Engine seed."})

    def __post_init__(self) -> None:
        if self.agent_models is not None:
            if self.enable_lora:
                raise ValueError(
                    "--agent_models and --enable_lora exclude each other: a LoRA team shares one base (--model)"
                )
            if self.num_agents is None:
                self.num_agents = len(self.agent_models)
            if len(self.agent_models) != self.num_agents:
                raise ValueError(
                    f"--agent_models names {len(self.agent_models)} models for --num_agents {self.num_agents}"
                )
        elif self.model is None:
            raise ValueError("--model is required (or --agent_models, one model per agent)")
        if self.num_agents is None or self.num_agents < 1:
            raise ValueError(f"--num_agents must be >= 1, got {self.num_agents}")
        if self.max_lora_rank not in VLLM_LORA_RANKS:
            raise ValueError(f"--max_lora_rank must be one of {list(VLLM_LORA_RANKS)}, got {self.max_lora_rank}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(
                f"--max_model_len must be >= 2 (a prompt token and a completion token), got {self.max_model_len}"
            )
        engines = 1 if self.enable_lora else self.num_agents
        if self.gpu_memory_utilization is None:
            self.gpu_memory_utilization = round(0.9 / engines, 4)
        elif not 0 < self.gpu_memory_utilization * engines <= 1:
            raise ValueError(
                f"--gpu_memory_utilization is per engine: {self.gpu_memory_utilization} x {engines} engine(s) must "
                "be in (0, 1]"
            )

    @property
    def layout(self) -> str:
        return "multi_lora" if self.enable_lora else "per_agent"

    @property
    def models(self) -> list[str]:
        """The model each agent starts from."""
        return list(self.agent_models) if self.agent_models is not None else [self.model] * self.num_agents


class EngineFailure(RuntimeError):
    """An engine failed while serving a request (HTTP 500)."""


def _single_process_env() -> None:
    """What vLLM's `external_launcher` executor needs to run the engines in this process: a one-process group on a
    port the OS hands out."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


class TeamEngines:
    """The engines of a served team, each agent's weight version, and the requests they serve (no HTTP here)."""

    def __init__(self, args: VLLMServeArguments):
        self.args = args
        self.num_agents = int(args.num_agents)
        self.lora = args.enable_lora
        self._lock = threading.Lock()  # vLLM's LLM is not thread-safe: one request at a time
        self._scratch = tempfile.mkdtemp(prefix="trl_marl_vllm_server-")
        self.versions = [0] * self.num_agents  # pushes received per agent
        self.steps: list[int | None] = [None] * self.num_agents  # the trainer's step of each agent's weights
        self.failed: list[str | None] = [None] * self.num_agents  # why an agent's engine is unusable
        self._lora_requests: list[Any] = [None] * self.num_agents
        self._lora_ids = 0
        self._expected: dict[int, tuple[dict, dict]] = {}
        _single_process_env()
        models = args.models
        self.engines = [self._start(models[0], lora=True)] if self.lora else [self._start(m) for m in models]
        self.vocab_sizes = [self._engine(i).llm_engine.model_config.get_vocab_size() for i in range(self.num_agents)]
        self.max_model_lens = [self._engine(i).llm_engine.model_config.max_model_len for i in range(self.num_agents)]
        self.dtype = str(self.engines[0].llm_engine.model_config.dtype).removeprefix("torch.")

    def _start(self, model: str, lora: bool = False):
        from vllm import LLM

        args = self.args
        kwargs: dict[str, Any] = dict(
            model=model,
            dtype=args.dtype,
            skip_tokenizer_init=True,  # prompts come in as token ids, completions go back as token ids
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            distributed_executor_backend="external_launcher",  # in this process: weights are pushed in place
            seed=args.seed,
            max_num_batched_tokens=4096,  # the colocated engines' setting: the same batches, the same numerics
            logprobs_mode="processed_logprobs",  # temperature applied, as the trainer scores
            enforce_eager=not torch.cuda.is_available(),  # vLLM's CPU compilation is slower to start, not faster
        )
        if lora:
            kwargs.update(enable_lora=True, max_loras=self.num_agents, max_lora_rank=args.max_lora_rank)
        return LLM(**kwargs)

    def _engine(self, agent: int):
        return self.engines[0 if self.lora else agent]

    def info(self) -> dict[str, Any]:
        """The team as `GET /info` reports it."""
        from importlib.metadata import PackageNotFoundError, version

        from trl_marl import __version__
        from trl_marl.generation.vllm_backend import installed_vllm_version

        def v(dist: str) -> str | None:
            try:
                return version(dist)
            except PackageNotFoundError:
                return None

        args = self.args
        return {
            "api_version": API_VERSION,
            "status": "ready",
            "layout": args.layout,
            "num_agents": self.num_agents,
            "model": args.model,
            "dtype": self.dtype,
            "max_lora_rank": args.max_lora_rank if self.lora else None,
            "seed": args.seed,
            "agents": [
                {
                    "agent": i,
                    "model": args.models[i],
                    "version": self.versions[i],
                    "step": self.steps[i],
                    "failed": self.failed[i],
                    "vocab_size": self.vocab_sizes[i],
                    "max_model_len": self.max_model_lens[i],
                }
                for i in range(self.num_agents)
            ],
            "versions": {
                "trl_marl": __version__,
                "vllm": installed_vllm_version(),
                "torch": torch.__version__,
                "transformers": v("transformers"),
            },
        }

    def _check_usable(self, agent: int) -> None:
        if self.failed[agent] is not None:
            raise EngineFailure(
                f"agent {agent + 1}'s engine failed ({self.failed[agent]}) and its weights are undefined: restart "
                "the server and push the weights again"
            )

    # ------------------------------------------------------------------ generation
    def generate(self, body: Any) -> dict[str, Any]:
        """Serve one `GenerateRequest` (JSON body); returns the `GenerateResult` as JSON."""
        req = GenerateRequest.from_json(body).validate(self.num_agents, self.vocab_sizes, self.max_model_lens)
        if not req.prompt_ids:
            return {"completion_ids": [], "logprobs": [] if req.logprobs else None}
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=req.n,
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=req.top_k,
                min_p=req.min_p,
                repetition_penalty=req.repetition_penalty,
                max_tokens=req.max_tokens,
                stop_token_ids=req.stop_token_ids,
                seed=seed,
                logprobs=0 if req.logprobs else None,  # 0: the sampled token's log-prob only
            )
            for seed in prompt_seeds(req.seed, len(req.prompt_ids), req.n)
        ]
        prompts = [{"prompt_token_ids": p} for p in req.prompt_ids]
        with self._lock:
            self._check_usable(req.agent)
            extra = {"lora_request": self._lora_requests[req.agent]} if self.lora else {}
            results = self._engine(req.agent).generate(prompts, params, use_tqdm=False, **extra)
        ids, logprobs = [], []
        for res in results:
            for sample in res.outputs:
                tokens = list(sample.token_ids)
                ids.append(tokens)
                if req.logprobs:
                    entries = sample.logprobs or [{}] * len(tokens)
                    logprobs.append([float(e[t].logprob) if t in e else None for t, e in zip(tokens, entries)])
        return {"completion_ids": ids, "logprobs": logprobs if req.logprobs else None}

    # ------------------------------------------------------------------ weight updates
    def update_weights(self, agent: int, step: int | None, payload: bytes) -> dict[str, Any]:
        """Apply one `POST /update_weights` payload to `agent`; returns its new version and step."""
        metadata, entries = payload_metadata(payload)
        kind, expected = metadata.get("kind"), "lora" if self.lora else "full"
        if kind != expected:
            what = {"full": "full weights", "lora": "LoRA adapters"}
            raise RequestError(
                f"this server serves a {self.args.layout} team and takes {what[expected]} (payload kind "
                f"{expected!r}), got kind {kind!r}"
                + ("; push only the agent's adapter" if self.lora else "; start it with --enable_lora for adapters")
            )
        if self.lora:
            config = self._check_adapter(agent, metadata, entries)
        else:
            names = self._check_full(agent, entries)
            tensors = decode_weights(payload)
        with self._lock:
            self._check_usable(agent)
            if self.lora:
                self._load_adapter(agent, config, payload)
            else:
                self._reload(agent, [(name, tensors[name]) for name in names])
            self.versions[agent] += 1
            self.steps[agent] = step
            return {"agent": agent, "version": self.versions[agent], "step": step}

    def _expected_weights(self, agent: int) -> tuple[dict, dict]:
        """(required, tied duplicates): checkpoint name -> shape of agent's model, read from a meta-device copy of
        its transformers model (no weights loaded)."""
        if agent not in self._expected:
            from transformers import AutoConfig, AutoModelForCausalLM

            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.args.models[agent]))
            required = {n: list(p.shape) for n, p in model.named_parameters()}
            every = {n: list(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
            self._expected[agent] = required, {n: s for n, s in every.items() if n not in required}
        return self._expected[agent]

    def _check_full(self, agent: int, entries: dict[str, tuple[str, list[int]]]) -> list[str]:
        """Refuse a payload that would leave the engine half-loaded (vLLM's in-place reload cannot be undone: a wrong
        name or shape breaks the engine for good); return the names to load (tied duplicates dropped)."""
        required, tied = self._expected_weights(agent)
        unknown = sorted(set(entries) - set(required) - set(tied))
        missing = sorted(set(required) - set(entries))
        who = f"agent {agent + 1}'s weights ({self.args.models[agent]})"
        if unknown or missing:
            raise RequestError(
                f"{who}: a push carries every weight of the model under its checkpoint name; "
                + (f"unknown: {unknown[:5]}{' ...' if len(unknown) > 5 else ''} " if unknown else "")
                + (f"missing: {missing[:5]}{' ...' if len(missing) > 5 else ''}" if missing else "")
            )
        for name, (dtype, shape) in entries.items():
            want = required.get(name, tied.get(name))
            if shape != want:
                raise RequestError(f"{who}: {name} has shape {shape}, the model's is {want}")
            if dtype not in _FLOAT_DTYPES:
                raise RequestError(f"{who}: {name} has dtype {dtype}; weights must be one of {list(_FLOAT_DTYPES)}")
        return sorted(required)

    def _reload(self, agent: int, weights: list) -> None:
        """Load checked full weights into the agent's engine (under the lock)."""
        engine = self._engine(agent)
        try:
            # the worker's in-place reload, as the colocated engines push (vllm_backend.VLLMTeamGeneration)
            engine.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
            )
            engine.apply_model(refresh_tied_lm_head)
            engine.reset_prefix_cache()
        except Exception as exc:
            self.failed[agent] = f"{type(exc).__name__}: {exc}"
            raise EngineFailure(f"agent {agent + 1}'s weight update failed: {self.failed[agent]}") from exc

    def _check_adapter(self, agent: int, metadata: dict, entries: dict) -> dict:
        try:
            config = json.loads(metadata.get("adapter_config", ""))
            assert isinstance(config, dict)
        except (ValueError, AssertionError):
            raise RequestError(
                "a LoRA payload carries its PEFT config as JSON in the metadata key 'adapter_config'"
            ) from None
        who = f"agent {agent + 1}'s adapter"
        if config.get("peft_type") != "LORA":
            raise RequestError(f"{who}: peft_type must be 'LORA', got {config.get('peft_type')!r}")
        rank = config.get("r")
        if not isinstance(rank, int) or not 1 <= rank <= self.args.max_lora_rank:
            raise RequestError(
                f"{who}: rank r={rank!r} must be in 1..{self.args.max_lora_rank} (the server's --max_lora_rank)"
            )
        other = sorted(n for n in entries if ".lora_" not in n)
        if not entries or other:
            raise RequestError(f"{who}: vLLM serves LoRA matrices only (lora_A / lora_B), got {other[:5] or 'none'}")
        return config

    def _load_adapter(self, agent: int, config: dict, payload: bytes) -> None:
        """Serve the adapter under a new LoRA request id (under the lock); the agent's previous adapter is evicted,
        and kept if vLLM refuses the new one."""
        from vllm.lora.request import LoRARequest

        self._lora_ids += 1
        name = f"agent_{agent + 1}-v{self.versions[agent] + 1}"
        folder = os.path.join(self._scratch, name)
        os.makedirs(folder)
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            json.dump(config, f)
        with open(os.path.join(folder, "adapter_model.safetensors"), "wb") as f:
            f.write(payload)  # the payload is a PEFT adapter file as it is
        engine = self._engine(agent).llm_engine
        new, old = LoRARequest(name, self._lora_ids, folder), self._lora_requests[agent]
        if old is not None:
            engine.remove_lora(old.lora_int_id)  # first: max_loras holds one adapter per agent
        try:
            engine.add_lora(new)  # loads now, so a bad adapter fails this push, not a later generate
        except Exception as exc:
            if old is not None:
                engine.add_lora(old)
            shutil.rmtree(folder, ignore_errors=True)
            raise RequestError(f"vLLM refused agent {agent + 1}'s adapter: {type(exc).__name__}: {exc}") from None
        self._lora_requests[agent] = new
        if old is not None:
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def close(self) -> None:
        """Remove the adapters' scratch folder and drop the engines."""
        shutil.rmtree(self._scratch, ignore_errors=True)
        self.engines = []


# ---------------------------------------------------------------------------------------------------------- HTTP
class _TeamHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    team: TeamEngines | None = None  # None while the engines load
    closing: threading.Event


class _Handler(BaseHTTPRequestHandler):
    server: _TeamHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client's connection is reused across requests

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's signature)
        logger.debug("%s " + format, self.client_address[0], *args)

    def _reply(self, status: int, data: dict[str, Any]) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status >= 400:  # part of the request may be unread: do not parse it as the next one
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _body(self, limit: int | None) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise RequestError("the request needs a Content-Length header")
        if limit is not None and int(length) > limit:
            raise RequestError(f"the body is {length} bytes, more than the {limit} a JSON request may have")
        return self.rfile.read(int(length))

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        routes = {"/health": "GET", "/info": "GET", "/generate": "POST", "/update_weights": "POST", "/close": "POST"}
        try:
            if url.path not in routes:
                return self._reply(404, {"error": f"no endpoint {url.path!r}; endpoints: {', '.join(ENDPOINTS)}"})
            if routes[url.path] != method:
                return self._reply(405, {"error": f"{url.path} takes {routes[url.path]}, not {method}"})
            if url.path in ("/generate", "/update_weights"):
                body = self._body(_MAX_JSON_BYTES if url.path == "/generate" else None)
            team = self.server.team
            if team is None:
                return self._reply(503, {"status": "loading", "error": "the engines are still loading"})
            if url.path == "/health":
                return self._reply(200, {"status": "ready"})
            if url.path == "/info":
                return self._reply(200, team.info())
            if url.path == "/close":
                self._reply(200, {"status": "closing"})
                self.server.closing.set()
                return None
            if url.path == "/generate":
                try:
                    request = json.loads(body)
                except ValueError as exc:
                    raise RequestError(f"the body is not JSON: {exc}") from None
                return self._reply(200, team.generate(request))
            agent, step = _update_query(url.query, team.num_agents)
            return self._reply(200, team.update_weights(agent, step, body))
        except RequestError as exc:
            self._reply(400, {"error": str(exc)})
        except Exception as exc:  # an engine failure: say what, keep serving
            logger.error("%s %s failed:\n%s", method, url.path, traceback.format_exc())
            self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})


def _update_query(query: str, num_agents: int) -> tuple[int, int | None]:
    """`agent` (required) and `step` (optional) of `POST /update_weights?agent=I&step=S`."""
    params = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(params) - {"agent", "step"})
    if unknown:
        raise RequestError(f"unknown query parameter(s) {unknown}; /update_weights takes agent and step")
    values = {}
    for name in ("agent", "step"):
        raw = params.get(name, [None])[-1]
        if raw is None:
            continue
        if not raw.isdigit():
            raise RequestError(f"{name} must be a non-negative integer, got {raw!r}")
        values[name] = int(raw)
    if "agent" not in values:
        raise RequestError("/update_weights needs ?agent=I (0-based)")
    if values["agent"] >= num_agents:
        raise RequestError(
            f"agent must be in 0..{num_agents - 1} (the server serves {num_agents}), got {values['agent']}"
        )
    return values["agent"], values.get("step")


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM stops the server as Ctrl-C does, while the engines load too."""
    raise KeyboardInterrupt


def serve(args: VLLMServeArguments) -> int:
    """Listen, load the engines, serve until `POST /close`, SIGTERM or Ctrl-C; returns the exit status."""
    try:
        check_vllm_available()
    except ImportError as exc:
        raise SystemExit(f"trl-marl vllm-serve: {exc}") from None
    try:
        httpd = _TeamHTTPServer((args.host, args.port), _Handler)
    except OSError as exc:
        raise SystemExit(f"trl-marl vllm-serve: cannot listen on {args.host}:{args.port}: {exc}") from None
    httpd.closing = threading.Event()
    host, port = httpd.server_address[:2]
    url = f"http://{host}:{port}"
    what = (
        f"one multi-LoRA engine on {args.model}"
        if args.enable_lora
        else f"one engine per agent ({', '.join(dict.fromkeys(args.models))})"
    )
    print(f"trl-marl vllm-serve: listening on {url} ({args.num_agents} agents, {what}); loading", flush=True)
    thread = threading.Thread(target=httpd.serve_forever, name="vllm-serve-http", daemon=True)
    thread.start()
    team = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        team = TeamEngines(args)
        httpd.team = team
        print(f"trl-marl vllm-serve: ready on {url} ({', '.join(ENDPOINTS)})", flush=True)
        httpd.closing.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        httpd.shutdown()
        httpd.server_close()
        if team is not None:
            team.close()
    print(f"trl-marl vllm-serve: closed {url}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`trl-marl vllm-serve ...`: parse the flags (`--help` lists them) and serve."""
    from trl import TrlParser

    parser = TrlParser(
        VLLMServeArguments,
        prog="trl-marl vllm-serve",
        description="\n\n".join(__doc__.split("\n\n")[:2]),
        formatter_class=RawDescriptionHelpFormatter,
    )
    try:
        (args,) = parser.parse_args_and_config(argv)
    except ValueError as exc:  # VLLMServeArguments.__post_init__
        parser.error(str(exc))
    return serve(args)
