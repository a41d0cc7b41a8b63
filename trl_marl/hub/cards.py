"""Model cards of a saved team: one per agent folder and one for the team (`README.md` beside `team.json`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from huggingface_hub import ModelCard

from trl_marl.hub.papers import paper_of
from trl_marl.hub.settings import (
    _HUB_ID,
    CARD_FILE,
    TEAM_FILE,
    _adapter_config,
    _agent_entries,
    agent_repo_id,
    read_team_description,
)


def _hub_model_name(source: str | None) -> str | None:
    """`source` when it looks like a Hub model id (`namespace/name`, not a local path), else None."""
    if not source or os.path.exists(source) or os.path.isabs(source):
        return None
    return source if _HUB_ID.match(source) else None


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

    paper = description.get("paper") or paper_of(description.get("algorithm")) or {}
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


def _splice(card: ModelCard, quick_start: str, team_section: str, config_section: str, base_text: str | None):
    """Replace TRL's single-model quick start with ours, add the team and training-configuration sections.
    `base_text` replaces TRL's link to a Hub base model where there is no single one (a local model, a
    heterogeneous team)."""
    text = card.text
    if base_text is not None:
        text = text.replace("[None](https://huggingface.co/None)", base_text)
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
    local = None if base else _local_name(source)
    return _splice(
        card, quick, team_section, _config_section(description), f"`{local}` (a local model)" if local else None
    )


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
    sources = list(dict.fromkeys(e.get("source") for e in entries))  # distinct, in agent order
    hub_bases = [b for b in (_hub_model_name(s) for s in sources) if b]
    base = hub_bases[0] if len(sources) == 1 and hub_bases else None
    name = model_name or (repo_id or local_path).rstrip("/").split("/")[-1]
    card = _trl_card(description, base, name, repo_id, dataset_name, _card_tags(description, tags))
    # The team root holds no config.json: it is a trl_marl team (each agent folder is a transformers / peft model).
    card.data.library_name = "trl_marl"
    if len(hub_bases) > 1:  # a heterogeneous team: every Hub base model, as the Hub's list form of `base_model`
        card.data.base_model = hub_bases
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
    base_text = None
    if base is None and sources and sources != [None]:
        cells = [_source_cell({"source": s}) for s in sources]
        local = len(cells) == 1 and cells[0].startswith("`")
        base_text = f"{cells[0]} (a local model)" if local else ", ".join(cells)
    return _splice(card, quick, team_section, _config_section(description), base_text)


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
