"""What every classic learner shares: the episode record, decentralized rollouts, the training loop and evaluation.

Training and execution are kept apart, as CTDE asks: `Learner.act` (execution) receives only the per-agent
observations `o_i`; the centralized state and the joint actions reach a learner only through `Learner.update`
(training), inside the recorded `Episode`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from trl_marl.envs.gridworld import GridWorld

__all__ = [
    "Episode",
    "Learner",
    "ReplayBuffer",
    "TrainResult",
    "epsilon_greedy",
    "evaluate",
    "linear_schedule",
    "pad_episodes",
    "sample_softmax",
    "tabular_update",
    "run_episode",
    "train",
]


@dataclass
class Episode:
    """One recorded episode: the per-agent observation and action streams, plus what training may use.

    Attributes:
        obs: `(T + 1, n)` decentralized observations `o_i` (the last row is the final observation).
        states: `(T + 1,)` centralized states.
        actions: `(T, n)` actions.
        rewards: `(T, n)` per-agent rewards.
        terminated: the episode ended by itself (goal or crash): nothing to bootstrap after its last step. False
            when it was truncated at the step limit.
        steps_to_goal: `GridWorld.steps_to_goal()` of the episode.
        winner: competitive games: the rewarded agent, else None.
        crashed: the episode ended in a crash.
    """

    obs: np.ndarray
    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: bool
    steps_to_goal: int
    winner: int | None = None
    crashed: bool = False

    @property
    def length(self) -> int:
        return len(self.actions)

    @property
    def has_next(self) -> np.ndarray:
        """`(T,)` whether step t has a successor to bootstrap from: all but the last step of a terminated episode."""
        has_next = np.ones(self.length, dtype=bool)
        if self.terminated:
            has_next[-1] = False
        return has_next


class ReplayBuffer:
    """A fixed-size ring buffer of transitions `(s, o, a, r, s', o', has_next)` taken from episodes.

    `r` is stored per agent `(n,)`; the learner decides how to combine it.
    """

    def __init__(self, capacity: int, num_agents: int):
        self.capacity, self.size, self.pos = capacity, 0, 0
        self.data = {
            "s": np.zeros(capacity, dtype=np.int64),
            "o": np.zeros((capacity, num_agents), dtype=np.int64),
            "a": np.zeros((capacity, num_agents), dtype=np.int64),
            "r": np.zeros((capacity, num_agents), dtype=np.float32),
            "s2": np.zeros(capacity, dtype=np.int64),
            "o2": np.zeros((capacity, num_agents), dtype=np.int64),
            "has_next": np.zeros(capacity, dtype=bool),
        }

    def add(self, episode: Episode) -> None:
        T = episode.length
        rows = {
            "s": episode.states[:T],
            "o": episode.obs[:T],
            "a": episode.actions,
            "r": episode.rewards,
            "s2": episode.states[1:],
            "o2": episode.obs[1:],
            "has_next": episode.has_next,
        }
        idx = (self.pos + np.arange(T)) % self.capacity
        for k, v in rows.items():
            self.data[k][idx] = v
        self.pos = int((self.pos + T) % self.capacity)
        self.size = min(self.capacity, self.size + T)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """A uniform minibatch (with replacement) as tensors."""
        idx = rng.integers(self.size, size=batch_size)
        return {k: torch.from_numpy(v[idx]) for k, v in self.data.items()}


def pad_episodes(episodes: list[Episode]) -> dict[str, torch.Tensor]:
    """Stack episodes into right-padded tensors, `M` episodes by `T` = the longest length.

    Returns `obs (M, T + 1, n)`, `states (M, T + 1)`, `actions (M, T, n)`, `rewards (M, T, n)`,
    `has_next (M, T)` (False on padding) and `valid (M, T)`. Padding uses index 0 and reward 0, so a padded step
    has a zero TD error when its values are zeroed or masked.
    """
    M, T, n = len(episodes), max(e.length for e in episodes), episodes[0].obs.shape[1]
    obs = np.zeros((M, T + 1, n), dtype=np.int64)
    states = np.zeros((M, T + 1), dtype=np.int64)
    actions = np.zeros((M, T, n), dtype=np.int64)
    rewards = np.zeros((M, T, n), dtype=np.float32)
    has_next = np.zeros((M, T), dtype=bool)
    valid = np.zeros((M, T), dtype=bool)
    for m, e in enumerate(episodes):
        L = e.length
        obs[m, : L + 1], states[m, : L + 1], actions[m, :L], rewards[m, :L] = e.obs, e.states, e.actions, e.rewards
        has_next[m, :L], valid[m, :L] = e.has_next, True
    return {
        "obs": torch.from_numpy(obs),
        "states": torch.from_numpy(states),
        "actions": torch.from_numpy(actions),
        "rewards": torch.from_numpy(rewards),
        "has_next": torch.from_numpy(has_next),
        "valid": torch.from_numpy(valid),
    }


class Learner(Protocol):
    """A multi-agent learner: decentralized `act`, centralized-or-not `update`."""

    name: str

    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        """Joint action `(n,)` from the per-agent observations `(n,)` only. `explore=False`: the greedy policy."""
        ...

    def update(self, episode: Episode, progress: float) -> dict[str, float]:
        """Learn from one finished episode; `progress` in [0, 1] is the fraction of training done (for schedules)."""
        ...


def linear_schedule(start: float, end: float, fraction: float, progress: float) -> float:
    """`start + (end - start) * min(1, progress / fraction)`: linear from `start` to `end` over the first `fraction`
    of training, then flat (an epsilon-greedy schedule)."""
    if fraction <= 0:
        return end
    return start + (end - start) * min(1.0, progress / fraction)


def epsilon_greedy(q: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Per agent, a uniformly random action with probability `epsilon`, else `argmax_a q[i, a]` (ties broken at
    random). `q` is `(n, num_actions)`; returns `(n,)` actions."""
    n, num_actions = q.shape
    noise = rng.random(q.shape)  # a random order among the maximal entries
    greedy = np.where(q == q.max(axis=-1, keepdims=True), noise, -1.0).argmax(axis=-1)
    explore = rng.random(n) < epsilon
    return np.where(explore, rng.integers(num_actions, size=n), greedy)


def sample_softmax(logits: np.ndarray, rng: np.random.Generator, greedy: bool = False) -> np.ndarray:
    """One action per row of `(n, A)` logits: sampled from `softmax(logits)`, or the argmax when `greedy`."""
    if greedy:
        return logits.argmax(axis=-1)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random((len(logits), 1)) * cdf[:, -1:]
    return np.minimum((u > cdf).sum(axis=-1), logits.shape[-1] - 1)


def tabular_update(
    table: torch.Tensor, index: tuple[torch.Tensor, ...], targets: torch.Tensor, lr: float
) -> torch.Tensor:
    """In-place tabular step towards minibatch targets, duplicates averaged; returns the errors.

        T[k] <- T[k] + lr * mean_{j : index_j = k} (y_j - T[k])

    Averaging keeps a frequent entry (say, the start state) from taking a step `lr * count` in one minibatch.
    """
    with torch.no_grad():
        errors = targets - table[index]
        flat = torch.as_tensor(np.ravel_multi_index([i.numpy() for i in index], table.shape)).flatten()
        counts = torch.bincount(flat, minlength=table.numel())[flat].view(errors.shape).to(errors.dtype)
        table.index_put_(index, lr * errors / counts, accumulate=True)
    return errors


def run_episode(env: GridWorld, policy: Callable[[np.ndarray], np.ndarray], seed: int | None = None) -> Episode:
    """Play one episode where `policy(obs) -> actions` sees only the per-agent observations, and record it."""
    obs = env.reset(seed=seed)
    all_obs, states, actions, rewards = [obs], [env.state()], [], []
    done, info = False, {}
    while not done:
        a = np.asarray(policy(obs), dtype=np.int64)
        obs, r, done, info = env.step(a)
        all_obs.append(obs)
        states.append(info["state"])
        actions.append(a)
        rewards.append(r)
    return Episode(
        obs=np.asarray(all_obs),
        states=np.asarray(states),
        actions=np.asarray(actions),
        rewards=np.asarray(rewards, dtype=np.float64),
        terminated=bool(info["terminated"]),
        steps_to_goal=env.steps_to_goal(),
        winner=info["winner"],
        crashed=bool(info["crashed"]),
    )


def evaluate(learner: Learner, env: GridWorld, seed: int | None = None) -> Episode:
    """One episode of decentralized greedy execution (`act(obs, explore=False)`)."""
    return run_episode(env, lambda obs: learner.act(obs, explore=False), seed=seed)


@dataclass
class TrainResult:
    """Learning curve of one learner on one seed.

    Attributes:
        name: the learner's name.
        seed: the seed.
        train_steps: `(episodes,)` steps to goal of every training (exploring) episode.
        eval_at: episode counts at which the greedy policy was evaluated.
        eval_steps: steps to goal of the greedy, decentralized policy at each `eval_at`.
        final: the last greedy evaluation episode (its per-agent trace).
        train_winners: competitive games: the rewarded agent of every training episode (None: nobody).
        seconds: wall time of the run.
        logs: the last metrics the learner's `update` returned.
    """

    name: str
    seed: int
    train_steps: np.ndarray
    eval_at: np.ndarray
    eval_steps: np.ndarray
    final: Episode
    train_winners: list[int | None]
    seconds: float
    logs: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """Tiny tensors run fastest on one thread; restore the caller's setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train(learner: Learner, env: GridWorld, episodes: int, seed: int, eval_every: int = 10) -> TrainResult:
    """Train `learner` for `episodes` episodes and evaluate its greedy decentralized policy every `eval_every`.

    Episode k is reset with seed `seed * 1_000_003 + k`, so runs are reproducible.
    """
    start = time.perf_counter()
    train_steps, train_winners, eval_at, eval_steps, logs = [], [], [], [], {}
    with _torch_threads(1):
        for k in range(episodes):
            episode = run_episode(env, lambda obs: learner.act(obs, explore=True), seed=seed * 1_000_003 + k)
            logs = learner.update(episode, progress=k / max(1, episodes - 1)) or logs
            train_steps.append(episode.steps_to_goal)
            train_winners.append(episode.winner)
            if (k + 1) % eval_every == 0 or k + 1 == episodes:
                eval_at.append(k + 1)
                eval_steps.append(evaluate(learner, env, seed=seed).steps_to_goal)
        final = evaluate(learner, env, seed=seed)
    return TrainResult(
        name=learner.name,
        seed=seed,
        train_steps=np.asarray(train_steps),
        eval_at=np.asarray(eval_at),
        eval_steps=np.asarray(eval_steps),
        final=final,
        train_winners=train_winners,
        seconds=time.perf_counter() - start,
        logs=dict(logs),
    )
