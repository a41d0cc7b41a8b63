"""MAPPO-style learner (Yu et al., NeurIPS 2022): PPO with a centralized value function.

Each agent has its own policy `pi_i(a_i | o_i)` over its own observation (a softmax over a logit table). The value
`V_i(s)` reads the centralized state (a table over joint states; in the cooperative game every agent's reward is
the shared one, so the agents' values agree). Advantages come from GAE on that value and each policy takes PPO
clipped-surrogate steps:

    delta_t = r_t + discount * V(s_{t+1}) - V(s_t),     A_t = sum_k (discount * lam)^k delta_{t+k}      (`gae`)
    L_pi    = sum_i - mean_t min(rho_i,t A_i,t, clip(rho_i,t, 1 - eps, 1 + eps) A_i,t),
              rho_i,t = pi_i(a_i,t | o_i,t) / pi_i_old(a_i,t | o_i,t)                                   (`ppo_clip_loss`)
    L_V     = sum_i mean_t (V_i(s_t) - V_hat_i,t)^2                                                      (`value_loss`)

The centralized value removes from the advantage the variance caused by where the other agents are, which a value
on `o_i` alone would leave in. These are the same functions `MAPPOTrainer` (`recipes/mappo.py`) uses on LLM
agents.
"""

from __future__ import annotations

import numpy as np
import torch

from trl_marl.algorithms.advantages import gae
from trl_marl.algorithms.losses import ppo_clip_loss, value_loss
from trl_marl.classic.base import Episode, pad_episodes, sample_softmax

__all__ = ["MAPPOStyle"]


class MAPPOStyle:
    """Tabular softmax policies on own observations, centralized value tables `V_i(s)`, PPO updates.

    Episodes are collected `batch_episodes` at a time with the current (stochastic) policies; then `epochs`
    full-batch Adam steps minimise `L_pi + value_coef * L_V - entropy_coef * H`. Advantages are normalized over the
    batch per agent.

    Args:
        num_agents, num_obs, num_actions, num_states: sizes of the game.
        discount: gamma. lam: GAE lambda. clip_range: PPO epsilon.
        lr: Adam learning rate (policy logits and value tables).
        batch_episodes: episodes per PPO update. epochs: optimizer steps per update.
        value_coef, entropy_coef: loss weights.
        seed: seeds the action sampling.
    """

    name = "MAPPOStyle"

    def __init__(
        self,
        num_agents: int = 2,
        num_obs: int = 16,
        num_actions: int = 5,
        num_states: int = 256,
        discount: float = 0.9,
        lam: float = 0.95,
        clip_range: float = 0.2,
        lr: float = 0.02,
        batch_episodes: int = 8,
        epochs: int = 4,
        value_coef: float = 0.5,
        entropy_coef: float = 0.01,
        seed: int = 0,
    ):
        self.num_agents, self.num_actions, self.discount, self.lam = num_agents, num_actions, discount, lam
        self.clip_range, self.batch_episodes, self.epochs = clip_range, batch_episodes, epochs
        self.value_coef, self.entropy_coef = value_coef, entropy_coef
        self.rng = np.random.default_rng(seed)
        self.logits = torch.zeros(num_agents, num_obs, num_actions, requires_grad=True)
        self.values = torch.zeros(num_agents, num_states, requires_grad=True)
        self.optimizer = torch.optim.Adam([self.logits, self.values], lr=lr)
        self.batch: list[Episode] = []
        self.last_logs: dict[str, float] = {}

    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        logits = self.logits.detach().numpy()[np.arange(len(obs)), obs]
        return sample_softmax(logits, self.rng, greedy=not explore)

    def log_probs(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(B, n)` log pi_i(a_i | o_i) and `(B, n)` entropies, each agent from its own observation."""
        agents = torch.arange(self.num_agents)
        logp_all = torch.log_softmax(self.logits[agents, obs], dim=-1)  # (B, n, A)
        entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
        return logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1), entropy

    def update(self, episode: Episode, progress: float) -> dict[str, float]:
        self.batch.append(episode)
        if len(self.batch) < self.batch_episodes:
            return self.last_logs
        b, self.batch = pad_episodes(self.batch), []
        valid = b["valid"]
        with torch.no_grad():
            # V_i(s_t) for t = 0..T, laid out (M, n, T + 1); padded steps are zeroed so their TD errors vanish.
            v = self.values[:, b["states"]].permute(1, 0, 2) * torch.cat([valid, valid[:, -1:]], dim=1).unsqueeze(1)
            has_next = b["has_next"].unsqueeze(1).expand(-1, self.num_agents, -1)
            adv, targets = gae(
                b["rewards"].permute(0, 2, 1), v[..., :-1], v[..., 1:], has_next, self.discount, self.lam
            )
            adv, targets = adv.permute(0, 2, 1)[valid], targets.permute(0, 2, 1)[valid]  # (B, n) over real steps
            std = adv.std(dim=0, keepdim=True)
            adv = (adv - adv.mean(dim=0, keepdim=True)) / torch.where(std > 1e-6, std, torch.ones_like(std))
            obs, actions, states = b["obs"][:, :-1][valid], b["actions"][valid], b["states"][:, :-1][valid]
            old_logp, _ = self.log_probs(obs, actions)
        for _ in range(self.epochs):
            logp, entropy = self.log_probs(obs, actions)
            policy_loss = sum(
                ppo_clip_loss(logp[:, i], old_logp[:, i], adv[:, i], self.clip_range)[0]
                for i in range(self.num_agents)
            )
            v_loss = sum(value_loss(self.values[i, states], targets[:, i]) for i in range(self.num_agents))
            loss = policy_loss + self.value_coef * v_loss - self.entropy_coef * entropy.mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        self.last_logs = {
            "policy_loss": policy_loss.item(),
            "value_loss": v_loss.item(),
            "entropy": entropy.mean().item(),
        }
        return self.last_logs
