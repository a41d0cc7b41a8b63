"""Games other people wrote, in training: TextArena and PettingZoo environments as the team's shared environment, the
two agents as the players (competitive, per-player rewards). Moves are scripted (legal moves read off the game's
own text) so that every game is played to the end; the loss, the tree and the metrics are the trainers' own."""

from __future__ import annotations

import random
import re

import pytest
from conftest import END, Scripted, agentic_args

from trl_marl import MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer


def legal_tictactoe(agent, text, continued):
    """A random legal TicTacToe move, read off the board in the prompt (seeded by the prompt: replayable)."""
    cells = re.findall(r"\[(\d)\]", text.split("Available Moves:")[-1].split("<|im_end|>")[0])
    return f"[{random.Random(text).choice(cells)}]" + END


def test_textarena_tictactoe_training_logs_per_player_rewards(tiny_path, tmp_path):
    pytest.importorskip("textarena")
    from trl_marl.environments import textarena_factory

    # one episode per item (no baseline needed): a game of up to 9 moves is 5 turns of the two players
    args = agentic_args(tmp_path, cls=MAREINFORCEConfig, num_turns=5, num_generations=1, max_completion_length=8)
    trainer = MAREINFORCETrainer(
        model=tiny_path,
        args=args,
        train_dataset=[{"prompt": "", "seed": 3}, {"prompt": "", "seed": 4}],
        environment_factory=textarena_factory("TicTacToe-v0"),
    )
    script = Scripted(trainer, legal_tictactoe)
    trainer.train()
    logs = trainer.state.log_history[0]
    # a game of TicTacToe ends in 5 to 9 moves: both players act, the winner gets +1 and the loser -1 (or 0, 0)
    rewards = [logs["agent_1/env_reward"], logs["agent_2/env_reward"]]
    assert rewards[0] == -rewards[1] and abs(rewards[0]) in (0.0, 0.5, 1.0)
    assert logs["agent_1/episode_length"] >= 3 and logs["agent_2/episode_length"] >= 2
    assert logs["episodes/ended_by_environment"] == 1.0 and logs["agent_1/tools/calls"] == 0
    # one call per agent position per turn, over both games while any goes on
    assert script.calls[:2] == [(0, 2), (1, 2)] and len(script.calls) <= 10
    rollout = trainer._buffered[0]["rollout"]
    last = [n for n in rollout.nodes if not n.children]
    assert len(last) == 2 and all(n.rewards.ndim == 2 and n.rewards[0].sum() == 0 for n in last)  # zero-sum
    # where a player did not move (the game ended on the other's move), its sample is one EOS, masked
    idle = [s for s in rollout.samples if s.tool_mask is not None]
    assert idle and all(s.completion_ids.numel() == 1 and s.tool_mask.tolist() == [0] for s in idle)


def test_pettingzoo_game_training(tiny_path, tmp_path):
    pytest.importorskip("pettingzoo")
    from test_environments_adapters import _race_env_cls

    from trl_marl.environments import pettingzoo_factory

    def text(name, observation):
        return f"Counter: {int(observation[0])}. Add 1, 2 or 3; reaching 10 wins."

    def action(name, message, space, observation):
        m = re.search(r"[123]", message)
        return int(m.group()) - 1 if m else None

    trainer = MAGRPOTrainer(
        model=tiny_path,
        args=agentic_args(tmp_path, num_turns=4, rollout_buffer_size=1, max_completion_length=8),
        train_dataset=[{"prompt": "", "seed": 0}] * 2,
        environment_factory=pettingzoo_factory(_race_env_cls(), observation_to_text=text, text_to_action=action),
    )
    Scripted(trainer, lambda agent, prompt, continued: f"{random.Random(prompt).randint(1, 3)}{END}")
    trainer.train()
    logs = trainer.state.log_history[0]
    assert (
        sorted([logs["agent_1/env_reward"], logs["agent_2/env_reward"]]) == [-1.0, 1.0]
        or logs["episodes/ended_by_environment"] < 1
    )
    assert "agent_2/episode_length" in logs
