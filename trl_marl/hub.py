"""Sharing a team on the Hugging Face Hub: model cards, `push_team_to_hub`, and `AgentTeam` to load a team back.

A saved team (`MultiAgentTrainer.save_model`) is a folder with one `save_pretrained` folder per agent
(`agent_1/ ... agent_n/`, each with its tokenizer and a model card `README.md`), a `team.json` describing the team
and a team-level `README.md`. It is shared in one of two layouts (`MultiAgentConfig.hub_team_layout`):

- `"team"`: ONE repo `hub_model_id` holding the folder as saved (`agent_i/`, `team.json`, `README.md`, and the
  `critic/` / `reward_model/` folders of trainers that have them).
- `"per_agent"`: one repo per agent, named `{hub_model_id}-agent-{i}` (i = 1..n, the agent's folder number), each
  holding that agent's folder at the repo root (so `AutoModelForCausalLM.from_pretrained(repo)` just works), its card,
  and a `team.json` that also lists every agent's repo. Critics and reward models are not pushed in this layout.

`AgentTeam.from_pretrained` loads either layout, from a local folder or the Hub, for decentralized execution: each
agent answers from its own prompt only.

Hub settings follow transformers: `hub_model_id`, `hub_token` (used for the requests only; it is never written to
a card, `team.json` or an uploaded file, and `training_args.bin` -- a pickle that holds it -- is never uploaded),
`hub_private_repo`, `hub_revision`, `hub_always_push` and `hub_strategy` (see `HUB_STRATEGIES`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import huggingface_hub
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.errors import RepositoryNotFoundError

from .config_secrets import redact_secrets
from .team import eos_token_ids, render_prompt

if TYPE_CHECKING:  # pragma: no cover
    from huggingface_hub import CommitInfo

    from .trainers.base import MultiAgentTrainer

__all__ = [
    "AgentTeam",
    "HUB_STRATEGIES",
    "HUB_TEAM_LAYOUTS",
    "TEAM_FILE",
    "agent_repo_id",
    "agent_role",
    "build_agent_card",
    "build_team_card",
    "check_hub_settings",
    "push_team_to_hub",
    "safe_training_config",
    "write_model_cards",
]

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


# --------------------------------------------------------------------------------------------------- naming, config
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
        value = redact_secrets(_jsonable(getattr(args, name, None)))  # trl_marl.config_secrets: what slipped through
        if secret_value and secret_value in json.dumps(value):
            continue
        out[name] = value
    return dict(sorted(out.items()))


def team_metadata(trainer: MultiAgentTrainer) -> dict[str, Any]:
    """What `team.json` records beyond the team itself, for cards written from the folder alone: the safe training
    config (`safe_training_config`), the method's paper and the trainer's Hub tags."""
    paper = {k: v for k, v in (getattr(trainer, "_paper", None) or {}).items() if k in ("title", "id", "citation")}
    return {
        "training_config": safe_training_config(trainer.args),
        "paper": paper or None,
        "tags": list(getattr(trainer, "_tag_names", [])),
    }


# --------------------------------------------------------------------------------------------------------- cards
def _hub_model_name(source: str | None) -> str | None:
    """`source` when it looks like a Hub model id (`namespace/name`, not a local path), else None."""
    if not source or os.path.exists(source) or os.path.isabs(source):
        return None
    return source if _HUB_ID.match(source) else None


def _adapter_config(folder: str | os.PathLike | None) -> dict | None:
    if folder is None:
        return None
    path = os.path.join(folder, "adapter_config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


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


def _card_tags(description: dict, extra: Sequence[str] | str | None) -> list[str]:
    tags = list(description.get("tags") or ["trl", "trl_marl", "multi-agent"])
    algorithm = str(description.get("algorithm", "")).lower()
    if algorithm and algorithm not in tags:
        tags.append(algorithm)
    for t in [extra] if isinstance(extra, str) else list(extra or []):
        if t not in tags:
            tags.append(t)
    return tags


def _trl_card(
    description: dict, base_model: str | None, model_name: str, hub_id: str | None, dataset_name, tags
) -> ModelCard:
    """TRL's model card (metadata, intro, training procedure, framework versions, citations) for a team member."""
    from trl.trainer.utils import generate_model_card

    paper = description.get("paper") or {}
    return generate_model_card(
        base_model=base_model,
        model_name=model_name,
        hub_model_id=hub_id or model_name,
        dataset_name=dataset_name,
        tags=tags,
        wandb_url=None,
        trackio_url=None,
        trainer_name=str(description.get("algorithm", "a multi-agent trainer")),
        trainer_citation=paper.get("citation"),
        paper_title=paper.get("title"),
        paper_id=paper.get("id"),
    )


def _splice(card: ModelCard, quick_start: str, team_section: str, config_section: str, local_base: str | None):
    """Replace TRL's single-model quick start with ours, add the team and training-configuration sections."""
    text = card.text
    if local_base is not None:
        text = text.replace("[None](https://huggingface.co/None)", f"`{local_base}` (a local model)")
    start, procedure = text.find("## Quick start"), text.find("## Training procedure")
    if 0 <= start < procedure:
        text = text[:start] + quick_start + "\n" + team_section + "\n" + text[procedure:]
    else:
        text = text.rstrip() + "\n\n" + quick_start + "\n" + team_section + "\n"
    versions = text.find("### Framework versions")
    if versions >= 0:
        text = text[:versions] + config_section + "\n" + text[versions:]
    else:
        text = text.rstrip() + "\n\n" + config_section
    card.text = text  # `card.content` is rebuilt from `card.data` and `card.text`
    return card


def _config_section(description: dict) -> str:
    config = description.get("training_config")
    if not config:
        return ""
    body = json.dumps(config, indent=2, sort_keys=True)
    return f"### Training configuration\n\n```json\n{body}\n```\n"


def _locations(
    description: dict, layout: str, repo_id: str | None, agent_repo_ids: Sequence[str] | None, local: str
) -> tuple[str, list[str]]:
    """Where the team and each agent live: (team location, per-agent location) as users should load them."""
    entries = _agent_entries(description)
    if layout == "per_agent":
        ids = list(agent_repo_ids) if agent_repo_ids else None
        if ids is None and repo_id:
            ids = [agent_repo_id(repo_id, i + 1) for i in range(len(entries))]
        if ids is not None:
            return repo_id or ids[0], ids
    team = repo_id or local
    return team, [f"{team}/{e['folder']}" if not repo_id else f"{repo_id} (subfolder {e['folder']})" for e in entries]


def build_agent_card(
    description: dict,
    index: int,
    *,
    layout: str = "team",
    repo_id: str | None = None,
    agent_repo_ids: Sequence[str] | None = None,
    local_path: str = "path/to/team",
    agent_folder: str | os.PathLike | None = None,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: Sequence[str] | str | None = None,
) -> ModelCard:
    """The model card of agent `index` (0-based) of a team: TRL's card (metadata, training procedure, versions,
    citations) naming the algorithm, plus the agent's role, a table of the OTHER agents (role, where they live,
    source model), how to load the team and run it decentralized, and the training config (`team.json`'s
    `training_config`, already filtered by `safe_training_config`).

    `repo_id` is the team repo (`"team"`) or the base id of the per-agent repos (`"per_agent"`); `agent_repo_ids`
    overrides the per-agent names. Without either, the card points at `local_path`.
    """
    entries = _agent_entries(description)
    me = entries[index]
    n, k = len(entries), index + 1
    role = me["role"]
    algorithm = str(description.get("algorithm", "a multi-agent trainer"))
    team_loc, locs = _locations(description, layout, repo_id, agent_repo_ids, local_path)
    adapter = _adapter_config(agent_folder)
    source = adapter.get("base_model_name_or_path") if adapter else me.get("source")
    base = _hub_model_name(source)
    team_name = model_name or (repo_id or local_path).rstrip("/").split("/")[-1]
    per_agent_ids = locs if layout == "per_agent" and (repo_id or agent_repo_ids) else None
    name = per_agent_ids[index].split("/")[-1] if per_agent_ids else f"{team_name} agent {k} ({role})"
    card = _trl_card(
        description,
        base,
        name,
        per_agent_ids[index] if per_agent_ids else repo_id,
        dataset_name,
        _card_tags(description, tags),
    )
    if adapter is not None:
        card.data.library_name = "peft"

    load_arg = json.dumps(per_agent_ids) if per_agent_ids else json.dumps(team_loc)
    auto = "AutoPeftModelForCausalLM" if adapter is not None else "AutoModelForCausalLM"
    auto_import = "from peft import AutoPeftModelForCausalLM" if adapter is not None else ""
    if per_agent_ids:
        target, extra = per_agent_ids[index], ""
    elif repo_id:
        target, extra = repo_id, f', subfolder="{me["folder"]}"'
    else:
        target, extra = f"{local_path.rstrip('/')}/{me['folder']}", ""
    single = (
        f'model = {auto}.from_pretrained("{target}"{extra})\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{target}"{extra})'
    )
    imports = "from transformers import AutoModelForCausalLM, AutoTokenizer"
    if adapter is not None:
        imports = f"{auto_import}\nfrom transformers import AutoTokenizer"
    quick = (
        "## Quick start\n\n"
        f"This is agent {k} of {n} (role **{role}**) of a team trained with {algorithm}. Load the whole team and run "
        "it decentralized -- every agent answers from its own prompt only:\n\n"
        "```python\nfrom trl_marl import AgentTeam\n\n"
        f"team = AgentTeam.from_pretrained({load_arg})\n"
        f'answer = team.generate({index}, "Your prompt for the {role}", max_new_tokens=128)\n'
        "answers = team.act([prompt_1, ..., prompt_n])  # one prompt per agent\n```\n\n"
        f"or this agent alone:\n\n```python\n{imports}\n\n{single}\n```\n"
    )
    rows = [f"| {j + 1} | {e['role']} | {locs[j]} | {_source_cell(e)} |" for j, e in enumerate(entries) if j != index]
    others = "\n".join(rows) if rows else "| - | - | - | - |"
    team_line = (
        f"one repo per agent ({', '.join(locs)}), layout `per_agent`"
        if per_agent_ids
        else f"{team_loc}, layout `team`"
    )
    team_section = (
        "## Team\n\n"
        f"- Algorithm: **{algorithm}** (trained with trl_marl on TRL)\n"
        f"- This agent: **agent {k} of {n}**, role **{role}**, formatter `{me.get('formatter', '?')}`\n"
        f"- Team: {team_line}\n"
        f"- Reward: `{description.get('reward_func', '?')}`, joint mode `{description.get('joint_mode', '?')}`, "
        f"turns {description.get('num_turns', '?')}\n\n"
        "The other agents of the team:\n\n"
        "| agent | role | where | initial model |\n|---|---|---|---|\n"
        f"{others}\n"
    )
    return _splice(card, quick, team_section, _config_section(description), None if base else _local_name(source))


def _source_cell(entry: dict) -> str:
    src = entry.get("source")
    hub = _hub_model_name(src)
    if hub:
        return f"[{hub}](https://huggingface.co/{hub})"
    return f"`{_local_name(src)}`" if src else "?"


def _local_name(source: str | None) -> str | None:
    return Path(source).name if source else None


def build_team_card(
    description: dict,
    *,
    layout: str = "team",
    repo_id: str | None = None,
    agent_repo_ids: Sequence[str] | None = None,
    local_path: str = "path/to/team",
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: Sequence[str] | str | None = None,
) -> ModelCard:
    """The team-level card (`README.md` beside `team.json`): TRL's card naming the algorithm, a table of every
    agent (role, location, formatter, initial model), how to load and run the team, and the training config."""
    entries = _agent_entries(description)
    algorithm = str(description.get("algorithm", "a multi-agent trainer"))
    team_loc, locs = _locations(description, layout, repo_id, agent_repo_ids, local_path)
    sources = {e.get("source") for e in entries}
    common = sources.pop() if len(sources) == 1 else None
    base = _hub_model_name(common)
    name = model_name or (repo_id or local_path).rstrip("/").split("/")[-1]
    card = _trl_card(description, base, name, repo_id, dataset_name, _card_tags(description, tags))
    load_arg = json.dumps(locs) if layout == "per_agent" and (repo_id or agent_repo_ids) else json.dumps(team_loc)
    quick = (
        "## Quick start\n\n"
        f"A team of {len(entries)} cooperating agents trained with {algorithm}. Load every agent with its tokenizer and "
        "run the team decentralized -- each agent answers from its own prompt only:\n\n"
        "```python\nfrom trl_marl import AgentTeam\n\n"
        f"team = AgentTeam.from_pretrained({load_arg})\n"
        "answers = team.act([prompt_1, ..., prompt_n])  # one prompt per agent, in agent order\n"
        'first = team.generate(0, "A prompt for agent 1")\n```\n'
    )
    rows = "\n".join(
        f"| {j + 1} | {e['role']} | {locs[j]} | `{e.get('formatter', '?')}` | {_source_cell(e)} |"
        for j, e in enumerate(entries)
    )
    team_section = (
        "## Team\n\n"
        f"- Algorithm: **{algorithm}** (trained with trl_marl on TRL)\n"
        f"- Reward: `{description.get('reward_func', '?')}`, joint mode `{description.get('joint_mode', '?')}`, "
        f"turns {description.get('num_turns', '?')}\n"
        f"- Layout: `{layout}`\n\n"
        "| agent | role | where | formatter | initial model |\n|---|---|---|---|---|\n"
        f"{rows}\n"
    )
    local_base = None if base or common is None else _local_name(common)
    return _splice(card, quick, team_section, _config_section(description), local_base)


def read_team_description(folder: str | os.PathLike) -> dict | None:
    """`team.json` of `folder`, or None when there is none."""
    path = os.path.join(folder, TEAM_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_model_cards(
    folder: str | os.PathLike,
    description: dict | None = None,
    *,
    layout: str = "team",
    repo_id: str | None = None,
    agent_repo_ids: Sequence[str] | None = None,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: Sequence[str] | str | None = None,
) -> None:
    """Write `README.md` in every agent folder of a saved team (`build_agent_card`) and the team `README.md` beside
    `team.json` (`build_team_card`). `description` defaults to the folder's `team.json`."""
    description = description if description is not None else read_team_description(folder)
    if description is None:
        raise FileNotFoundError(f"{folder} has no {TEAM_FILE}: not a team saved by a trl_marl trainer")
    common = dict(layout=layout, repo_id=repo_id, agent_repo_ids=agent_repo_ids, local_path=str(folder))
    card_kw = dict(model_name=model_name, dataset_name=dataset_name, tags=tags)
    for i, entry in enumerate(_agent_entries(description)):
        sub = os.path.join(folder, entry["folder"])
        if os.path.isdir(sub):
            build_agent_card(description, i, agent_folder=sub, **common, **card_kw).save(os.path.join(sub, CARD_FILE))
    build_team_card(description, **common, **card_kw).save(os.path.join(folder, CARD_FILE))


# --------------------------------------------------------------------------------------------------------- pushing
_APIS: dict[str, HfApi] = {}


def _api() -> HfApi:
    """One `HfApi` per endpoint (so `run_as_future` pushes are queued one after the other, as in transformers)."""
    from . import __version__

    endpoint = huggingface_hub.constants.ENDPOINT
    if endpoint not in _APIS:
        _APIS[endpoint] = HfApi(endpoint=endpoint, library_name="trl_marl", library_version=__version__)
    return _APIS[endpoint]


def _create_repos(
    layout: str,
    repo_id: str | Sequence[str],
    num_agents: int,
    token: str | None,
    private: bool | None,
) -> tuple[str | None, list[str] | None]:
    """Create (exist_ok) the repo(s) of a team; return (team repo id, per-agent repo ids) with namespaces resolved."""
    api = _api()
    if layout == "team":
        if not isinstance(repo_id, str):
            raise ValueError("hub_team_layout='team' pushes to ONE repo: pass repo_id as a string")
        return api.create_repo(repo_id, token=token, private=private, exist_ok=True).repo_id, None
    if isinstance(repo_id, str):
        ids = [agent_repo_id(repo_id, i + 1) for i in range(num_agents)]
    else:
        ids = list(repo_id)
        if len(ids) != num_agents:
            raise ValueError(f"got {len(ids)} per-agent repo ids for a team of {num_agents} agents")
    resolved = [api.create_repo(r, token=token, private=private, exist_ok=True).repo_id for r in ids]
    base = None
    if isinstance(repo_id, str):
        suffix = "-agent-1"
        base = resolved[0][: -len(suffix)] if resolved[0].endswith(suffix) else repo_id
    return base, resolved


def _upload(
    folder: str | os.PathLike,
    description: dict,
    layout: str,
    team_repo_id: str | None,
    agent_repo_ids: Sequence[str] | None,
    *,
    token: str | None,
    revision: str | None,
    commit_message: str,
    run_as_future: bool,
) -> list[CommitInfo | Future]:
    """Upload a saved team (cards already written) in `layout`; one commit per repo."""
    api = _api()
    if layout == "team":
        return [
            api.upload_folder(
                repo_id=team_repo_id,
                folder_path=str(folder),
                commit_message=commit_message,
                token=token,
                revision=revision,
                run_as_future=run_as_future,
                allow_patterns=["*/*", TEAM_FILE, CARD_FILE],
                ignore_patterns=list(UPLOAD_IGNORE),
            )
        ]
    entries = _agent_entries(description)
    results = []
    for i, (entry, repo) in enumerate(zip(entries, agent_repo_ids)):
        sub = os.path.join(folder, entry["folder"])
        if not os.path.isdir(sub):
            raise FileNotFoundError(f"agent folder {sub} is missing")
        # the repo's own team.json: the team, this agent's index and every agent's repo
        own = {**description, "hub": {"layout": "per_agent", "agent_index": i, "repo_ids": list(agent_repo_ids)}}
        with open(os.path.join(sub, TEAM_FILE), "w", encoding="utf-8") as f:
            json.dump(own, f, indent=2)
        results.append(
            api.upload_folder(
                repo_id=repo,
                folder_path=sub,
                commit_message=commit_message,
                token=token,
                revision=revision,
                run_as_future=run_as_future,
                ignore_patterns=list(UPLOAD_IGNORE),
            )
        )
    return results


def push_team_to_hub(
    trainer_or_folder: MultiAgentTrainer | str | os.PathLike,
    repo_id: str | Sequence[str] | None = None,
    *,
    layout: str | None = None,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "End of training",
    revision: str | None = None,
    blocking: bool = True,
) -> CommitInfo | Future | list[CommitInfo | Future] | None:
    """Push a team to the Hub with `HfApi.create_repo` + `HfApi.upload_folder`.

    Args:
        trainer_or_folder: a trainer (its team is saved to `args.output_dir` first, on every process) or a folder
            written by `save_model` (`agent_i/` folders and `team.json`).
        repo_id: `layout="team"`: the team repo. `layout="per_agent"`: the base id -- agent i goes to
            `{repo_id}-agent-{i}` (i = 1..n) -- or the list of n per-agent repo ids. For a trainer it defaults to its
            `hub_model_id` (else the output folder's name, as transformers does); required for a folder.
        layout: `"team"` (one repo, a folder per agent + `team.json` + README) or `"per_agent"` (one repo per agent);
            default: the trainer's `hub_team_layout`, `"team"` for a folder.
        token: Hub token for the requests (default: the trainer's `hub_token`, else the locally saved login). It is
            sent in the Authorization header only and never written to any uploaded file.
        private: create the repo(s) private (default: the trainer's `hub_private_repo`); no effect on existing repos.
        commit_message: the commit message of every repo's commit.
        revision: branch to commit to (default: the trainer's `hub_revision`, else the default branch).
        blocking: wait for the uploads; with False the upload(s) run in the background and Futures are returned.

    Before uploading, the cards (every agent's `README.md` and the team's) are rewritten with the final repo ids.
    Never uploaded: `training_args.bin` (it pickles `hub_token`), `checkpoint-*` folders, files starting with `_`.

    Returns:
        `"team"`: the `CommitInfo` (or a Future) of the commit. `"per_agent"`: a list of them, one per agent, in agent
        order. None on non-main processes of a distributed run.
    """
    if not isinstance(trainer_or_folder, (str, os.PathLike)):
        trainer = trainer_or_folder
        args = trainer.args
        trainer.save_model(args.output_dir, _internal_call=True)  # no push of the configured layout
        if not trainer.is_world_process_zero():
            return None
        folder = args.output_dir
        layout = layout or args.hub_team_layout
        if repo_id is None:
            repo_id = getattr(trainer, "hub_model_id", None) or args.hub_model_id or Path(folder).absolute().name
        token = token if token is not None else args.hub_token
        private = private if private is not None else args.hub_private_repo
        revision = revision if revision is not None else args.hub_revision
    else:
        folder = os.fspath(trainer_or_folder)
        layout = layout or "team"
        if repo_id is None:
            raise ValueError("push_team_to_hub(folder) needs repo_id (the team repo, or the per-agent base id / ids)")
    if layout not in HUB_TEAM_LAYOUTS:
        raise ValueError(f"layout must be one of {list(HUB_TEAM_LAYOUTS)}, got {layout!r}")
    description = read_team_description(folder)
    if description is None:
        raise FileNotFoundError(f"{folder} has no {TEAM_FILE}: save the team with trainer.save_model() first")
    n = len(_agent_entries(description))
    team_id, agent_ids = _create_repos(layout, repo_id, n, token, private)
    write_model_cards(folder, description, layout=layout, repo_id=team_id, agent_repo_ids=agent_ids)
    results = _upload(
        folder,
        description,
        layout,
        team_id,
        agent_ids,
        token=token,
        revision=revision,
        commit_message=commit_message,
        run_as_future=not blocking,
    )
    return results[0] if layout == "team" else results


# ------------------------------------------------------------------------------- trainer integration (base.py)
def trainer_repo_ids(trainer: MultiAgentTrainer) -> tuple[str | None, list[str] | None]:
    """The trainer's team repo id (or per-agent base id) and per-agent repo ids, as far as they are known."""
    team = getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id
    agents = getattr(trainer, "hub_agent_repo_ids", None)
    if agents is None and team and trainer.args.hub_team_layout == "per_agent":
        agents = [agent_repo_id(team, i + 1) for i in range(trainer.num_agents)]
    return team, agents


def write_trainer_cards(
    trainer: MultiAgentTrainer,
    output_dir: str | os.PathLike,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: Sequence[str] | str | None = None,
) -> None:
    """Cards of a trainer's saved team (called by `_save` and `create_model_card`), pointing at the repos of its
    `hub_model_id` / `hub_team_layout` when set."""
    team, agents = trainer_repo_ids(trainer)
    write_model_cards(
        output_dir,
        trainer._team_description(),
        layout=trainer.args.hub_team_layout,
        repo_id=team,
        agent_repo_ids=agents,
        model_name=model_name,
        dataset_name=dataset_name,
        tags=tags,
    )


def init_trainer_repos(trainer: MultiAgentTrainer, token: str | None = None, private: bool | None = None) -> None:
    """`Trainer.init_hf_repo` for a team: create the team repo or the per-agent repos (main process only) and set
    `trainer.hub_model_id` (team repo / per-agent base id) and `trainer.hub_agent_repo_ids`."""
    if not trainer.is_world_process_zero():
        return
    args = trainer.args
    repo = args.hub_model_id or Path(args.output_dir).absolute().name
    token = token if token is not None else args.hub_token
    private = private if private is not None else args.hub_private_repo
    team, agents = _create_repos(args.hub_team_layout, repo, trainer.num_agents, token, private)
    trainer.hub_model_id = team
    trainer.hub_agent_repo_ids = agents
    trainer.push_in_progress = None


def push_trainer(
    trainer: MultiAgentTrainer,
    commit_message: str | None = "End of training",
    blocking: bool = True,
    token: str | None = None,
    revision: str | None = None,
    private: bool | None = None,
    **card_kwargs: Any,
) -> CommitInfo | Future | list[CommitInfo | Future] | None:
    """`Trainer.push_to_hub` for a team: create the repo(s) if needed, save the team, write the cards with
    `card_kwargs` (`model_name`, `dataset_name`, `tags`), wait for a running checkpoint push, upload."""
    unknown = sorted(set(card_kwargs) - {"model_name", "dataset_name", "tags"})
    if unknown:
        raise TypeError(
            f"push_to_hub got unexpected keyword arguments {unknown} (model card: model_name, dataset_name, tags)"
        )
    args = trainer.args
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    token = token if token is not None else args.hub_token
    if trainer.hub_model_id is None:
        trainer.init_hf_repo(token=token, private=private)
    trainer.save_model(_internal_call=True)
    if not trainer.is_world_process_zero():
        return None
    model_name = card_kwargs.pop("model_name", None)
    if model_name is None:
        model_name = (args.hub_model_id or Path(args.output_dir).name).split("/")[-1]
    trainer.create_model_card(model_name=model_name, **card_kwargs)
    revision = revision if revision is not None else args.hub_revision
    trainer._finish_current_push()
    team, agents = trainer_repo_ids(trainer)
    results = _upload(
        args.output_dir,
        trainer._team_description(),
        args.hub_team_layout,
        team,
        agents,
        token=token,
        revision=revision,
        commit_message=commit_message or "End of training",
        run_as_future=not blocking,
    )
    return results[0] if args.hub_team_layout == "team" else results


def push_trainer_checkpoint(trainer: MultiAgentTrainer, checkpoint_folder: str) -> None:
    """`Trainer._push_from_checkpoint` for a team, by `hub_strategy`: `"end"` nothing; `"every_save"` the team of
    the checkpoint (agents, tokenizers, cards, team.json) to the repo(s); `"checkpoint"` / `"all_checkpoints"` (team
    layout) also the whole checkpoint folder to `last-checkpoint/` / `checkpoint-N/` of the team repo. Pushes run in
    the background; a push is skipped while the previous one runs unless `hub_always_push`."""
    from transformers.trainer_utils import HubStrategy, SaveStrategy
    from transformers.utils.hub import PushInProgress

    args = trainer.args
    strategy = HubStrategy(args.hub_strategy)
    if not trainer.is_world_process_zero() or strategy == HubStrategy.END:
        return
    running = getattr(trainer, "push_in_progress", None)
    if not args.hub_always_push and running is not None and not running.is_done():
        return
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    if args.save_strategy == SaveStrategy.STEPS:
        message = f"Training in progress, step {trainer.state.global_step}"
    else:
        message = f"Training in progress, epoch {int(trainer.state.epoch or 0)}"
    team, agents = trainer_repo_ids(trainer)
    jobs = _upload(
        checkpoint_folder,
        trainer._team_description(),
        args.hub_team_layout,
        team,
        agents,
        token=args.hub_token,
        revision=args.hub_revision,
        commit_message=message,
        run_as_future=True,
    )
    if strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
        path_in_repo = "last-checkpoint" if strategy == HubStrategy.CHECKPOINT else Path(checkpoint_folder).name
        jobs.append(
            _api().upload_folder(
                repo_id=team,
                folder_path=checkpoint_folder,
                path_in_repo=path_in_repo,
                commit_message=message + ", checkpoint",
                token=args.hub_token,
                revision=args.hub_revision,
                run_as_future=True,
                ignore_patterns=["*training_args.bin"],
            )
        )
    if running is None or running.is_done():
        trainer.push_in_progress = PushInProgress(jobs)
    else:
        running.jobs.extend(jobs)


# --------------------------------------------------------------------------------------------------------- loading
def _is_agent_folder(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in ("config.json", "adapter_config.json"))


def _download(repo_or_path: str, revision: str | None, token: str | None, cache_dir: str | None) -> str:
    if os.path.isdir(repo_or_path):
        return repo_or_path
    return huggingface_hub.snapshot_download(
        repo_id=repo_or_path, revision=revision, token=token, cache_dir=cache_dir, ignore_patterns=DOWNLOAD_IGNORE
    )


def _resolve_team(
    path_or_repo: str | os.PathLike | Sequence[str | os.PathLike],
    revision: str | None,
    token: str | None,
    cache_dir: str | None,
) -> tuple[list[str], dict]:
    """Local agent folders and the team description of a team in either layout, local or on the Hub."""
    if isinstance(path_or_repo, (list, tuple)):
        folders = [_download(os.fspath(p), revision, token, cache_dir) for p in path_or_repo]
        return folders, _description_of_agents(folders)
    source = os.fspath(path_or_repo)
    if os.path.isdir(source):
        folder = source
    else:
        try:
            folder = _download(source, revision, token, cache_dir)
        except RepositoryNotFoundError as team_error:
            # not a team repo: the base id of a per-agent team ({source}-agent-1, ...)?
            try:
                first = _download(agent_repo_id(source, 1), revision, token, cache_dir)
            except RepositoryNotFoundError:
                raise RepositoryNotFoundError(
                    f"neither a team repo {source!r} nor per-agent repos {agent_repo_id(source, 1)!r}, ... were "
                    "found (private repos need token=)",
                    response=team_error.response,
                ) from team_error
            folder = first
    return _team_from_folder(folder, revision, token, cache_dir)


def _team_from_folder(folder: str, revision, token, cache_dir) -> tuple[list[str], dict]:
    description = read_team_description(folder)
    if _is_agent_folder(folder):
        hub = (description or {}).get("hub") or {}
        if hub.get("layout") == "per_agent" and len(hub.get("repo_ids", [])) > 1:
            # one agent of a per-agent team: fetch its teammates' repos
            me = int(hub.get("agent_index", 0))
            folders = [
                folder if j == me else _download(r, revision, token, cache_dir) for j, r in enumerate(hub["repo_ids"])
            ]
            return folders, description
        return [folder], description or _description_of_agents([folder])
    if description is None:
        raise FileNotFoundError(
            f"{folder} is neither a team folder (no {TEAM_FILE}) nor an agent folder (no config.json / "
            "adapter_config.json)"
        )
    folders = [os.path.join(folder, e["folder"]) for e in _agent_entries(description)]
    missing = [f for f in folders if not os.path.isdir(f)]
    if missing:
        raise FileNotFoundError(f"{TEAM_FILE} of {folder} lists agent folders that are missing: {missing}")
    return folders, description


def _description_of_agents(folders: Sequence[str]) -> dict:
    """The team description of a per-agent team: the first folder's `team.json`, else one made up from the folders."""
    for f in folders:
        d = read_team_description(f)
        if d is not None:
            n = len(_agent_entries(d))
            if n != len(folders):
                raise ValueError(f"{TEAM_FILE} of {f} describes {n} agents but {len(folders)} were given")
            return d
    return {
        "algorithm": None,
        "num_agents": len(folders),
        "agents": [{"folder": f"agent_{i + 1}", "source": str(f)} for i, f in enumerate(folders)],
    }


class AgentTeam:
    """A trained team loaded for DECENTRALIZED execution: `agents[i]` answers from its own prompt only, with its
    own tokenizer `tokenizers[i]`; nothing is shared between agents at inference.

    Attributes:
        agents: one causal LM per agent (a `PeftModel` where the saved agent was a PEFT adapter).
        tokenizers: one tokenizer per agent.
        roles: each agent's role (from `team.json`; `agent_i` when unknown).
        formatter_names: the names of the formatters that built each agent's prompts during training (callables are
            not saved: build prompts with the same formatters, e.g. `task.formatters[i](item)`).
        description: the team's `team.json` (algorithm, sources, training config, ...).
        folders: the local folder each agent was loaded from.
    """

    def __init__(
        self,
        agents: Sequence[Any],
        tokenizers: Sequence[Any],
        description: dict | None = None,
        folders: Sequence[str] | None = None,
    ):
        if len(agents) != len(tokenizers):
            raise ValueError(f"{len(agents)} agents but {len(tokenizers)} tokenizers")
        self.agents = list(agents)
        self.tokenizers = list(tokenizers)
        self.description = description or {"num_agents": len(self.agents), "agents": []}
        entries = _agent_entries({**self.description, "num_agents": len(self.agents)})
        self.roles = [e["role"] for e in entries]
        self.formatter_names = [e.get("formatter") for e in entries]
        self.folders = list(folders) if folders is not None else [None] * len(self.agents)
        self.eos_ids = [eos_token_ids(m, t) for m, t in zip(self.agents, self.tokenizers)]

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        revision: str | None = None,
        token: str | None = None,
        cache_dir: str | None = None,
        **loading_kwargs: Any,
    ) -> AgentTeam:
        """Load a team saved by a trl_marl trainer or pushed with `push_team_to_hub`, in either layout.

        Args:
            path_or_repo: a local team folder (`team.json` + `agent_i/`); a team repo id (layout `"team"`); the base
                id of a per-agent team (`{id}-agent-1`, ... are fetched); one per-agent repo (its teammates are fetched
                from the repo ids in its `team.json`); or a list of per-agent repo ids / agent folders, in agent order.
            revision: branch, tag or commit of every repo.
            token: Hub token for private repos (Authorization header only).
            cache_dir: Hub cache folder.
            loading_kwargs: passed to every agent's `from_pretrained` (`dtype`, `device_map`, ...). An agent folder with
                `adapter_config.json` is a PEFT adapter and loads through `peft.AutoPeftModelForCausalLM` (its base model
                from `base_model_name_or_path`).

        Returns:
            The team, every agent in eval mode with its tokenizer (padding token set to EOS when missing).
        """
        folders, description = _resolve_team(path_or_repo, revision, token, cache_dir)
        if token is not None:
            loading_kwargs.setdefault("token", token)
        agents, tokenizers = [], []
        for folder in folders:
            model = _load_agent_model(folder, **loading_kwargs)
            agents.append(model.eval())
            tokenizers.append(_load_agent_tokenizer(folder, token))
        return cls(agents, tokenizers, description, folders)

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    def __len__(self) -> int:
        return len(self.agents)

    def __repr__(self) -> str:
        algo = self.description.get("algorithm")
        return f"AgentTeam(num_agents={self.num_agents}, roles={self.roles}, algorithm={algo!r})"

    def to(self, device: str | Any) -> AgentTeam:
        """Move every agent to `device` (use `agents[i].to(...)` to place agents on different devices)."""
        for a in self.agents:
            a.to(device)
        return self

    @property
    def default_max_new_tokens(self) -> int | None:
        """The training `max_new_tokens` (from `team.json`), the default completion length of `generate`."""
        return (self.description.get("training_config") or {}).get("max_new_tokens")

    def generate(self, agent: int, prompt: str | list[dict], **generate_kwargs: Any) -> str:
        """Agent `agent` (0-based) answers `prompt` -- a string, or chat messages rendered with its tokenizer's chat
        template -- from that prompt only. Returns the completion text (special tokens removed).

        `generate_kwargs` go to `model.generate` (`max_new_tokens`, `do_sample`, `temperature`, `top_p`, ...);
        defaults: the model's generation config, `max_new_tokens` from training, the agent's EOS and padding tokens.
        The prompt is tokenized as in training (no special tokens for chat-template prompts; cut from the left to the
        training `max_prompt_length`, if any). Seed with `torch.manual_seed` for reproducible sampling.
        """
        import torch

        if not 0 <= agent < self.num_agents:
            raise IndexError(f"agent must be in [0, {self.num_agents}), got {agent}")
        model, tok = self.agents[agent], self.tokenizers[agent]
        text = render_prompt(prompt, tok)
        enc = tok(str(text), return_tensors="pt", add_special_tokens=not text.chat)
        limit = (self.description.get("training_config") or {}).get("max_prompt_length")
        if limit:  # as in training: long prompts keep their last `max_prompt_length` tokens
            enc = {k: v[:, -limit:] for k, v in enc.items()}
        device = next(model.parameters()).device
        kwargs: dict[str, Any] = {"pad_token_id": tok.pad_token_id, "eos_token_id": self.eos_ids[agent]}
        if self.default_max_new_tokens is not None:
            kwargs["max_new_tokens"] = self.default_max_new_tokens
        kwargs.update(generate_kwargs)
        with torch.no_grad():
            out = model.generate(
                input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device), **kwargs
            )
        return tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)

    def act(self, prompts_per_agent: Sequence[str | list[dict]], **generate_kwargs: Any) -> list[str]:
        """One decentralized step: agent i answers `prompts_per_agent[i]` (its own prompt only), in agent order.
        Returns one completion per agent; `generate_kwargs` as in `generate`."""
        if len(prompts_per_agent) != self.num_agents:
            raise ValueError(f"got {len(prompts_per_agent)} prompts for a team of {self.num_agents} agents")
        return [self.generate(i, p, **generate_kwargs) for i, p in enumerate(prompts_per_agent)]


def _load_agent_model(folder: str, **kwargs: Any):
    from transformers import AutoModelForCausalLM

    if os.path.isfile(os.path.join(folder, "adapter_config.json")):
        from peft import AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(folder, **kwargs)
    kwargs.pop("token", None)  # a local folder needs none
    return AutoModelForCausalLM.from_pretrained(folder, **kwargs)


def _load_agent_tokenizer(folder: str, token: str | None):
    from transformers import AutoTokenizer

    has_tokenizer = any(
        os.path.isfile(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )
    source = folder
    if not has_tokenizer:
        adapter = _adapter_config(folder)
        if adapter is None or not adapter.get("base_model_name_or_path"):
            raise FileNotFoundError(f"no tokenizer in {folder}")
        source = adapter["base_model_name_or_path"]
    tok = AutoTokenizer.from_pretrained(source, **({"token": token} if token and source != folder else {}))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
