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

A pair record has exactly the JSON shape of the spec (`to_record()`); the token ids of the winner's and loser's
completions are kept beside it in memory for training, so nothing is re-tokenized within a run.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["PAIR_SELECTIONS", "PreferencePair", "select_pairs", "select_aligned_pairs", "pairs_from_rollout"]

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

    def to_record(self) -> dict:
        """The spec's JSON record (the iterative fields only when set)."""
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
        return rec


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
