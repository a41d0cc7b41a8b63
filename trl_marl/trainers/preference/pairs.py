"""Preference pairs between JOINT responses, built from task items by the trainers themselves.

For each task item every agent samples K candidates (`preference_num_candidates`) to its own prompt — one batched
`generate` call per agent for the whole batch — and the candidates with the same index form one joint response. The
oracle (the task reward after `reward_processor`, one batched call) scores each joint response. Of any two joint
responses with different scores, the higher is the winner, the other the loser; ties are dropped.
`pair_selection` and `preference_pairs_per_sample` decide which pairs each item keeps:

| `pair_selection` | kept pairs |
|---|---|
| `"reward_gap"` (default) | the largest score gaps first, at most `preference_pairs_per_sample` |
| `"all"` | every non-tied pair (`preference_pairs_per_sample` must be None) |
| `"random"` | a uniformly random subset of `preference_pairs_per_sample` |
| `"comparator_reward"` | (iterative trainers) by the comparator's score, then the gap, descending |

A pair record has the JSON shape of the spec (`to_record()`), plus `winner_eos` / `loser_eos` where known: per
agent, the text of the EOS token the completion ended with, or null when it was cut at `max_completion_length` (so
that a re-tokenized completion scores exactly the tokens that were generated). The token ids of the winner's and loser's
completions are kept beside it in memory for training, so nothing is re-tokenized within a run.

`to_dataset()` / `PreferencePair.from_dataset()` convert pairs to and from TRL's standard preference format (a
`datasets.Dataset` with `prompt`, `chosen`, `rejected`): over the joint transcript (what the joint reward model and
`trl reward` read) or for one agent's side (what `DPOTrainer` reads); `from_dataset` also reads every form of
preference data a trainer takes as `train_dataset` (`preference_data.py`). See docs/preference-pairs.md.
`PreferencePair.from_record` turns a record (from a round file, a user's file or a `datasets.Dataset` row) back into
a training pair with each agent's tokenizer; `as_preference_pairs` accepts records, pairs or a Dataset of records.
Every pair given from outside is checked (`pair_checks.py`).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trl_marl.data_types.text import valid_text, valid_texts
from trl_marl.trainers.preference.pair_checks import check_record, record_problem, shape_problem
from trl_marl.trainers.preference.preference_data import preference_records

__all__ = [
    "PAIR_SELECTIONS",
    "PreferencePair",
    "select_pairs",
    "select_aligned_pairs",
    "pairs_from_rollout",
    "pairs_per_item",
    "to_dataset",
    "joint_prompt_text",
    "joint_response_text",
    "as_preference_pairs",
    "cut_completions",
]

PAIR_SELECTIONS = ("reward_gap", "all", "random", "comparator_reward")


@dataclass
class PreferencePair:
    """Two joint responses to one item: the winner and the loser, one entry per agent in every list."""

    prompts: list[str]
    winner_completions: list[str]
    loser_completions: list[str]
    winner_reward: float
    loser_reward: float
    candidate_reward_mean: float
    prompt_ids: list[torch.Tensor] = field(default_factory=list, repr=False)
    winner_ids: list[torch.Tensor] = field(default_factory=list, repr=False)
    loser_ids: list[torch.Tensor] = field(default_factory=list, repr=False)
    raw_rewards: list[float] | None = None
    target_raw_reward: float | None = None
    comparator_raw_reward: float | None = None
    # per agent, the formatter's chat messages when the prompt came from a chat template (else None)
    prompt_messages: list[list[dict] | None] | None = field(default=None, repr=False)
    # per agent, the reference model's sequence log-probs of the winner's / loser's completion (MADPO with a
    # reference model; TRL's `ref_chosen_logps` / `ref_rejected_logps`)
    ref_chosen_logps: list[float] | None = field(default=None, repr=False)
    ref_rejected_logps: list[float] | None = field(default=None, repr=False)
    winner_eos: list[str | None] | None = None  # per agent: the EOS token's text it ended with, None when cut
    loser_eos: list[str | None] | None = None

    def to_record(self) -> dict:
        """The spec's JSON record (the iterative fields and `winner_eos` / `loser_eos` only when set)."""
        rec = {
            "prompts": list(self.prompts),
            "winner_completions": list(self.winner_completions),
            "loser_completions": list(self.loser_completions),
            "winner_reward": float(self.winner_reward),
            "loser_reward": float(self.loser_reward),
            "candidate_reward_mean": float(self.candidate_reward_mean),
        }
        if self.raw_rewards is not None:
            rec["raw_rewards"] = [float(r) for r in self.raw_rewards]
            rec["target_raw_reward"] = self.target_raw_reward
            rec["comparator_raw_reward"] = self.comparator_raw_reward
        if self.winner_eos is not None and self.loser_eos is not None:
            rec["winner_eos"], rec["loser_eos"] = list(self.winner_eos), list(self.loser_eos)
        return rec

    @classmethod
    def from_dataset(cls, dataset, trainer=None) -> list[PreferencePair]:
        """Pairs from preference data in TRL's format: the inverse of `to_dataset()` (lossless for the texts and
        scores), and any form a preference trainer takes as `train_dataset`.

        `dataset` is one dataset with each agent's TRL columns (`prompt_1`, `chosen_1`, `rejected_1`, ...), a list
        with one TRL preference dataset per agent (rows aligned: row j of every dataset is pair j), or the JOINT
        dataset `to_dataset(pairs)` writes (its `agent_prompts` / `agent_chosen` / `agent_rejected` columns hold
        every agent's side); TRL's implicit-prompt and conversational forms are read as TRL reads them
        (`trl_marl.trainers.preference.preference_data`). Conversational prompts keep their messages in
        `prompt_messages`; the prompt text is then the message contents (or, with `trainer`, agent i's chat
        template applied, as generation renders it). Every row is checked (`pair_checks`).

        With `trainer` (any trl_marl trainer) the token ids are filled in by re-tokenizing the text the way a
        round file is re-read (`PreferencePair.from_record` with the trainer's tokenizers), so the pairs can be
        trained on; without it they hold text only (enough for the joint reward model).
        """
        records = preference_records(dataset, getattr(trainer, "num_agents", None), "dataset")
        if trainer is None:
            return [_text_pair(rec) for rec in records]
        make = getattr(trainer, "pair_from_record", None)
        if make is None:
            args = trainer.args
            chat = list(trainer._chat_prompts)
            return [
                cls.from_record(
                    r, trainer.tokenizers, args.max_completion_length, trainer.eos_ids, args.max_prompt_length, chat
                )
                for r in records
            ]
        return [make(rec) for rec in records]

    @classmethod
    def from_record(
        cls,
        record: dict,
        tokenizers: Sequence[Any],
        max_completion_length: int,
        eos_ids: Sequence[Sequence[int]] | None = None,
        max_prompt_length: int | None = None,
        chat: Sequence[bool | None] | None = None,
    ) -> PreferencePair:
        """A training pair from a record (`to_record()`'s shape), re-tokenized with each agent's tokenizer as the
        trainers tokenize their own samples.

        Args:
            record: `prompts`, `winner_completions`, `loser_completions` (one entry per agent), `winner_reward`,
                `loser_reward`; optional `candidate_reward_mean` (default: the mean of the two rewards), the
                iterative fields and `winner_eos` / `loser_eos`. A prompt is the rendered prompt text, or a list of
                chat messages (rendered with the agent's chat template, generation prompt added).
            tokenizers: one tokenizer per agent (the trainer's `tokenizers`).
            max_completion_length: completions are cut to it (a completion that fills it without `*_eos` is taken as
                cut).
            eos_ids: per agent, the ids that end a completion (the trainer's `eos_ids`; default: each tokenizer's
                `eos_token_id`).
            max_prompt_length: prompts keep their last `max_prompt_length` tokens (as generation does).
            chat: per agent, whether its prompts are chat-template text (tokenized without special tokens); None
                infers it: no special tokens when the text already starts with the tokenizer's BOS.
        """
        n = len(tokenizers)
        problem = shape_problem(record, n) or record_problem(record)
        if problem is not None:
            raise ValueError(problem)
        from trl_marl.data_types.text import UNKNOWN_EOS
        from trl_marl.models.loading import completion_token_ids
        from trl_marl.rollout.prompts import render_prompt

        eos_ids = eos_ids or [[t.eos_token_id] if t.eos_token_id is not None else [] for t in tokenizers]
        chat = list(chat) if chat is not None else [None] * n
        prompts, prompt_ids = [], []
        for i, (tok, prompt) in enumerate(zip(tokenizers, record["prompts"])):
            text = render_prompt(prompt, tok)
            is_chat = getattr(text, "chat", False) or chat[i]
            if is_chat is None:
                bos = getattr(tok, "bos_token", None)
                is_chat = bool(bos) and str(text).startswith(bos)
            ids = tok(valid_text(str(text)), add_special_tokens=not is_chat)["input_ids"]
            if max_prompt_length is not None:
                ids = ids[-max_prompt_length:]
            prompts.append(str(text))
            prompt_ids.append(torch.tensor(ids, dtype=torch.long))

        def completions(key: str) -> list[torch.Tensor]:
            ends = record.get(key.replace("_completions", "_eos"))
            return [
                completion_token_ids(
                    tokenizers[i], text, eos_ids[i], max_completion_length, UNKNOWN_EOS if ends is None else ends[i]
                )
                for i, text in enumerate(record[key])
            ]

        w, lo = float(record["winner_reward"]), float(record["loser_reward"])
        messages = [p if _is_messages(p) else None for p in record["prompts"]]
        return cls(
            prompts=prompts,
            winner_completions=[str(c) for c in record["winner_completions"]],
            loser_completions=[str(c) for c in record["loser_completions"]],
            winner_reward=w,
            loser_reward=lo,
            candidate_reward_mean=float(record.get("candidate_reward_mean", (w + lo) / 2)),
            prompt_ids=prompt_ids,
            winner_ids=completions("winner_completions"),
            loser_ids=completions("loser_completions"),
            raw_rewards=record.get("raw_rewards"),
            target_raw_reward=record.get("target_raw_reward"),
            comparator_raw_reward=record.get("comparator_raw_reward"),
            winner_eos=record.get("winner_eos"),
            loser_eos=record.get("loser_eos"),
            prompt_messages=messages if any(messages) else None,
        )


def as_preference_pairs(
    pairs: Any, make_pair: Callable[[dict], PreferencePair], source: str = "preference_pairs"
) -> list[PreferencePair]:
    """`preference_pairs=` as a list of `PreferencePair`: accepts `PreferencePair`s (kept as they are), records
    (dicts of `PreferencePair.to_record()`'s shape, converted by `make_pair`), a `datasets.Dataset` of records, or
    a round file's content (`{"iteration", "num_pairs", "pairs"}`). Every pair is checked (`pair_checks`): a
    `ValueError` names `source` and the pair's index."""
    if isinstance(pairs, dict) and "pairs" in pairs:
        pairs = pairs["pairs"]
    if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__iter__"):
        raise TypeError(
            "preference_pairs must be a list of PreferencePair or of records (dicts), or a datasets.Dataset of "
            f"records; got {type(pairs).__name__}"
        )
    out = []
    for k, p in enumerate(pairs):
        where = f"{source}[{k}]"
        if isinstance(p, PreferencePair):
            check_record(_checked_fields(p), where)
            out.append(p if p.prompt_ids else _named(make_pair, p.to_record(), where))
        elif isinstance(p, dict):
            check_record(p, where)
            out.append(_named(make_pair, p, where))
        else:
            raise TypeError(f"{where} must be a PreferencePair or a record (dict), got {type(p).__name__}")
    return out


def cut_completions(pairs: Sequence[PreferencePair], tokenizers: Sequence[Any], max_completion_length: int) -> int:
    """How many completions of `pairs` (each agent's winner and loser) lost tokens to `max_completion_length` when
    their text was tokenized: the text's tokens (plus the EOS the ids end with, if any) are more than the limit.
    Only completions that fill the limit are tokenized again."""
    cut = 0
    for p in pairs:
        sides = ((p.winner_completions, p.winner_ids, p.winner_eos), (p.loser_completions, p.loser_ids, p.loser_eos))
        for texts, ids_of, ends in sides:
            for i, (text, ids) in enumerate(zip(texts, ids_of)):
                if len(ids) < max_completion_length:
                    continue
                full = len(tokenizers[i](str(text), add_special_tokens=False)["input_ids"])
                with_eos = ends is None or ends[i] is not None  # unknown ends are finished, given an EOS
                cut += full + int(with_eos) > max_completion_length
    return cut


def _checked_fields(pair: PreferencePair) -> dict:
    """A pair's fields as given (no conversion), for `check_record`."""
    return {
        "prompts": pair.prompts,
        "winner_completions": pair.winner_completions,
        "loser_completions": pair.loser_completions,
        "winner_reward": pair.winner_reward,
        "loser_reward": pair.loser_reward,
        "candidate_reward_mean": pair.candidate_reward_mean,
    }


def _named(make_pair: Callable[[dict], PreferencePair], record: dict, where: str) -> PreferencePair:
    """`make_pair(record)`, its `ValueError` prefixed with where the record came from."""
    try:
        return make_pair(record)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def select_pairs(
    scores: Sequence[float],
    selection: str = "reward_gap",
    limit: int | None = None,
    rng: random.Random | None = None,
) -> list[tuple[int, int]]:
    """Choose (winner, loser) candidate indices among one item's joint responses.

    Every unordered pair of candidates with different scores is a candidate pair (ties dropped). `"reward_gap"`
    sorts them by gap, largest first (stable: lower indices first among equal gaps) and keeps `limit`; `"all"` keeps
    all; `"random"` keeps a random subset of `limit` (drawn from `rng`).
    """
    if selection not in ("reward_gap", "all", "random"):
        raise ValueError(f"pair_selection must be one of {list(PAIR_SELECTIONS[:3])} here, got {selection!r}")
    pairs = []
    for a, b in itertools.combinations(range(len(scores)), 2):
        if scores[a] == scores[b]:
            continue
        w, lo = (a, b) if scores[a] > scores[b] else (b, a)
        pairs.append((w, lo))
    if selection == "reward_gap":
        pairs.sort(key=lambda p: -(scores[p[0]] - scores[p[1]]))
        return pairs if limit is None else pairs[:limit]
    if selection == "random":
        if limit is None or limit >= len(pairs):
            return pairs
        return sorted((rng or random.Random(0)).sample(pairs, limit))
    return pairs


def pairs_from_rollout(
    rollout,
    selection: str,
    limit: int | None,
    rng: random.Random | Callable[[int], random.Random],
    formatters=None,
) -> list[PreferencePair]:
    """Preference pairs from a single-turn aligned rollout (one node per item, K joint actions), item after item
    (`pairs_per_item`, flattened)."""
    return [p for pairs in pairs_per_item(rollout, selection, limit, rng, formatters) for p in pairs]


def pairs_per_item(
    rollout,
    selection: str,
    limit: int | None,
    rng: random.Random | Callable[[int], random.Random],
    formatters=None,
) -> list[list[PreferencePair]]:
    """Per node of a single-turn aligned rollout (one node per item, K joint actions), in node order: the pairs it
    keeps (`select_pairs`). `rng` (for `"random"`) is one generator for every item, or a function from the item's
    index in `rollout.items` to that item's own generator (the trainers key it by the item, `rng.keyed_rng`, so
    the choice does not depend on the process that makes it). With the agents' `formatters`, chat-message prompts
    are kept in `prompt_messages` (for the conversational export)."""
    out: list[list[PreferencePair]] = []
    n = rollout.num_agents
    for node in rollout.nodes:
        scores = node.rewards.tolist() if node.rewards.ndim == 1 else node.rewards.mean(dim=1).tolist()
        mean = sum(scores) / len(scores)
        messages = None
        if formatters is not None:
            item = rollout.items[node.item]
            messages = [_messages_or_none(formatters[i](item)) for i in range(n)]
            messages = messages if any(messages) else None
        kept = []
        for w, lo in select_pairs(scores, selection, limit, rng(node.item) if callable(rng) else rng):
            ws = [rollout.samples[node.samples[i][w]] for i in range(n)]
            ls = [rollout.samples[node.samples[i][lo]] for i in range(n)]
            kept.append(
                PreferencePair(
                    prompts=[s.prompt for s in ws],
                    winner_completions=[s.completion for s in ws],
                    loser_completions=[s.completion for s in ls],
                    winner_reward=scores[w],
                    loser_reward=scores[lo],
                    candidate_reward_mean=mean,
                    prompt_ids=[s.prompt_ids for s in ws],
                    winner_ids=[s.completion_ids for s in ws],
                    loser_ids=[s.completion_ids for s in ls],
                    prompt_messages=messages,
                )
            )
        out.append(kept)
    return out


def _messages_or_none(formatted) -> list[dict] | None:
    if isinstance(formatted, (list, tuple)) and formatted and all(isinstance(m, dict) for m in formatted):
        return [dict(m) for m in formatted]
    return None


def select_aligned_pairs(
    target_scores: Sequence[float],
    comparator_scores: Sequence[float | None],
    selection: str = "comparator_reward",
    limit: int | None = None,
    rng: random.Random | None = None,
) -> list[tuple[int, bool]]:
    """Index-aligned comparisons of iterative training: candidate c of the current agents against candidate c of the
    comparator, for every c present on both sides (`None` = a comparator candidate that was dropped). Ties are
    dropped; either side may win. Returns `(c, target_wins)` pairs:

    | `selection` | order / subset |
    |---|---|
    | `"comparator_reward"` | comparator score, then gap, both descending (no assumption that the comparator wins) |
    | `"reward_gap"` | gap descending |
    | `"random"` | a random subset of `limit` |
    | `"all"` | every non-tied index |

    `limit` caps the number kept (not with `"all"`).
    """
    found = []
    for c in range(min(len(target_scores), len(comparator_scores))):
        comp = comparator_scores[c]
        if comp is None or target_scores[c] == comp:
            continue
        found.append((c, target_scores[c] > comp, abs(target_scores[c] - comp), comp))
    if selection == "comparator_reward":
        found.sort(key=lambda f: (-f[3], -f[2], f[0]))
    elif selection == "reward_gap":
        found.sort(key=lambda f: (-f[2], f[0]))
    elif selection == "random":
        if limit is not None and limit < len(found):
            found = sorted((rng or random.Random(0)).sample(found, limit))
    elif selection != "all":
        raise ValueError(f"pair_selection must be one of {list(PAIR_SELECTIONS)}, got {selection!r}")
    if limit is not None and selection != "all":
        found = found[:limit]
    return [(c, wins) for c, wins, _, _ in found]


# ---------------------------------------------------------------- TRL's preference format
JOINT_HEADER = "Joint multi-agent response"


def joint_prompt_text(prompts: Sequence[str]) -> str:
    """The prompt half of the joint transcript: every agent's prompt, labelled, after a header line."""
    head = "\n".join(f"Agent {i + 1} prompt:\n{p}" for i, p in enumerate(prompts))
    return f"{JOINT_HEADER}\n{head}\n"


def joint_response_text(responses: Sequence[str]) -> str:
    """The response half of the joint transcript: every agent's response, labelled. The responses come last, next
    to the final token a reward model's scalar head reads."""
    return "\n".join(f"Agent {i + 1} response:\n{r}" for i, r in enumerate(responses))


def _plain_prompt(pair: PreferencePair, i: int) -> str:
    """Agent i's prompt without chat-template markup: its messages' contents when known, else the prompt text."""
    msgs = pair.prompt_messages[i] if pair.prompt_messages else None
    if msgs:
        return "\n".join(str(m.get("content", "")) for m in msgs)
    return str(pair.prompts[i])


def _is_chat(pair: PreferencePair) -> bool:
    return bool(pair.prompt_messages) and all(m for m in pair.prompt_messages)


def to_dataset(pairs: Sequence[PreferencePair], agent: int | None = None, conversational: bool | None = None):
    """Pairs as a `datasets.Dataset` in TRL's standard preference format (`prompt`, `chosen`, `rejected`).

    * `agent=None`: the JOINT transcript, what the joint reward model reads (`trl reward` / `RewardTrainer` can fit
      it as is): `prompt` = every agent's prompt, `chosen` / `rejected` = every agent's response of the winning /
      losing joint response. Extra columns keep each agent's side (`agent_prompts`, `agent_chosen`,
      `agent_rejected`) so that `PreferencePair.from_dataset` restores the pairs exactly.
    * `agent=i`: agent i's side only (`DPOTrainer` trains agent i on it): its prompt, its winning and losing
      response.

    `conversational=None` picks the conversational form (`prompt` a list of messages, `chosen` / `rejected` one
    assistant message) when every agent's prompt came from a chat template, else plain text; `True` / `False`
    forces one. Every row also carries `winner_reward`, `loser_reward` and `candidate_reward_mean` (TRL's
    trainers drop unused columns). Invalid unicode in a text (a lone surrogate, which Arrow cannot store) is written
    as U+FFFD (`valid_text`); valid text as it is.
    """
    from datasets import Dataset

    pairs = list(pairs)
    if conversational is None:
        conversational = bool(pairs) and all(_is_chat(p) for p in pairs)
    rows: dict[str, list] = {"prompt": [], "chosen": [], "rejected": []}
    if agent is None:
        rows.update(agent_prompts=[], agent_chosen=[], agent_rejected=[])
    rows.update(winner_reward=[], loser_reward=[], candidate_reward_mean=[])
    for p in pairs:
        if agent is None:
            if conversational:
                prompt = [
                    {
                        "role": "user",
                        "content": joint_prompt_text([_plain_prompt(p, i) for i in range(len(p.prompts))]),
                    }
                ]
            else:
                prompt = joint_prompt_text(p.prompts)
            chosen, rejected = joint_response_text(p.winner_completions), joint_response_text(p.loser_completions)
            rows["agent_prompts"].append([str(x) for x in p.prompts])
            rows["agent_chosen"].append(list(p.winner_completions))
            rows["agent_rejected"].append(list(p.loser_completions))
        else:
            if not 0 <= agent < len(p.prompts):
                raise ValueError(
                    f"agent must be in [0, {len(p.prompts) - 1}] (or None for the joint dataset), got {agent}"
                )
            if conversational:
                msgs = p.prompt_messages[agent] if p.prompt_messages else None
                prompt = [dict(m) for m in msgs] if msgs else [{"role": "user", "content": str(p.prompts[agent])}]
            else:
                prompt = str(p.prompts[agent])
            chosen, rejected = p.winner_completions[agent], p.loser_completions[agent]
        if conversational:
            chosen = [{"role": "assistant", "content": chosen}]
            rejected = [{"role": "assistant", "content": rejected}]
        rows["prompt"].append(prompt)
        rows["chosen"].append(chosen)
        rows["rejected"].append(rejected)
        rows["winner_reward"].append(float(p.winner_reward))
        rows["loser_reward"].append(float(p.loser_reward))
        rows["candidate_reward_mean"].append(float(p.candidate_reward_mean))
    return Dataset.from_dict(valid_texts(rows))


def _text(value) -> str:
    """A plain-text cell, or the contents of a conversational cell's messages."""
    if isinstance(value, list):
        return "\n".join(str(m.get("content", "")) for m in value)
    return str(value)


def _text_pair(rec: dict) -> PreferencePair:
    """A text-only pair from a record (`preference_records`): chat-message prompts as their contents, the messages
    kept in `prompt_messages`."""
    messages = [p if _is_messages(p) else None for p in rec["prompts"]]
    return PreferencePair(
        prompts=[_text(p) for p in rec["prompts"]],
        winner_completions=list(rec["winner_completions"]),
        loser_completions=list(rec["loser_completions"]),
        winner_reward=rec["winner_reward"],
        loser_reward=rec["loser_reward"],
        candidate_reward_mean=rec["candidate_reward_mean"],
        prompt_messages=messages if any(messages) else None,
    )


def _is_messages(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)
