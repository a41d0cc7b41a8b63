"""MADDPG-style actor-critic (Lowe et al., NeurIPS 2017) for discrete actions: the CTDE pattern.

Agent i has an actor `pi_i(a_i | o_i)` that sees only its own observation (a softmax over a logit table) and its own
CENTRALIZED critic `Q_i(s, a_1, ..., a_n)` over the joint state and the joint action (a table over joint states
times joint actions). During training every agent's action is known, so a crash caused by the other agent's
exploratory move is booked on that joint action, not on agent i's own action; at execution the actor sees only
`o_i`.

    critic: y_i = r_i + discount * sum_{a'} prod_j pi'_j(a'_j | o'_j) * Q_i(s', a')      (`td_targets`; pi' = target
            Q_i(s, a) <- Q_i(s, a) + lr_critic * (y_i - Q_i(s, a))                         actors)
    actor:  J_i(s) = sum_{a_i} pi_i(a_i | o_i) * E_{a_-i ~ pi_-i(. | o_-i)} Q_i(s, a_i, a_-i)
            theta_i <- theta_i + lr_actor * grad_theta_i J_i        (other agents' policies held fixed)

The actor step is the discrete counterpart of MADDPG's `grad_theta mu_i(o_i) * grad_{a_i} Q_i(x, a_1..n)` at
`a_j = mu_j(o_j)`: the other agents enter through their current POLICIES, not their exploratory actions. The critic
grows with the number of agents (here `|A|^n` joint actions), MADDPG's scaling limit.

The LLM counterparts in this project: `MAPPOTrainer(shared_critic=False)` (`recipes/mappo.py --shared_critic false`)
gives each agent its own critic over the joint history, as here; `MAACTrainer` (`recipes/maac.py`) has one
centralized critic whose TD error every agent shares.
"""

from __future__ import annotations

import numpy as np
import torch

from trl_marl.algorithms.advantages import td_targets
from trl_marl.classic.base import Episode, ReplayBuffer, linear_schedule, sample_softmax, tabular_update

__all__ = ["MADDPGStyle", "expected_joint_value", "softmax_actor_gradient"]


def expected_joint_value(q: torch.Tensor, pi_0: torch.Tensor, pi_1: torch.Tensor) -> torch.Tensor:
    """Expectation of two-agent joint-action values under independent policies:

        V[..., b] = sum_{x, y} pi_0[b, x] * pi_1[b, y] * Q[..., b, x, y]

    Args:
        q: `(..., B, A, A)` joint-action values, axes (agent 0's action, agent 1's action).
        pi_0, pi_1: `(B, A)` action probabilities of agent 0 and agent 1.

    Returns:
        `(..., B)`.
    """
    return (q * pi_0.unsqueeze(-1) * pi_1.unsqueeze(-2)).sum(dim=(-1, -2))


def softmax_actor_gradient(pi: torch.Tensor, q_bar: torch.Tensor, entropy_coef: float = 0.0) -> torch.Tensor:
    """Gradient of `J = sum_a pi_a * q_bar_a + entropy_coef * H(pi)` with respect to the logits of `pi = softmax(z)`:

        dJ/dz_a = pi_a * (q_bar_a - sum_b pi_b q_bar_b) - entropy_coef * pi_a * (log pi_a + H(pi))

    (the all-actions policy gradient; `q_bar_a` is the critic's value of action a with the other agents' actions
    averaged under their policies). `pi` and `q_bar` are `(B, A)`; returns `(B, A)`.
    """
    log_pi = torch.log(pi.clamp_min(1e-12))
    entropy = -(pi * log_pi).sum(dim=-1, keepdim=True)
    advantage = q_bar - (pi * q_bar).sum(dim=-1, keepdim=True)
    return pi * advantage - entropy_coef * pi * (log_pi + entropy)


class MADDPGStyle:
    """Softmax actors on own observations, one centralized critic `Q_i(s, a_1, a_2)` per agent, off-policy.

    Behaviour: each agent samples from its actor, replaced by a uniformly random action with probability epsilon
    (the same schedule as the value-based learners; the discrete stand-in for MADDPG's action noise). Transitions go
    to a replay buffer; after each episode, `updates_per_episode` times, a minibatch updates

    - the critics by a tabular step towards `y_i` (`tabular_update`), the next-state value taken under the TARGET
      actors (copies of the actors, refreshed every `target_every` episodes), as MADDPG does;
    - the actors by one RMSprop step along `softmax_actor_gradient` of `mean J_i(s) + entropy_coef * H(pi_i)` over
      the minibatch's states.

    The buffer is small (500 transitions, the last ~60 episodes) on purpose: the actor of observation `o_i` is pulled
    by every joint state in the minibatch in which agent i sees `o_i`, so the minibatch should come from roughly the
    states the current policies visit, not from the random play of the first episodes.

    Args:
        num_agents, num_obs, num_actions, num_states: sizes of the game (only 2 agents are supported: the critic is a
            table over joint actions).
        discount: gamma.
        critic_lr: tabular step size of the critics. actor_lr: RMSprop learning rate of the actor logits.
        entropy_coef: weight of the actors' entropy bonus (keeps the softmax from saturating early).
        batch_size, buffer_size, updates_per_episode, target_every: replay and target settings.
        epsilon_start, epsilon_end, epsilon_fraction: the exploration schedule.
        seed: seeds the exploration and sampling.
    """

    name = "MADDPGStyle"

    def __init__(
        self,
        num_agents: int = 2,
        num_obs: int = 16,
        num_actions: int = 5,
        num_states: int = 256,
        discount: float = 0.9,
        critic_lr: float = 0.2,
        actor_lr: float = 0.05,
        entropy_coef: float = 0.01,
        batch_size: int = 128,
        buffer_size: int = 500,
        updates_per_episode: int = 1,
        target_every: int = 10,
        epsilon_start: float = 1.0,
        epsilon_end: float = 0.1,
        epsilon_fraction: float = 0.3,
        seed: int = 0,
    ):
        if num_agents != 2:
            raise ValueError("MADDPGStyle's tabular critic is written for 2 agents")
        self.num_agents, self.num_actions, self.discount = num_agents, num_actions, discount
        self.entropy_coef, self.batch_size = entropy_coef, batch_size
        self.updates_per_episode, self.target_every = updates_per_episode, target_every
        self.epsilon_start, self.epsilon_end, self.epsilon_fraction = epsilon_start, epsilon_end, epsilon_fraction
        self.epsilon = epsilon_start
        self.rng = np.random.default_rng(seed)
        self.logits = torch.zeros(num_agents, num_obs, num_actions, requires_grad=True)
        self.critic = torch.zeros(num_agents, num_states, num_actions, num_actions)
        self.critic_lr = critic_lr
        self.target_logits = self.logits.detach().clone()
        self.actor_optimizer = torch.optim.RMSprop([self.logits], lr=actor_lr)
        self.buffer = ReplayBuffer(buffer_size, num_agents)
        self.episodes_seen = 0

    def policies(self, obs: torch.Tensor, logits: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each agent's action probabilities `(B, A)` at observations `obs` `(B, n)` (decentralized)."""
        logits = self.logits if logits is None else logits
        return [torch.softmax(logits[i, obs[:, i]], dim=-1) for i in range(self.num_agents)]

    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        logits = self.logits.detach().numpy()[np.arange(len(obs)), obs]
        actions = sample_softmax(logits, self.rng, greedy=not explore)
        if not explore:
            return actions
        random = self.rng.random(len(obs)) < self.epsilon
        return np.where(random, self.rng.integers(self.num_actions, size=len(obs)), actions)

    def update(self, episode: Episode, progress: float) -> dict[str, float]:
        self.buffer.add(episode)
        self.episodes_seen += 1
        n = self.num_agents
        agents = torch.arange(n)
        for _ in range(self.updates_per_episode):
            b = self.buffer.sample(self.batch_size, self.rng)
            # Critics: TD on Q_i(s, a_0, a_1), the next state's value under the target actors.
            with torch.no_grad():
                next_pi = self.policies(b["o2"], self.target_logits)
                next_v = expected_joint_value(self.critic[:, b["s2"]], *next_pi)  # (n, B)
                y = td_targets(b["r"].T, next_v, b["has_next"].expand(n, -1), self.discount)
            index = (agents[:, None].expand(-1, len(b["s"])), *(x.expand(n, -1) for x in (b["s"], *b["a"].T)))
            critic_loss = tabular_update(self.critic, index, y, self.critic_lr).pow(2).mean()
            # Actors: ascend J_i(s) against the critic, the other agent's current policy held fixed.
            with torch.no_grad():
                pi_0, pi_1 = self.policies(b["o"])
                q = self.critic[:, b["s"]]  # (n, B, A, A), axes (a_0, a_1)
                q_bar = ((q[0] * pi_1.unsqueeze(-2)).sum(-1), (q[1] * pi_0.unsqueeze(-1)).sum(-2))  # (B, A) each
                j = (pi_0 * q_bar[0]).sum(-1) + (pi_1 * q_bar[1]).sum(-1)
                grad = torch.zeros_like(self.logits)
                for i, (pi, qb) in enumerate(zip((pi_0, pi_1), q_bar)):
                    g = softmax_actor_gradient(pi, qb, self.entropy_coef) / len(b["s"])
                    grad[i].index_put_((b["o"][:, i],), g, accumulate=True)
            self.logits.grad = -grad  # the optimizer minimises -J
            self.actor_optimizer.step()
        if self.episodes_seen % self.target_every == 0:
            self.target_logits = self.logits.detach().clone()
        self.epsilon = linear_schedule(self.epsilon_start, self.epsilon_end, self.epsilon_fraction, progress)
        return {
            "critic_loss": critic_loss.item(),
            "actor_objective": j.mean().item(),
            "epsilon": self.epsilon,
        }
