"""Two small built-in tasks that run anywhere, with prompts generated in code (no download).

- `length_ratio`: a writer and an expander. Agent 2's text should be 2-3x as long as agent 1's (the reference
  library's story-length task). Reward 1 inside the band, `exp(-distance)` outside.
- `coordination`: a division-of-labour game a tiny random model learns in a minute of CPU. The team must split the
  alphabet: agent 1 should write with letters from the first half (a-m), agent 2 from the second half (n-z), and both
  must actually write. The reward is shared, so each agent has to learn its own role from the team's score (the
  credit-assignment problem of cooperative MARL in its smallest form).
"""

from __future__ import annotations

import math
import random

from trl_marl.tasks.base import Task

__all__ = ["length_ratio_reward", "coordination_reward", "length_ratio_task", "coordination_task", "TOPICS"]

TOPICS = [
    "a lighthouse keeper",
    "the first snow of winter",
    "a lost key",
    "a robot learning to paint",
    "an old bridge",
    "a city at night",
    "a quiet library",
    "a river in spring",
    "a broken clock",
    "a dog who can read",
    "the last train home",
    "a garden on a roof",
    "a letter never sent",
    "a storm at sea",
    "a market at dawn",
    "a mountain village",
    "a forgotten song",
    "a paper boat",
    "a desert well",
    "the moon over a lake",
    "a kite in the wind",
    "a baker's first loaf",
    "a map with no names",
    "a window facing east",
    "a silver coin",
    "a tree that remembers",
    "a child's first book",
    "a bicycle ride",
    "an empty theatre",
    "a door in a wall",
    "a cat on a roof",
    "a field of sunflowers",
    "a chess game in the park",
    "a letter from the future",
    "a tiny island",
    "a red umbrella",
    "the sound of rain",
    "a hidden staircase",
    "an evening walk",
    "a clockmaker's shop",
    "a bridge of stones",
    "a fisherman's net",
    "an owl at midnight",
    "a winter market",
    "a candle in the dark",
    "a river crossing",
    "a mountain path",
    "a starry sky",
    "a summer festival",
    "a painter's last work",
    "a garden gate",
    "a foggy morning",
    "a ship in a bottle",
    "a tea house",
    "a field trip",
    "a new neighbour",
    "a lost glove",
    "a small victory",
    "a long journey",
    "a quiet harbour",
    "an unexpected guest",
    "a green door",
    "a stone wall",
    "a wooden boat",
    "a morning song",
    "a hidden garden",
    "a bright comet",
    "a slow river",
    "a cold night",
    "a warm kitchen",
    "a secret path",
    "a golden field",
    "a busy street",
    "a quiet room",
    "a high tower",
    "an open window",
    "a winding road",
    "a sleeping town",
    # 80 topics: 64 train items (every recipe's rollout_buffer_size divides them: no skipped items) + 16 eval
    "a painted door",
    "the last train home",
]


def _items(template: str, topics: list[str]) -> list[dict]:
    return [{"prompt": template.format(topic=t), "topic": t} for t in topics]


def _datasets(template: str, seed: int = 0, eval_size: int = 16):
    from datasets import Dataset

    topics = list(TOPICS)
    random.Random(seed).shuffle(topics)
    return Dataset.from_list(_items(template, topics[eval_size:])), Dataset.from_list(
        _items(template, topics[:eval_size])
    )


def length_ratio_reward(
    completions_1: list[str], completions_2: list[str], low: float = 2.0, high: float = 3.0
) -> list[float]:
    """1 when `len(c2) / len(c1)` lies in `[low, high]`, else `exp(-distance to the band)`; 0 when agent 1 wrote
    nothing. Lengths are in characters of the stripped text."""
    out = []
    for a, b in zip(completions_1, completions_2):
        la, lb = len(a.strip()), len(b.strip())
        if la == 0:
            out.append(0.0)
            continue
        ratio = lb / la
        dist = 0.0 if low <= ratio <= high else min(abs(ratio - low), abs(ratio - high))
        out.append(math.exp(-dist))
    return out


def length_ratio_task(seed: int = 0) -> Task:
    """Agent 1 writes a short story opening; agent 2 expands it to 2-3x its length."""
    train, evaluation = _datasets("Write the opening of a short story about {topic}.", seed)
    return Task(
        name="length_ratio",
        num_agents=2,
        train_dataset=train,
        eval_dataset=evaluation,
        formatters=[
            lambda item: f"{item['prompt']} Keep it brief.\n",
            lambda item: f"{item['prompt']} Write a longer, more detailed version.\n",
        ],
        reward_func=length_ratio_reward,
        roles=["writer", "expander"],
        description="Agent 2's text should be 2-3x as long as agent 1's (reward 1 in the band, exp(-distance) out).",
    )


FIRST_HALF = frozenset("abcdefghijklm")
SECOND_HALF = frozenset("nopqrstuvwxyz")


def _share(text: str, letters: frozenset) -> float:
    chars = [c for c in text.lower() if c.isalpha() and c.isascii()]
    if not chars:
        return 0.0
    return sum(c in letters for c in chars) / len(chars)


def coordination_reward(completions_1: list[str], completions_2: list[str]) -> list[float]:
    """Team score of the alphabet-splitting game, in [0, 1]:

        r = ( share_{a-m}(agent 1) + share_{n-z}(agent 2) ) / 2

    where `share_S(text)` is the fraction of the text's ASCII letters that lie in S (0 for a text without letters).
    """
    return [(_share(a, FIRST_HALF) + _share(b, SECOND_HALF)) / 2.0 for a, b in zip(completions_1, completions_2)]


def coordination_task(seed: int = 0) -> Task:
    """The alphabet-splitting coordination game (see the module docstring)."""
    train, evaluation = _datasets("Together, describe {topic}.", seed)
    return Task(
        name="coordination",
        num_agents=2,
        train_dataset=train,
        eval_dataset=evaluation,
        formatters=[
            lambda item: f"{item['prompt']} You write the first part.\n",
            lambda item: f"{item['prompt']} You write the second part.\n",
        ],
        reward_func=coordination_reward,
        roles=["first_half", "second_half"],
        description="Split the alphabet: agent 1 writes with letters a-m, agent 2 with n-z; shared reward in [0, 1].",
    )
