"""Games other people wrote as team environments: TextArena (extra `textarena`) and PettingZoo AEC (extra `pettingzoo`).

Every game is played to the end offline with scripted random legal moves through `play`, the lock-step loop."""

from __future__ import annotations

import random
import re

import pytest

from trl_marl.environments import EnvironmentRegistry, EpisodeConfig, play, start_branches


def _config(max_turns=200):
    return EpisodeConfig(num_agents=2, turn_order="sequential", max_turns=max_turns, max_tool_calling_iterations=1)


# ------------------------------------------------------------------------------------------------------ TextArena


def _move(game: str, observation: str, rng: random.Random) -> str:
    """A random legal move read off the game's own text."""
    if game == "TicTacToe-v0":
        board = observation.split("Available Moves:")[-1]
        cells = re.findall(r"\[(\d)\]", board)
        return f"I take [{rng.choice(cells)}]"
    if game == "Nim-v0":
        piles = [int(x) for x in re.findall(r"pile \d+: (\d+)", observation)[-3:]]
        i = rng.choice([k for k, v in enumerate(piles) if v > 0])
        return f"[{i} {rng.randint(1, piles[i])}]"
    if game == "SimpleNegotiation-v0":
        return rng.choice(["[Offer: 1 Wheat -> 1 Wood]", "[Accept]", "[Deny]", "Shall we trade?"])
    return rng.choice(["[Call]", "[Fold]"])  # Poker: both legal in every state


def _scripted(game: str, seed: int, tool: bool = False):
    """Moves drawn from a stream seeded by the conversation itself, so a replayed game gets the same moves."""

    def generate(agent, prompts, tools):
        out = []
        for p, ts in zip(prompts, tools):
            rng = random.Random(f"{seed}|{agent}|{len(p)}|{p[-1]['content']}")
            if p[-1]["role"] == "tool":  # after a move made through the tool
                out.append("Done.")
                continue
            move = _move(game, p[-1]["content"], rng)
            if tool:
                assert [t.name for t in ts] == ["move"]
                out.append({"role": "assistant", "content": "", "tool_calls": [_call("move", action=move)]})
            else:
                out.append(move)
        return out

    return generate


def _call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


GAMES = ["TicTacToe-v0", "Nim-v0", "SimpleNegotiation-v0", "Poker-v0"]


@pytest.mark.parametrize("game", GAMES)
def test_textarena_games_play_to_the_end(game):
    pytest.importorskip("textarena")
    from trl_marl.environments import textarena_factory

    state = random.getstate()
    reg = EnvironmentRegistry(textarena_factory(game))
    bs = start_branches(_config(), [{"seed": 1}, {"seed": 2}], lambda item: ["", ""], registry=reg, num_generations=2)
    counters = play(bs, _scripted(game, seed=0))
    assert all(b.done and b.done_reason == "environment" for b in bs)  # the game ended, not the turn limit
    for b in bs:
        rewards = b.reward()
        assert rewards == [float(b.env.rewards.get(p, 0)) for p in range(2)]  # competitive: each player's own
        assert b.env.game_info[0]["reason"]
        assert b.prompt(0)[0]["role"] == "user" and b.prompt(0)[0]["content"].startswith("[GAME]")
        # turn-based: each agent acts only when its player is to move; nobody sees the other's text directly
        assert not any(m["content"].startswith("Agent ") for h in b.histories for m in h if m["role"] == "user")
    assert counters["generate_calls"] <= 2 * max(b.turn for b in bs)  # one call per position per turn, batched
    assert random.getstate() == state  # TextArena seeds `random`; the adapter keeps it to itself

    # the same seed and moves replay the same game
    again = start_branches(_config(), [{"seed": 1}], lambda item: ["", ""], registry=reg, num_generations=2)
    play(again, _scripted(game, seed=0))
    assert again[0].transcript == bs[0].transcript and again[0].reward() == bs[0].reward()


def test_textarena_tool_action_and_cooperative_reward():
    pytest.importorskip("textarena")
    from trl_marl.environments import TextArenaEnvironment, textarena_factory

    reg = EnvironmentRegistry(textarena_factory("TicTacToe-v0", action="tool", reward="cooperative"))
    (b,) = start_branches(_config(), [{"seed": 3}], lambda item: ["", ""], registry=reg)
    assert [t.name for t in b.tools(0)] == ["move"] and b.tools(1) == []  # only the player to move
    assert "agent_index" not in str(b.tools(0)[0].schema)
    play([b], _scripted("TicTacToe-v0", seed=1, tool=True))
    assert b.done_reason == "environment" and b.stats[0].calls >= 3
    assert b.reward() == [sum(b.env.rewards.values()) / 2] * 2 and b.joint_reward
    assert b.env.move("[0]", agent_index=0) == "The game is over."
    with pytest.raises(ValueError, match="reward must be one of"):
        TextArenaEnvironment("Nim-v0", reward="shared")
    with pytest.raises(ValueError, match="'Chess-v9' is not a registered TextArena game"):
        TextArenaEnvironment("Chess-v9")


@pytest.mark.parametrize(
    "game, why",
    [("Wordle-v0", "needs NLTK data that it downloads"), ("Debate-v0", "calls a model API and needs an API key")],
)
def test_textarena_games_that_cannot_run_offline_say_why(game, why, monkeypatch):
    pytest.importorskip("textarena")
    from trl_marl.environments import TextArenaUnavailable, textarena_factory

    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(TextArenaUnavailable, match=rf"TextArena game '{game}' cannot run here: it {why}"):
        textarena_factory(game, num_players=1 if game == "Wordle-v0" else 2)


# ------------------------------------------------------------------------------------------------------ PettingZoo


def _race_env_cls():
    """A tiny AEC game written against PettingZoo's API: players alternately add 1-3 to a counter; whoever reaches
    10 wins (+1, the other -1). The observation is the counter (a NumPy array, as `api_test` wants), shown as text
    by the adapter's `observation_to_text`."""
    import numpy as np
    from gymnasium import spaces
    from pettingzoo import AECEnv
    from pettingzoo.utils import AgentSelector

    class RaceTo10(AECEnv):
        metadata = {"name": "race_to_10_v0", "render_modes": [], "is_parallelizable": False}

        def __init__(self):
            super().__init__()
            self.possible_agents = ["player_0", "player_1"]
            self.action_spaces = {a: spaces.Discrete(3) for a in self.possible_agents}  # action a adds a + 1
            self.observation_spaces = {a: spaces.Box(0, 12, (1,), dtype=np.int64) for a in self.possible_agents}

        def observation_space(self, agent):
            return self.observation_spaces[agent]

        def action_space(self, agent):
            return self.action_spaces[agent]

        def observe(self, agent):
            return np.array([self.counter], dtype=np.int64)

        def reset(self, seed=None, options=None):
            self.agents = list(self.possible_agents)
            self.counter = 0
            self.rewards = {a: 0 for a in self.agents}
            self._cumulative_rewards = {a: 0 for a in self.agents}
            self.terminations = {a: False for a in self.agents}
            self.truncations = {a: False for a in self.agents}
            self.infos = {a: {} for a in self.agents}
            self._selector = AgentSelector(self.agents)
            self.agent_selection = self._selector.next()

        def step(self, action):
            agent = self.agent_selection
            if self.terminations[agent] or self.truncations[agent]:
                self._was_dead_step(action)
                return
            self._cumulative_rewards[agent] = 0
            if action not in (0, 1, 2):
                raise ValueError(f"illegal action {action}")
            self.counter += action + 1
            if self.counter >= 10:
                other = [a for a in self.agents if a != agent][0]
                self.rewards = {agent: 1, other: -1}
                self.terminations = {a: True for a in self.agents}
            else:
                self.rewards = {a: 0 for a in self.agents}
            self._accumulate_rewards()
            self.agent_selection = self._selector.next()

    return RaceTo10


@pytest.mark.filterwarnings("ignore::UserWarning")  # api_test's style advice for this toy environment
def test_pettingzoo_tiny_aec_env_follows_the_api_and_plays_to_the_end():
    pytest.importorskip("pettingzoo")
    from pettingzoo.test import api_test

    from trl_marl.environments import pettingzoo_factory

    race = _race_env_cls()
    api_test(race(), num_cycles=20)  # it is a genuine AEC environment

    def legal(name, text, space, observation):
        m = re.search(r"\d", text)
        return int(m.group()) - 1 if m and m.group() in "123" else None

    def text(name, observation):
        return f"Counter: {int(observation[0])}. Add 1, 2 or 3; reaching 10 wins."

    reg = EnvironmentRegistry(pettingzoo_factory(race, observation_to_text=text, text_to_action=legal))
    bs = start_branches(_config(), [{"seed": 0}], lambda item: ["", ""], registry=reg, num_generations=3)
    rng = random.Random(0)
    moves = iter(["add 9"] + [str(rng.randint(1, 3)) for _ in range(100)])  # the first message is invalid

    def generate(agent, prompts, tools):
        assert all(p[-1]["content"].startswith(("Counter:", "Invalid")) for p in prompts)
        return [next(moves) for _ in prompts]

    play(bs, generate)
    for b in bs:
        assert b.done and b.done_reason == "environment" and b.env.env.counter >= 10
    assert sorted(bs[1].reward()) == sorted(bs[2].reward()) == [-1.0, 1.0]
    penalised = bs[0].reward()
    assert sorted([penalised[0] + 1.0, penalised[1]]) == [-1.0, 1.0]  # agent 1 paid for its invalid message
    notes = [m["content"] for m in bs[0].histories[0] if m["content"].startswith("Invalid action")]
    assert notes and notes[0].startswith("Invalid action 'add 9'.\nCounter:")  # told, then asked again


def test_pettingzoo_classic_tictactoe_with_text_observations():
    pytest.importorskip("pettingzoo")
    pytest.importorskip("pygame")  # PettingZoo's classic games import it for rendering
    from pettingzoo.classic import tictactoe_v3

    from trl_marl.environments import PettingZooEnvironment, pettingzoo_factory

    def board(name, observation):
        planes = observation["observation"]  # (3, 3, 2): this player's marks, the opponent's
        cells = [
            "X" if planes[r][c][0] else "O" if planes[r][c][1] else str(3 * c + r) for r in range(3) for c in range(3)
        ]
        legal = [i for i, m in enumerate(observation["action_mask"]) if m]
        return "\n".join(" ".join(cells[i : i + 3]) for i in (0, 3, 6)) + f"\nLegal: {legal}"

    reg = EnvironmentRegistry(pettingzoo_factory(tictactoe_v3.env, observation_to_text=board, reward="competitive"))
    bs = start_branches(_config(), [{"seed": 0}, {"seed": 1}], lambda item: ["", ""], registry=reg)
    rng = random.Random(1)

    def generate(agent, prompts, tools):
        return [f"I play {rng.choice(eval(p[-1]['content'].split('Legal: ')[-1]))}" for p in prompts]

    play(bs, generate)
    for b in bs:
        assert b.done_reason == "environment" and sum(b.env.invalid) == 0
        assert sorted(b.reward()) in ([-1.0, 1.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="reward must be one of"):
        PettingZooEnvironment(tictactoe_v3.env, reward="zero-sum")
    with pytest.raises(TypeError, match="expected a PettingZoo AECEnv"):
        PettingZooEnvironment(lambda: object())


@pytest.mark.parametrize("module, extra", [("textarena", "textarena"), ("pettingzoo", "pettingzoo")])
def test_missing_package_names_the_extra(module, extra, monkeypatch):
    import sys

    from trl_marl.environments import PettingZooEnvironment, TextArenaEnvironment

    monkeypatch.setitem(sys.modules, module, None)  # import fails
    with pytest.raises(ImportError, match=rf"pip install 'trl-marl\[{extra}\]'"):
        if module == "textarena":
            TextArenaEnvironment("Nim-v0")
        else:
            PettingZooEnvironment(lambda: None)
