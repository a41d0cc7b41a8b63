"""The iterative preference trainers: `MADPOIterTrainer` and `MARLHFIterTrainer`.

Each holds a `RoundDriver` (`self.rounds`, see `rounds.py`) that runs the rounds (collect -> store -> select ->
train) inside ONE `Trainer.train()`, and gives it its round step (`round_batches`): MADPO trains `num_train_epochs`
over the round's training pairs B(nu); MARLHF fits a NEWLY initialised joint reward model on B(nu), then runs
`num_train_epochs` of RL over the task items on its scores (MARLHF's round step lives in `marlhf.py`, whatever its
RL backend).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trl_marl.trainers.preference.data_parallel import global_batch_slices
from trl_marl.trainers.preference.iterative_config import MADPOIterConfig, MARLHFIterConfig
from trl_marl.trainers.preference.madpo import MADPOTrainer
from trl_marl.trainers.preference.marlhf import MARLHFTrainer, removed_name
from trl_marl.trainers.preference.pairs import PreferencePair
from trl_marl.trainers.preference.rounds import RoundDriver, build_round_plugins

__all__ = ["MADPOIterTrainer", "MARLHFIterTrainer"]


class MADPOIterTrainer(MADPOTrainer):
    """Iterative MADPO: each round trains `num_train_epochs` over the round's training pairs B(nu) with the MADPO
    loss. Arguments are those of `MADPOTrainer`, plus `comparator` / `replay_mode`: a registered plugin name (instead
    of the config's `comparator_policy` / `preference_replay_mode`) or a ready instance (see docs/plugins.md)."""

    _name = "MADPOIter"
    _tag_names = ["trl", "trl_marl", "multi-agent", "madpo", "iterative-dpo"]
    config_class = MADPOIterConfig
    args_class = MADPOIterConfig
    runs_rounds = True  # its pairs come from the rounds: given pairs are refused
    _precompute_from_initial_agents = False  # later rounds' pairs are collected after updates

    def __init__(
        self,
        model=None,
        reward_funcs=None,
        args: MADPOIterConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        *,
        comparator: Any = None,
        replay_mode: Any = None,
        **kwargs,
    ):
        """`comparator=` / `replay_mode=`: a registered plugin name (instead of the config's `comparator_policy` /
        `preference_replay_mode`) or a ready instance (see docs/plugins.md)."""
        args = self._checked_args(args)
        round_plugins = build_round_plugins(args, comparator, replay_mode)  # their errors come before models load
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, **kwargs)
        self.rounds = RoundDriver(self, *round_plugins)

    # ---- the round step (called by the driver) ----
    def round_micro_batches(self) -> int:
        """Training batches of one round: `num_train_epochs` over the most pairs a round selects, padded to whole
        optimizer steps."""
        a = self.args
        per_step = a.per_device_train_batch_size * self.accelerator.num_processes
        batches = math.ceil(self.rounds.max_pairs_per_round() / per_step) * math.ceil(a.num_train_epochs)
        ga = a.gradient_accumulation_steps
        return math.ceil(batches / ga) * ga

    def round_batches(self, nu: int, pairs: list[PreferencePair]) -> list:
        """This process's slice of each global batch of `train_batch_size x processes` pairs, `num_train_epochs`
        shuffled passes (the reference log-probs precomputed first when asked)."""
        a = self.args
        bs, world, rank = a.per_device_train_batch_size, self.accelerator.num_processes, self.accelerator.process_index
        if a.precompute_ref_log_probs:  # the round's pairs (the same on every process), split over the processes
            self.precompute_reference_logps(pairs)
        g = torch.Generator().manual_seed(a.seed * 7919 + nu)
        order: list[int] = []
        for _ in range(math.ceil(a.num_train_epochs)):
            order.extend(torch.randperm(len(pairs), generator=g).tolist())
        order = order[: max(1, round(len(pairs) * a.num_train_epochs))]
        # this process's slice of each global batch of bs x world pairs (the last one filled up by wrapping around)
        batches = [[pairs[k] for k in mine] for mine in global_batch_slices(order, bs, rank, world)]
        return self.rounds.cap_batches(self.rounds.align(batches, a.gradient_accumulation_steps))

    def preference_oracle(self) -> None:
        """New comparisons are scored with the task reward."""
        return None

    # ---- the Trainer hooks, handed to the driver ----
    def _prepare_pairs(self) -> bool:
        return True  # each round collects its own pairs

    def get_train_dataloader(self):
        return self.rounds.loader()

    def _prepare_inputs(self, batch):
        return {"pairs": batch}

    def _training_context(self, checkpoint):
        return self.rounds.running(checkpoint)

    def _rng_round(self) -> int:
        return self.rounds.stream_round

    def _save_checkpoint_extra(self, folder: str) -> None:
        super()._save_checkpoint_extra(folder)
        if self.args.should_save:
            self.rounds.save_state(folder)

    def _extra_resume_state(self) -> dict:
        return {**super()._extra_resume_state(), **self.rounds.resume_state()}

    def _restore_extra_state(self, checkpoint: str, extra: dict) -> None:
        super()._restore_extra_state(checkpoint, extra)
        self.rounds.restore_resume_state(extra)


_MARLHF_ITER_TAGS = ["trl", "trl_marl", "multi-agent", "marlhf", "iterative-rlhf"]


class MARLHFIterTrainer(MARLHFTrainer):
    """Iterative MARLHF: each round fits a NEWLY initialised joint reward model on the round's training pairs B(nu),
    then runs `num_train_epochs` of RL over the task items on its scores. Arguments are those of `MARLHFTrainer`
    (`critic_model` / `critics` for the `maac` / `iac` backends), plus `comparator` / `replay_mode` (as
    `MADPOIterTrainer`'s). With an actor-critic backend the critics carry over from round to round; only the reward
    model is new each round."""

    _name = "MARLHFIter"
    _tag_names = ["trl", "trl_marl", "multi-agent", "marlhf", "iterative-rlhf"]
    config_class = MARLHFIterConfig
    args_class = MARLHFIterConfig
    runs_rounds = True


# removed in favour of `MARLHFIterTrainer` with `MARLHFIterConfig(rl_algorithm=...)`, forwarded for one release
_REMOVED = {"MARLHFIterMAACTrainer": ("MARLHFIterTrainer", None), "MARLHFIterIACTrainer": ("MARLHFIterTrainer", None)}


def __getattr__(name: str) -> Any:
    return removed_name(__name__, name, _REMOVED, globals())
