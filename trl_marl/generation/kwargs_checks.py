"""`generation_kwargs` checked when a config is built: what one agent's extra sampling settings would break or lose
later, against the backend in use (transformers' `GenerationConfig`, or vLLM's `SamplingParams`)."""

from __future__ import annotations

import difflib
import functools
import warnings
from typing import Any

__all__ = ["check_generation_kwargs", "generation_config_fields"]

_COUNT_KEYS = ("num_return_sequences", "n")
_HF = "transformers' GenerationConfig"
_VLLM = "vLLM's SamplingParams"


@functools.cache
def generation_config_fields() -> frozenset[str]:
    """The settings of transformers' `GenerationConfig` (what `generation_kwargs` may set without vLLM).
    `GenerationConfig(**kwargs)` stores any other key as well, and `generate` then ignores it."""
    from transformers import GenerationConfig

    return frozenset(k for k in vars(GenerationConfig()) if not k.startswith("_") and k != "transformers_version")


def check_generation_kwargs(kwargs: dict[str, Any], label: str, use_vllm: bool | str, num_generations: int) -> None:
    """Refuse, when the config is built, what one agent's `generation_kwargs` (named `label`) would break or lose
    later: a completion count (`num_return_sequences`, vLLM's `n`: `num_generations` is TRL's name), greedy decoding
    (`do_sample=False`) with `num_generations > 1`, and keys that the backend in use does not take (the keys go to
    transformers' `GenerationConfig`, or with `use_vllm` to vLLM's `SamplingParams`, as in TRL). With
    `use_vllm="auto"` and vLLM installed, the backend is picked when the trainer is built: a key of one backend only
    is a warning; with `use_vllm=True` and no vLLM there is nothing to check the keys against (the trainer refuses to
    build without vLLM). ValueError naming the field, the key and what to do."""
    from trl_marl.generation import vllm_backend

    for key in _COUNT_KEYS:
        if key in kwargs:
            raise ValueError(
                f"{label} sets {key}={kwargs[key]!r}: the completions sampled per prompt are num_generations (TRL's "
                f"name), which the trainer passes to the backend itself; set num_generations={kwargs[key]!r}"
            )
    if kwargs.get("do_sample") is False and num_generations > 1:
        raise ValueError(
            f"{label} sets do_sample=False with num_generations={num_generations}: greedy decoding gives one "
            f"completion {num_generations} times, so every group has no spread and no advantage (transformers refuses "
            "num_return_sequences > 1 without sampling). TRL's GRPO always samples: leave do_sample out (temperature, "
            "top_p and top_k set the randomness), or set num_generations=1 (MAREINFORCE) for greedy rollouts"
        )
    hf = generation_config_fields()
    vllm = vllm_backend.vllm_sampling_fields() if use_vllm else None
    if use_vllm is True:
        if vllm is None:
            return
        allowed, which = vllm, f"which {_VLLM} does not take (use_vllm=True: the keys go there)"
    elif use_vllm == "auto" and vllm is not None:
        allowed, which = hf | vllm, f"which neither {_HF} nor {_VLLM} takes (use_vllm='auto' picks one of them)"
        for key in sorted(set(kwargs) & (hf ^ vllm)):
            owner, other = (_HF, "vLLM") if key in hf else (_VLLM, "transformers")
            warnings.warn(
                f"{label}: {key!r} is a setting of {owner} only: if use_vllm='auto' picks {other} when the trainer is "
                f"built, {'it is ignored' if other == 'transformers' else 'vLLM refuses it when it samples'}; set "
                "use_vllm to the backend it belongs to",
                UserWarning,
                stacklevel=6,
            )
    else:
        where = (
            "use_vllm='auto' samples with transformers here (vLLM is not installed)"
            if use_vllm == "auto"
            else "use_vllm=False: the keys go there"
        )
        allowed, which = hf, f"which {_HF} does not take ({where}; the keys of {_VLLM} need use_vllm=True)"
    unknown = sorted(k for k in kwargs if k not in allowed)
    if unknown:
        named = ", ".join(
            f"{k!r}"
            + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(k, allowed, 1)) else "")
            for k in unknown
        )
        raise ValueError(
            f"{label} sets {unknown}, {which}: {named}. Left in, transformers would ignore them without a word and "
            "vLLM refuse them mid-run"
        )
