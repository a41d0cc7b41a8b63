"""What `trl-marl vllm-serve` and its client say to each other over HTTP (no vLLM needed).

Endpoints (JSON in and out, except the weight payload):

| endpoint | body | answer |
|---|---|---|
| `GET /health` | - | 200 `{"status": "ready"}`; 503 `{"status": "loading"}` while the engines start |
| `GET /info` | - | the team: layout, models, limits, each agent's weight version, library versions |
| `POST /generate` | a `GenerateRequest` as JSON | `{"completion_ids": [[int]], "logprobs": [[float or null]] or null}` |
| `POST /update_weights?agent=I[&step=S]` | a safetensors payload (`encode_weights`) | the agent's new `{"version", "step"}` |
| `POST /close` | - | 200, then the server stops |

Agents are 0-based indices in requests (`prompts_per_agent[i]`) and 1-based in messages ("agent 2"), as elsewhere in
trl_marl. Errors answer `{"error": message}`: 400 for a bad request (the message names the field and its allowed
values), 404 / 405 for an unknown endpoint or method, 503 while loading, 500 when an engine fails.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

__all__ = [
    "API_VERSION",
    "ENDPOINTS",
    "LAYOUTS",
    "PAYLOAD_KINDS",
    "GenerateRequest",
    "GenerateResult",
    "RequestError",
    "decode_weights",
    "encode_weights",
    "payload_metadata",
    "prompt_seeds",
]

API_VERSION = 1
ENDPOINTS = ("GET /health", "GET /info", "POST /generate", "POST /update_weights", "POST /close")
# "per_agent": one engine per agent, full weights pushed; "multi_lora": one engine with the shared base, every agent a
# LoRA adapter, adapters pushed
LAYOUTS = ("per_agent", "multi_lora")
# the weight payload's kinds (its safetensors metadata `kind`): full checkpoint-named weights, or one PEFT LoRA adapter
PAYLOAD_KINDS = ("full", "lora")


class RequestError(ValueError):
    """A request the server refuses (HTTP 400); the message names the field and its allowed values."""


def _int(name: str, value: Any, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise RequestError(f"{name} must be >= {low}, got {value}")
    return value


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _token_ids(name: str, value: Any, vocab_size: int | None, allow_empty: bool) -> list[int]:
    if not isinstance(value, list | tuple) or (not value and not allow_empty):
        raise RequestError(f"{name} must be a {'' if allow_empty else 'non-empty '}list of token ids, got {value!r}")
    ids = [_int(f"{name}[{k}]", t, 0) for k, t in enumerate(value)]
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        k = max(range(len(ids)), key=ids.__getitem__)
        raise RequestError(f"{name}[{k}] is {ids[k]}: token ids must be below the model's vocab_size {vocab_size}")
    return ids


@dataclass
class GenerateRequest:
    """One `POST /generate`: `n` completions for each prompt of one agent (rows prompt-major in the answer).

    Sampling settings are vLLM's `SamplingParams` (temperature 0 decodes greedily; `top_k` 0 or -1 and `min_p` 0 turn
    those filters off). `seed` seeds this request's own random streams (`prompt_seeds`: every completion gets a seed
    of its own): the same request on the same weights samples the same tokens whatever else the server runs. `logprobs=True` also returns each sampled token's log-prob
    (temperature applied, as the trainer scores it). The completion is not cut at a stop token: vLLM stops after it.
    """

    agent: int
    prompt_ids: list[list[int]]
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False

    @classmethod
    def from_json(cls, data: Any) -> GenerateRequest:
        """Read a request body; unknown or missing fields are refused by name."""
        if not isinstance(data, dict):
            raise RequestError(f"the body must be a JSON object, got {type(data).__name__}")
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise RequestError(f"unknown field(s) {unknown}; a generate request has {allowed}")
        for required in ("agent", "prompt_ids"):
            if required not in data:
                raise RequestError(f"missing field {required!r}")
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def validate(
        self,
        num_agents: int,
        vocab_sizes: Sequence[int] | None = None,
        max_model_lens: Sequence[int] | None = None,
    ) -> GenerateRequest:
        """Check every field (types, ranges, token ids below the agent's vocab size, prompts shorter than its
        `max_model_len`; both per agent, from `GET /info`); return the request with its fields normalized."""
        agent = _int("agent", self.agent, 0)
        if agent >= num_agents:
            raise RequestError(f"agent must be in 0..{num_agents - 1} (the server serves {num_agents}), got {agent}")
        vocab_size = vocab_sizes[agent] if vocab_sizes is not None else None
        max_model_len = max_model_lens[agent] if max_model_lens is not None else None
        if not isinstance(self.prompt_ids, list | tuple):
            raise RequestError(f"prompt_ids must be a list of token id lists, got {self.prompt_ids!r}")
        prompts = [_token_ids(f"prompt_ids[{r}]", p, vocab_size, False) for r, p in enumerate(self.prompt_ids)]
        if max_model_len is not None:
            for r, p in enumerate(prompts):
                if len(p) >= max_model_len:
                    raise RequestError(
                        f"prompt_ids[{r}] has {len(p)} tokens: a prompt must be shorter than the server's "
                        f"max_model_len {max_model_len} (prompt + completion); cut the prompts or start the server "
                        "with a larger --max_model_len"
                    )
        n, max_tokens, top_k = _int("n", self.n, 1), _int("max_tokens", self.max_tokens, 1), _int("top_k", self.top_k)
        if top_k < -1:
            raise RequestError(f"top_k must be -1 or 0 (off) or >= 1, got {top_k}")
        temperature, top_p = _number("temperature", self.temperature), _number("top_p", self.top_p)
        min_p, penalty = _number("min_p", self.min_p), _number("repetition_penalty", self.repetition_penalty)
        if temperature < 0:
            raise RequestError(f"temperature must be >= 0 (0: greedy), got {temperature}")
        if not 0 < top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {top_p}")
        if not 0 <= min_p <= 1:
            raise RequestError(f"min_p must be in [0, 1], got {min_p}")
        if penalty <= 0:
            raise RequestError(f"repetition_penalty must be > 0 (1: off), got {penalty}")
        stops = _token_ids("stop_token_ids", self.stop_token_ids, vocab_size, True)
        seed = None if self.seed is None else _int("seed", self.seed)
        if not isinstance(self.logprobs, bool):
            raise RequestError(f"logprobs must be true or false, got {self.logprobs!r}")
        return GenerateRequest(
            agent, prompts, n, temperature, top_p, top_k, min_p, penalty, max_tokens, stops, seed, self.logprobs
        )


@dataclass
class GenerateResult:
    """The answer to a `GenerateRequest`: `n` rows per prompt, prompt-major. `logprobs[r][k]` is the log-prob of
    `completion_ids[r][k]` (None where vLLM did not score it); `logprobs` is None unless the request asked for them."""

    completion_ids: list[list[int]]
    logprobs: list[list[float | None]] | None = None

    @classmethod
    def from_json(cls, data: Any, expected_rows: int) -> GenerateResult:
        """Read an answer, checking its shape (a malformed answer is a server bug, not something to train on)."""
        if not isinstance(data, dict) or not isinstance(data.get("completion_ids"), list):
            raise ValueError(f"the answer has no completion_ids list: {str(data)[:200]}")
        ids, logprobs = data["completion_ids"], data.get("logprobs")
        if len(ids) != expected_rows:
            raise ValueError(f"the answer has {len(ids)} completions, expected {expected_rows}")
        if logprobs is not None and [len(r) for r in logprobs] != [len(r) for r in ids]:
            raise ValueError("the answer's logprobs do not line up with its completion_ids")
        return cls(ids, logprobs)


def prompt_seeds(seed: int | None, num_prompts: int, n: int) -> list[int | None]:
    """The seed of each prompt of a request sampled `n` times per prompt: `seed + r * n` for prompt r. vLLM gives the
    j-th sample of a prompt seed + j, so every completion of the request has its own seed, and two equal prompts in
    one request are sampled independently. None (unseeded) stays None."""
    return [None if seed is None else seed + r * n for r in range(num_prompts)]


# ------------------------------------------------------------------------------------------------ weight payload
def encode_weights(
    tensors: Iterable[tuple[str, torch.Tensor]], kind: str, adapter_config: Mapping | None = None
) -> bytes:
    """Serialize named tensors as one safetensors blob (the body of `POST /update_weights`).

    `kind` "full": checkpoint-named weights of a whole agent (`trl_marl.generation.vllm_backend.iter_vllm_weights`);
    "lora": one PEFT LoRA adapter (`peft.get_peft_model_state_dict` names) with its `adapter_config` (the PEFT config
    as a dict), carried in the blob's metadata. Each tensor is copied to CPU as it is drawn, so an iterator whose
    tensors are valid only until the next item (a merged PEFT model) can be passed directly.
    """
    from safetensors.torch import save

    if kind not in PAYLOAD_KINDS:
        raise ValueError(f"kind must be one of {list(PAYLOAD_KINDS)}, got {kind!r}")
    if (kind == "lora") != (adapter_config is not None):
        raise ValueError("adapter_config is required for kind='lora' and only for it")
    state = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in tensors}
    metadata = {"format": "pt", "kind": kind}
    if adapter_config is not None:
        metadata["adapter_config"] = json.dumps(_jsonable(dict(adapter_config)), sort_keys=True)
    return save(state, metadata=metadata)


def _jsonable(value: Any) -> Any:
    """A PEFT config dict as JSON: sets become sorted lists, as `PeftConfig.save_pretrained` writes them."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def payload_metadata(payload: bytes) -> tuple[dict[str, str], dict[str, tuple[str, list[int]]]]:
    """Read a payload's header without loading a tensor: `(metadata, {name: (dtype, shape)})`.

    The safetensors layout: an 8-byte little-endian header length, then the JSON header."""
    if len(payload) < 8:
        raise RequestError("the body is not a safetensors payload (fewer than 8 bytes)")
    (size,) = struct.unpack("<Q", payload[:8])
    try:
        header = json.loads(payload[8 : 8 + size])
        assert isinstance(header, dict)
    except (ValueError, AssertionError):
        raise RequestError("the body is not a safetensors payload (its header is not a JSON object)") from None
    metadata = header.pop("__metadata__", None) or {}
    try:
        entries = {name: (str(e["dtype"]), [int(d) for d in e["shape"]]) for name, e in header.items()}
    except (TypeError, KeyError, ValueError):
        raise RequestError("the body is not a safetensors payload (a tensor entry lacks dtype or shape)") from None
    return metadata, entries


def decode_weights(payload: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a payload written by `encode_weights`."""
    from safetensors.torch import load

    try:
        return load(payload)
    except Exception as exc:  # safetensors raises its own error types for a corrupt blob
        raise RequestError(f"the body is not a valid safetensors payload: {type(exc).__name__}: {exc}") from None
