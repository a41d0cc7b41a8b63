"""TRL's argument names on every trainer, with the earlier names as deprecated aliases.

A TRL user writes `GRPOTrainer(model, reward_funcs, args=..., train_dataset=..., processing_class=...,
peft_config=...)`. Every trl_marl trainer takes the same: `model` (an id / path / model object for a homogeneous
team, or a list with one per agent), `reward_funcs` (one team reward, or a list summed with `args.reward_weights`),
`processing_class` (one tokenizer, or one per agent), positionally in TRL's order
`(model, reward_funcs, args, train_dataset, eval_dataset, processing_class)`. The earlier names `agent_model`,
`agents`, `reward_func` and `tokenizer` still work, with a `FutureWarning`; giving a name and its alias together is
an error. `args.model_init_kwargs` (TRL's config field) joins the loading options of `model_config`.

`accept_trl_names` wraps a trainer's `__init__`; only the outermost call translates (a subclass's `__init__`
calling `super().__init__(agent_model=...)` internally is not the user's doing and does not warn).
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

from trl_marl.utils.deprecation import warn_deprecated

__all__ = ["TRL_POSITIONAL", "DEPRECATED_KWARGS", "accept_trl_names", "translate_trl_names"]

# TRL's positional order (GRPOTrainer / DPOTrainer): model, reward_funcs, args, train_dataset, eval_dataset,
# processing_class
TRL_POSITIONAL = ("model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class")
# earlier name -> TRL's name
DEPRECATED_KWARGS = {
    "agent_model": "model",
    "agents": "model",
    "reward_func": "reward_funcs",
    "tokenizer": "processing_class",
}

_RESOLVED = "_trl_marl_names_resolved"


def translate_trl_names(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Map a user's call (TRL's positional order and names, or the deprecated names) to the internal keywords
    (`agent_model` / `agents`, `reward_func`, `tokenizer`, `model_config`)."""
    if len(args) > len(TRL_POSITIONAL):
        raise TypeError(
            f"trainers take at most {len(TRL_POSITIONAL)} positional arguments ({', '.join(TRL_POSITIONAL)}); "
            f"got {len(args)}"
        )
    kwargs = dict(kwargs)
    for name, value in zip(TRL_POSITIONAL, args):
        if name in kwargs:
            raise TypeError(f"got multiple values for argument {name!r}")
        kwargs[name] = value
    for old, new in DEPRECATED_KWARGS.items():
        if old in kwargs and kwargs[old] is not None:
            if kwargs.get(new) is not None:
                raise TypeError(f"pass {new}= (TRL's name) or its deprecated alias {old}=, not both")
            warn_deprecated(f"`{old}=` is deprecated; use `{new}=` (TRL's name)", stacklevel=4)
    model = kwargs.pop("model", None)
    if model is not None:
        if isinstance(model, (list, tuple)):
            kwargs["agents"] = list(model)
        elif isinstance(model, (str, os.PathLike)) or hasattr(model, "parameters"):
            kwargs["agent_model"] = model
        else:
            raise TypeError(
                f"model must be a model id / path, a model object, or a list of them (one per agent); "
                f"got {type(model).__name__}"
            )
    reward_funcs = kwargs.pop("reward_funcs", None)
    if reward_funcs is not None:
        if isinstance(reward_funcs, (list, tuple)):
            from trl_marl.rewards import weighted_sum

            config = kwargs.get("args")
            weights = getattr(config, "reward_weights", None)
            reward_funcs = (
                reward_funcs[0]
                if len(reward_funcs) == 1 and weights is None
                else weighted_sum(list(reward_funcs), weights)
            )
        kwargs["reward_func"] = reward_funcs
    processing_class = kwargs.pop("processing_class", None)
    if processing_class is not None:
        kwargs["tokenizer"] = processing_class
    init_kwargs = getattr(kwargs.get("args"), "model_init_kwargs", None)
    if init_kwargs:
        kwargs["model_config"] = _merge_model_init_kwargs(kwargs.get("model_config"), init_kwargs)
    return kwargs


def _merge_model_init_kwargs(model_config: Any, init_kwargs: dict[str, Any]) -> dict[str, Any]:
    """`model_config` (dict or TRL `ModelConfig`) plus TRL's `model_init_kwargs` (`from_pretrained` keywords)."""
    from trl_marl.models.loading import MODEL_CONFIG_KEYS

    if model_config is not None and not isinstance(model_config, dict):  # trl.ModelConfig
        model_config = {
            k: v
            for k, v in {
                "dtype": getattr(model_config, "dtype", None),
                "attn_implementation": getattr(model_config, "attn_implementation", None),
                "revision": getattr(model_config, "model_revision", None),
            }.items()
            if v is not None
        }
    merged = dict(model_config or {})
    extra = dict(merged.get("model_kwargs") or {})
    for key, value in init_kwargs.items():
        if key in MODEL_CONFIG_KEYS and key != "model_kwargs":
            if key in merged and merged[key] != value:
                raise ValueError(f"{key} is {merged[key]!r} in model_config but {value!r} in args.model_init_kwargs")
            merged[key] = value
        else:
            extra[key] = value
    if extra:
        merged["model_kwargs"] = extra
    return merged


def accept_trl_names(init):
    """Wrap a trainer `__init__` so that the outermost call accepts TRL's names and positional order."""
    if getattr(init, "_accepts_trl_names", False):
        return init

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        if self.__dict__.get(_RESOLVED):
            return init(self, *args, **kwargs)
        self.__dict__[_RESOLVED] = True
        try:
            return init(self, **translate_trl_names(args, kwargs))
        except BaseException:
            self.__dict__.pop(_RESOLVED, None)
            raise

    wrapper._accepts_trl_names = True
    wrapper.__signature__ = _trl_signature(init)
    return wrapper


def _trl_signature(init) -> inspect.Signature:
    """The signature users see (`help()`, the API docs): TRL's positional order first, the deprecated names left
    out, every other argument keyword-only."""
    sig = inspect.signature(init)
    params = list(sig.parameters.values())
    kinds = inspect.Parameter
    front = [params[0]] + [kinds(name, kinds.POSITIONAL_OR_KEYWORD, default=None) for name in TRL_POSITIONAL]
    skip = set(TRL_POSITIONAL) | set(DEPRECATED_KWARGS)
    keyword = [
        p.replace(kind=kinds.KEYWORD_ONLY)
        for p in params[1:]
        if p.name not in skip and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
    ]
    var_kw = [p for p in params if p.kind == kinds.VAR_KEYWORD]
    return sig.replace(parameters=front + keyword + var_kw)
