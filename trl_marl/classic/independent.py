"""Independent learners: each agent runs its own tabular Q-learning on its own observation (Tan, 1993).

Each agent treats the others as part of the environment. From agent i's point of view the world is then
non-stationary — its transition and reward depend on what the other agents do, and they are exploring and learning
too — so `Q_i(o_i, a_i)` converges to the value of a best response to the others' *behaviour* (exploration
included), not to their greedy policies.

The LLM counterpart in this project is `IACTrainer` (`recipes/iac.py`): one critic per agent that sees only that
agent's own history.
"""

from __future__ import annotations

import numpy as np
import torch

from trl_marl.algorithms.advantages import td_targets
from trl_marl.classic.base import Episode, epsilon_greedy, linear_schedule

__all__ = ["IndependentAgents", "q_learning_step"]


def q_learning_step(
    q: torch.Tensor,
    obs: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    next_obs: torch.Tensor,
    has_next: torch.Tensor,
    discount: float,
    lr: float,
    negative_lr_scale: float = 1.0,
) -> torch.Tensor:
    """One tabular Q-learning update of every agent's table, in place; returns the TD errors `(n,)`.

        y_i     = r_i + discount * max_a' Q_i(o'_i, a')        (`td_targets`; r_i alone when the episode ended)
        delta_i = y_i - Q_i(o_i, a_i)
        Q_i(o_i, a_i) <- Q_i(o_i, a_i) + lr * delta_i            (lr * negative_lr_scale when delta_i < 0)

    `negative_lr_scale < 1` is hysteretic Q-learning (Matignon et al., 2007): an optimistic independent learner that
    discounts bad outcomes, which it cannot tell apart from the other agents' exploration.

    Args:
        q: `(n, num_obs, num_actions)` tables, one per agent.
        obs, actions, next_obs: `(n,)` indices of one transition; rewards `(n,)`; has_next a bool scalar tensor.
    """
    agents = torch.arange(q.shape[0])
    target = td_targets(rewards, q[agents, next_obs].max(dim=-1).values, has_next.expand(q.shape[0]), discount)
    error = target - q[agents, obs, actions]
    q[agents, obs, actions] += lr * torch.where(error < 0, negative_lr_scale * error, error)
    return error


class IndependentAgents:
    """Independent Q-learners: agent i keeps a table `Q_i(o_i, a_i)` and learns from its own reward only.

    Exploration is epsilon-greedy, linear from `epsilon_start` to `epsilon_end` over the first `epsilon_fraction` of
    training. After each episode every transition is replayed once, last to first (so the final reward reaches the
    first step in one pass), with `q_learning_step`.

    Args:
        num_agents, num_obs, num_actions: sizes of the game.
        discount: gamma.
        lr: the tabular step size.
        epsilon_start, epsilon_end, epsilon_fraction: the exploration schedule.
        negative_lr_scale: 1.0 is plain Q-learning; below 1, hysteretic Q-learning (see `q_learning_step`).
        seed: seeds the exploration.
    """

    name = "IndependentAgents"

    def __init__(
        self,
        num_agents: int = 2,
        num_obs: int = 16,
        num_actions: int = 5,
        discount: float = 0.9,
        lr: float = 0.2,
        epsilon_start: float = 1.0,
        epsilon_end: float = 0.1,
        epsilon_fraction: float = 0.3,
        negative_lr_scale: float = 1.0,
        seed: int = 0,
    ):
        self.discount, self.lr, self.negative_lr_scale = discount, lr, negative_lr_scale
        self.epsilon_start, self.epsilon_end, self.epsilon_fraction = epsilon_start, epsilon_end, epsilon_fraction
        self.epsilon = epsilon_start
        self.q = torch.zeros(num_agents, num_obs, num_actions, dtype=torch.float32)
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        rows = self.q.numpy()[np.arange(len(obs)), obs]  # agent i looks up its own o_i only
        if not explore:
            return rows.argmax(axis=-1)
        return epsilon_greedy(rows, self.epsilon, self.rng)

    def update(self, episode: Episode, progress: float) -> dict[str, float]:
        obs = torch.as_tensor(episode.obs)
        actions = torch.as_tensor(episode.actions)
        rewards = torch.as_tensor(episode.rewards, dtype=torch.float32)
        has_next = torch.as_tensor(episode.has_next)
        errors = []
        with torch.no_grad():
            for t in reversed(range(episode.length)):
                err = q_learning_step(
                    self.q,
                    obs[t],
                    actions[t],
                    rewards[t],
                    obs[t + 1],
                    has_next[t],
                    self.discount,
                    self.lr,
                    self.negative_lr_scale,
                )
                errors.append(err.abs().mean().item())
        self.epsilon = linear_schedule(self.epsilon_start, self.epsilon_end, self.epsilon_fraction, progress)
        return {"td_error": float(np.mean(errors)), "epsilon": self.epsilon}
