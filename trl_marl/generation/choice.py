"""`use_vllm="auto"`: pick the faster generation backend for the device, the model and the completion length, and
say why.

The rule, from the measured figures (`benchmarks/README.md`, "vLLM against HF `generate`"; 2 agents, 8 prompts x 4
samples per step; generation CPU time, HF / vLLM):

| device | team | backend | measured |
|---|---|---|---|
| vLLM not installed, or `parallel_training="mp"` | any | transformers | - |
| CUDA | any | vLLM | what vLLM is built for (paged attention, CUDA graphs, batched sampling) |
| CPU | head_dim < 32 | transformers | vLLM's CPU attention refuses it |
| CPU | a shared-base LoRA team served by one multi-LoRA engine (`vllm_enable_lora`) | transformers | vLLM's CPU LoRA ops: 0.52x of per-agent engines, which are ~0.84x of HF at this size |
| CPU | `max_completion_length` >= 128 | vLLM | hidden 512: 1.67x; hidden 128: 1.04x (the whole step 1.24x / 1.14x) |
| CPU | shorter completions | transformers | hidden 512 at 16 tokens: vLLM 0.91x; hidden 128: 0.83-0.85x (measured before the shared prefill) |

(Measured 2026-12-03 at load average about 1, `benchmarks/vllm_throughput.py`. Earlier runs put hidden 512 at 16
tokens at 1.36-1.45x, before transformers' engine prefilled each prompt once for its G samples
(`trl_marl.generation.hf._shared_prefill`): a short completion's call is mostly prefill, so that moved the crossover.)

Why (a py-spy profile of each backend, `benchmarks/vllm_profile.py`, docs/vllm.md "Where the time goes"): vLLM's CPU
engine adds ~3.5 ms of per-step bookkeeping (scheduler, input preparation, output processing) whatever the model, so
it loses while the forward is small and wins once its faster forward (oneDNN GEMMs, paged attention) saves more; one
multi-LoRA engine spends most of its time gathering every token's adapter weights in vLLM's CPU LoRA ops.

The rule looks at the smallest head of the team and its longest completions (every agent gets an engine). It only
chooses between transformers' `generate` and colocated engines: server mode is chosen explicitly (`use_vllm=True,
vllm_mode="server"`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CPU_MIN_COMPLETION_LENGTH", "BackendChoice", "choose_backend", "parse_use_vllm"]

# On CPU, vLLM wins from this many new tokens on, at both measured sizes (hidden 512: 1.67x at 128 tokens, 0.91x at
# 16; hidden 128: 1.04x at 128 tokens, 0.83-0.85x at 16)
CPU_MIN_COMPLETION_LENGTH = 128
# vLLM's CPU attention backend refuses smaller heads
CPU_MIN_HEAD_DIM = 32


@dataclass(frozen=True)
class BackendChoice:
    """The backend `use_vllm="auto"` picked (`use_vllm`: colocated vLLM engines, else transformers' `generate`)
    and why, in one sentence."""

    use_vllm: bool
    reason: str


def _head_dim(config: Any) -> int:
    head_dim = getattr(config, "head_dim", None)
    return int(head_dim) if head_dim else config.hidden_size // config.num_attention_heads


def choose_backend(
    args: Any, model_configs: Sequence[Any], device_type: str, vllm_version: str | None
) -> BackendChoice:
    """Apply the module's rule.

    Args:
        args: the trainer config (`max_completion_length`, `parallel_training`, `share_base_model`,
            `vllm_enable_lora`).
        model_configs: each agent's transformers config (`hidden_size`, `num_attention_heads`, `head_dim`).
        device_type: the training device's type (`"cuda"`, `"cpu"`, ...).
        vllm_version: the installed, supported vLLM's version; None when vLLM cannot be used.
    """
    if vllm_version is None:
        return BackendChoice(False, "vLLM is not installed (or not a version TRL 1.16 supports)")
    if args.parallel_training == "mp":
        return BackendChoice(False, "parallel_training='mp' places agents on explicit devices, which vLLM does not")
    if device_type == "cuda":
        return BackendChoice(True, f"a CUDA device and vLLM {vllm_version}: vLLM is built for GPUs")
    if device_type != "cpu":
        return BackendChoice(False, f"vLLM has no engine for the {device_type!r} device here")
    head_dim = min(_head_dim(c) for c in model_configs)
    if head_dim < CPU_MIN_HEAD_DIM:
        return BackendChoice(False, f"head_dim {head_dim} < {CPU_MIN_HEAD_DIM}, which vLLM's CPU attention refuses")
    if args.share_base_model and args.vllm_enable_lora:
        return BackendChoice(
            False,
            "a shared-base LoRA team on CPU: vLLM's CPU LoRA ops made one multi-LoRA engine 1.9x slower than per-agent "
            "engines (vllm_enable_lora=False and use_vllm=True give those)",
        )
    lengths = args.max_completion_length  # one value, or one per agent (the MAGRPO family)
    tokens = max(lengths) if isinstance(lengths, (list, tuple)) else lengths
    if tokens >= CPU_MIN_COMPLETION_LENGTH:
        return BackendChoice(
            True,
            f"CPU and {tokens} new tokens: vLLM generated 1.67x faster at hidden 512 and 1.04x at hidden 128 with 128 "
            "tokens",
        )
    return BackendChoice(
        False,
        f"CPU and {tokens} < {CPU_MIN_COMPLETION_LENGTH} new tokens: transformers' generate prefills each prompt once "
        "for its samples and vLLM's per-step scheduling costs more than it saves (vLLM 0.91x at hidden 512, "
        "0.83-0.85x at hidden 128, with 16 tokens)",
    )


def parse_use_vllm(value: str) -> bool | str:
    """`--use_vllm` on the command line: a boolean as transformers reads one (`true`, `false`, `yes`, `1`, ...) or
    `auto`."""
    if str(value).lower() == "auto":
        return "auto"
    from transformers.hf_argparser import string_to_bool

    return string_to_bool(value)
