"""MARLHF: multi-agent RL from preference feedback.

1. Collect preference pairs between joint responses with the task reward as oracle (`pairs.py`), or take the pairs
   given (`preference_data.py`: TRL's preference format with one set of columns per agent).
2. Fit a `JointRewardModel` (all agents' prompts and responses as one text, a scalar head, Bradley-Terry) — newly
   initialised, never falling back on the task reward — with TRL's `RewardTrainer` as a stage before the RL loop
   (sharing the outer accelerate state; its engine is released before the RL engine is built), and freeze it. Or,
   with `reward_model_path`, load a reward model trained elsewhere (e.g. `trl reward`) and use it as is.
3. RL on its scores (no gradients through it) with the backend `rl_algorithm`: `magrpo` (group mean), `mareinforce`
   (raw), `marloo` (leave-one-out), `maremax` (group max), `maac` (centralized critic), `iac` (independent
   critics); the reference-KL penalty applies to this phase only. The backend is the trainer's RL step
   (`trainers/rl_step.py`), the same part its own trainer holds: `GroupBaselineStep` with the algorithm's baseline,
   or the `maac` / `iac` trainer's `ActorCriticStep`; the trainer is a `MARLHFTrainer` whatever the backend.

Evaluation always samples the current agents and scores them with the TASK reward.

The iterative trainers (`MARLHFIterTrainer`, `runs_rounds`) run the same pipeline round after round: a `RoundDriver`
(`rounds.py`) collects each round's pairs, and MARLHF's round step (`round_batches`) fits a NEWLY initialised reward
model on them, then runs `num_train_epochs` of RL over the task items on its scores.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trl_marl.models.loading import check_model_source
from trl_marl.rewards import RewardFunction
from trl_marl.trainers.actor_critic.config import check_actor_critic_fields, check_iac_fields, check_maac_fields
from trl_marl.trainers.actor_critic.step import ActorCriticStep
from trl_marl.trainers.checkpoints import stop_if_preempted
from trl_marl.trainers.config_checks import check_device
from trl_marl.trainers.group_baseline import GroupBaselineStep
from trl_marl.trainers.preference.madpo import PreferenceCollectionMixin, PreferenceConfig
from trl_marl.trainers.preference.pairs import PreferencePair
from trl_marl.trainers.preference.preference_data import looks_like_preference_data
from trl_marl.trainers.preference.reward_model import JointRewardModel
from trl_marl.trainers.preference.rounds import RoundDriver, build_round_plugins
from trl_marl.trainers.registry import algorithms, get_algorithm
from trl_marl.trainers.rl_step import RLStep, RLStepTrainer
from trl_marl.utils.deprecation import TrlMarlDeprecationWarning, warn_deprecated

__all__ = ["MARLHFConfig", "MARLHFTrainer", "RL_ALGORITHMS"]

logger = logging.getLogger(__name__)

ACTOR_CRITIC_BACKENDS = ("maac", "iac")
# rl_algorithm -> group baseline of the REINFORCE-family backend (the registered algorithms with a baseline,
# trl_marl.trainers.registry), None for the actor-critic backends
RL_ALGORITHMS = {
    **{a.name: a.baseline for a in algorithms() if a.baseline is not None},
    **dict.fromkeys(ACTOR_CRITIC_BACKENDS),
}
# the actor-critic backends' fields -> the rl_algorithm values that read them
BACKEND_FIELDS = {
    "critic_type": ACTOR_CRITIC_BACKENDS,
    "critic_learning_rate": ACTOR_CRITIC_BACKENDS,
    "value_loss_coef": ACTOR_CRITIC_BACKENDS,
    "critic_value_head_hidden_dim": ACTOR_CRITIC_BACKENDS,
    "critic_devices": ACTOR_CRITIC_BACKENDS,
    "critic_max_length": ("maac",),
    "use_separate_critic": ("iac",),
    "value_clip_range": ("iac",),
    "value_head_hidden_dim": ("iac",),
}


@dataclass
class MARLHFConfig(PreferenceConfig):
    r"""Configuration of `MARLHFTrainer`: all `PreferenceConfig` fields (pair collection) and the RL fields of
    `MultiAgentConfig` (`num_generations`, `rollout_buffer_size`, `train_batch_size` counted in task items, ...),
    plus:

    Parameters:
        rl_algorithm: the RL backend: `magrpo`, `mareinforce`, `marloo` or `maremax` (the REINFORCE family), `maac`
            or `iac` (actor-critic).
        advantage_normalization: z-score advantages inside each group; `None` means on for `magrpo`, `maac` and
            `iac`, off for the others (with it on they would all equal MAGRPO).
        reward_model_path: a sequence-classification reward model (num_labels=1) trained elsewhere, e.g. with
            `trl reward` on `to_dataset(pairs)`: loaded and used as is (no pair collection, no fitting). A local
            folder that does not exist is refused when the trainer is built, as `reward_model_name`'s.
            `MARLHFTrainer` only (the iterative trainers refit per round).
        reward_model_name: model id / path of the reward model's backbone; `None` uses the first agent's id
            (required when the agents are model objects without an id).
        reward_learning_rate: learning rate of the reward model's fit (TRL's `RewardTrainer`, constant schedule).
        reward_num_train_epochs: epochs of Bradley-Terry training over the pairs.
        reward_train_batch_size: pairs per reward-model step and process.
        reward_gradient_accumulation_steps: gradient accumulation of the reward model's fit.
        reward_center_rewards_coefficient: TRL's `center_rewards_coefficient` (`None`: off).
        reward_max_length: truncate joint transcripts to this many tokens (keeping the end), >= 1; `None` keeps them.
        reward_freeze_backbone: train only the scalar head.
        reward_model_device: device of the reward model; `None` is the trainer's device (works on CPU-only
            machines, unlike the reference library's `"cuda:0"` default). A device this machine does not have is
            refused when the config is built.
        critic_type: `maac` / `iac` backends: `"v"` or `"q"` critics (see `MAACConfig`).
        critic_learning_rate: `maac` / `iac`: learning rate of separate critics (`None`: the agents').
        value_loss_coef: `maac` / `iac`: weight of the critic loss.
        critic_value_head_hidden_dim: `maac` / `iac`: hidden size of the separate critics' value head.
        critic_devices: `maac` / `iac`: critic devices in `mp` mode (refused in `"none"` mode, where accelerate places
            the critics, and with `iac` value heads).
        critic_max_length: `maac`: truncate the centralized critic's input (keeping the end).
        use_separate_critic: `iac`: separate critics (True) or value heads on the actors (False).
        value_clip_range: `iac` with value heads: value clipping eps.
        value_head_hidden_dim: `iac` with value heads: hidden size of the value heads.

    With `rl_algorithm` `maac` or `iac` the RL step is `MAACTrainer`'s / `IACTrainer`'s (pass `critic_model` or
    `critics` to `MARLHFTrainer` as to those trainers; IAC defaults to copies of the agents), the actor-critic
    configs' checks apply to these fields, and `num_generations` is the actor-critic's (use 1 for multi-sample-free
    rollouts).
    """

    _train_batch_counts_rollout_items = True

    train_batch_size: int | None = field(
        default=None, metadata={"help": "Task items per RL training step (divides rollout_buffer_size)."}
    )
    rl_algorithm: str = field(default="magrpo", metadata={"help": "RL backend.", "choices": list(RL_ALGORITHMS)})
    advantage_normalization: bool | None = field(
        default=None, metadata={"help": "Z-score advantages per group; None: on for magrpo, maac and iac."}
    )
    reward_model_name: str | None = field(
        default=None, metadata={"help": "Reward model backbone id/path; None: the first agent's."}
    )
    reward_model_path: str | None = field(
        default=None, metadata={"help": "A seq-cls reward model trained elsewhere (e.g. trl reward), used as is."}
    )
    reward_learning_rate: float = field(default=1e-5, metadata={"help": "Reward model learning rate."})
    reward_num_train_epochs: int = field(default=1, metadata={"help": "Bradley-Terry epochs over the pairs."})
    reward_train_batch_size: int = field(default=4, metadata={"help": "Pairs per reward-model step and process."})
    reward_gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Gradient accumulation of the reward model's fit."}
    )
    reward_center_rewards_coefficient: float | None = field(
        default=None, metadata={"help": "TRL RewardConfig.center_rewards_coefficient (None: off)."}
    )
    reward_max_length: int | None = field(
        default=None, metadata={"help": "Truncate joint transcripts to this many tokens (keeps the end)."}
    )
    reward_freeze_backbone: bool = field(default=False, metadata={"help": "Train only the reward head."})
    reward_model_device: str | None = field(
        default=None, metadata={"help": "Device of the reward model; None: the trainer's device."}
    )
    # the maac / iac backends (see MAACConfig / IACConfig)
    critic_type: str = field(default="v", metadata={"help": "maac/iac: 'v' for V(h), 'q' for Q(h, a)."})
    critic_learning_rate: float | None = field(
        default=None, metadata={"help": "maac/iac: learning rate of separate critics (None: the agents')."}
    )
    value_loss_coef: float = field(default=0.6, metadata={"help": "maac/iac: weight of the critic loss."})
    critic_value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "maac/iac: hidden size of the critics' value head."}
    )
    critic_devices: list[str] | None = field(default=None, metadata={"help": "maac/iac: devices of the critics."})
    critic_max_length: int | None = field(
        default=None, metadata={"help": "maac: truncate the centralized critic's input to this many tokens."}
    )
    use_separate_critic: bool = field(
        default=True, metadata={"help": "iac: separate critic models (True) or value heads on the actors."}
    )
    value_clip_range: float | None = field(
        default=None, metadata={"help": "iac (value heads): value clipping eps; None disables."}
    )
    value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "iac (value heads): hidden size of the value heads."}
    )

    @property
    def completions_per_item(self) -> int:
        """The larger of the two phases' samples per item: pair collection's `preference_num_candidates` and the RL
        phase's `num_generations`."""
        return max(self.preference_num_candidates, self.num_generations)

    @property
    def training_rows_per_item(self) -> int:
        """The RL phase trains on each item's `num_generations` samples (`train_batch_size` counts task items)."""
        return self.num_generations

    @property
    def num_critics(self) -> int:
        """The actor-critic backends' critics: one centralized critic (`maac`), one per agent (`iac`)."""
        return self.num_agents if self.rl_algorithm == "iac" else 1

    @property
    def uses_separate_critics(self) -> bool:
        """Whether the actor-critic backend's critics are models of their own (not value heads on the actors)."""
        return self.rl_algorithm != "iac" or self.use_separate_critic

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        if self.rl_algorithm not in RL_ALGORITHMS:
            raise ValueError(f"rl_algorithm must be one of {list(RL_ALGORITHMS)}, got {self.rl_algorithm!r}")
        if self.reward_learning_rate <= 0:
            raise ValueError(f"reward_learning_rate must be > 0, got {self.reward_learning_rate}")
        if self.reward_num_train_epochs < 1 or self.reward_train_batch_size < 1:
            raise ValueError("reward_num_train_epochs and reward_train_batch_size must be >= 1")
        if self.reward_gradient_accumulation_steps < 1:
            raise ValueError(
                f"reward_gradient_accumulation_steps must be >= 1, got {self.reward_gradient_accumulation_steps}"
            )
        check_device("reward_model_device", self.reward_model_device)
        if self.reward_max_length is not None and self.reward_max_length < 1:
            # the transcript keeps its last reward_max_length tokens: 0 would keep them all, -3 drop the first 3
            raise ValueError(f"reward_max_length must be None (no truncation) or >= 1, got {self.reward_max_length}")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, backends in BACKEND_FIELDS.items():
            if self.rl_algorithm not in backends and getattr(self, name) != defaults[name]:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is read by rl_algorithm {' or '.join(map(repr, backends))} only; "
                    f"with rl_algorithm={self.rl_algorithm!r} it does nothing: leave it unset, or choose that backend"
                )
        if self.rl_algorithm in ACTOR_CRITIC_BACKENDS:  # what MAACConfig / IACConfig check
            check_actor_critic_fields(self, self.num_critics, self.uses_separate_critics)
            (check_maac_fields if self.rl_algorithm == "maac" else check_iac_fields)(self)


class MARLHFTrainer(PreferenceCollectionMixin, RLStepTrainer):
    """Multi-agent RLHF with a joint reward model (see the module docstring).

    Takes the `MultiAgentTrainer` arguments plus `reward_model` (a fitted `JointRewardModel`: skips pair
    collection and reward learning), `preference_pairs` (pairs collected elsewhere) and `adapter` (centralized mode).
    `train_dataset` holds task items, or preference data (as `MADPOTrainer` takes it) to fit the reward model on as
    given, the RL phase then rolling out on its prompts; `reward_funcs` is then needed only to evaluate.
    `save_model` also writes `reward_model/`.

    The RL phase is the trainer's RL step, picked by `args.rl_algorithm` through the algorithm registry
    (`_rl_step_for`). With `"maac"` / `"iac"` pass `critic_model=` / `critics=` as to `MAACTrainer` / `IACTrainer`
    (MAAC needs one; IAC defaults to copies of the agents); the REINFORCE backends refuse them. In the iterative
    trainers (`runs_rounds`) the round driver (`self.rounds`) runs MARLHF's round step.
    """

    _name = "MARLHF"
    candidate_reward_keys = ("preference/candidate_reward_mean",)
    _tag_names = ["trl", "trl_marl", "multi-agent", "marlhf", "rlhf"]
    config_class = MARLHFConfig
    args_class = MARLHFConfig
    # a checkpoint holds the data of whichever step the backend is
    resume_types = GroupBaselineStep.resume_types + ActorCriticStep.resume_types

    def __init__(
        self,
        model=None,
        reward_funcs=None,
        args=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        *,
        reward_model: JointRewardModel | None = None,
        preference_pairs=None,
        adapter=None,
        comparator=None,
        replay_mode=None,
        critic_model: Any = None,
        critics: Sequence[Any] | None = None,
        **kwargs,
    ):
        """`comparator=` / `replay_mode=` (iterative trainers): a registered plugin name (instead of the config's
        `comparator_policy` / `preference_replay_mode`) or a ready instance (see docs/plugins.md). `critic_model=` /
        `critics=`: the `maac` / `iac` backends' critics (as `ActorCriticTrainer` takes them)."""
        args = self._checked_args(args)
        self.rl_step = self._rl_step_for(args, critic_model, critics)
        self.baseline = RL_ALGORITHMS[args.rl_algorithm]  # the REINFORCE backend's baseline; None for actor-critic
        fitted = reward_model is not None or args.reward_model_path is not None
        if fitted and (preference_pairs is not None or looks_like_preference_data(train_dataset)):
            raise ValueError(
                "a fitted reward model is given (reward_model= or reward_model_path), so no reward model is fitted "
                "and the preference pairs would not be used: pass the pairs, or the fitted reward model"
            )
        inputs = self._preference_inputs(
            args, train_dataset, eval_dataset, preference_pairs, reward_funcs, kwargs, needs_pairs=not fitted
        )
        if self.runs_rounds:  # their errors come before any model loads
            round_plugins = build_round_plugins(args, comparator, replay_mode)
        elif comparator is not None or replay_mode is not None:
            raise TypeError(
                f"comparator= and replay_mode= are arguments of MARLHFIterTrainer, not {type(self).__name__}"
            )
        for name in ("reward_model_name", "reward_model_path"):  # a missing folder fails here, not after the pairs
            if getattr(args, name) is not None:
                check_model_source(str(getattr(args, name)), name)
        if reward_model is None and args.reward_model_path is not None:
            reward_model = JointRewardModel.load(args.reward_model_path, max_length=args.reward_max_length)
        self.reward_model = reward_model
        self.adapter = adapter  # the roles' adapter in centralized mode (`_setup_roles`)
        super().__init__(
            model, inputs.reward_func, args, inputs.train_dataset, inputs.eval_dataset, processing_class, **kwargs
        )
        if reward_model is not None:  # under ZeRO-3 / FSDP2: sharded like the reference models
            reward_model.prepare_for_scoring(self.accelerator, args.reward_model_device)
        self.pairs = self._accept_pairs(inputs)
        # RL rollouts score with the learned reward; `rollout_engine` keeps the task reward (pairs, evaluation)
        self.train_rollout_engine = copy.copy(self.rollout_engine)
        self.train_rollout_engine.reward = RewardFunction(self._learned_reward, self.num_agents)
        self._reward_model_state: dict | None = None  # the gathered reward model while `save_model` writes it
        self._round_step = 0  # iterative: training steps taken in the current round
        self.rounds = RoundDriver(self, *round_plugins) if self.runs_rounds else None

    def _rl_step_for(self, args: MARLHFConfig, critic_model: Any, critics: Sequence[Any] | None) -> RLStep:
        """The RL step `args.rl_algorithm` names in the algorithm registry: `GroupBaselineStep` with the algorithm's
        baseline for the REINFORCE family, else the step of the algorithm's trainer (`step_class`: MAAC's, IAC's)."""
        algorithm = get_algorithm(args.rl_algorithm)
        given = critic_model is not None or critics is not None
        if algorithm.baseline is not None:
            if given:
                backends = " or ".join(map(repr, ACTOR_CRITIC_BACKENDS))
                raise ValueError(
                    f"critic_model= / critics= are for the actor-critic backends (rl_algorithm {backends}); "
                    f"rl_algorithm={args.rl_algorithm!r} trains without a critic: do not pass them, or choose one of "
                    "those"
                )
            norm = args.advantage_normalization
            return GroupBaselineStep(
                self, algorithm.baseline, args.rl_algorithm == "magrpo" if norm is None else bool(norm)
            )
        if args.rl_algorithm == "maac" and not given:
            raise ValueError(
                "rl_algorithm='maac' trains a centralized critic: pass critic_model= (a model id / path or a model "
                "object) or critics=[critic]"
            )
        return algorithm.trainer_class.step_class(self, args, critic_model, critics)

    def _check_config(self, args: MARLHFConfig) -> None:
        if args.rl_algorithm not in ("mareinforce", *ACTOR_CRITIC_BACKENDS) and args.num_generations < 2:
            raise ValueError(
                f"rl_algorithm={args.rl_algorithm!r} needs num_generations >= 2 (its baseline compares "
                f"the samples of a group), got {args.num_generations}"
            )

    def _setup_roles(self, model, args, reward_func, formatters):
        if self.reward_model is None and args.reward_model_name is None:
            source = model[0] if isinstance(model, (list, tuple)) else model
            if not isinstance(source, (str, os.PathLike)) and not getattr(
                getattr(source, "config", None), "_name_or_path", ""
            ):
                raise ValueError(
                    "reward_model_name is required when the agents are model objects without an id (the reward "
                    "model's backbone is loaded from it)"
                )
        return super()._setup_roles(model, args, reward_func, formatters)

    # ---- the learned reward ----
    def _learned_reward(self, *completions, batch_items=None) -> list[float]:
        if self.reward_model is None:
            raise RuntimeError("the joint reward model is not fitted yet (MARLHFTrainer.train fits it first)")
        prompts = [
            [self.rollout_engine.first_prompts(item)[i] for i in range(self.num_agents)] for item in batch_items
        ]
        responses = [[c[j] for c in completions] for j in range(len(completions[0]))]
        return self.reward_model.score(prompts, responses, batch_size=max(8, len(responses)))

    def fit_reward_model(self) -> JointRewardModel:
        """Collect pairs (if needed) and fit a NEWLY initialised joint reward model on them with TRL's
        `RewardTrainer` (a stage: it shares the outer accelerate state, shards the pairs over the processes, under
        ZeRO-3 / FSDP2 the parameters too, and releases its optimizer and engine before returning), then shard it for scoring
        (`JointRewardModel.prepare_for_scoring`). Logs TRL's reward metrics on the pairs as
        `reward_model/accuracy`, `reward_model/margin`, `reward_model/loss` (eval mode, after the fit)."""
        if self.pairs is None:
            self.pairs = self.collect_preference_pairs()
        a = self.args
        name = a.reward_model_name or self.agent_names[0]
        tok = None if a.reward_model_name else self.tokenizers[0]
        rm = JointRewardModel.from_pretrained(
            name,
            tokenizer=tok,
            max_length=a.reward_max_length,
            seed=self.rng_streams.seed_for("reward_model_init", self._rng_round()),
        )
        rm.to(self.accelerator.device)
        result = rm.fit(
            self.pairs,
            learning_rate=a.reward_learning_rate,
            num_epochs=a.reward_num_train_epochs,
            batch_size=a.reward_train_batch_size,
            freeze_backbone=a.reward_freeze_backbone,
            seed=a.seed,
            output_dir=os.path.join(a.output_dir, "reward_model_fit"),
            gradient_accumulation_steps=a.reward_gradient_accumulation_steps,
            center_rewards_coefficient=a.reward_center_rewards_coefficient,
            bf16=bool(a.bf16),
            fp16=bool(a.fp16),
            use_cpu=a.use_cpu,
            ddp_backend=a.ddp_backend,
        )
        self._reward_fit_steps = len(result["losses"])
        # RL scores with it under the outer engine: sharded under ZeRO-3 / FSDP2 (the stage's engine is gone)
        rm.prepare_for_scoring(self.accelerator, a.reward_model_device)
        m = self._metrics["train"]
        if result["losses"]:
            m["reward_model/loss_first"].append(result["losses"][0])
            m["reward_model/loss_last"].append(result["losses"][-1])
        for key in ("accuracy", "margin", "loss"):
            m[f"reward_model/{key}"].append(result[key])
        self.reward_model = rm
        return rm

    @torch.no_grad()
    def reward_model_accuracy(self, rm: JointRewardModel) -> float:
        """Share of the collected pairs whose winner the reward model scores higher."""
        if not self.pairs:
            return float("nan")
        w = rm.score([p.prompts for p in self.pairs], [p.winner_completions for p in self.pairs])
        lo = rm.score([p.prompts for p in self.pairs], [p.loser_completions for p in self.pairs])
        return sum(a > b for a, b in zip(w, lo)) / len(w)

    def _training_context(self, checkpoint):
        return self.rounds.running(checkpoint) if self.rounds is not None else super()._training_context(checkpoint)

    def _prepare_training(self, checkpoint):
        # resuming restored the collected pairs and the fitted reward model (no re-collection, no re-fit); a
        # preemption signal is honoured at the end of each phase, with what it produced in the checkpoint
        if self.rounds is not None or self.reward_model is not None:
            return None
        if self.pairs is None:
            self.pairs = self.collect_preference_pairs()
        if not self.pairs:
            return self._end_without_pairs("no reward model can be fitted")
        stop_if_preempted(self, "after the preference pair collection")
        self.fit_reward_model()
        return None

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        # a sharded reward model is gathered on every rank (a collective) before the main process writes it
        self._reward_model_state = self.reward_model.full_state_dict() if self.reward_model is not None else None
        try:
            super().save_model(output_dir, _internal_call)
        finally:
            self._reward_model_state = None

    def _save_extra(self, output_dir: str, state_dict: dict) -> None:
        super()._save_extra(output_dir, state_dict)
        if self.reward_model is not None:
            folder = os.path.join(output_dir, "reward_model")
            self.reward_model.save_pretrained(folder, state_dict=self._reward_model_state)

    def _extra_resume_state(self) -> dict:
        extra = {**super()._extra_resume_state(), "pairs": self.pairs, "reward_model": self.reward_model is not None}
        return extra if self.rounds is None else {**extra, **self.rounds.resume_state()}

    def _restore_extra_state(self, checkpoint: str, extra: dict) -> None:
        super()._restore_extra_state(checkpoint, extra)
        if self.rounds is not None:
            self.rounds.restore_resume_state(extra)
        if extra.get("pairs") is not None:
            self.pairs = extra["pairs"]
        if extra.get("reward_model"):
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            from trl_marl.checkpointing.checkpoint import CheckpointError

            folder = os.path.join(checkpoint, "reward_model")
            if not os.path.isfile(os.path.join(folder, "config.json")):
                raise CheckpointError(
                    f"{folder} is missing or has no config.json, but the checkpoint's state says a reward model was "
                    f"fitted; delete {checkpoint} and resume from the checkpoint before it"
                )
            model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1)
            rm = JointRewardModel(model, AutoTokenizer.from_pretrained(folder), self.args.reward_max_length)
            self.reward_model = rm.prepare_for_scoring(self.accelerator, self.args.reward_model_device)

    # ---- rounds (the iterative trainers: `runs_rounds`) ----
    def get_train_dataloader(self):
        return super().get_train_dataloader() if self.rounds is None else self.rounds.loader()

    def _save_checkpoint_extra(self, folder: str) -> None:
        super()._save_checkpoint_extra(folder)
        if self.rounds is not None and self.args.should_save:
            self.rounds.save_state(folder)

    def _rng_round(self) -> int:
        return super()._rng_round() if self.rounds is None else self.rounds.stream_round

    def _prepare_inputs(self, items):
        """Iterative: as `MultiAgentTrainer._prepare_inputs`, keyed on the step WITHIN the round, so each round's
        first step rolls out (with the round's reward model), whatever the steps before it."""
        if self.rounds is None or not isinstance(items, list):
            return super()._prepare_inputs(items)
        k = self._round_step % self.args.steps_per_rollout
        self._round_step += 1
        if k == 0 or self._buffered is None:
            self._buffered = self._rollout_step(items)
        return self._buffered[k]

    def preference_oracle(self) -> Callable[..., list[float]] | None:
        """The scorer of a round's new comparisons: the latest reward model with
        `preference_scoring_reward="reward_model"` (once one is fitted), else None (the task reward)."""
        if self.args.preference_scoring_reward == "reward_model" and self.reward_model is not None:
            return self._learned_reward
        return None

    def round_micro_batches(self) -> int:
        """Training batches (micro-steps) of one round: whole rollouts, padded to a multiple of
        `lcm(steps_per_rollout, gradient_accumulation_steps)` (`_align_rollouts`)."""
        a = self.args
        global_batch = a.rollout_buffer_size * self.accelerator.num_processes
        rollouts = len(self.train_dataset) // global_batch * math.ceil(a.num_train_epochs)
        unit = math.lcm(a.steps_per_rollout, a.gradient_accumulation_steps)
        return math.ceil(rollouts * a.steps_per_rollout / unit) * unit

    def round_batches(self, nu: int, pairs: list[PreferencePair]) -> list:
        """Round nu's step: a NEWLY initialised reward model fitted on its training pairs, then this process's RL
        batches over the task items (`num_train_epochs` shuffled passes, `steps_per_rollout` batches per rollout)."""
        self.pairs = pairs
        self.reward_model = None
        self.fit_reward_model()
        a = self.args
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        global_batch = a.rollout_buffer_size * world
        g = torch.Generator().manual_seed(a.seed * 7919 + nu)
        batches = []
        for _ in range(math.ceil(a.num_train_epochs)):
            order = torch.randperm(len(self.train_dataset), generator=g).tolist()
            for s in range(0, len(order) - global_batch + 1, global_batch):
                mine = order[s + rank * a.rollout_buffer_size : s + (rank + 1) * a.rollout_buffer_size]
                items = [self.train_dataset[j] for j in mine]
                batches.extend([items] * a.steps_per_rollout)
        self._buffered = None
        self._round_step = 0
        return self.rounds.cap_batches(self._align_rollouts(batches, a.steps_per_rollout))

    def _align_rollouts(self, batches: list, steps_per_rollout: int) -> list:
        """Pad a round's batches (`steps_per_rollout` consecutive batches per rollout) with WHOLE rollouts, wrapping
        around, to a multiple of `lcm(steps_per_rollout, gradient_accumulation_steps)`: the round ends on a rollout
        boundary and on an optimizer step, so the next round starts on both."""
        unit = math.lcm(steps_per_rollout, self.args.gradient_accumulation_steps)
        if not batches or len(batches) % unit == 0:
            return batches
        groups = [batches[s : s + steps_per_rollout] for s in range(0, len(batches), steps_per_rollout)]
        need = (unit - len(batches) % unit) // steps_per_rollout
        return batches + [b for k in range(need) for b in groups[k % len(groups)]]


# Removed names -> what replaces them, for one release: the backends are `MARLHFConfig(rl_algorithm=...)` on
# `MARLHFTrainer` (a config name builds a `MARLHFConfig` with its backend).
_REMOVED = {
    "MARLHFMAACTrainer": ("MARLHFTrainer", None),
    "MARLHFIACTrainer": ("MARLHFTrainer", None),
    "MARLHFMAACConfig": ("MARLHFConfig", "maac"),
    "MARLHFIACConfig": ("MARLHFConfig", "iac"),
}


def removed_name(module: str, name: str, removed: dict[str, tuple[str, str | None]], namespace: dict) -> Any:
    """A removed backend class of `module`, forwarded with a `TrlMarlDeprecationWarning`: a trainer name is the
    trainer itself; a config name builds the config with its `rl_algorithm` (unless given)."""
    if name not in removed:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new, backend = removed[name]
    how = (
        f"{new}(rl_algorithm={backend!r}, ...)"
        if backend
        else f"{new} (with {new.replace('Trainer', 'Config')}.rl_algorithm)"
    )
    warn_deprecated(
        f"{module}.{name} is removed in the next release: use {how}", TrlMarlDeprecationWarning, stacklevel=3
    )
    target = namespace[new]
    if backend is None:
        return target

    def build(*args: Any, rl_algorithm: str = backend, **kwargs: Any) -> Any:
        return target(*args, rl_algorithm=rl_algorithm, **kwargs)

    return build


def __getattr__(name: str) -> Any:
    return removed_name(__name__, name, _REMOVED, globals())
