"""A built-in cooperative game with state, a tool and an environment-owned reward: the signalling game.

Two agents. Agent 1 (the signaller) is told a secret word drawn from a few choices and must convey it in its
message; agent 2 (the receiver) reads that message (turn order `"sequential"`: it sees agent 1's message of the same
turn) and answers through the `submit(answer)` tool, which ends the episode. The environment owns the reward
(`get_reward()`, one joint float in [0, 1] by default), shaped so that a tiny model gets a gradient long before it
can write a well-formed tool call:

    reward = w_signal  * [agent 1's message names the secret and no other choice]
           + w_submit  * [agent 2 called submit with one of the choices]
           + w_correct * [the submitted answer is the secret]
           + w_text    * [no submit, and agent 2's message names the secret and no other choice]

with defaults (0.25, 0.25, 0.5, 0.25): 1.0 for a correct submit after a clear signal, 0.5 for the same through plain
text. Matching is whole-word and case-insensitive. The default secrets are single tokens (after a space) of
`trl_marl.testing`'s tiny tokenizer.

Deterministic: `reset(secret=...)` plays that secret; `reset(seed=...)` draws it with `random.Random(seed)`.
`signal_game_dataset` makes the items; `signal_game_prompts(item)` the two agents' prompts.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["SECRETS", "SignalGame", "signal_game_dataset", "signal_game_prompts"]

SECRETS = ("red", "blue", "cat")
DEFAULT_WEIGHTS = {"signal": 0.25, "submit": 0.25, "correct": 0.5, "text": 0.25}


def _named(text: str | None, choices: Sequence[str]) -> set[str]:
    """The choices that appear as whole words in `text` (case-insensitive)."""
    if not text:
        return set()
    low = text.lower()
    return {c for c in choices if re.search(rf"(?<![a-z0-9]){re.escape(c.lower())}(?![a-z0-9])", low)}


class SignalGame:
    """The signalling game (see the module docstring). Agent indices: 0 signaller, 1 receiver.

    Args:
        secrets: the choices (distinct, non-empty strings).
        weights: reward weights, keys among `signal`, `submit`, `correct`, `text` (missing keys keep defaults).
        per_agent: return `[r_1, r_2]` where each agent gets the shared part plus only its own shaping term
            (`signal` for agent 1; `submit` / `text` for agent 2) instead of one joint float.
    """

    def __init__(
        self, secrets: Sequence[str] = SECRETS, weights: dict[str, float] | None = None, per_agent: bool = False
    ):
        secrets = tuple(secrets)
        if len(secrets) < 2 or len(set(s.lower() for s in secrets)) != len(secrets) or not all(secrets):
            raise ValueError(f"SignalGame: secrets must be >= 2 distinct non-empty strings, got {secrets!r}")
        unknown = set(weights or {}) - set(DEFAULT_WEIGHTS)
        if unknown:
            raise ValueError(f"SignalGame: unknown weight(s) {sorted(unknown)}; known: {sorted(DEFAULT_WEIGHTS)}")
        self.secrets = secrets
        self.weights = {**DEFAULT_WEIGHTS, **(weights or {})}
        self.per_agent = per_agent
        self.secret: str | None = None
        self._clear()

    def _clear(self) -> None:
        self.answer: str | None = None
        self.signal: str | None = None
        self.receiver_text: str | None = None
        self.done = False

    def reset(self, secret: str | None = None, seed: int | None = None, **item: Any) -> list[str]:
        """Start a game with `secret` (or one drawn from `seed`); returns the two agents' instructions."""
        if secret is None:
            if seed is None:
                raise ValueError("SignalGame.reset needs a `secret` or a `seed` column in the item")
            secret = random.Random(seed).choice(self.secrets)
        if secret not in self.secrets:
            raise ValueError(f"SignalGame.reset: secret {secret!r} is not one of {list(self.secrets)}")
        self.secret = secret
        self._clear()
        choices = ", ".join(self.secrets)
        return [
            f"The secret is {secret}. Tell your teammate the secret.",
            f"Your teammate knows a secret, one of: {choices}. Submit it with the submit tool.",
        ]

    def tools_for(self, agent_index: int) -> list[str]:
        """Only the receiver may submit."""
        return ["submit"] if agent_index == 1 else []

    def submit(self, answer: str) -> str:
        """Submit the secret. Ends the game.

        Args:
            answer: The secret word.
        """
        if self.done:
            return "The game is over."
        self.answer = str(answer).strip()
        self.done = True
        return "Submitted."

    def on_message(self, agent_index: int, text: str) -> None:
        if agent_index == 0:
            self.signal = text
        elif agent_index == 1:
            self.receiver_text = text

    def reward_terms(self) -> dict[str, float]:
        """Each shaping term in {0, 1} (before weighting)."""
        if self.secret is None:
            raise RuntimeError("SignalGame.get_reward() before reset()")
        signal = _named(self.signal, self.secrets)
        submitted = self.answer is not None
        answer = self.answer.lower().strip(" .'\"[]") if submitted else None
        text = _named(self.receiver_text, self.secrets)
        return {
            "signal": float(signal == {self.secret}),
            "submit": float(submitted and answer in {s.lower() for s in self.secrets}),
            "correct": float(submitted and answer == self.secret.lower()),
            "text": float(not submitted and text == {self.secret}),
        }

    def get_reward(self) -> float | list[float]:
        t = self.reward_terms()
        w = self.weights
        shared = w["correct"] * t["correct"]
        if self.per_agent:
            return [shared + w["signal"] * t["signal"], shared + w["submit"] * t["submit"] + w["text"] * t["text"]]
        return sum(w[k] * t[k] for k in t)


def signal_game_prompts(item: dict) -> list[str]:
    """The two agents' prompts for an item (the environment's `reset` text is appended to each)."""
    return [item.get("prompt", "") + "\n", item.get("prompt", "") + "\n"]


def signal_game_dataset(n: int = 64, seed: int = 0, secrets: Sequence[str] = SECRETS):
    """A `datasets.Dataset` of `n` items with columns `prompt`, `secret` (balanced over the secrets, shuffled with
    `seed`) and `seed`."""
    from datasets import Dataset

    rng = random.Random(seed)
    chosen = [secrets[i % len(secrets)] for i in range(n)]
    rng.shuffle(chosen)
    return Dataset.from_list(
        [{"prompt": "Signalling game.", "secret": s, "seed": seed * 100_003 + i} for i, s in enumerate(chosen)]
    )
