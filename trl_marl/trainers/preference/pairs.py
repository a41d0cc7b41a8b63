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
agent, the text of the EOS token the completion ended with, or null when it was cut at `max_new_tokens` (so that a
re-tokenized completion scores exactly the tokens that were generated). The token ids of the winner's and loser's
completions are kept beside it in memory for training, so nothing is re-tokenized within a run.
`PreferencePair.from_record` turns a record (from a round file, a user's file or a `datasets.Dataset` row) back into
a training pair with each agent's tokenizer; `as_preference_pairs` accepts records, pairs or a Dataset of records.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "PAIR_SELECTIONS",
    "PreferencePair",
    "select_pairs",
    "select_aligned_pairs",
    "pairs_from_rollout",
    "as_preference_pairs",
]

RECORD_FIELDS = ("prompts", "winner_completions", "loser_completions", "winner_reward", "loser_reward")

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
    def from_record(
        cls,
        record: dict,
        tokenizers: Sequence[Any],
        max_new_tokens: int,
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
            max_new_tokens: completions are cut to it (a completion that fills it without `*_eos` is taken as cut).
            eos_ids: per agent, the ids that end a completion (the trainer's `eos_ids`; default: each tokenizer's
                `eos_token_id`).
            max_prompt_length: prompts keep their last `max_prompt_length` tokens (as generation does).
            chat: per agent, whether its prompts are chat-template text (tokenized without special tokens); None
                infers it: no special tokens when the text already starts with the tokenizer's BOS.
        """
        n = len(tokenizers)
        missing = [k for k in RECORD_FIELDS if k not in record]
        if missing:
            raise ValueError(f"a preference record needs the fields {list(RECORD_FIELDS)}; missing {missing}")
        for key in ("prompts", "winner_completions", "loser_completions"):
            value = record[key]
            if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != n:
                raise ValueError(f"record[{key!r}] must be a list with one entry per agent ({n}), got {value!r:.200}")
        from ...team import UNKNOWN_EOS, completion_token_ids, render_prompt

        eos_ids = eos_ids or [[t.eos_token_id] if t.eos_token_id is not None else [] for t in tokenizers]
        chat = list(chat) if chat is not None else [None] * n
        prompts, prompt_ids = [], []
        for i, (tok, prompt) in enumerate(zip(tokenizers, record["prompts"])):
            text = render_prompt(prompt, tok)
            is_chat = getattr(text, "chat", False) or chat[i]
            if is_chat is None:
                bos = getattr(tok, "bos_token", None)
                is_chat = bool(bos) and str(text).startswith(bos)
            ids = tok(str(text), add_special_tokens=not is_chat)["input_ids"]
            if max_prompt_length is not None:
                ids = ids[-max_prompt_length:]
            prompts.append(str(text))
            prompt_ids.append(torch.tensor(ids, dtype=torch.long))

        def completions(key: str) -> list[torch.Tensor]:
            ends = record.get(key.replace("_completions", "_eos"))
            return [
                completion_token_ids(
                    tokenizers[i], text, eos_ids[i], max_new_tokens, UNKNOWN_EOS if ends is None else ends[i]
                )
                for i, text in enumerate(record[key])
            ]

        w, lo = float(record["winner_reward"]), float(record["loser_reward"])
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
        )


def as_preference_pairs(pairs: Any, make_pair: Callable[[dict], PreferencePair]) -> list[PreferencePair]:
    """`preference_pairs=` as a list of `PreferencePair`: accepts `PreferencePair`s (kept as they are), records
    (dicts of `PreferencePair.to_record()`'s shape, converted by `make_pair`), a `datasets.Dataset` of records, or
    a round file's content (`{"iteration", "num_pairs", "pairs"}`)."""
    if isinstance(pairs, dict) and "pairs" in pairs:
        pairs = pairs["pairs"]
    if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__iter__"):
        raise TypeError(
            "preference_pairs must be a list of PreferencePair or of records (dicts), or a datasets.Dataset of "
            f"records; got {type(pairs).__name__}"
        )
    out = []
    for k, p in enumerate(pairs):
        if isinstance(p, PreferencePair):
            out.append(p if p.prompt_ids else make_pair(p.to_record()))
        elif isinstance(p, dict):
            out.append(make_pair(p))
        else:
            raise TypeError(
                f"preference_pairs[{k}] must be a PreferencePair or a record (dict), got {type(p).__name__}"
            )
    return out


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


def pairs_from_rollout(rollout, selection: str, limit: int | None, rng: random.Random) -> list[PreferencePair]:
    """Preference pairs from a single-turn aligned rollout (one node per item, K joint actions)."""
    out: list[PreferencePair] = []
    n = rollout.num_agents
    for node in rollout.nodes:
        scores = node.rewards.tolist() if node.rewards.ndim == 1 else node.rewards.mean(dim=1).tolist()
        mean = sum(scores) / len(scores)
        for w, lo in select_pairs(scores, selection, limit, rng):
            ws = [rollout.samples[node.samples[i][w]] for i in range(n)]
            ls = [rollout.samples[node.samples[i][lo]] for i in range(n)]
            out.append(
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
                )
            )
    return out


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
