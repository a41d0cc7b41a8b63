"""A two-agent 4x4 grid world in which the fastest plan needs coordination, to check the MARL math on a known optimum.

Layout (row, column), row 0 at the top::

        c0  c1  c2  c3
    r0   .   .   .   .
    r1   A   B   .   G
    r2   .   .   .   .
    r3   .   .   .   .

Rules:

- Agent A (agent 0) starts at (1, 0), agent B (agent 1) at (1, 1); the goal G is at (1, 3).
- Actions, the same for both agents: 0 stay, 1 up, 2 down, 3 left, 4 right. A move off the grid leaves the agent
  where it is (that is not a collision).
- Moves are simultaneous and the agents are solid outside the goal (the goal holds both). The agents CRASH when,
  outside the goal, both would end on the same cell, they would swap cells, or one moves into the cell of the other
  while that one stays. Following the other agent into the cell it is leaving is allowed. A crash ends the episode,
  the moves are not made, and each agent receives `-collision_penalty` (default -1).
- Cooperative rule (`competitive=False`, the default): an agent that reaches the goal stays there (its actions are
  ignored). The episode ends when BOTH agents are on the goal; that step pays the one shared reward, 1.0 to each
  agent. Every other step pays 0.
- Competitive rule (`competitive=True`): the episode ends as soon as an agent reaches the goal and only that agent
  is rewarded (1.0, the other 0.0). When both step on the goal at the same time, one of them, drawn with the
  environment's seeded generator, takes the reward.
- Step limit: after `max_steps` (default 12) steps the episode is truncated with reward 0. A crash or a truncation
  counts as `max_steps` steps to the goal (the goal was not reached).
- Observations are decentralized: agent i sees only its own cell, `o_i = row * 4 + col` (0..15). The centralized
  state, which only critics and mixers see during training, is both cells, `s = o_A * 16 + o_B` (0..255).
- `reset(seed)` seeds the environment's generator, in the manner of Gymnasium. The cooperative game is deterministic;
  the generator only draws the winner of a tie in the competitive game.

Why the optimum is 3 steps. A is 3 cells from the goal, so no joint policy finishes in fewer than 3 steps, and A's
only 3-step path is straight along row 1, through B's start (1, 1) and (1, 2). It is free only if B walks ahead:
B right, right (on the goal at t = 2) while A right, right, right follows one cell behind, entering at every step the
cell B is leaving: both are on the goal at t = 3. This plan is the only one that takes 3 steps. If B steps aside
instead, B needs at least 4 steps; if A avoids B, its detour through row 0 or row 2 (up, right x3, down) takes 5.

Why coordination matters. A's fastest path is safe only as long as B really moves right: at each of the first two
steps, a B that stays or steps back crashes into A (and a B that steps up or down makes its own trip longer). An
independent learner cannot tell B's random exploratory moves from the rest of the world, so it learns that walking
behind B is dangerous and settles on the 5-step detour — a best response to an exploring, still-learning partner
rather than to the partner's actual policy (the relative-overgeneralization face of non-stationarity). A learner
whose critic or mixer sees the joint state and actions can book a crash on B's move and learn that following a B
that goes right is safe.

The competitive variant used by the recipe, `RACE`, keeps the grid and the rules but makes the start symmetric so
that neither agent has a head start: A at (1, 0), B at (0, 1), goal at (2, 2), both 3 steps away. Their shortest
paths cross at (1, 1), (2, 1) and (1, 2), so racing risks a crash; two non-crossing paths (A down, right, right and
B right, down, down) reach the goal together at t = 3, a tie that the coin decides. (With the cooperative starts B is
a step closer and always wins the race by walking right.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "ACTIONS",
    "MOVES",
    "OPTIMAL_STEPS",
    "RACE",
    "GridConfig",
    "GridWorld",
    "crashes",
    "propose_moves",
]

ACTIONS = ("stay", "up", "down", "left", "right")
# (d_row, d_col) of each action.
MOVES = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))
# The fewest steps in which both agents of the default cooperative layout can stand on the goal (module docstring).
OPTIMAL_STEPS = 3

Cell = tuple[int, int]


@dataclass(frozen=True)
class GridConfig:
    """Layout and rules of the grid world.

    Attributes:
        size: side of the square grid.
        starts: start cell (row, col) of each agent.
        goal: goal cell (row, col), shared by all agents.
        max_steps: step limit; an episode that reaches it is truncated with reward 0.
        collision_penalty: what each agent loses when the agents crash (the episode then ends).
        competitive: the first agent on the goal takes the only reward (instead of all having to reach it).
    """

    size: int = 4
    starts: tuple[Cell, ...] = ((1, 0), (1, 1))
    goal: Cell = (1, 3)
    max_steps: int = 12
    collision_penalty: float = 1.0
    competitive: bool = False

    def __post_init__(self):
        object.__setattr__(self, "starts", tuple(tuple(c) for c in self.starts))
        object.__setattr__(self, "goal", tuple(self.goal))
        cells = [*self.starts, self.goal]
        if any(not (0 <= r < self.size and 0 <= c < self.size) for r, c in cells):
            raise ValueError(f"starts {self.starts} and goal {self.goal} must lie on the {self.size}x{self.size} grid")
        if len(self.starts) < 2:
            raise ValueError("a multi-agent grid world needs at least 2 agents")
        if len(set(self.starts)) != len(self.starts) or self.goal in self.starts:
            raise ValueError("agents must start on distinct cells, away from the goal")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")

    @property
    def num_agents(self) -> int:
        return len(self.starts)

    @property
    def num_cells(self) -> int:
        return self.size * self.size

    @property
    def num_states(self) -> int:
        """Number of centralized states (joint cells)."""
        return self.num_cells**self.num_agents


# The competitive variant used by the recipe: a symmetric race. Both agents are 3 steps from the goal and their
# shortest paths cross, so neither has a head start and racing risks a crash (see the module docstring).
RACE = GridConfig(starts=((1, 0), (0, 1)), goal=(2, 2), competitive=True)


def propose_moves(positions: Sequence[Cell], actions: Sequence[int], size: int) -> list[Cell]:
    """Cells the agents move to if nothing collides: `clip(p_i + MOVES[a_i], 0, size - 1)` per coordinate."""
    out = []
    for (r, c), a in zip(positions, actions):
        dr, dc = MOVES[int(a)]
        out.append((min(max(r + dr, 0), size - 1), min(max(c + dc, 0), size - 1)))
    return out


def crashes(positions: Sequence[Cell], proposed: Sequence[Cell], goal: Cell) -> bool:
    """Whether simultaneous moves `p_i -> q_i` crash: for some pair i != j, with the cell in question not the goal,

        q_i == q_j                         (both end on the same cell)
        q_i == p_j and q_j == p_i          (swap)
        q_i == p_j and q_j == p_j          (i walks into j, which stays)

    Following (`q_i == p_j` while j moves elsewhere) is not a crash.
    """
    p, q, goal = [tuple(x) for x in positions], [tuple(x) for x in proposed], tuple(goal)
    for i in range(len(p)):
        if q[i] == goal:
            continue
        for j in range(len(p)):
            if i != j and (q[i] == q[j] or (q[i] == p[j] and q[j] in (p[i], p[j]))):
                return True
    return False


class GridWorld:
    """The grid world of the module docstring (cooperative by default, competitive with `competitive=True`).

    `reset(seed)` returns the per-agent observations; `step(actions)` returns `(observations, rewards, done, info)`
    with one reward per agent. `info` holds `state` (centralized state), `steps`, `terminated` (goal reached or crash),
    `truncated` (step limit), `crashed`, `at_goal` (per agent) and `winner` (competitive: the rewarded agent or None).
    Keyword overrides build the config: `GridWorld(competitive=True)`.
    """

    def __init__(self, config: GridConfig | None = None, **overrides):
        base = config or GridConfig()
        self.config = replace(base, **overrides) if overrides else base
        self.rng = np.random.default_rng()
        self.reset()

    @property
    def num_agents(self) -> int:
        return self.config.num_agents

    def observations(self) -> np.ndarray:
        """Decentralized observations: agent i's own cell index `row * size + col`, `(n,)`."""
        size = self.config.size
        return np.array([r * size + c for r, c in self.positions])

    def state(self) -> int:
        """Centralized state: the joint cell index `sum_i o_i * num_cells^(n - 1 - i)`."""
        size, cells, s = self.config.size, self.config.num_cells, 0
        for r, c in self.positions:
            s = s * cells + r * size + c
        return s

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Put the agents on their start cells; with `seed`, reseed the environment's generator."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.positions: list[Cell] = list(self.config.starts)
        self.at_goal = [False] * self.num_agents
        self.steps = 0
        self.done = False
        return self.observations()

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, bool, dict]:
        if self.done:
            raise RuntimeError("step() called on a finished episode; call reset()")
        cfg = self.config
        actions = [int(a) for a in np.asarray(actions).reshape(-1)]
        if len(actions) != self.num_agents or any(not 0 <= a < len(ACTIONS) for a in actions):
            raise ValueError(f"expected {self.num_agents} actions in 0..{len(ACTIONS) - 1}, got {actions}")
        actions = [0 if done else a for a, done in zip(actions, self.at_goal)]  # an agent on the goal stays there
        proposed = propose_moves(self.positions, actions, cfg.size)
        crashed = crashes(self.positions, proposed, cfg.goal)
        self.steps += 1
        rewards = np.zeros(self.num_agents)
        winner = None
        terminated = False
        if crashed:
            rewards -= cfg.collision_penalty
            terminated = True
        else:
            newly = [p == cfg.goal and not done for p, done in zip(proposed, self.at_goal)]
            self.positions = proposed
            self.at_goal = [p == cfg.goal for p in proposed]
            if cfg.competitive and any(newly):
                winner = int(self.rng.choice([i for i, x in enumerate(newly) if x]))
                rewards[winner] = 1.0
                terminated = True
            elif not cfg.competitive and all(self.at_goal):
                rewards[:] = 1.0
                terminated = True
        truncated = not terminated and self.steps >= cfg.max_steps
        self.done = terminated or truncated
        info = {
            "state": self.state(),
            "steps": self.steps,
            "terminated": terminated,
            "truncated": truncated,
            "crashed": crashed,
            "at_goal": list(self.at_goal),
            "winner": winner,
        }
        return self.observations(), rewards, self.done, info

    def steps_to_goal(self) -> int:
        """Steps the finished episode took to put the agents on the goal (cooperative: all of them; competitive: the
        winner), or `max_steps` when it crashed or was truncated."""
        succeeded = any(self.at_goal) if self.config.competitive else all(self.at_goal)
        return self.steps if self.done and succeeded else self.config.max_steps
