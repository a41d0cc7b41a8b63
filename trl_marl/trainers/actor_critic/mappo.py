"""`MAPPOTrainer`: multi-agent PPO with centralized value functions."""

from __future__ import annotations

import torch

from trl_marl.algorithms.advantages import RunningMeanStd, linked_gae
from trl_marl.algorithms.logprobs import sequence_logprobs
from trl_marl.algorithms.losses import ppo_clip_loss
from trl_marl.data_types.critic import Transitions, ValueStream
from trl_marl.trainers.actor_critic.config import MAPPOConfig
from trl_marl.trainers.actor_critic.maac import MAACStep, MAACTrainer

__all__ = ["MAPPOStep", "MAPPOTrainer"]


class MAPPOStep(MAACStep):
    """MAPPO's step: GAE(lambda), `ppo_epochs` passes of the clipped surrogate, value clipping and normalization."""

    critic_loss_per_agent_batch = False
    needs_old_logprobs = True

    def _critics_length_message(self, args, got: int) -> str:
        if args.shared_critic:
            return f"critics has {got} entries but MAPPOTrainer with shared_critic=True has ONE critic"
        return f"critics has {got} entries but MAPPOTrainer with shared_critic=False has one critic per agent ({args.num_agents})"

    def attach(self) -> None:
        super().attach()
        if self.args.popart and self.trainer.is_deepspeed_enabled:
            raise ValueError("popart=True is not available under DeepSpeed (it rescales the value head in place)")
        if self.args.value_normalization:
            self.normalizers = [RunningMeanStd() for _ in self.team.critics]

    def _advantages(self, trans: Transitions, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE(lambda) along each trajectory: `(A, V_hat = A + V)`."""
        return linked_gae(trans.rewards, values, trans.next_index, self.args.discount, self.args.gae_lambda)

    def _value_clip_range(self, stream: ValueStream) -> float | None:
        return self.args.value_clip_range

    def update_chunks(self, num_items: int) -> list[list[int]]:
        """`ppo_epochs` passes, each over minibatches of `train_batch_size` items (reshuffled every pass)."""
        per = self.args.train_batch_size or num_items
        M = num_items // per
        chunks = []
        for _ in range(self.args.ppo_epochs):
            order = torch.randperm(num_items).tolist() if M > 1 else list(range(num_items))
            chunks += [sorted(order[m * per : (m + 1) * per]) for m in range(M)]
        return chunks

    def _actor_loss(self, i, logp, batch, adv, data, rows):
        """The clipped surrogate on token-level or sequence-level ratios to the rollout-time policy."""
        device = logp.device
        mask = batch.completion_mask.to(device)
        old = torch.zeros_like(logp)
        for r, row in enumerate(rows):
            lp = data.old_logprobs[i][row]
            old[r, : lp.numel()] = lp.to(device)
        adv = adv.to(device)
        if self.args.ratio_level == "token":
            loss, clipped = ppo_clip_loss(logp, old, adv, self.args.clip_range, mask)
            log_ratio = ((logp.detach() - old) * mask).sum() / mask.sum().clamp(min=1)
        else:
            seq, seq_old = sequence_logprobs(logp, mask), sequence_logprobs(old, mask)
            loss, clipped = ppo_clip_loss(seq, seq_old, adv, self.args.clip_range)
            log_ratio = (seq.detach() - seq_old).mean()
        m = self.trainer._metrics["train"]
        m[f"agent_{i + 1}/clip_fraction"].append(clipped.item())
        m[f"agent_{i + 1}/log_ratio_mean"].append(log_ratio.item())
        return loss


class MAPPOTrainer(MAACTrainer):
    """Multi-agent PPO: the MAAC rollout and centralized critic(s), GAE across turns and `ppo_epochs` passes of the
    clipped surrogate on per-agent ratios, with value clipping and value normalization.

        A_t   = GAE(lambda) of delta_t = r_t + gamma * V(h_{t+1}) - V(h_t)
        rho   = pi_theta_i(a) / pi_old_i(a)                          (per token, or per completion)
        L_i   = - mean( min(rho * A, clip(rho, 1 - eps, 1 + eps) * A) )
        L_V   = mean( max( (V - V_hat)^2, (V_clip - V_hat)^2 ) )    (normalized targets with value normalization)

    `shared_critic=True`: one critic, the team reward, the same advantage for every agent. `shared_critic=False`: one
    critic per agent, each reading the joint history and learning that agent's reward (pass `critics=[...]` with one
    entry per agent, or a `critic_model` broadcast).
    """

    _name = "MAPPO"
    _tag_names = ["trl", "trl_marl", "multi-agent", "mappo", "actor-critic", "ppo"]
    _paper = {
        "title": "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games",
        "id": "2103.01955",
        "citation": (
            "@inproceedings{yu2022mappo,\n  title={The Surprising Effectiveness of PPO in Cooperative Multi-Agent "
            "Games},\n  author={Yu, Chao and Velu, Akash and Vinitsky, Eugene and Gao, Jiaxuan and Wang, Yu and "
            "Bayen, Alexandre and Wu, Yi},\n  booktitle={NeurIPS Datasets and Benchmarks},\n  year={2022}\n}"
        ),
    }
    config_class = MAPPOConfig
    step_class = MAPPOStep
