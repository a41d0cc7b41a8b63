"""The actor-critic trainers: MAAC, IAC and MAPPO (one module each: the trainer and its step variant), on
`ActorCriticTrainer` (`trainer.py`), whose RL step is an `ActorCriticStep` (`step.py`, shared with MARLHF's `maac` /
`iac` backends), with their configs (`config.py`) and what they know of critics (`critics.py`).

Every trainer runs the agents jointly (one trajectory per task item in multi-turn runs, `num_generations = 1`),
scores each joint action with the team reward, and trains critics beside the policies. They differ in their critics:

| trainer | critic(s) | reads | TD error / advantage | actor update |
|---|---|---|---|---|
| `MAACTrainer` | ONE centralized critic | the agents' prompts joined as one text (+ completions for Q) | the SAME for every agent | `- logprob_sum(a_i) * delta` |
| `IACTrainer` | one critic PER AGENT (separate model, or a value head on the actor) | the agent's own history (+ its completion for Q) | agent i's own | `- logprob_sum(a_i) * delta_i` |
| `MAPPOTrainer` | one shared centralized critic, or one per agent reading the joint history | the joint text | GAE(lambda) | PPO clipped surrogate, `ppo_epochs` passes |

The value stream of a critic gives frozen TD targets and advantages for the whole update (`step.py`).
"""

from trl_marl.data_types.critic import Transitions, build_transitions
from trl_marl.trainers.actor_critic.config import RATIO_LEVELS, ActorCriticConfig, IACConfig, MAACConfig, MAPPOConfig
from trl_marl.trainers.actor_critic.critics import joint_critic_text
from trl_marl.trainers.actor_critic.iac import IACStep, IACTrainer
from trl_marl.trainers.actor_critic.maac import MAACStep, MAACTrainer
from trl_marl.trainers.actor_critic.mappo import MAPPOStep, MAPPOTrainer
from trl_marl.trainers.actor_critic.step import ActorCriticStep
from trl_marl.trainers.actor_critic.trainer import ActorCriticTrainer

__all__ = [
    "ActorCriticConfig",
    "ActorCriticStep",
    "ActorCriticTrainer",
    "MAACConfig",
    "MAACStep",
    "MAACTrainer",
    "IACConfig",
    "IACStep",
    "IACTrainer",
    "MAPPOConfig",
    "MAPPOStep",
    "MAPPOTrainer",
    "Transitions",
    "build_transitions",
    "joint_critic_text",
    "RATIO_LEVELS",
]
