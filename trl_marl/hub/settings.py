"""Team layouts and Hub settings, `team.json` reading, and the training config that is safe to publish.

Shared by the card, push and loader modules of `trl_marl.hub`; imports nothing from the trainers.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import fields
from typing import Any

from trl_marl.hub.papers import paper_of
from trl_marl.utils.secrets import redact_secrets

TEAM_FILE = "team.json"
CARD_FILE = "README.md"
HUB_TEAM_LAYOUTS = ("team", "per_agent")
# Which transformers `hub_strategy` values each layout supports. "every_save" pushes the team (agents, tokenizers,
# cards, team.json) on every checkpoint save; "checkpoint" / "all_checkpoints" also push the whole checkpoint
# (optimizer, scheduler, RNG, trainer state) to `last-checkpoint/` / `checkpoint-N/` of the team repo -- a training
# state that does not split into per-agent repos, hence team layout only.
HUB_STRATEGIES = {
    "team": ("end", "every_save", "checkpoint", "all_checkpoints"),
    "per_agent": ("end", "every_save"),
}
# Never uploaded: private files (transformers' rule), checkpoints of the output folder, and `training_args.bin`
# (a pickle of the config, hub_token included).
UPLOAD_IGNORE = ["_*", "checkpoint-*", "last-checkpoint/*", "*training_args.bin"]
# Not downloaded by `AgentTeam.from_pretrained`: checkpoints pushed with hub_strategy "checkpoint" / "all_checkpoints".
DOWNLOAD_IGNORE = ["last-checkpoint/*", "checkpoint-*", "*training_args.bin"]

# Config fields of transformers' TrainingArguments worth stating in a card (ours are all stated, see
# `safe_training_config`).
_CARD_TRAINING_FIELDS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "optim",
    "seed",
    "bf16",
    "fp16",
    "gradient_checkpointing",
)
_SECRET_WORDS = {"token", "secret", "password", "passwd", "credential", "credentials", "key", "apikey", "auth"}
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def agent_repo_id(base_repo_id: str, index: int) -> str:
    """The repo of agent `index` (1-based, its folder number) in the per-agent layout: `{base_repo_id}-agent-{index}`."""
    return f"{base_repo_id}-agent-{index}"


def agent_role(formatter: Any, index: int) -> str:
    """An agent's role: its formatter's `role` attribute (built-in tasks set it from `Task.roles`), else
    `agent_{index + 1}`."""
    role = getattr(formatter, "role", None)
    return role if isinstance(role, str) and role else f"agent_{index + 1}"


def check_hub_settings(layout: str, hub_strategy: Any) -> None:
    """Raise ValueError for an unknown `hub_team_layout` or a `hub_strategy` that layout does not support."""
    if layout not in HUB_TEAM_LAYOUTS:
        raise ValueError(f"hub_team_layout must be one of {list(HUB_TEAM_LAYOUTS)}, got {layout!r}")
    strategy = str(getattr(hub_strategy, "value", hub_strategy))
    if strategy not in HUB_STRATEGIES[layout]:
        hint = (
            " ('checkpoint' / 'all_checkpoints' push the whole training state, which does not split into per-agent "
            "repos: use hub_team_layout='team')"
            if layout == "per_agent" and strategy in HUB_STRATEGIES["team"]
            else ""
        )
        raise ValueError(
            f"hub_strategy={strategy!r} is not supported with hub_team_layout={layout!r}; supported: "
            f"{list(HUB_STRATEGIES[layout])}{hint}"
        )


def _is_secret_name(name: str) -> bool:
    return bool(set(name.lower().split("_")) & _SECRET_WORDS)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(getattr(value, "value", value))


def safe_training_config(args: Any) -> dict[str, Any]:
    """The part of a trainer config that is safe and useful to publish in a card and `team.json`.

    Every field the trl_marl config classes add (beyond TRL's base config) plus a fixed list of optimisation fields
    of `TrainingArguments` (`learning_rate`, `max_steps`, `seed`, ...). Left out: any field whose name contains a
    secret-like word (`token`, `key`, `secret`, `password`, `auth`, ...: so `hub_token` never appears), local paths
    and devices (`*_dir`, `*_path`, `*_devices`), and any value that contains the `hub_token` string.
    """
    from trl.trainer.base_config import _BaseConfig

    base_names = {f.name for f in fields(_BaseConfig)}
    secret_value = getattr(args, "hub_token", None)
    out: dict[str, Any] = {}
    for f in fields(args):
        name = f.name
        if not f.init or (name in base_names and name not in _CARD_TRAINING_FIELDS):
            continue
        if _is_secret_name(name) or name.endswith(("_dir", "_path", "_devices")):
            continue
        value = redact_secrets(_jsonable(getattr(args, name, None)))  # trl_marl.utils.secrets: what slipped through
        if secret_value and secret_value in json.dumps(value):
            continue
        out[name] = value
    return dict(sorted(out.items()))


def team_metadata(trainer: Any) -> dict[str, Any]:
    """What `team.json` records beyond the team itself, for cards written from the folder alone: the safe training
    config (`safe_training_config`), the method's paper (`papers.PAPERS` by the trainer's `_name`, else its `_paper`)
    and the trainer's Hub tags."""
    source = paper_of(getattr(trainer, "_name", None)) or getattr(trainer, "_paper", None) or {}
    paper = {k: v for k, v in source.items() if k in ("title", "id", "citation")}
    return {
        "training_config": safe_training_config(trainer.args),
        "paper": paper or None,
        "tags": list(getattr(trainer, "_tag_names", [])),
    }


def _agent_entries(description: dict) -> list[dict]:
    n = int(description.get("num_agents") or len(description.get("agents", [])))
    entries = list(description.get("agents") or [])
    entries += [{} for _ in range(n - len(entries))]
    out = []
    for i, e in enumerate(entries):
        e = dict(e)
        e.setdefault("folder", f"agent_{i + 1}")
        e.setdefault("role", f"agent_{i + 1}")
        out.append(e)
    return out


def _adapter_config(folder: str | os.PathLike | None) -> dict | None:
    if folder is None:
        return None
    path = os.path.join(folder, "adapter_config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


TEAM_FILE_FIX = (
    "restore it from the Hub repo or a checkpoint, or save the team again (trainer.save_model() or "
    "AgentTeam.save_pretrained)"
)
# Optional top-level fields of `team.json` and the JSON types they must have (None is always allowed).
_TEAM_OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {
    "algorithm": (str,),
    "reward_func": (str,),
    "joint_mode": (str,),
    "num_turns": (int,),
    "training_config": (dict,),
    "paper": (dict,),
    "tags": (list,),
    "hub": (dict,),
}
_AGENT_FOLDER_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def read_team_description(folder: str | os.PathLike) -> dict | None:
    """`team.json` of `folder` (validated by `validate_team_description`), or None when there is none.

    A truncated or invalid file, a missing or mistyped field raises `trl_marl.checkpointing.state_files.CorruptedStateError` naming
    the file, what is wrong and what to do -- never a bare `JSONDecodeError` / `KeyError`."""
    from trl_marl.checkpointing.state_files import read_json_state

    path = os.path.join(folder, TEAM_FILE)
    if not os.path.isfile(path):
        return None
    return validate_team_description(read_json_state(path, TEAM_FILE_FIX), path)


def validate_team_description(description: dict, path: str) -> dict:
    """Check the fields of a `team.json` read from `path`: `num_agents` (a positive int), `agents` (one object per
    agent; `folder` a plain folder name inside the team folder, `role` / `source` / `formatter` strings), the optional
    fields' types, and the `hub` entry of a per-agent repo (`layout`, `agent_index` in range of `repo_ids`).
    Returns `description`; raises `CorruptedStateError` otherwise."""
    from trl_marl.checkpointing.state_files import CorruptedStateError, require

    fix = TEAM_FILE_FIX
    n = require(description, "num_agents", int, path, fix)
    if n < 1:
        raise CorruptedStateError(path, f"the field 'num_agents' should be at least 1, found {n}", fix)
    agents = require(description, "agents", list, path, fix)
    if len(agents) != n:
        raise CorruptedStateError(path, f"'num_agents' is {n} but 'agents' lists {len(agents)} entries", fix)
    for i, entry in enumerate(agents):
        if not isinstance(entry, dict):
            raise CorruptedStateError(path, f"agents[{i}] should be an object, found {entry!r:.80}", fix)
        for key in ("folder", "role", "source", "formatter"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                raise CorruptedStateError(path, f"agents[{i}].{key} should be a string, found {entry[key]!r:.80}", fix)
        name = entry.get("folder")
        if name is not None and (not _AGENT_FOLDER_NAME.match(name) or name in (".", "..")):
            # a downloaded team.json must not point outside its own folder
            raise CorruptedStateError(
                path, f"agents[{i}].folder should be a folder name inside the team folder, found {name!r:.80}", fix
            )
    for key, kinds in _TEAM_OPTIONAL_FIELDS.items():
        value = description.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
            names = " or ".join(k.__name__ for k in kinds)
            raise CorruptedStateError(path, f"the field {key!r} should be a {names}, found {value!r:.80}", fix)
    hub = description.get("hub")
    if hub is not None:
        layout = hub.get("layout")
        if layout not in HUB_TEAM_LAYOUTS:
            raise CorruptedStateError(
                path, f"hub.layout should be one of {list(HUB_TEAM_LAYOUTS)}, found {layout!r:.80}", fix
            )
        if layout == "per_agent":
            repo_ids = require(hub, "repo_ids", list, path, fix)
            if len(repo_ids) != n or not all(isinstance(r, str) and r for r in repo_ids):
                raise CorruptedStateError(path, f"hub.repo_ids should list {n} repo ids, found {repo_ids!r:.120}", fix)
            index = require(hub, "agent_index", int, path, fix)
            if not 0 <= index < n:
                raise CorruptedStateError(path, f"hub.agent_index should be in [0, {n}), found {index}", fix)
    return description


# Top-level entries a team save writes (`MultiAgentTrainer._save`): agent, critic and reward-model folders. A re-used
# output_dir may hold them from an earlier run (another trainer, more agents, LoRA instead of full weights).
_SAVED_TEAM_ENTRY = re.compile(r"^(agent_\d+|critic|critic_\d+|reward_model)$")


def saved_team_entries(folder: str | os.PathLike) -> list[str]:
    """The top-level names of `folder` that a team save writes (`agent_<i>/`, `critic/`, `critic_<i>/`,
    `reward_model/`, `team.json`, `training_args.bin`): what its checksums cover."""
    return sorted(
        name
        for name in os.listdir(folder)
        if (_SAVED_TEAM_ENTRY.match(name) and os.path.isdir(os.path.join(folder, name)))
        or name in (TEAM_FILE, "training_args.bin")
    )


def clear_saved_team(folder: str | os.PathLike) -> list[str]:
    """Remove what an earlier team save left in `folder` (`agent_<i>/`, `critic/`, `critic_<i>/`, `reward_model/`,
    `team.json`) so that a new save holds only what the run writes; other entries (the user's files, `checkpoint-*`,
    logs) are left alone. Returns the names removed."""
    import shutil

    if not os.path.isdir(folder):
        return []
    removed = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path) and _SAVED_TEAM_ENTRY.match(name):
            shutil.rmtree(path)
            removed.append(name)
        elif name in (TEAM_FILE, "checksums.json") and os.path.isfile(path):
            os.remove(path)
            removed.append(name)
    return removed
