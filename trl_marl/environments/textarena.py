"""TextArena games (PyPI `textarena`, extra `trl-marl[textarena]`, tested on 0.7.4) as team environments.

Players map to agents (agent i plays player i). Play is turn-based: `active_agents()` is the current player, so at
each agent position only the branches whose game waits for that agent generate; the current player's new
observations (the game's messages since it last acted, `[GAME] ...` / `[Player j] ...` lines) are its prompt
(`observe`), and its move is either its message (`action="message"`, TextArena's own protocol: the text goes to
`env.step`) or a `move(action)` tool call (`action="tool"`). The adapter uses the game's `-raw` variant plus
TextArena's `ActionFormattingWrapper` (a move without brackets is wrapped in them), so observations arrive as
deltas rather than TextArena's ever-growing transcript. The agents' messages are not shared directly
(`share_messages = False`): the game reports the moves.

Rewards come from the game's result (`env.close()`): `"competitive"` gives each agent its player's reward (e.g.
+1 / -1), `"cooperative"` one joint float, the mean over the players. A game cut off by the rollout's turn limit
scores 0 for everyone.

TextArena seeds Python's global `random` in `reset`; the adapter runs every call into the game with its own
`random` state swapped in, so a seeded `reset(seed=...)` replays the same game and the trainer's global stream is
left alone. Games that download data (NLTK word lists: Wordle, WordChains, ...) or call a model API (Debate, ...)
cannot run offline: they raise `TextArenaUnavailable` naming the game and the reason.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

__all__ = ["TextArenaEnvironment", "TextArenaUnavailable", "textarena_factory"]

REWARD_MODES = ("competitive", "cooperative")
ACTION_MODES = ("message", "tool")


class TextArenaUnavailable(RuntimeError):
    """A TextArena game that cannot be created or started here (downloads, API keys, missing packages)."""


def _import_textarena():
    try:
        import textarena
    except ImportError as e:
        raise ImportError(
            "TextArena games need the `textarena` package: pip install 'trl-marl[textarena]' (textarena==0.7.4)"
        ) from e
    return textarena


def _why(game_id: str, error: BaseException) -> TextArenaUnavailable:
    text = str(error).strip()
    if isinstance(error, LookupError) or "nltk" in text.lower():
        reason = "it needs NLTK data that it downloads at start (offline, the download fails)"
    elif "api key" in text.lower() or "api_key" in text.lower():
        reason = "it calls a model API and needs an API key"
    elif isinstance(error, ImportError):
        reason = "it needs a package that is not installed"
    else:
        reason = "it failed to start"
    first = text.splitlines()[0] if text else ""
    for line in text.splitlines():  # NLTK's message opens with a banner of asterisks
        if line.strip().strip("*").strip():
            first = line.strip()
            break
    return TextArenaUnavailable(
        f"TextArena game {game_id!r} cannot run here: {reason} ({type(error).__name__}: {first})"
    )


class TextArenaEnvironment:
    """One TextArena game, shared by the team (see the module docstring).

    Args:
        game_id: a registered TextArena id, e.g. `"TicTacToe-v0"`, `"Nim-v0"`, `"SimpleNegotiation-v0"`, `"Poker-v0"`.
        num_players: players, hence agents (agent i is player i).
        reward: `"competitive"` (per player) or `"cooperative"` (one joint float, the players' mean).
        action: `"message"` (the agent's message is its move) or `"tool"` (a `move(action)` tool, offered to the
            current player only).
        **make_kwargs: passed to `textarena.make` (game options).
    """

    share_messages = False

    def __init__(
        self,
        game_id: str,
        num_players: int = 2,
        reward: str = "competitive",
        action: str = "message",
        **make_kwargs: Any,
    ):
        ta = _import_textarena()
        if reward not in REWARD_MODES:
            raise ValueError(f"TextArenaEnvironment: reward must be one of {REWARD_MODES}, got {reward!r}")
        if action not in ACTION_MODES:
            raise ValueError(f"TextArenaEnvironment: action must be one of {ACTION_MODES}, got {action!r}")
        from textarena.envs.registration import ENV_REGISTRY
        from textarena.wrappers import ActionFormattingWrapper

        if game_id not in ENV_REGISTRY:
            raise ValueError(
                f"TextArenaEnvironment: {game_id!r} is not a registered TextArena game (textarena {ta.__version__}); "
                "e.g. 'TicTacToe-v0', 'Nim-v0', 'SimpleNegotiation-v0', 'Poker-v0'"
            )
        raw_id = f"{game_id}-raw" if f"{game_id}-raw" in ENV_REGISTRY else game_id
        self.game_id, self.num_players, self.reward_mode, self.action = game_id, num_players, reward, action
        self._rng_state = random.Random(0).getstate()
        try:
            with self._own_random():
                self._game = ActionFormattingWrapper(ta.make(raw_id, **make_kwargs))
        except Exception as e:
            raise _why(game_id, e) from e
        self.done = False
        self.rewards: dict[int, float] | None = None
        self.game_info: dict | None = None
        self._started = False

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        outer = random.getstate()
        random.setstate(self._rng_state)
        try:
            yield
        finally:
            self._rng_state = random.getstate()
            random.setstate(outer)

    # --------------------------------------------------------------------------------------- the contract
    def reset(self, seed: int | None = None, **item: Any) -> None:
        """Start a new game (`seed` from the item makes it reproducible). The prompts come through `observe`."""
        self._rng_state = random.Random(seed).getstate()
        try:
            with self._own_random():
                self._game.reset(num_players=self.num_players, seed=seed)
        except Exception as e:
            raise _why(self.game_id, e) from e
        self.done, self.rewards, self.game_info, self._started = False, None, None, True
        return None

    @property
    def current_player(self) -> int:
        return int(self._game.state.current_player_id)

    def active_agents(self) -> list[int]:
        """The current player (nobody once the game is over)."""
        return [] if self.done else [self.current_player]

    def tools_for(self, agent_index: int) -> list[str]:
        return ["move"] if self.action == "tool" and not self.done and agent_index == self.current_player else []

    def observe(self, agent_index: int) -> str | None:
        """The game's messages to the current player since it last acted."""
        if self.done or agent_index != self.current_player:
            return None
        with self._own_random():
            pid, obs = self._game.get_observation()
        return self._text(pid, obs)

    def _text(self, pid: int, obs: Any) -> str:
        if isinstance(obs, str):
            return obs.strip()
        from textarena.core import GAME_ID, ObservationType

        roles = getattr(self._game.state, "role_mapping", {}) or {}
        lines = []
        for sender, message, kind in obs or []:
            if sender == pid and kind == ObservationType.PLAYER_ACTION:
                continue  # the agent's own move is already its assistant message
            name = "GAME" if sender == GAME_ID else roles.get(sender, f"Player {sender}")
            lines.append(f"[{name}] {message}".strip())
        return "\n".join(lines)

    def on_message(self, agent_index: int, text: str) -> None:
        """In `"message"` mode, the current player's message is its move."""
        if self.action == "message" and not self.done and agent_index == self.current_player:
            self._step(text)

    def move(self, action: str, agent_index: int) -> str:
        """Make your move in the game.

        Args:
            action: Your move, in the game's format (e.g. "[4]").
        """
        if self.done:
            return "The game is over."
        if agent_index != self.current_player:
            return f"It is not your turn (Player {self.current_player} is to move)."
        self._step(action)
        return "Game over." if self.done else "Move played."

    def _step(self, action: str) -> None:
        with self._own_random():
            done, _ = self._game.step(action)
            if done:
                self.rewards, self.game_info = self._game.close()
        self.done = bool(done)

    def get_reward(self) -> float | list[float]:
        """Competitive: each agent's player reward; cooperative: their mean. 0 for a game that did not finish."""
        per_player = [float((self.rewards or {}).get(p, 0.0)) for p in range(self.num_players)]
        if self.reward_mode == "cooperative":
            return sum(per_player) / len(per_player)
        return per_player


def textarena_factory(game_id: str, **kwargs: Any):
    """`environment_factory=textarena_factory("TicTacToe-v0")`: a zero-argument factory. Creates and resets one
    game at once, so a game that cannot run here fails now with `TextArenaUnavailable`, not during training."""
    TextArenaEnvironment(game_id, **kwargs).reset(seed=0)

    def factory() -> TextArenaEnvironment:
        return TextArenaEnvironment(game_id, **kwargs)

    factory.__name__ = f"textarena_{game_id}"
    return factory
