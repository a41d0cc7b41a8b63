"""Checks of preference pairs before anything trains on them (the table in docs/preference-pairs.md#checks).

Two kinds of problem, whatever the source (pairs and records given by the user, preference datasets, round files,
a comparator's candidates):

* **Refused** (`record_problem` / `check_record`, a `ValueError` naming the source, the pair and the field): a
  completion that is not a string, a prompt that is neither a string nor a list of chat messages, a reward that is
  not a finite number, a winner whose recorded reward is below the loser's (the label contradicts the scores: one of
  them is wrong, and which one cannot be told).
* **Dropped, with a count in the log** (`unusable_reason` / `drop_unusable` / `usable_pairs`): a pair whose chosen equals its rejected
  for every agent (its margin is 0 by construction: no signal, yet Adam would still move the weights on its rounding
  noise), and a pair with an empty completion that no trainer recorded as an immediate stop (an empty string in a
  dataset is a missing answer, not an answer).

Equal recorded rewards are accepted: the order of the pair is the preference label, the scores are information.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

import torch

__all__ = [
    "RECORD_FIELDS",
    "DROP_REASONS",
    "shape_problem",
    "record_problem",
    "check_record",
    "unusable_reason",
    "drop_unusable",
    "usable_pairs",
]

logger = logging.getLogger(__name__)

# the fields every pair record has (`PreferencePair.to_record()`; `candidate_reward_mean` is optional)
RECORD_FIELDS = ("prompts", "winner_completions", "loser_completions", "winner_reward", "loser_reward")
# why a pair is dropped -> how the log line says it
DROP_REASONS = {
    "identical": "whose chosen equals rejected for every agent",
    "empty": "with an empty completion",
}
_SIDES = (("winner_completions", "chosen"), ("loser_completions", "rejected"))
_REWARDS = ("winner_reward", "loser_reward", "candidate_reward_mean")


def _is_messages(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(m, Mapping) for m in value)


def shape_problem(record: Mapping[str, Any], num_agents: int) -> str | None:
    """What is missing or mis-shaped in a pair record, or None: the `RECORD_FIELDS`, and `prompts`,
    `winner_completions`, `loser_completions` each a list with one entry per agent."""
    missing = [k for k in RECORD_FIELDS if k not in record]
    if missing:
        return f"a preference record needs the fields {list(RECORD_FIELDS)}; missing {missing}"
    for key in ("prompts", "winner_completions", "loser_completions"):
        value = record[key]
        if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != num_agents:
            return f"record[{key!r}] must be a list with one entry per agent ({num_agents}), got {value!r:.200}"
    return None


def record_problem(record: Mapping[str, Any]) -> str | None:
    """What makes a pair record (`PreferencePair.to_record()`'s shape) impossible to train on as given, or None.

    Checks the fields that are present and shaped as one list per agent (missing fields and wrong lengths are
    `PreferencePair.from_record`'s errors): every prompt is a string or a list of chat messages, every completion a
    string, `winner_reward` / `loser_reward` / `candidate_reward_mean` finite numbers (not booleans, not strings),
    and `winner_reward >= loser_reward`."""
    prompts = record.get("prompts")
    if isinstance(prompts, (list, tuple)):
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, str) and not _is_messages(prompt):
                return (
                    f"agent {i + 1}'s prompt is {prompt!r:.80} ({type(prompt).__name__}), not a string or a list of "
                    "chat messages"
                )
    for key, side in _SIDES:
        values = record.get(key)
        if isinstance(values, (list, tuple)):
            for i, text in enumerate(values):
                if not isinstance(text, str):
                    return f"agent {i + 1}'s {side} completion is {text!r:.80} ({type(text).__name__}), not a string"
    for key in _REWARDS:
        value = record.get(key)
        if value is None and key == "candidate_reward_mean":
            continue
        if key not in record:
            continue
        if isinstance(value, bool) or not isinstance(value, Real):
            return f"{key} is {value!r:.80} ({type(value).__name__}), not a number"
        if not math.isfinite(value):
            return f"{key} is {value}: recorded rewards must be finite"
    if "winner_reward" in record and "loser_reward" in record and record["winner_reward"] < record["loser_reward"]:
        return (
            f"winner_reward {record['winner_reward']} is below loser_reward {record['loser_reward']}: the recorded "
            "rewards contradict which response won (winner and loser swapped?)"
        )
    return None


def check_record(record: Mapping[str, Any], where: str, num_agents: int | None = None) -> None:
    """Raise a `ValueError` starting with `where` (e.g. `"train_dataset row 3"`) when `record_problem` finds one
    (with `num_agents`, `shape_problem` first)."""
    problem = shape_problem(record, num_agents) if num_agents is not None else None
    problem = problem or record_problem(record)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")


def _same_ids(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is None or b is None or torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def unusable_reason(pair: Any) -> str | None:
    """Why a pair (a `PreferencePair`) is dropped before training (a key of `DROP_REASONS`), or None.

    * `"identical"`: every agent's chosen completion equals its rejected one (the text, and the token ids where both
      are known);
    * `"empty"`: some completion is the empty string and no EOS was recorded for it (`winner_eos` / `loser_eos`: a
      trainer records the EOS of a completion that stopped at once, which is kept)."""
    n = len(pair.winner_completions)
    w_ids = pair.winner_ids or [None] * n
    l_ids = pair.loser_ids or [None] * n
    if all(
        pair.winner_completions[i] == pair.loser_completions[i] and _same_ids(w_ids[i], l_ids[i]) for i in range(n)
    ):
        return "identical"
    for texts, ends in ((pair.winner_completions, pair.winner_eos), (pair.loser_completions, pair.loser_eos)):
        if any(text == "" and not (ends and ends[i]) for i, text in enumerate(texts)):
            return "empty"
    return None


def drop_unusable(pairs: Sequence[Any]) -> tuple[list[Any], str | None]:
    """`pairs` without the ones `unusable_reason` drops, and what was dropped in words (None when nothing was): the
    count per reason and the first few indices in `pairs` (e.g. the dataset rows)."""
    kept: list[Any] = []
    dropped: dict[str, list[int]] = {}
    for k, pair in enumerate(pairs):
        reason = unusable_reason(pair)
        if reason is None:
            kept.append(pair)
        else:
            dropped.setdefault(reason, []).append(k)
    if not dropped:
        return kept, None
    parts = []
    for reason, where in dropped.items():
        shown = ", ".join(map(str, where[:5])) + (", ..." if len(where) > 5 else "")
        parts.append(f"{len(where)} {DROP_REASONS[reason]} (pairs {shown})")
    return kept, f"dropped {len(pairs) - len(kept)} of {len(pairs)} preference pairs: {'; '.join(parts)}"


def usable_pairs(pairs: Sequence[Any], source: str, log: bool = True) -> list[Any]:
    """`drop_unusable(pairs)`'s kept pairs; with `log`, one warning `"{source}: dropped ..."` when any was dropped."""
    kept, summary = drop_unusable(pairs)
    if summary is not None and log:
        logger.warning("%s: %s", source, summary)
    return kept
