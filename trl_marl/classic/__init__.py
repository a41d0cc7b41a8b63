"""Classic multi-agent RL learners on the grid world of `trl_marl.envs.gridworld`: the same math as the LLM trainers
(`td_targets`, `gae`, `ppo_clip_loss`, `value_loss`), checked on a problem whose optimum is known.

| learner | critic / value | LLM counterpart |
|---|---|---|
| `IndependentAgents` | one Q table per agent, on its own observation | `IACTrainer` |
| `MADDPGStyle` | per-agent critic on the joint state and joint action | `MAPPOTrainer(shared_critic=False)`, `MAACTrainer` |
| `QMIXStyle` | per-agent utilities, monotonic state-conditioned mixer | none (closest: `MAACTrainer`, `MAPPOTrainer`) |
| `MAPPOStyle` | centralized value on the joint state, PPO clip | `MAPPOTrainer` |

Every learner acts from the per-agent observations only (`act(obs)`); centralized information reaches it only in
`update(episode)`. See `docs/classic-marl.md` and `recipes/gridworld.py`.
"""

from trl_marl.classic.base import Episode, Learner, TrainResult, evaluate, run_episode, train
from trl_marl.classic.independent import IndependentAgents
from trl_marl.classic.maddpg import MADDPGStyle
from trl_marl.classic.mappo import MAPPOStyle
from trl_marl.classic.qmix import QMixer, QMIXStyle, monotonic_mix

LEARNERS = {cls.name: cls for cls in (IndependentAgents, MADDPGStyle, QMIXStyle, MAPPOStyle)}

__all__ = [
    "LEARNERS",
    "Episode",
    "IndependentAgents",
    "Learner",
    "MADDPGStyle",
    "MAPPOStyle",
    "QMIXStyle",
    "QMixer",
    "TrainResult",
    "evaluate",
    "monotonic_mix",
    "run_episode",
    "train",
]
