"""`MAACTrainer`: multi-agent actor-critic with ONE centralized critic."""

from __future__ import annotations

from trl_marl.trainers.actor_critic.config import MAACConfig
from trl_marl.trainers.actor_critic.step import ActorCriticStep
from trl_marl.trainers.actor_critic.trainer import ActorCriticTrainer

__all__ = ["MAACStep", "MAACTrainer"]


class MAACStep(ActorCriticStep):
    """MAAC's step: ONE centralized critic over the joint prompts, updated with each agent's batch in turn."""

    critic_loss_per_agent_batch = True

    def _critics_length_message(self, args, got: int) -> str:
        return (
            f"critics has {got} entries but MAACTrainer has ONE shared centralized critic: pass critics=[critic] or "
            "critic_model=critic"
        )


class MAACTrainer(ActorCriticTrainer):
    """Multi-agent actor-critic: ONE centralized critic over the joint prompts; every agent gets the SAME TD error.

        delta_t = r_t + gamma * V(h_{t+1}) - V(h_t)             (r_t: the team reward, the mean over agents)
        loss    = sum_i - mean( logprob_sum(a_{i,t}) * delta_t ) + value_loss_coef * mean( (V(h_t) - V_hat_t)^2 )

    The critic reads `joint_critic_text` (the agents' prompts, plus the completions for `critic_type="q"`) tokenized
    with the first agent's tokenizer. As the spec says, it is updated SEQUENTIALLY with each agent's batch: the
    optimizer step is the update with agent 1's batch (together with the actors'), then `n - 1` critic-only steps of
    the same optimizer follow, each on the critic as the previous one left it (`sequential_critic_updates`). Actors and
    critic are clipped by their own norms. Under DeepSpeed / FSDP (the engine owns the critic's step) the critic loss
    is weighted `n` in the one step instead, the first-order equivalent. No importance sampling and no ratio clipping.
    `critic_model` (or `critics=[one]`) is required.

    ```python
    from trl_marl import MAACConfig, MAACTrainer

    trainer = MAACTrainer(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        critic_model="Qwen/Qwen2.5-0.5B-Instruct",
        reward_funcs=reward,
        formatters=[writer_prompt, editor_prompt],
        args=MAACConfig(output_dir="out", num_agents=2),
        train_dataset=dataset,
    )
    trainer.train()
    ```
    """

    _name = "MAAC"
    _tag_names = ["trl", "trl_marl", "multi-agent", "maac", "actor-critic"]
    config_class = MAACConfig
    step_class = MAACStep
