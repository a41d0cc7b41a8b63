"""Preference data a team trains on as given: TRL's preference format with one set of columns per agent.

A row holds one pair of joint responses: each agent's prompt, its part of the preferred (chosen) joint response and
its part of the dispreferred (rejected) one. The forms accepted (n = `num_agents`, agents numbered from 1):

| form | columns |
|---|---|
| one dataset, TRL's columns once per agent | `prompt_1`, `chosen_1`, `rejected_1`, ..., `prompt_n`, `chosen_n`, `rejected_n` |
| a list of n per-agent datasets, row j of each being pair j | TRL's `prompt`, `chosen`, `rejected` in each |
| the joint dataset `to_dataset(pairs)` writes | `agent_prompts`, `agent_chosen`, `agent_rejected` (one entry per agent) |
| pair records (`PreferencePair.to_record()`), as a Dataset or a list of dicts | `prompts`, `winner_completions`, ... |
| a one-agent team | TRL's `prompt`, `chosen`, `rejected` as they are |

Each agent's `prompt` / `chosen` / `rejected` is read as TRL's `DPOTrainer` reads a row: the prompt column may be
left out (TRL's implicit prompt, the common prefix of chosen and rejected: `trl.data_utils.maybe_extract_prompt`), and
the values may be conversational (`trl.data_utils.is_conversational`): a prompt is then a list of messages, rendered
with the agent's chat template as generation renders it, and a completion ONE assistant message, whose content is
the completion (ended with the agent's EOS, as a sampled completion). Optional `winner_reward`, `loser_reward`,
`candidate_reward_mean` columns carry scores (default 1, 0 and 0.5).

`looks_like_preference_data` tells preference data from task items (it has chosen / rejected-like columns), and
`preference_records` reads it into pair records, refusing what does not match the scheme with the columns found and
the columns expected. `resolve_inputs` decides, for a preference trainer, where the pairs and the task items come
from (docs/offline-preference.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from trl_marl.trainers.arguments import check_dataset_kind, refuse_dataset_dict
from trl_marl.trainers.preference.pair_checks import check_record

__all__ = [
    "PreferenceInputs",
    "PromptColumn",
    "looks_like_preference_data",
    "preference_records",
    "prompt_items",
    "resolve_inputs",
]

_SUFFIXED = re.compile(r"^(prompt|chosen|rejected)_(\d+)$")
_PAIR_COLUMNS = ("chosen", "rejected", "agent_chosen", "agent_rejected", "winner_completions", "loser_completions")
_JOINT_COLUMNS = ("agent_prompts", "agent_chosen", "agent_rejected")
_SCORE_DEFAULTS = {"winner_reward": 1.0, "loser_reward": 0.0, "candidate_reward_mean": 0.5}
_GUIDE = "docs/offline-preference.md"


def _scheme(n: int | None) -> str:
    agents = "prompt_1, chosen_1, rejected_1, prompt_2, chosen_2, rejected_2, ..."
    if n is not None:
        agents = ", ".join(f"prompt_{i}, chosen_{i}, rejected_{i}" for i in range(1, n + 1))
    return (
        f"one dataset with each agent's TRL columns ({agents}; a prompt_i column may be left out: TRL's implicit "
        "prompt), or a list with one TRL preference dataset (prompt, chosen, rejected) per agent, rows aligned, or "
        "the joint dataset to_dataset(pairs) writes (agent_prompts, agent_chosen, agent_rejected)"
    )


def _is_dataset(value: Any) -> bool:
    return isinstance(value, Dataset)


def _is_dataset_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_dataset(d) for d in value)


def _column_names(data: Any) -> list[str]:
    """The columns of a Dataset, or the keys of the first row of a list of dicts ([] when unknown)."""
    if _is_dataset(data):
        return list(data.column_names)
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], Mapping):
        return list(data[0])
    return []


def looks_like_preference_data(data: Any) -> bool:
    """Whether `data` is preference data rather than task items: a list of datasets (one per agent), or rows with a
    chosen / rejected-like column (`chosen`, `rejected`, `chosen_i`, `rejected_i`, `agent_chosen`, `agent_rejected`,
    `winner_completions`, `loser_completions`)."""
    if _is_dataset_list(data):
        return True
    return any(c in _PAIR_COLUMNS or (_SUFFIXED.match(c) and not c.startswith("prompt")) for c in _column_names(data))


def _rows(data: Any) -> list[dict]:
    return data.to_list() if _is_dataset(data) else [dict(r) for r in data]


def _scores(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: row[k] if row.get(k) is not None else d for k, d in _SCORE_DEFAULTS.items()}


def _completion(value: Any, where: str) -> Any:
    """A completion's text: a string as is; a conversational completion's single assistant message's content."""
    if isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        if len(value) != 1 or value[0].get("role") != "assistant":
            roles = [m.get("role") for m in value]
            raise ValueError(
                f"{where} holds the messages {roles}; a conversational completion is ONE assistant message (each "
                "agent answers in one turn)"
            )
        return value[0].get("content")
    return value


def _agent_side(row: Mapping[str, Any], keys: tuple[str | None, str, str], where: str, agent: int) -> tuple:
    """(prompt, chosen text, rejected text) of one agent, read as TRL's DPOTrainer reads a row (implicit prompt,
    conversational form)."""
    from trl.data_utils import maybe_extract_prompt

    prompt_key, chosen_key, rejected_key = keys
    example = {"chosen": row[chosen_key], "rejected": row[rejected_key]}
    for side, key in (("chosen", chosen_key), ("rejected", rejected_key)):
        if not isinstance(example[side], (str, list)):
            raise ValueError(
                f"{where}: agent {agent}'s {side} ({key}) is {example[side]!r:.80}, not a string or a list of messages"
            )
    if prompt_key is not None:
        example["prompt"] = row[prompt_key]
    example = maybe_extract_prompt(example)  # TRL: the common prefix of chosen and rejected when there is no prompt
    return (
        example["prompt"],
        _completion(example["chosen"], f"{where}: agent {agent}'s chosen ({chosen_key})"),
        _completion(example["rejected"], f"{where}: agent {agent}'s rejected ({rejected_key})"),
    )


def _per_agent_columns(cols: list[str], n: int | None, name: str) -> list[tuple[str | None, str, str]]:
    """Per agent, its (prompt or None, chosen, rejected) columns in the one-dataset forms; a clear error otherwise."""
    suffixed = {int(m.group(2)) for c in cols if (m := _SUFFIXED.match(c))}
    plain = [c for c in ("chosen", "rejected") if c in cols]
    found = f"{name} has the columns {cols}"
    if plain and suffixed:
        raise ValueError(
            f"{found}: both unsuffixed and per-agent (_i) preference columns; use one scheme: {_scheme(n)}"
        )
    if plain:
        if n != 1:
            team = f"a team of {n} agents" if n else "a team"
            raise ValueError(
                f"{found}: TRL's preference columns for ONE model, but {team} needs one set per agent: {_scheme(n)}"
            )
        if "chosen" not in cols or "rejected" not in cols:
            raise ValueError(f"{found}: a preference dataset needs both chosen and rejected")
        return [("prompt" if "prompt" in cols else None, "chosen", "rejected")]
    n = n if n is not None else max(suffixed, default=0)
    extra = sorted(i for i in suffixed if not 1 <= i <= n)
    if extra:
        raise ValueError(f"{found}: columns for agent(s) {extra}, but num_agents={n} (agents are numbered 1..{n})")
    missing = [f"{side}_{i}" for i in range(1, n + 1) for side in ("chosen", "rejected") if f"{side}_{i}" not in cols]
    if missing or n == 0:
        raise ValueError(f"{found}: {missing or 'no per-agent columns'} missing; expected {_scheme(n)}")
    return [
        (f"prompt_{i}" if f"prompt_{i}" in cols else None, f"chosen_{i}", f"rejected_{i}") for i in range(1, n + 1)
    ]


def preference_records(data: Any, num_agents: int | None, name: str = "train_dataset") -> list[dict]:
    """Pair records (`PreferencePair.to_record()`'s shape; a prompt may be chat messages) from preference data in
    any accepted form (module docstring), row by row, each checked (`pair_checks.check_record`).

    `num_agents=None` infers the team's size from the columns (not possible for TRL's one-model columns). Raises
    `ValueError` naming `name`, the columns found and the scheme expected when the data does not match."""
    refuse_dataset_dict(name, data)
    if _is_dataset_list(data):
        return _from_agent_datasets(data, num_agents, name)
    cols = _column_names(data)
    if "winner_completions" in cols or "loser_completions" in cols:
        return _from_records(data, name)
    if any(c in cols for c in _JOINT_COLUMNS):
        return _from_joint_columns(data, cols, num_agents, name)
    keys = _per_agent_columns(cols, num_agents, name)  # the one-dataset forms: prompt_i / chosen_i / rejected_i
    rows = _rows(data)
    sides = [[_agent_side(row, k, f"{name} row {j}", i + 1) for i, k in enumerate(keys)] for j, row in enumerate(rows)]
    return _checked(sides, rows, name)


def _checked(sides_per_row: list[list[tuple]], score_rows: list[Mapping], name: str) -> list[dict]:
    """Records from each row's per-agent (prompt, chosen, rejected) and its scores, each checked."""
    out = []
    for j, (sides, row) in enumerate(zip(sides_per_row, score_rows)):
        out.append(
            {
                "prompts": [s[0] for s in sides],
                "winner_completions": [s[1] for s in sides],
                "loser_completions": [s[2] for s in sides],
                **_scores(row),
            }
        )
        check_record(out[-1], f"{name} row {j}")
    return out


def _from_agent_datasets(data: Sequence[Dataset], num_agents: int | None, name: str) -> list[dict]:
    """A list of per-agent TRL preference datasets, row j of each being pair j (scores from the first)."""
    if num_agents is not None and len(data) != num_agents:
        raise ValueError(
            f"{name} is a list of {len(data)} datasets, read as one preference dataset per agent, but "
            f"num_agents={num_agents}"
        )
    sizes = [len(d) for d in data]
    if len(set(sizes)) != 1:
        raise ValueError(
            f"{name}: the per-agent datasets must have the same number of rows (row j of each is pair j), got {sizes}"
        )
    keys = []
    for i, d in enumerate(data):
        try:
            keys.append(_per_agent_columns(list(d.column_names), 1, f"{name}[{i}]")[0])
        except ValueError as exc:
            raise ValueError(f"{exc} (each dataset of the list is ONE agent's TRL preference dataset)") from None
    rows = [_rows(d) for d in data]
    sides = [
        [_agent_side(rows[i][j], keys[i], f"{name} row {j}", i + 1) for i in range(len(data))] for j in range(sizes[0])
    ]
    return _checked(sides, rows[0], name)


def _from_records(data: Any, name: str) -> list:
    """Pair records, kept whole (their `*_eos` and iterative fields too); `PreferencePair`s among them are kept."""
    records = data.to_list() if _is_dataset(data) else list(data)
    for j, rec in enumerate(records):
        if isinstance(rec, Mapping):
            check_record(rec, f"{name}[{j}]")
    return records


def _from_joint_columns(data: Any, cols: list[str], num_agents: int | None, name: str) -> list[dict]:
    """The joint dataset `to_dataset(pairs)` writes: `agent_prompts`, `agent_chosen`, `agent_rejected` lists."""
    missing = [c for c in _JOINT_COLUMNS if c not in cols]
    if missing:
        raise ValueError(
            f"{name} has the columns {cols}: the joint form needs {list(_JOINT_COLUMNS)}; missing {missing}"
        )
    rows = _rows(data)
    sides_per_row = []
    for j, row in enumerate(rows):
        n = num_agents if num_agents is not None else len(row["agent_chosen"] or [])
        if any(not isinstance(row[c], list) or len(row[c]) != n for c in _JOINT_COLUMNS):
            raise ValueError(f"{name} row {j}: {list(_JOINT_COLUMNS)} must each list one entry per agent ({n})")
        per_agent = [{f"{c}[{i}]": row[c][i] for c in _JOINT_COLUMNS} for i in range(n)]
        keys = [tuple(f"{c}[{i}]" for c in _JOINT_COLUMNS) for i in range(n)]
        sides_per_row.append(
            [_agent_side(r, k, f"{name} row {j}", i + 1) for i, (r, k) in enumerate(zip(per_agent, keys))]
        )
    return _checked(sides_per_row, rows, name)


class PromptColumn:
    """Agent i's formatter for task items made of prompts (`prompt_items`): the item's `prompt_{i+1}`."""

    def __init__(self, agent: int):
        self.column = f"prompt_{agent + 1}"

    def __call__(self, item: Mapping[str, Any]) -> Any:
        return item[self.column]

    def __repr__(self) -> str:
        return f"PromptColumn({self.column!r})"


def _prompts_of(entry: Any) -> list:
    """Every agent's prompt of a pair record or `PreferencePair` (chat messages where the pair kept them)."""
    if isinstance(entry, Mapping):
        return list(entry["prompts"])
    messages = entry.prompt_messages or [None] * len(entry.prompts)
    return [m if m else p for p, m in zip(entry.prompts, messages)]


def prompt_items(entries: Sequence[Any]) -> list[dict]:
    """The task items of pairs given without any: one item per distinct tuple of agent prompts, in order of first
    appearance, `{"prompt_1": ..., "prompt_n": ...}` (read by `PromptColumn`)."""
    items: dict[str, dict] = {}
    for entry in entries:
        prompts = _prompts_of(entry)
        key = json.dumps(prompts, sort_keys=True, default=str)
        items.setdefault(key, {f"prompt_{i + 1}": p for i, p in enumerate(prompts)})
    return list(items.values())


@dataclass
class PreferenceInputs:
    """What a preference trainer hands to `MultiAgentTrainer` and keeps for itself (`resolve_inputs`).

    Attributes:
        pairs: the given pairs (records, or `PreferencePair`s) in their order; None when the trainer collects them.
        source: where they came from, for messages (`"train_dataset"`, `"preference_pairs"`).
        train_dataset, eval_dataset, formatters, reward_func: the trainer's task items and how they are prompted and
            scored.
    """

    pairs: list | None
    source: str | None
    train_dataset: Any
    eval_dataset: Any
    formatters: Any
    reward_func: Callable | None


def no_task_reward(*completions: Any, **kwargs: Any) -> list[float]:
    """The task reward of a trainer given preference pairs and no `reward_funcs`: it trains without one, and any
    use of one (evaluation, collecting pairs) is refused here."""
    raise RuntimeError(
        "this trainer was given preference pairs and no reward_funcs, so it cannot score task items (evaluation, "
        "pair collection); pass reward_funcs= to the trainer for that"
    )


def _pair_entries(pairs: Any, num_agents: int) -> list:
    """`preference_pairs=` as a list of records / `PreferencePair`s: preference data in any accepted form, a round
    file's content (`{"iteration", "num_pairs", "pairs"}`) or an iterable of records / pairs."""
    refuse_dataset_dict("preference_pairs", pairs)
    if isinstance(pairs, Mapping) and "pairs" in pairs:
        pairs = pairs["pairs"]
    if looks_like_preference_data(pairs):
        return preference_records(pairs, num_agents, "preference_pairs")
    if isinstance(pairs, (str, bytes, Mapping)) or not hasattr(pairs, "__iter__"):
        raise TypeError(
            "preference_pairs must be preference data (a datasets.Dataset in TRL's format, one set of columns per "
            "agent, or a list of per-agent datasets), a list of PreferencePair or of records (dicts), or a round "
            f"file's content; got {type(pairs).__name__}"
        )
    return list(pairs)


def resolve_inputs(
    trainer: str,
    num_agents: int,
    train_dataset: Any,
    eval_dataset: Any,
    preference_pairs: Any,
    reward_func: Any,
    formatters: Any,
    collects_every_round: bool = False,
    centralized: bool = False,
    needs_pairs: bool = True,
) -> PreferenceInputs:
    """Where a preference trainer's pairs and task items come from, decided before any model loads.

    * `train_dataset` holds preference data (`looks_like_preference_data`): the pairs are its rows, exactly.
    * else `preference_pairs` (preference data, records, `PreferencePair`s or a round file's content): those pairs;
      `train_dataset` holds the task items (or is None).
    * else the trainer collects pairs from the task items with `reward_funcs` (required).

    Given pairs without task items, the task items are the pairs' distinct prompts (`prompt_items`, each agent's read
    by `PromptColumn`; `formatters=` is refused) and a preference `eval_dataset` is read the same way. Given pairs,
    `reward_funcs` is optional: it scores evaluation (`eval_dataset` needs it). `needs_pairs=False` (a fitted reward
    model was given): no pairs are collected, and `reward_funcs` is left to the trainer's own check. Every mismatch is a `ValueError`
    naming the argument and the route that works."""
    for name, data in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        check_dataset_kind(name, data)
    in_train = looks_like_preference_data(train_dataset)
    given = in_train or preference_pairs is not None
    if collects_every_round and given:
        arg = "train_dataset holds preference data" if in_train else "preference_pairs is given"
        raise ValueError(
            f"{trainer} collects its preference pairs from the task items every round, but {arg}: pass task items "
            "as train_dataset, or train on the pairs you have with MADPOTrainer / MARLHFTrainer"
        )
    if in_train and preference_pairs is not None:
        raise ValueError(
            "train_dataset holds preference data and preference_pairs is given too: pass the pairs one way (the "
            "task items for a preference_pairs= run go in train_dataset)"
        )
    if not given:
        if reward_func is None and needs_pairs:
            raise ValueError(
                f"reward_funcs is required: {trainer} collects preference pairs from the task items in train_dataset "
                "and scores them with it. To train on preference pairs you already have, pass them as "
                f"train_dataset (TRL's preference format, one set of columns per agent; see {_GUIDE})"
            )
        return PreferenceInputs(None, None, train_dataset, eval_dataset, formatters, reward_func)
    source = "train_dataset" if in_train else "preference_pairs"
    per_pair = 1 if centralized else num_agents  # centralized: ONE model's tagged joint completion per side
    if in_train:
        pairs = preference_records(train_dataset, per_pair, "train_dataset")
        train_dataset = None
    else:
        pairs = _pair_entries(preference_pairs, per_pair)
    if not pairs:
        raise ValueError(
            f"{source} is empty: there is no preference pair to train on. Pass at least one pair, or leave "
            "preference_pairs unset (None) to collect pairs from the task items in train_dataset with reward_funcs"
        )
    for k, entry in enumerate(pairs):  # before any model loads: a record that cannot become a pair
        if isinstance(entry, Mapping):
            check_record(entry, f"{source}[{k}]", per_pair)
    if train_dataset is None:
        if centralized:
            raise ValueError(
                "collaboration_mode='centralized' needs task items (train_dataset) to prompt its one model; pairs "
                "given without them are per-agent pairs: use collaboration_mode='decentralized'"
            )
        if formatters is not None:
            raise ValueError(
                f"formatters= turns task items into prompts, but the pairs in {source} carry every agent's prompt "
                "and there are no task items: leave formatters unset, or pass task items as train_dataset and the "
                "pairs as preference_pairs="
            )
        train_dataset = prompt_items(pairs)
        formatters = [PromptColumn(i) for i in range(num_agents)]
        if looks_like_preference_data(eval_dataset):
            eval_dataset = prompt_items(preference_records(eval_dataset, num_agents, "eval_dataset"))
        elif eval_dataset is not None and len(eval_dataset):
            columns = [f"prompt_{i + 1}" for i in range(num_agents)]
            if not all(c in _column_names(eval_dataset) for c in columns):
                raise ValueError(
                    f"eval_dataset has the columns {_column_names(eval_dataset)}, but with the pairs' prompts as the "
                    f"task items evaluation reads each agent's prompt from {columns} (or a preference dataset in the "
                    "training data's scheme); to evaluate on task items with formatters, pass the task items as "
                    "train_dataset and the pairs as preference_pairs="
                )
    if reward_func is None:
        if eval_dataset is not None:
            raise ValueError(
                "eval_dataset is given but reward_funcs is not: evaluation samples the agents on the eval items and "
                "scores them with reward_funcs; pass reward_funcs=, or leave eval_dataset unset"
            )
        reward_func = no_task_reward
    return PreferenceInputs(pairs, source, train_dataset, eval_dataset, formatters, reward_func)
