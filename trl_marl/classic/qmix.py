"""QMIX-style value decomposition (Rashid et al., ICML 2018), cooperative games only.

Each agent keeps a utility `Q_i(o_i, a_i)` over its OWN observation (here a table: a linear layer on the one-hot
observation). During training a mixing network combines them into the team value

    Q_tot(s, a) = f_s(Q_1(o_1, a_1), ..., Q_n(o_n, a_n)),      dQ_tot / dQ_i >= 0,

whose weights come from hypernetworks that read the centralized state `s` and are made non-negative with `abs()`.
Because `f_s` is monotonic in every `Q_i`, the joint greedy action is the tuple of per-agent greedy actions,

    argmax_a Q_tot(s, a) = (argmax_{a_1} Q_1(o_1, a_1), ..., argmax_{a_n} Q_n(o_n, a_n)),

so execution is decentralized, while the TD error is taken on `Q_tot` over the joint state and action. The mixer can
put the blame for a team outcome on the agent whose action caused it, which independent learners cannot.

Failure mode: a team value that is not monotonic in the agents' utilities cannot be represented. A crash is such a
value: "A steps right" is good when B also steps right and bad when B stays, while "A stays" is the reverse, and no
monotonic `f_s` orders both. Fitted on exploratory data, the mixer then spreads the crash over A's utility much as
an independent learner does. `QMIXStyle` therefore uses, by default, the optimistic weighting of Weighted QMIX
(Rashid et al., NeurIPS 2020; `optimistic_td_loss`): TD errors of joint actions that `Q_tot` over-estimates count
`optimism` times as much, so the mixer may leave the rare crash of an explorer under-fitted instead of lowering the
good joint action. `optimism=1.0` is plain QMIX.

There is no LLM trainer with a mixing network in this project; the closest are `MAACTrainer` (a centralized critic)
and `MAPPOTrainer` (a centralized value).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trl_marl.algorithms.advantages import gae
from trl_marl.algorithms.losses import value_loss
from trl_marl.classic.base import Episode, epsilon_greedy, linear_schedule, pad_episodes

__all__ = ["QMIXStyle", "QMixer", "monotonic_mix", "optimistic_td_loss"]


def monotonic_mix(
    agent_qs: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor
) -> torch.Tensor:
    """The QMIX mixing function, monotonic in every agent's value for any hypernetwork outputs:

        h     = elu( sum_i q_i * |W1_i| + b1 )          (E hidden units)
        Q_tot = sum_e |w2_e| * h_e + b2
        dQ_tot / dq_i = sum_e |w2_e| * elu'(.)_e * |W1_ie| >= 0      (elu' > 0)

    Args:
        agent_qs: `(B, n)` chosen per-agent values.
        w1: `(B, n, E)`, b1: `(B, E)`, w2: `(B, E)`, b2: `(B,)` — hypernetwork outputs for each sample's state.

    Returns:
        `(B,)` team values.
    """
    hidden = F.elu(torch.einsum("bn,bne->be", agent_qs, w1.abs()) + b1)
    return (hidden * w2.abs()).sum(dim=-1) + b2


def optimistic_td_loss(q_tot: torch.Tensor, targets: torch.Tensor, optimism: float = 1.0) -> torch.Tensor:
    """Squared TD error with the optimistic weighting of OW-QMIX:

        w    = 1 if Q_tot < y else optimism
        loss = mean( w * (Q_tot - y)^2 )

    With `optimism=1` it is `value_loss(q_tot, targets)`.
    """
    if optimism == 1.0:
        return value_loss(q_tot, targets)
    targets = targets.detach().to(q_tot.dtype)
    weights = torch.where(q_tot.detach() < targets, 1.0, optimism)
    return (weights * (q_tot - targets) ** 2).mean()


class QMixer(nn.Module):
    """The hypernetwork: the centralized state in, the weights of `monotonic_mix` out.

    The state of this game is one of `num_states` joint cells, so the hypernetwork is a linear map of the one-hot
    state — an embedding table, one row of mixing parameters per joint state: `W1(s)` `(n, E)`, `b1(s)` `(E,)`,
    `w2(s)` `(E,)` and `b2(s) = V(s)`. `monotonic_mix` takes `abs()` of `W1` and `w2`, so `Q_tot` is monotonic in
    every agent's value whatever the table holds.
    """

    def __init__(self, num_agents: int, num_states: int, embed_dim: int = 8):
        super().__init__()
        self.num_agents, self.embed_dim = num_agents, embed_dim
        self.hyper = nn.Embedding(num_states, num_agents * embed_dim + 2 * embed_dim + 1)
        # Start close to a sum of the agents' values (VDN): |W1| ~ 1, |w2| ~ 1/E, b1 ~ 0, V ~ 0, plus small noise.
        nE, E = num_agents * embed_dim, embed_dim
        with torch.no_grad():
            self.hyper.weight.normal_(0.0, 0.01)
            self.hyper.weight[:, :nE] += 1.0
            self.hyper.weight[:, nE + E : nE + 2 * E] += 1.0 / E

    def forward(self, agent_qs: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """`(B, n)` agent values and `(B,)` state indices -> `(B,)` team values."""
        nE, E = self.num_agents * self.embed_dim, self.embed_dim
        h = self.hyper(states)
        w1 = h[:, :nE].view(-1, self.num_agents, E)
        return monotonic_mix(agent_qs, w1, h[:, nE : nE + E], h[:, nE + E : nE + 2 * E], h[:, -1])


class QMIXStyle:
    """QMIX with tabular agent utilities, a hypernetwork mixer, an episode buffer, TD(lambda) targets and a target
    network.

    Acting: epsilon-greedy on `Q_i(o_i, .)` (the same schedule as `IndependentAgents`). Training, after each
    episode, `updates_per_episode` Adam steps on `batch_episodes` episodes drawn from the last `buffer_episodes`:

        V_t   = Q_tot^target(s_t, argmax_a Q_i(o_i,t, a))          greedy joint value (double-Q argmax, decentralized)
        y_t   = r_t + discount * ((1 - lam) * V_{t+1} + lam * y_{t+1})       the lambda-return, computed by `gae`
                with values V_t and next values V_{t+1} (lam = 0: one-step `r_t + discount * V_{t+1}`)
        loss  = mean_t w_t (Q_tot(s_t, a_t) - y_t)^2,  w_t = 1 if Q_tot < y_t else optimism  (`optimistic_td_loss`)

    with `r_t` the mean of the agents' rewards (the shared reward in the cooperative game). The target network is
    copied every `target_every` episodes. Episode replay and TD(lambda) are the pymarl2 recipe for QMIX.

    Args:
        num_agents, num_obs, num_actions, num_states: sizes of the game.
        discount: gamma. lam: TD(lambda) of the targets.
        lr: Adam learning rate (agent utilities and mixer).
        embed_dim: mixer hidden width.
        batch_episodes, buffer_episodes, updates_per_episode, target_every: replay and target-network settings.
        epsilon_start, epsilon_end, epsilon_fraction: the exploration schedule.
        optimism: weight of the TD errors of over-estimated joint actions (1.0: plain QMIX; see the module).
        seed: seeds the initialization, replay sampling and exploration.
    """

    name = "QMIXStyle"

    def __init__(
        self,
        num_agents: int = 2,
        num_obs: int = 16,
        num_actions: int = 5,
        num_states: int = 256,
        discount: float = 0.9,
        lam: float = 0.8,
        lr: float = 0.003,
        embed_dim: int = 8,
        batch_episodes: int = 8,
        buffer_episodes: int = 64,
        updates_per_episode: int = 1,
        target_every: int = 5,
        epsilon_start: float = 1.0,
        epsilon_end: float = 0.1,
        epsilon_fraction: float = 0.3,
        optimism: float = 0.3,
        seed: int = 0,
    ):
        if not 0.0 < optimism <= 1.0:
            raise ValueError(f"optimism must be in (0, 1], got {optimism}")
        self.optimism = optimism
        self.num_agents, self.num_states, self.discount, self.lam = num_agents, num_states, discount, lam
        self.batch_episodes, self.buffer_episodes = batch_episodes, buffer_episodes
        self.updates_per_episode, self.target_every = updates_per_episode, target_every
        self.epsilon_start, self.epsilon_end, self.epsilon_fraction = epsilon_start, epsilon_end, epsilon_fraction
        self.epsilon = epsilon_start
        self.rng = np.random.default_rng(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.agent_q = nn.Parameter(torch.zeros(num_agents, num_obs, num_actions))
            self.mixer = QMixer(num_agents, num_states, embed_dim)
        self.target_q = self.agent_q.detach().clone()
        self.target_mixer = copy.deepcopy(self.mixer).requires_grad_(False)
        self.optimizer = torch.optim.Adam([self.agent_q, *self.mixer.parameters()], lr=lr)
        self.buffer: list[Episode] = []
        self.episodes_seen = 0

    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        rows = self.agent_q.detach().numpy()[np.arange(len(obs)), obs]
        if not explore:
            return rows.argmax(axis=-1)
        return epsilon_greedy(rows, self.epsilon, self.rng)

    def team_values(self, agent_q: torch.Tensor, mixer: QMixer, states, obs, actions) -> torch.Tensor:
        """`Q_tot(s, a)` for states `(...)`, observations and actions `(..., n)`: the per-agent `Q_i(o_i, a_i)`
        gathered from `agent_q`, mixed with the state. Returns `(...)`."""
        chosen = agent_q[torch.arange(self.num_agents), obs, actions]  # (..., n)
        mixed = mixer(chosen.reshape(-1, self.num_agents), states.reshape(-1))
        return mixed.view(states.shape)

    def update(self, episode: Episode, progress: float) -> dict[str, float]:
        self.buffer = [*self.buffer[-(self.buffer_episodes - 1) :], episode]
        self.episodes_seen += 1
        losses = []
        for _ in range(self.updates_per_episode):
            picks = self.rng.integers(len(self.buffer), size=min(self.batch_episodes, len(self.buffer)) - 1)
            b = pad_episodes([episode, *(self.buffer[k] for k in picks)])  # the newest episode is always used
            with torch.no_grad():
                greedy = self.agent_q[torch.arange(self.num_agents), b["obs"]].argmax(dim=-1)  # (M, T + 1, n)
                v = self.team_values(self.target_q, self.target_mixer, b["states"], b["obs"], greedy)
                rewards = b["rewards"].mean(dim=-1)
                _, y = gae(rewards, v[:, :-1], v[:, 1:], b["has_next"], self.discount, self.lam)
            q_tot = self.team_values(self.agent_q, self.mixer, b["states"][:, :-1], b["obs"][:, :-1], b["actions"])
            loss = optimistic_td_loss(q_tot[b["valid"]], y[b["valid"]], self.optimism)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(loss.item())
        if self.episodes_seen % self.target_every == 0:
            self.target_q = self.agent_q.detach().clone()
            self.target_mixer.load_state_dict(self.mixer.state_dict())
        self.epsilon = linear_schedule(self.epsilon_start, self.epsilon_end, self.epsilon_fraction, progress)
        return {"td_loss": float(np.mean(losses)), "epsilon": self.epsilon}
