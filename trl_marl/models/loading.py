"""Loading a team's agents and tokenizers from ids, paths or objects, and the token-level facts of each agent (EOS ids, completions re-tokenized from text)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from trl_marl.checkpointing.checksums import verify_saved_agent
from trl_marl.data_types.text import UNKNOWN_EOS, CompletionText, valid_text

__all__ = [
    "MODEL_CONFIG_KEYS",
    "loading_kwargs",
    "check_model_source",
    "check_tokenizer_folder",
    "load_agents",
    "load_tokenizers",
    "eos_token_ids",
    "default_eos_token_id",
    "completion_token_ids",
    "ended_with_eos",
]


# Loading options accepted in `model_config` (the reference library's names; TRL's ModelConfig is converted).
MODEL_CONFIG_KEYS = ("dtype", "torch_dtype", "attn_implementation", "trust_remote_code", "revision", "model_kwargs")


def loading_kwargs(model_config: Any | None) -> dict:
    """`from_pretrained` keyword arguments from `model_config` (a dict or TRL's `ModelConfig`)."""
    if model_config is None:
        return {}
    if not isinstance(model_config, dict):  # trl.ModelConfig
        cfg = {
            "dtype": getattr(model_config, "dtype", None),
            "attn_implementation": getattr(model_config, "attn_implementation", None),
            "trust_remote_code": getattr(model_config, "trust_remote_code", False),
            "revision": getattr(model_config, "model_revision", None),
        }
        model_config = {k: v for k, v in cfg.items() if v not in (None, False)}
    unknown = sorted(set(model_config) - set(MODEL_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"model_config has unknown keys {unknown}; allowed keys are {list(MODEL_CONFIG_KEYS)}")
    kwargs = dict(model_config.get("model_kwargs") or {})
    dtype = model_config.get("dtype", model_config.get("torch_dtype"))
    if dtype is not None and dtype != "auto":
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dtype is not None:
        kwargs["dtype"] = dtype
    for key in ("attn_implementation", "trust_remote_code", "revision"):
        if model_config.get(key) is not None:
            kwargs[key] = model_config[key]
    return kwargs


def _name_or_path(model: Any) -> str:
    if isinstance(model, str):
        return model
    return getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__


WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# any one of these makes a folder loadable by AutoTokenizer (a fast tokenizer, sentencepiece, BPE or WordPiece vocab)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
)


def check_model_source(src: str, field: str | None = None) -> None:
    """A model id that can only be a local folder (absolute, `./`, `../`, `~`, or more than one `/`) must exist, and
    an existing folder must be a model: transformers would otherwise report "Repo id must be in the form ...", load an
    adapter folder's base with frozen weights ("optimizer got an empty parameter list"), or fail on missing weights.
    Each case is a `FileNotFoundError` / `ValueError` naming the folder and the fix (and `field`, the setting or
    argument that gave the id, when given: `"reward_model_path: model folder not found: ..."`). A Hub id is left to
    `from_pretrained`."""
    try:
        _check_model_source(src)
    except (FileNotFoundError, ValueError) as err:
        if field is None or type(err) not in (FileNotFoundError, ValueError):  # a subclass keeps its own form
            raise
        raise type(err)(f"{field}: {err}") from None


def _check_model_source(src: str) -> None:
    path = os.path.expanduser(src)
    if os.path.isdir(path):
        _check_model_folder(src, path)
        return
    if os.path.exists(path):
        raise ValueError(
            f"model {src!r} is a file; pass the folder a model was saved to (save_pretrained) or a Hub id"
        )
    if os.path.isabs(src) or src.startswith((".", "~")) or src.count("/") > 1 or "\\" in src:
        raise FileNotFoundError(
            f"model folder not found: {src!r} (no such local folder; check the path -- a Hub id has the form "
            "'namespace/repo_name')"
        )


def _check_model_folder(src: str, path: str) -> None:
    verify_saved_agent(path)  # an agent folder of a saved team: its bytes as written (checksums.json)
    files = set(os.listdir(path))
    if "config.json" not in files and "adapter_config.json" in files:
        import json

        with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as f:
            base = json.load(f).get("base_model_name_or_path") or "its base model"
        raise ValueError(
            f"model {src!r} is a PEFT adapter folder (adapter_config.json), not a model: pass model={base!r} with "
            "peft_config=LoraConfig(...) to train a new adapter, or load this one as a trainable agent object, "
            f"`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base!r}), {src!r}, is_trainable=True)`, "
            "and pass model=[that object, ...] with processing_class="
        )
    if "config.json" not in files:
        raise FileNotFoundError(
            f"model folder {src!r} has no config.json: it is not a saved transformers model (save one with "
            "`model.save_pretrained(folder)`; a trl_marl team folder holds one model per agent_i/ subfolder)"
        )
    if not files & set(WEIGHT_FILES) and not any(f.endswith((".safetensors", ".bin")) for f in files):
        raise FileNotFoundError(
            f"model folder {src!r} has a config.json but no weights (model.safetensors or pytorch_model.bin): the save "
            "was interrupted or the weights were not copied; save the model again with `save_pretrained`"
        )


def check_tokenizer_folder(src: str) -> None:
    """An existing local folder a tokenizer is loaded from must hold tokenizer files (else AutoTokenizer's error is
    "install sentencepiece" or similar, which does not name the folder)."""
    path = os.path.expanduser(src)
    if os.path.isdir(path) and not set(os.listdir(path)) & set(TOKENIZER_FILES):
        raise FileNotFoundError(
            f"tokenizer files missing in {src!r} (none of {', '.join(TOKENIZER_FILES)}): save the tokenizer there with "
            "`tokenizer.save_pretrained(folder)`, or pass processing_class= (one tokenizer, or one per agent)"
        )


def load_agents(
    agent_model: str | None, agents: Sequence[Any] | None, num_agents: int, model_config: Any | None = None
) -> tuple[list[PreTrainedModel], list[str]]:
    """Load the team: `agent_model` (one id -> `num_agents` independent copies) or `agents` (ids or model objects).

    Each id is loaded separately, so homogeneous agents never share parameters.
    """
    kwargs = loading_kwargs(model_config)
    sources = [agent_model] * num_agents if agents is None else list(agents)
    models, names = [], []
    for src in sources:
        if isinstance(src, (str, os.PathLike)):
            check_model_source(str(src))
            models.append(AutoModelForCausalLM.from_pretrained(str(src), **kwargs))
            names.append(str(src))
        elif isinstance(src, nn.Module):
            models.append(src)
            names.append(_name_or_path(src))
        else:
            raise TypeError(f"an agent must be a model id / path or a model object, got {type(src).__name__}")
    if len({id(m) for m in models}) != len(models):
        raise ValueError(
            "the same model object appears twice in agents; pass distinct objects or ids (agents never "
            "share parameters)"
        )
    return models, names


def load_tokenizers(tokenizer: Any, names: Sequence[str], num_agents: int, sources: Sequence[Any]) -> list:
    """One tokenizer per agent: the shared one, the per-agent list, or each agent's own (loaded from its id)."""
    if tokenizer is None:
        toks, cache = [], {}
        for name, src in zip(names, sources):
            if not isinstance(src, (str, os.PathLike)):
                raise ValueError("tokenizer is required when agents are given as model objects")
            if name not in cache:
                check_tokenizer_folder(name)
                cache[name] = AutoTokenizer.from_pretrained(name)
            toks.append(cache[name])
    elif isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != num_agents:
            raise ValueError(f"tokenizer list has {len(tokenizer)} entries but num_agents is {num_agents}")
        toks = list(tokenizer)
    else:
        toks = [tokenizer] * num_agents
    for t in toks:
        if t.pad_token_id is None:
            t.pad_token = t.eos_token
    return toks


def eos_token_ids(model: PreTrainedModel, tokenizer) -> list[int]:
    """Every token id that ends a completion: the generation config's EOS ids and the tokenizer's EOS."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update([source] if isinstance(source, int) else list(source))
    return sorted(ids)


def default_eos_token_id(tokenizer, eos_ids: Sequence[int]) -> int:
    """The EOS id a finished completion is taken to end with when the id it emitted is unknown: the tokenizer's
    `eos_token_id` (what its chat template closes a turn with) when it is one of the model's EOS ids, else the first
    of them."""
    tok = getattr(tokenizer, "eos_token_id", None)
    if tok is not None and (not eos_ids or tok in eos_ids):
        return int(tok)
    if not eos_ids:
        raise ValueError("the agent has no EOS token id (neither its tokenizer nor its generation config has one)")
    return int(eos_ids[0])


def completion_token_ids(
    tokenizer, text: str, eos_ids: Sequence[int], max_new_tokens: int, eos_token: Any = UNKNOWN_EOS
) -> torch.Tensor:
    """The token ids to score for a completion given as text (a comparator's, or one re-read from a record).

    - A `CompletionText` carrying the exact ids of THIS tokenizer: those ids, unchanged.
    - `eos_token` a string (the EOS token the completion ended with): the text's ids, then that EOS's id when it is
      one of `eos_ids`, else the default EOS (`default_eos_token_id`); cut so the whole fits `max_new_tokens`.
    - `eos_token` None: the completion was cut at `max_new_tokens`; its ids, NO EOS appended.
    - unknown (`UNKNOWN_EOS`, a plain text): a finished completion ending with the default EOS, unless its text
      alone fills `max_new_tokens` (then it was cut: no EOS).
    A `CompletionText`'s own `eos_token` is used when `eos_token` is not given. Invalid unicode in the text (a lone
    surrogate, which a tokenizer refuses) is tokenized as U+FFFD (`valid_text`), as round files store it.
    """
    if isinstance(text, CompletionText):
        if text.token_ids is not None and text.tokenizer is tokenizer:
            return torch.as_tensor(text.token_ids, dtype=torch.long).clone()
        if eos_token is UNKNOWN_EOS:
            eos_token = text.eos_token
    ids = tokenizer(valid_text(str(text)), add_special_tokens=False)["input_ids"]
    if eos_token is UNKNOWN_EOS:
        eos_token = None if len(ids) >= max_new_tokens else ""
    if eos_token is None:
        return torch.tensor(ids[:max_new_tokens], dtype=torch.long)
    eos_id = tokenizer.convert_tokens_to_ids(eos_token) if eos_token else None
    if eos_id is None or eos_id not in eos_ids:
        eos_id = default_eos_token_id(tokenizer, eos_ids)
    return torch.tensor([*ids[: max_new_tokens - 1], eos_id], dtype=torch.long)


def ended_with_eos(tokenizer, completion_ids: torch.Tensor, eos_ids: Sequence[int]) -> str | None:
    """The text of the EOS token a generated completion ended with, or None when it has none (cut)."""
    if completion_ids.numel() and int(completion_ids[-1]) in eos_ids:
        return tokenizer.convert_ids_to_tokens(int(completion_ids[-1]))
    return None
