"""The checks a trainer runs on its arguments before any model loads, and the W&B settings it applies.

Each bad argument is a clear error at construction naming the argument and what it accepts, not a failure minutes
later (a formatter that misses a column fails here on the first item of each dataset, not at the first evaluation).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from trl_marl.rollout.prompts import formatter_failure

__all__ = [
    "agent_sources",
    "check_run_arguments",
    "team_reward",
    "check_shared_base",
    "check_sharded_scoring",
    "check_formatters_on_first_items",
    "column_names",
    "apply_wandb_config",
]


def agent_sources(model: Any, num_agents: int) -> list:
    """One model source (id, path or object) per agent, from TRL's `model`: one id / path loaded `num_agents` times
    (a homogeneous team; a model object only for one agent), or a list with one source per agent."""
    if model is None:
        raise ValueError(
            "pass model= (one id / path for a homogeneous team, or a list with one model or id per agent; "
            "deprecated aliases: agent_model=, agents=)"
        )
    if isinstance(model, (list, tuple)):
        if len(model) != num_agents:
            raise ValueError(f"model has {len(model)} entries (one per agent) but num_agents is {num_agents}")
        return list(model)
    if not isinstance(model, (str, os.PathLike)) and not hasattr(model, "parameters"):
        raise TypeError(
            f"model must be a model id / path, a model object, or a list of them (one per agent); "
            f"got {type(model).__name__}"
        )
    if not isinstance(model, (str, os.PathLike)) and num_agents > 1:
        raise ValueError(
            f"model is one model object but num_agents={num_agents}: one object cannot be {num_agents} independent "
            "agents; pass a model id / path (loaded once per agent) or a list with one object per agent"
        )
    return [model] * num_agents


def check_run_arguments(
    args: Any,
    processing_class: Any,
    reward_func: Callable | None,
    train_dataset: Any,
    eval_dataset: Any,
    formatters: Sequence[Callable],
    external_transition: Callable | None,
    agentic: Any = None,
) -> None:
    """The trainer arguments every trainer needs, checked against `args` (one agent's formatters per agent).
    `agentic` (`trl_marl.trainers.agentic.AgenticSetup`, which checked its own): the environment and the agents'
    conversation make the next turns, and an environment's `get_reward` may be the reward."""
    n = args.num_agents
    if isinstance(processing_class, (list, tuple)) and len(processing_class) != n:
        raise ValueError(f"tokenizer list has {len(processing_class)} entries but num_agents is {n}")
    if args.num_turns > 1 and external_transition is None and agentic is None:
        raise ValueError(
            f"num_turns={args.num_turns} needs an external_transition (it builds each next turn's prompts), or "
            "tools / an environment_factory / turn_order='sequential' (the agents' conversation goes on)"
        )
    if reward_func is None and agentic is None:
        raise ValueError("reward_funcs is required: it scores the joint response of the agents")
    if train_dataset is None or len(train_dataset) == 0:
        raise ValueError("train_dataset is empty: pass a datasets.Dataset (or list of dicts) of task items")
    if eval_dataset is not None and len(eval_dataset) == 0:
        raise ValueError("eval_dataset is empty; pass None to disable evaluation")
    check_formatters_on_first_items(formatters, train_dataset=train_dataset, eval_dataset=eval_dataset)
    if args.parallel_training == "mp" and args.agent_devices and len(args.agent_devices) not in (1, n):
        raise ValueError(f"agent_devices has {len(args.agent_devices)} entries; give 1 or num_agents={n}")


def team_reward(
    reward_func: Callable | None,
    num_agents: int,
    processor: Callable[[float], float] | None,
    allow_per_agent: bool,
    columns: Sequence[str] | None,
    agentic: Any = None,
) -> Any:
    """The trainer's reward: `reward_funcs` as a `RewardFunction` (None without them), joined by the environments'
    `get_reward` for an agentic trainer (`AgenticSetup.reward_sources`)."""
    from trl_marl.rewards import RewardFunction

    reward = None
    if reward_func is not None:
        reward = RewardFunction(
            reward_func, num_agents, processor, allow_per_agent=allow_per_agent, column_names=columns
        )
    return agentic.reward_sources(reward, processor) if agentic is not None else reward


def check_shared_base(model: Any, args: Any, peft_config: Any, trainer: str, supported: bool) -> None:
    """`share_base_model=True` (every agent an adapter on ONE base): a `peft_config`, one model id, a trainer that
    supports it and no per-agent devices."""
    if peft_config is None:
        raise ValueError("share_base_model=True needs a peft_config: the agents are adapters on one base")
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError("share_base_model=True needs a homogeneous team given as model=<one id>")
    if not supported:
        raise ValueError(
            f"{trainer} does not support share_base_model=True (its critics or value heads need a model per agent); "
            "use peft_config with share_base_model=False"
        )
    if args.parallel_training == "mp":
        raise ValueError(
            "share_base_model=True puts every agent on one model: parallel_training='mp' cannot place them on "
            "different devices"
        )


def check_sharded_scoring(args: Any, sharded: bool) -> None:
    """Refuse `logprob_batch_size` on a team sharded by ZeRO-3 or FSDP2: there the processes' scoring forwards must
    match one to one (each gathers the agent's shards, a collective), and chunks of rows would differ in number
    between processes holding different numbers of rows (and re-gathering the agent for a second forward breaks
    ZeRO-3's recorded fetch order). Sharded teams score each agent's rows in one forward."""
    if sharded and args.logprob_batch_size is not None:
        raise ValueError(
            f"logprob_batch_size={args.logprob_batch_size} is not supported with DeepSpeed ZeRO-3 or FSDP2: sharded "
            "agents score each agent's rows in one forward (every process must run the same forwards). Leave "
            "logprob_batch_size=None and bound activations with gradient_checkpointing=True instead."
        )


def check_formatters_on_first_items(formatters: Sequence[Callable], **datasets: Any) -> None:
    """Every agent's formatter on the first item of each dataset, at construction: a missing column fails now, naming
    the dataset, the agent and the formatter, not at the first evaluation after training."""
    for which, ds in datasets.items():
        if ds is None:
            continue
        item = ds[0]
        for i, formatter in enumerate(formatters):
            try:
                formatter(item)
            except Exception as exc:
                raise ValueError(
                    f"{which}[0]: {formatter_failure(i, formatter, item, exc)}; every agent's formatter must accept "
                    f"every item of {which} (add the column, or pass formatters that read the columns it has)"
                ) from exc


def column_names(dataset: Any) -> list[str] | None:
    """The columns of a `datasets.Dataset` or of a list of dict rows (None when unknown)."""
    names = getattr(dataset, "column_names", None)
    if names is not None:
        return list(names)
    first = dataset[0] if len(dataset) else None
    return list(first) if isinstance(first, dict) else None


def apply_wandb_config(args: Any, cfg: dict) -> None:
    """The reference library's W&B settings (`project`, `entity`, `name`, `tags`, `dir`, `id`, `resume`): the
    `WANDB_*` environment, the run name, and `"wandb"` added to `report_to`."""
    env = {
        "project": "WANDB_PROJECT",
        "entity": "WANDB_ENTITY",
        "dir": "WANDB_DIR",
        "id": "WANDB_RUN_ID",
        "resume": "WANDB_RESUME",
    }
    for key, var in env.items():
        if cfg.get(key) is not None:
            os.environ[var] = str(cfg[key])
    if cfg.get("tags"):
        os.environ["WANDB_TAGS"] = ",".join(cfg["tags"])
    name = cfg.get("name") or cfg.get("run_name")
    if name:
        args.run_name = name
    report = args.report_to if isinstance(args.report_to, list) else [args.report_to]
    report = [r for r in report if r and r != "none"]
    if "wandb" not in report:
        args.report_to = report + ["wandb"]
