"""Cooperative writing: agent 1 summarises a short text, agent 2 writes a fuller explanation of the same text.

The 64 source texts (everyday topics, 65-80 words each) ship with the project in
`trl_marl/tasks/data/writing_prompts.json` (written for it; nothing is downloaded). They are split
deterministically: texts are ordered by `sha256("trl_marl/writing/" + id)` and the first `eval_size` (16 by
default) form the evaluation split, the other 48 the training split.

Both agents read the same text and act at the same time (neither sees the other's output), so the reward asks
them to coordinate: a short summary and an explanation two to three times as long that reuses the summary's key
words. It is level-gated like the reference library's TLDR reward; each level is reached only if the previous
one scored more than 0, and the maximum is 3.0:

| level | measure                                                              | value                         |
|-------|----------------------------------------------------------------------|-------------------------------|
| 1     | length band: both texts have 8-256 words                             | +0.5 (else stop)              |
| 2     | length ratio `r = words(agent 2) / words(agent 1)`                    | +1.0 x ramp(r), 0 stops       |
| 3     | lexical diversity: `u = |vocab(agent 2)| / |vocab(agent 1)|`          | +0.5 x clip((u - 1.3) / 0.7)  |
|       | (agent 2 brings new words instead of repeating itself)               | 0 stops                       |
| 4     | overlap: fraction of agent 1's key words that agent 2 uses           | +1.0 x fraction               |

where `ramp(r)` is 1 on [1.6, 3.2], rises linearly from 0 at 1.1 to 1 at 1.6, falls linearly from 1 at 3.2 to 0 at
5.0, and is 0 outside (1.1, 5.0); `clip` clips to [0, 1].

Definitions: `words(t)` is the number of whitespace-separated tokens of `t`. The vocabulary `vocab(t)` is the set
of tokens of `t.lower()` matched by `[a-z0-9]+(?:'[a-z]+)*` (so "Day's" and "day's" are one word, "day" another).
Agent 1's key words are its vocabulary minus `STOPWORDS` and minus words shorter than 3 characters; the overlap
is the fraction of them that are in agent 2's vocabulary (0 when agent 1 has no key word).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from importlib import resources

from trl_marl.tasks.base import Task

__all__ = [
    "MAX_REWARD",
    "STOPWORDS",
    "load_writing_prompts",
    "split_prompts",
    "writing_datasets",
    "writing_reward",
    "writing_reward_breakdown",
    "writing_task",
]

MAX_REWARD = 3.0
MIN_WORDS, MAX_WORDS = 8, 256

_STOPWORDS_TEXT = """
    a about above after again against all also am an and any are as at be because been before being below between
    both but by can could did do does doing down during each even every few for from further had has have having
    he her here hers herself him himself his how i if in into is it its itself just many may me might more most
    much must my myself no nor not now of off often on once one only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they this those
    through to too under until up upon us very was we were what when where which while who whom why will with
    would yet you your yours yourself yourselves
"""
# Function words ignored when collecting agent 1's key words (level 4).
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)*")


def load_writing_prompts() -> list[dict]:
    """The 64 built-in source texts, each `{"id", "title", "text"}`."""
    data = resources.files("trl_marl.tasks").joinpath("data", "writing_prompts.json")
    return json.loads(data.read_text(encoding="utf-8"))


def split_prompts(prompts: Sequence[dict], eval_size: int = 16) -> tuple[list[dict], list[dict]]:
    """Deterministic (train, eval) split: order by `sha256("trl_marl/writing/" + id)`, the first `eval_size` are
    the evaluation texts. Both lists keep the file order."""
    if not 0 <= eval_size <= len(prompts):
        raise ValueError(f"eval_size must be in [0, {len(prompts)}], got {eval_size}")

    def key(p: dict) -> str:
        return hashlib.sha256(f"trl_marl/writing/{p['id']}".encode()).hexdigest()

    eval_ids = {p["id"] for p in sorted(prompts, key=key)[:eval_size]}
    return [p for p in prompts if p["id"] not in eval_ids], [p for p in prompts if p["id"] in eval_ids]


def _item(p: dict) -> dict:
    return {"id": p["id"], "title": p["title"], "prompt": p["text"], "text": p["text"]}


def writing_datasets(eval_size: int = 16):
    """(train, eval) `datasets.Dataset`s with columns `id`, `title`, `prompt` (the source text) and `text` (a copy
    that transitions never replace)."""
    from datasets import Dataset

    train, evaluation = split_prompts(load_writing_prompts(), eval_size)
    return Dataset.from_list([_item(p) for p in train]), Dataset.from_list([_item(p) for p in evaluation])


# --------------------------------------------------------------------------------------------------------------
# Reward


def _vocab(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _ramp_ratio(r: float) -> float:
    if 1.6 <= r <= 3.2:
        return 1.0
    if 1.1 < r < 1.6:
        return (r - 1.1) / 0.5
    if 3.2 < r < 5.0:
        return (5.0 - r) / 1.8
    return 0.0


def writing_reward_breakdown(summary: str, expansion: str) -> dict[str, float]:
    """The levels earned by one (agent 1, agent 2) pair, e.g. `{"length_band": 0.5, "length_ratio": 1.0, ...}`;
    levels not reached are absent. The reward is the sum of the values (see the module docstring)."""
    out: dict[str, float] = {}
    n1, n2 = len(summary.split()), len(expansion.split())
    if not (MIN_WORDS <= n1 <= MAX_WORDS and MIN_WORDS <= n2 <= MAX_WORDS):
        return out
    out["length_band"] = 0.5
    ratio = _ramp_ratio(n2 / n1)
    if ratio <= 0:
        return out
    out["length_ratio"] = 1.0 * ratio
    v1, v2 = _vocab(summary), _vocab(expansion)
    growth = len(v2) / len(v1) if v1 else 0.0
    diversity = min(max((growth - 1.3) / 0.7, 0.0), 1.0)
    if diversity <= 0:
        return out
    out["lexical_diversity"] = 0.5 * diversity
    keywords = {w for w in v1 if w not in STOPWORDS and len(w) >= 3}
    out["overlap"] = 1.0 * (len(keywords & v2) / len(keywords) if keywords else 0.0)
    return out


def writing_reward(
    completions_agent_1: Sequence[str], completions_agent_2: Sequence[str], batch_items: Sequence[dict] | None = None
) -> list[float]:
    """Joint reward of the writing task, one value in [0, 3] per joint action (see the module docstring).
    `batch_items` is accepted for the calling convention and not used."""
    if len(completions_agent_1) != len(completions_agent_2):
        raise ValueError(f"got {len(completions_agent_1)} agent-1 and {len(completions_agent_2)} agent-2 completions")
    return [
        float(sum(writing_reward_breakdown(a, b).values())) for a, b in zip(completions_agent_1, completions_agent_2)
    ]


writing_reward.reward_range = (0.0, MAX_REWARD)


# --------------------------------------------------------------------------------------------------------------
# Formatters and task

_SUMMARY = """You are the summariser of a two-person writing team. Read the text below and write a summary of its key \
points in two or three sentences (about 30 to 50 words). Your teammate writes a longer explanation of the same text.

Title: {title}
Text: {text}

Summary:"""

_EXPANSION = """You are the explainer of a two-person writing team. Your teammate writes a short summary of the text \
below (about 30 to 50 words). You write a fuller explanation for a reader new to the topic, about two to three times \
as long as that summary (about 80 to 130 words): use the text's key terms and add a reason or an example for each \
point.

Title: {title}
Text: {text}

Explanation:"""


def _make_formatter(template: str, chat: bool, name: str):
    def formatter(item: dict) -> str | list[dict]:
        text = template.format(title=item.get("title", ""), text=item["prompt"])
        return [{"role": "user", "content": text}] if chat else text

    formatter.__name__ = name
    formatter.__doc__ = f"The {name.split('_')[1]} agent's prompt: instructions, the title and `item['prompt']`."
    return formatter


format_summary = _make_formatter(_SUMMARY, False, "format_summary")
format_expansion = _make_formatter(_EXPANSION, False, "format_expansion")


def writing_task(eval_size: int = 16, chat: bool = False) -> Task:
    """The summarise-then-explain writing task (see the module docstring).

    Args:
        eval_size: texts held out for evaluation (16 gives a 48/16 split).
        chat: formatters return chat messages (`[{"role": "user", "content": ...}]`) instead of plain strings.
    """
    train, evaluation = writing_datasets(eval_size)
    return Task(
        name="writing",
        num_agents=2,
        train_dataset=train,
        eval_dataset=evaluation,
        formatters=[
            _make_formatter(_SUMMARY, chat, "format_summary"),
            _make_formatter(_EXPANSION, chat, "format_expansion"),
        ],
        reward_func=writing_reward,
        roles=["summariser", "explainer"],
        description=(
            "Agent 1 summarises a short everyday text, agent 2 explains it at two to three times the length using "
            "the summary's key words. Level-gated reward up to 3.0: length band, length ratio, lexical diversity, "
            "keyword overlap."
        ),
    )
