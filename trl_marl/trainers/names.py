"""TRL's argument names on every trainer, with the earlier names as deprecated aliases.

A TRL user writes `GRPOTrainer(model, reward_funcs, args=..., train_dataset=..., processing_class=...,
peft_config=...)`. Every trl_marl trainer takes the same: `model` (an id / path / model object for a homogeneous
team, or a list with one per agent), `reward_funcs` (one team reward, or a list summed with `args.reward_weights`),
`processing_class` (one tokenizer, or one per agent), positionally in TRL's order `TRL_POSITIONAL`. The earlier names
`agent_model`, `agents`, `reward_func` and `tokenizer` still work for one release, with a `FutureWarning`
(`resolve_deprecated_kwargs`, called first thing by `MultiAgentTrainer.__init__`); giving a name and its alias
together is an error. `args.model_init_kwargs` (TRL's config field) joins the loading options of `model_config`
(`merge_model_init_kwargs`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from trl_marl.trainers.trl_settings import TRL_TRAINER_ARGUMENTS, unknown_setting_error
from trl_marl.utils.deprecation import warn_deprecated

__all__ = [
    "TRL_POSITIONAL",
    "DEPRECATED_KWARGS",
    "resolve_deprecated_kwargs",
    "check_reward_weights",
    "combine_reward_funcs",
    "merge_model_init_kwargs",
]

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


def resolve_deprecated_kwargs(
    trainer: type, model: Any, reward_funcs: Any, processing_class: Any, deprecated_kwargs: dict[str, Any]
) -> tuple[Any, Any, Any]:
    """`(model, reward_funcs, processing_class)` with the values given under their earlier names moved in.

    Each earlier name (`DEPRECATED_KWARGS`) warns with a `FutureWarning` naming TRL's; a name and its alias together
    is a TypeError, and so is any other unknown keyword: a TRL trainer argument trl_marl does not take names what to
    use instead (`trl_marl.trainers.trl_settings`), anything else the closest arguments `trainer` takes. An alias
    given as None is ignored.
    """
    current = {"model": model, "reward_funcs": reward_funcs, "processing_class": processing_class}
    for old, value in deprecated_kwargs.items():
        new = DEPRECATED_KWARGS.get(old)
        if new is None:
            known = [
                n for n in inspect.signature(trainer.__init__).parameters if n not in ("self", "deprecated_kwargs")
            ]
            raise unknown_setting_error(f"{trainer.__name__}.__init__()", old, known, TRL_TRAINER_ARGUMENTS)
        if value is None:
            continue
        if current[new] is not None:
            raise TypeError(f"pass {new}= (TRL's name) or its deprecated alias {old}=, not both")
        warn_deprecated(f"`{old}=` is deprecated; use `{new}=` (TRL's name)", stacklevel=4)
        current[new] = value
    return current["model"], current["reward_funcs"], current["processing_class"]


def check_reward_weights(
    reward_funcs: Callable | Sequence[Callable] | None, reward_weights: Sequence[float] | None
) -> None:
    """One weight per reward function, as TRL's `GRPOTrainer` requires when it is built (a ValueError naming both
    counts): a single function counts as one, no `reward_funcs` as none."""
    if reward_weights is None:
        return
    w = len(reward_weights)
    if reward_funcs is None:
        raise ValueError(
            f"reward_weights has {w} entries but no reward_funcs is given: the weights weigh the reward functions "
            "(one per function); leave reward_weights unset"
        )
    if not isinstance(reward_funcs, (list, tuple)):
        if w != 1:
            raise ValueError(
                f"reward_weights has {w} entries for 1 reward function (reward_funcs is one function): give one "
                "weight per function, as TRL's GRPOTrainer requires, or leave reward_weights unset"
            )
        return
    if w != len(reward_funcs):
        raise ValueError(
            f"reward_weights has {w} entries for {len(reward_funcs)} reward functions: give one weight per function, "
            "as TRL's GRPOTrainer requires, or leave reward_weights unset (1 each)"
        )


def combine_reward_funcs(
    reward_funcs: Callable | Sequence[Callable] | None, reward_weights: Sequence[float] | None
) -> Callable | None:
    """One team reward from TRL's `reward_funcs`: a list is summed with `reward_weights` (`weighted_sum`, each
    function's mean logged as `rewards/<name>/mean`); a one-element list without weights is its function, and one
    function with one weight other than 1 is that weighted sum. `check_reward_weights` first."""
    check_reward_weights(reward_funcs, reward_weights)
    from trl_marl.rewards import weighted_sum

    if not isinstance(reward_funcs, (list, tuple)):
        if reward_weights is None or list(reward_weights) == [1.0] or not callable(reward_funcs):
            return reward_funcs
        return weighted_sum([reward_funcs], reward_weights)  # its one weight applies, as in TRL

    if len(reward_funcs) == 1 and reward_weights is None:
        return reward_funcs[0]
    return weighted_sum(list(reward_funcs), reward_weights)


def merge_model_init_kwargs(model_config: Any, init_kwargs: dict[str, Any] | None) -> Any:
    """`model_config` (dict or TRL `ModelConfig`) plus TRL's `model_init_kwargs` (`from_pretrained` keywords); a key
    set to different values in both is a ValueError naming it. Without `init_kwargs`, `model_config` unchanged."""
    if not init_kwargs:
        return model_config
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
