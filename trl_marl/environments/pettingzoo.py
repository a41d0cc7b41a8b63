"""PettingZoo AEC environments (PyPI `pettingzoo`, extra `trl-marl[pettingzoo]`) as team environments.

PettingZoo's AEC API is turn-based: `env.agent_selection` acts, `env.observe(name)` is its observation,
`env.step(action)` plays, `env.rewards` are the rewards of the last step, and an agent that is terminated or
truncated must be stepped with `None` until it leaves `env.agents`. The adapter maps agent i to
`env.possible_agents[i]`, makes the selected agent the only active one, turns its observation into text
(`observation_to_text`) as its prompt, and its message into an action (`text_to_action`).

Defaults: an observation that is a `str` is used as is; a dict with an `action_mask` (PettingZoo's classic games)
shows its `observation` and the legal action indices; anything else goes through `str`. An action is the first
integer in the message, valid when the action space `contains` it and the mask (if any) allows it. An invalid
message costs `invalid_penalty` (added to that agent's reward) and the agent moves again at its next turn; after
`max_invalid` invalid messages in a row the episode ends.

Rewards are accumulated over every step (`env.rewards`): `"competitive"` gives each agent its own,
`"cooperative"` the mean over the agents as one joint float.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["PettingZooEnvironment", "default_observation_to_text", "default_text_to_action", "pettingzoo_factory"]

REWARD_MODES = ("competitive", "cooperative")


def _require_pettingzoo() -> None:
    try:
        import pettingzoo  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "PettingZoo environments need the `pettingzoo` package: pip install 'trl-marl[pettingzoo]'"
        ) from e


def _legal(observation: Any) -> list[int] | None:
    if isinstance(observation, dict) and "action_mask" in observation:
        return [i for i, m in enumerate(list(observation["action_mask"])) if m]
    return None


def default_observation_to_text(name: str, observation: Any) -> str:
    """`str` observations as is; `{"observation", "action_mask"}` dicts as the observation plus the legal actions;
    other values through `str`."""
    if isinstance(observation, str):
        return observation
    legal = _legal(observation)
    if legal is not None:
        inner = observation.get("observation")
        return f"{inner}\nLegal actions: {legal}"
    return str(observation)


def default_text_to_action(name: str, text: str, action_space: Any, observation: Any) -> Any | None:
    """The first integer in `text` if the action space contains it and the action mask allows it, else `None`."""
    match = re.search(r"-?\d+", text or "")
    if match is None:
        return None
    action = int(match.group())
    try:
        if not action_space.contains(action):
            return None
    except Exception:
        return None
    legal = _legal(observation)
    if legal is not None and action not in legal:
        return None
    return action


class PettingZooEnvironment:
    """One AEC environment, shared by the team (see the module docstring).

    Args:
        env_fn: zero-argument callable returning a PettingZoo `AECEnv` (e.g. `tictactoe_v3.env`).
        observation_to_text: `(agent name, observation) -> str`.
        text_to_action: `(agent name, text, action space, observation) -> action | None` (None: invalid).
        reward: `"competitive"` (per agent) or `"cooperative"` (one joint float, the mean).
        invalid_penalty: added to an agent's reward for each invalid message.
        max_invalid: invalid messages in a row after which the episode ends.
    """

    share_messages = False

    def __init__(
        self,
        env_fn: Callable[[], Any],
        observation_to_text: Callable[[str, Any], str] = default_observation_to_text,
        text_to_action: Callable[[str, str, Any, Any], Any] = default_text_to_action,
        reward: str = "competitive",
        invalid_penalty: float = -1.0,
        max_invalid: int = 3,
    ):
        _require_pettingzoo()
        if reward not in REWARD_MODES:
            raise ValueError(f"PettingZooEnvironment: reward must be one of {REWARD_MODES}, got {reward!r}")
        if not isinstance(max_invalid, int) or max_invalid < 1:
            raise ValueError(f"PettingZooEnvironment: max_invalid must be an int >= 1, got {max_invalid!r}")
        self.env = env_fn()
        for attr in ("reset", "step", "observe", "possible_agents"):
            if not hasattr(self.env, attr):
                raise TypeError(
                    f"PettingZooEnvironment: env_fn() returned {type(self.env).__name__}, which has no `{attr}`; "
                    "expected a PettingZoo AECEnv (use `.env()`, not `.parallel_env()`)"
                )
        self.names: list[str] = list(self.env.possible_agents)
        self.observation_to_text = observation_to_text
        self.text_to_action = text_to_action
        self.reward_mode = reward
        self.invalid_penalty = float(invalid_penalty)
        self.max_invalid = max_invalid
        self.done = False
        self.totals = [0.0] * len(self.names)
        self.invalid = [0] * len(self.names)
        self._note: str | None = None

    def reset(self, seed: int | None = None, **item: Any) -> None:
        """Reset the AEC environment (with `seed` from the item). Prompts come through `observe`."""
        self.env.reset(seed=seed)
        self.done = False
        self.totals = [0.0] * len(self.names)
        self.invalid = [0] * len(self.names)
        self._note = None
        self._skip_dead()
        return None

    def _selected(self) -> int | None:
        if self.done or not self.env.agents:
            return None
        return self.names.index(self.env.agent_selection)

    def _skip_dead(self) -> None:
        """Step terminated / truncated agents with `None` (the AEC rule) and end when nobody is left."""
        env = self.env
        while env.agents:
            a = env.agent_selection
            if not (env.terminations.get(a, False) or env.truncations.get(a, False)):
                return
            env.step(None)
            self._collect()
        self.done = True

    def _collect(self) -> None:
        for name, r in self.env.rewards.items():
            self.totals[self.names.index(name)] += float(r)

    def active_agents(self) -> list[int]:
        i = self._selected()
        return [] if i is None else [i]

    def observe(self, agent_index: int) -> str | None:
        """The selected agent's observation as text (after a note about its last invalid message, if any)."""
        if agent_index != self._selected():
            return None
        name = self.names[agent_index]
        text = self.observation_to_text(name, self.env.observe(name))
        note, self._note = self._note, None
        return f"{note}\n{text}" if note else text

    def on_message(self, agent_index: int, text: str) -> None:
        """The selected agent's message becomes its action (or counts as invalid)."""
        if agent_index != self._selected():
            return
        name = self.names[agent_index]
        action = self.text_to_action(name, text, self.env.action_space(name), self.env.observe(name))
        if action is None:
            self.invalid[agent_index] += 1
            self.totals[agent_index] += self.invalid_penalty
            self._note = f"Invalid action {text.strip()[:80]!r}."
            if self.invalid[agent_index] >= self.max_invalid:
                self.done = True
            return
        self.invalid[agent_index] = 0
        self.env.step(action)
        self._collect()
        self._skip_dead()

    def get_reward(self) -> float | list[float]:
        if self.reward_mode == "cooperative":
            return sum(self.totals) / len(self.totals)
        return list(self.totals)


def pettingzoo_factory(env_fn: Callable[[], Any], **kwargs: Any) -> Callable[[], PettingZooEnvironment]:
    """`environment_factory=pettingzoo_factory(tictactoe_v3.env, observation_to_text=...)`."""

    def factory() -> PettingZooEnvironment:
        return PettingZooEnvironment(env_fn, **kwargs)

    return factory
