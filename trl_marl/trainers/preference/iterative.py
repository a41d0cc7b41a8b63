"""Iterative (online) preference training: `MADPOIterTrainer` and `MARLHFIterTrainer`.

`num_iterations` rounds; in round nu:

1. **collect** — the current agents sample `preference_num_candidates` joint responses per item and the COMPARATOR
   (`comparator_policy`, an entry-point plugin) samples `comparator_num_candidates`; candidate c of one side is
   compared with candidate c of the other (indices present on both sides), the oracle scores both, the higher wins
   (either side may), ties are dropped, and `pair_selection` keeps `preference_pairs_per_sample` per item;
2. **store** the round's pairs D(nu) as `preference_replay_dir/iteration_{nu:04d}.json`
   (`{"iteration", "num_pairs", "pairs"}`, written atomically: temp file, fsync, rename);
3. **select** the training set B(nu) with the replay mode (`preference_replay_mode`, an entry-point plugin) over
   this run's stored rounds — replayed pairs are re-read from their round files;
4. **train** — MADPO: `num_train_epochs` over B(nu); MARLHF: a NEWLY initialised joint reward model fitted on
   B(nu), then `num_train_epochs` of RL over the task items on its scores.

The whole run is ONE `Trainer.train()` (one accelerate / DeepSpeed engine): the training data loader drives the rounds,
running each round's collection when the previous round's last step is done. With `save_strategy != "no"` a
checkpoint is written at the end of every round (and only then); it holds the agents, optimizer, scheduler, every RNG
stream (the comparator's separate stream included), the round counter, the replay index with copies of its round
files, and the policy-history index, so that a run resumed from round nu's checkpoint produces the same round nu+1
pairs and weights as an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback

from trl_marl.checkpointing.state_files import CorruptedStateError, read_json_state, require
from trl_marl.data_types.rng import keyed_rng
from trl_marl.plugins.comparators_protocol import check_comparator_output
from trl_marl.plugins.registry import COMPARATOR_GROUP, load_plugin
from trl_marl.plugins.replay import make_replay_mode
from trl_marl.trainers.actor_critic import IACConfig, MAACConfig
from trl_marl.trainers.preference.data_parallel import collection_chunks, global_batch_slices, merge_item_shares
from trl_marl.trainers.preference.madpo import MADPOConfig, MADPOTrainer
from trl_marl.trainers.preference.marlhf import (
    MARLHFConfig,
    MARLHFIACTrainer,
    MARLHFMAACTrainer,
    MARLHFTrainer,
    _MARLHFMixin,
)
from trl_marl.trainers.preference.pairs import PAIR_SELECTIONS, PreferencePair, select_aligned_pairs
from trl_marl.utils.progress import progress_bar, trainer_shows_progress

__all__ = [
    "IterativeConfigMixin",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFIterMAACConfig",
    "MARLHFIterMAACTrainer",
    "MARLHFIterIACConfig",
    "MARLHFIterIACTrainer",
    "write_round_file",
    "read_round_file",
]

logger = logging.getLogger(__name__)

STATE_FILE = "iterative_state.json"
COMPARATOR_RNG_FILE = "comparator_state.json"


@dataclass
class IterativeConfigMixin:
    r"""Fields of the iterative trainers (`MADPOIterConfig`, `MARLHFIterConfig`).

    Parameters:
        num_rounds: rounds of collect -> store -> select -> train.
        num_iterations: deprecated alias of `num_rounds` (in TRL's GRPO `num_iterations` means PPO epochs).
        preference_replay_mode: which stored rounds each round trains on: `current`, `nearest_k`, `all_history`,
            `lambda_decay` (or a plugin's name; entry-point group `trl_marl.replay_modes`).
        preference_replay_k: `nearest_k`: the latest k non-empty rounds; `lambda_decay`: the latest K (optional).
        preference_replay_lambda: `lambda_decay`'s lambda in [0, 1] (weights `lambda ** age`).
        preference_replay_sample_size: pairs drawn per round in the historical modes (default: the current round's
            pair count, or the latest non-empty round's when the current one is empty).
        preference_replay_dir: where round files go (default `output_dir/preference_replay`). Files already there
            from an earlier run are NOT imported.
        policy_checkpoint_dir: where policy snapshots for the `history` comparator go (default
            `output_dir/policy_history`).
        comparator_policy: the comparator: `current`, `current_copy`, `model`, `history`, `api` (or a plugin's
            name; entry-point group `trl_marl.comparators`). In code, the trainer's `comparator=` also takes an
            instance.
        comparator_kwargs: keyword arguments for the comparator's constructor, after the config (a dict, or a JSON
            object on the command line): a plugin's own options.
        replay_kwargs: keyword arguments for the replay mode's constructor, besides `k`, `lam`, `sample_size` (a
            dict or a JSON object): a plugin's own options.
        comparator_generation_mode: `decentralized` (one response per role) or `centralized` (one comparator model
            writes the whole joint response, parsed into roles).
        comparator_centralized_agent_index: which comparator model writes the joint response in centralized mode.
        comparator_model_name: `model` comparator: one model id / path for every agent.
        comparator_agents: `model` comparator: one model id / path per agent.
        comparator_devices: devices of the comparator models (one, or one per agent).
        comparator_num_candidates: candidates the comparator samples per item (default: `preference_num_candidates`).
        comparator_history_k: `history` comparator: how many rounds back (default 1).
        comparator_api_url: `api` comparator: the endpoint URL.
        comparator_api_format: `generic`, `openai`, `anthropic`, `openai_responses` (aliases `responses`, `codex`).
        comparator_api_model: the remote model name.
        comparator_api_key_env: the NAME of the environment variable holding the key (keys are never in configs).
        comparator_api_timeout: wall-clock seconds per request attempt, reading the whole response included.
        comparator_api_max_response_bytes: largest API response body accepted (checked while streaming).
        comparator_api_headers: extra request headers (JSON object); credential headers (`Authorization`,
            `X-Api-Key`, `X-Auth-Token`, `Cookie`, any name with token / secret / key / auth) are rejected.
        comparator_api_extra_body: extra request fields (JSON object); secret-named fields are rejected, as are
            secret-named query parameters of `comparator_api_url` (keys come from `comparator_api_key_env`).
        comparator_api_max_n_per_request: most candidates per request (formats with `n`).
        comparator_api_response_field: dotted path of the completions in a `generic` response.
        comparator_api_max_retries: retries on timeouts, connection errors, 429 and 5xx.
        comparator_api_retry_backoff: seconds before the first retry (doubled each retry).
        comparator_api_max_concurrency: most requests in flight.
    """

    num_rounds: int = field(default=3, metadata={"help": "Rounds of collect -> store -> select -> train."})
    num_iterations: int | None = field(default=None, metadata={"help": "Deprecated alias of num_rounds."})
    preference_replay_mode: str = field(default="current", metadata={"help": "Replay mode (plugin name)."})
    preference_replay_k: int | None = field(default=None, metadata={"help": "Rounds k of nearest_k / lambda_decay."})
    preference_replay_lambda: float | None = field(default=None, metadata={"help": "lambda of lambda_decay."})
    preference_replay_sample_size: int | None = field(
        default=None, metadata={"help": "Pairs drawn per round in the historical modes."}
    )
    preference_replay_dir: str | None = field(default=None, metadata={"help": "Directory of the round files."})
    policy_checkpoint_dir: str | None = field(default=None, metadata={"help": "Directory of policy snapshots."})
    comparator_policy: str = field(default="current", metadata={"help": "Comparator (plugin name)."})
    comparator_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Options for the comparator's constructor (JSON object)."}
    )
    replay_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Options for the replay mode's constructor (JSON object)."}
    )
    comparator_generation_mode: str = field(
        default="decentralized", metadata={"help": "decentralized or centralized comparator generation."}
    )
    comparator_centralized_agent_index: int = field(
        default=0, metadata={"help": "Comparator model that writes the joint response (centralized)."}
    )
    comparator_model_name: str | None = field(default=None, metadata={"help": "Comparator model id for all agents."})
    comparator_agents: list[str] | None = field(default=None, metadata={"help": "Comparator model id per agent."})
    comparator_devices: list[str] | None = field(default=None, metadata={"help": "Devices of comparator models."})
    comparator_num_candidates: int | None = field(
        default=None, metadata={"help": "Comparator candidates per item (default: preference_num_candidates)."}
    )
    comparator_history_k: int | None = field(default=None, metadata={"help": "history: rounds back (default 1)."})
    comparator_api_url: str | None = field(default=None, metadata={"help": "API comparator endpoint URL."})
    comparator_api_format: str = field(default="generic", metadata={"help": "API format."})
    comparator_api_model: str | None = field(default=None, metadata={"help": "Remote model name."})
    comparator_api_key_env: str | None = field(
        default=None, metadata={"help": "Name of the environment variable holding the API key."}
    )
    comparator_api_timeout: float = field(
        default=120.0, metadata={"help": "Wall-clock seconds per API request attempt (whole response)."}
    )
    comparator_api_max_response_bytes: int = field(
        default=4 * 1024 * 1024, metadata={"help": "Largest API response body accepted (bytes)."}
    )
    comparator_api_headers: dict | str | None = field(default=None, metadata={"help": "Extra headers (JSON)."})
    comparator_api_extra_body: dict | str | None = field(default=None, metadata={"help": "Extra body (JSON)."})
    comparator_api_max_n_per_request: int | None = field(default=None, metadata={"help": "Most candidates/request."})
    comparator_api_response_field: str = field(default="completions", metadata={"help": "generic: completions path."})
    comparator_api_max_retries: int = field(default=3, metadata={"help": "API retries."})
    comparator_api_retry_backoff: float = field(default=1.0, metadata={"help": "Seconds before the first retry."})
    comparator_api_max_concurrency: int = field(default=8, metadata={"help": "API requests in flight."})

    def _validate_iterative(self) -> None:
        if self.num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {self.num_rounds}")
        for name in ("comparator_api_headers", "comparator_api_extra_body", "comparator_kwargs", "replay_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    setattr(self, name, json.loads(value))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{name} must be a JSON object, got {value!r}") from exc
        from trl_marl.utils.secrets import check_no_secrets

        check_no_secrets(
            "comparator_api",
            self.comparator_api_url,
            self.comparator_api_headers,
            self.comparator_api_extra_body,
            "comparator_api_key_env",
        )
        if self.comparator_num_candidates is not None and self.comparator_num_candidates < 1:
            raise ValueError(f"comparator_num_candidates must be >= 1, got {self.comparator_num_candidates}")
        # plugin names and options fail here, with the registered names, before any model loads
        make_replay_mode(
            self.preference_replay_mode,
            k=self.preference_replay_k,
            lam=self.preference_replay_lambda,
            sample_size=self.preference_replay_sample_size,
            **(self.replay_kwargs or {}),
        )
        load_plugin(COMPARATOR_GROUP, self.comparator_policy)
        if self.comparator_history_k is not None and self.comparator_policy != "history":
            raise ValueError("comparator_history_k only applies to comparator_policy='history'")


_ITER_PAIR_SELECTION = field(
    default="comparator_reward",
    metadata={"help": "comparator_reward, reward_gap, all or random.", "choices": list(PAIR_SELECTIONS)},
)


@dataclass
class MADPOIterConfig(MADPOConfig, IterativeConfigMixin):
    r"""Configuration of `MADPOIterTrainer`: the `MADPOConfig` fields, the iterative fields of
    `IterativeConfigMixin`, and these defaults: `num_train_epochs=1` (per round), `pair_selection="comparator_reward"`.
    """

    num_train_epochs: float = field(default=1.0, metadata={"help": "Epochs over B(nu) in each round."})
    pair_selection: str = _ITER_PAIR_SELECTION
    _allowed_pair_selections = PAIR_SELECTIONS
    _deprecated_aliases = {**MADPOConfig._deprecated_aliases, "num_iterations": "num_rounds"}

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        self._validate_iterative()


PREFERENCE_SCORING = ("task", "reward_model")


@dataclass
class MARLHFIterConfig(MARLHFConfig, IterativeConfigMixin):
    r"""Configuration of `MARLHFIterTrainer`: the `MARLHFConfig` fields, the iterative fields of
    `IterativeConfigMixin`, plus:

    Parameters:
        preference_scoring_reward: the oracle of new comparisons: `"task"` (the task reward) or `"reward_model"`
            (the most recently fitted reward model; the task reward while none exists yet).

    Defaults changed: `num_train_epochs=1` (RL epochs per round), `reward_num_train_epochs=2`,
    `pair_selection="comparator_reward"`.
    """

    num_train_epochs: float = field(default=1.0, metadata={"help": "RL epochs over the items in each round."})
    reward_num_train_epochs: int = field(default=2, metadata={"help": "Bradley-Terry epochs per round."})
    pair_selection: str = _ITER_PAIR_SELECTION
    preference_scoring_reward: str = field(
        default="task",
        metadata={"help": "Oracle of new comparisons: task or reward_model.", "choices": list(PREFERENCE_SCORING)},
    )
    _allowed_pair_selections = PAIR_SELECTIONS
    _deprecated_aliases = {**MARLHFConfig._deprecated_aliases, "num_iterations": "num_rounds"}

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        self._validate_iterative()
        if self.preference_scoring_reward not in PREFERENCE_SCORING:
            raise ValueError(
                f"preference_scoring_reward must be one of {list(PREFERENCE_SCORING)}, got "
                f"{self.preference_scoring_reward!r}"
            )
        if self.reward_model_path is not None:
            raise ValueError(
                "reward_model_path is a reward model used as is, but the iterative trainers fit a NEW reward model "
                "every round: use MARLHFTrainer with reward_model_path, or leave it unset"
            )


# ----------------------------------------------------------------------------------------------- round files
def write_round_file(path: str, iteration: int, records: list[dict]) -> None:
    """Write `{"iteration", "num_pairs", "pairs"}` to `path` atomically (temp file in the same folder, fsync,
    rename), so a crash never leaves a half-written round."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".round-", suffix=".json.tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"iteration": iteration, "num_pairs": len(records), "pairs": records}, f, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


ROUND_RECORD_KEYS = (
    "prompts",
    "winner_completions",
    "loser_completions",
    "winner_reward",
    "loser_reward",
    "candidate_reward_mean",
)
_ROUND_FIX = "delete it and resume from a checkpoint written before that round (its copy of the round is restored)"


def read_round_file(
    path: str, expected_iteration: int | None = None, num_agents: int | None = None, fix: str = _ROUND_FIX
) -> dict:
    """Read and validate a round file: `{"iteration", "num_pairs", "pairs"}`, the pair count and (when given) the
    round number agree with the header, every pair has the record fields (with `num_agents` entries per list).
    Any damage is a `CorruptedStateError` naming the file, what is wrong and `fix`."""
    data = read_json_state(path, fix)
    iteration = require(data, "iteration", int, path, fix)
    num_pairs = require(data, "num_pairs", int, path, fix)
    pairs = require(data, "pairs", list, path, fix)
    if expected_iteration is not None and iteration != expected_iteration:
        raise CorruptedStateError(path, f"its header says round {iteration}, expected round {expected_iteration}", fix)
    if num_pairs != len(pairs):
        raise CorruptedStateError(path, f"its header says {num_pairs} pairs but it holds {len(pairs)}", fix)
    for k, rec in enumerate(pairs):
        if not isinstance(rec, dict):
            raise CorruptedStateError(path, f"pair {k} is a {type(rec).__name__}, not a JSON object", fix)
        missing = [key for key in ROUND_RECORD_KEYS if key not in rec]
        if missing:
            raise CorruptedStateError(path, f"pair {k} lacks {missing}", fix)
        if num_agents is not None:
            for key in ROUND_RECORD_KEYS[:3]:
                if not isinstance(rec[key], list) or len(rec[key]) != num_agents:
                    raise CorruptedStateError(path, f"pair {k}'s {key!r} should list {num_agents} entries", fix)
    return data


class _StoredRound(Sequence):
    """A stored round, read lazily from its file (the replay mode only indexes what it selects)."""

    def __init__(self, path: str, size: int, iteration: int | None = None, num_agents: int | None = None):
        self.path, self.size, self._pairs = path, size, None
        self.iteration, self.num_agents = iteration, num_agents

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        if self._pairs is None:
            data = read_round_file(self.path, self.iteration, self.num_agents)
            if data["num_pairs"] != self.size:
                raise CorruptedStateError(
                    self.path,
                    f"it holds {data['num_pairs']} pairs but this run's replay index recorded {self.size}",
                    _ROUND_FIX,
                )
            self._pairs = data["pairs"]
        return self._pairs[index]


# ----------------------------------------------------------------------------------------------- the round loader
class _RoundLoader:
    """The training "data loader" of an iterative trainer: it runs each round's collection and yields the round's
    training batches (this process's share), round after round."""

    def __init__(self, trainer: Any, length: int):
        self.trainer, self.length = trainer, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        t = self.trainer
        resumed = t._resume_round  # a round interrupted by preemption: its remaining batches first
        t._resume_round = None
        while resumed is not None or t.completed_rounds < t.args.num_iterations:
            if resumed is not None:
                batches, start = resumed["batches"], resumed["next"]
                resumed = None
            else:
                nu = t.completed_rounds + 1
                batches, start = t._start_round(nu), 0
                t.completed_rounds = nu
            t._round_batches_now = batches
            for j in range(start, len(batches)):
                t._round_next = j + 1
                t._last_batch_of_round = j == len(batches) - 1
                yield batches[j]
            t._last_batch_of_round = False
            t._round_batches_now, t._round_next = None, 0
        t._rounds_done = True


class _RoundCallback(TrainerCallback):
    """Checkpoints at round ends only; stops when every round is done."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        at_end = t._last_batch_of_round
        preempted = t._preemption.stop_now  # a preemption checkpoint may fall inside a round
        control.should_save = bool(at_end and args.save_strategy != "no") or preempted
        if (at_end and t.completed_rounds >= t.args.num_iterations) or preempted:
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.trainer._rounds_done:
            control.should_training_stop = True
        return control


class IterativeMixin:
    """Rounds, the comparator, the replay buffer, round files, policy history and round checkpoints."""

    def __init__(
        self,
        model=None,
        reward_funcs=None,
        args=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        *,
        comparator: Any = None,
        replay_mode: Any = None,
        **kwargs,
    ):
        """`comparator=` / `replay_mode=`: a registered plugin name (instead of the config's `comparator_policy` /
        `preference_replay_mode`) or a ready instance (a notebook user's own object; see docs/plugins.md)."""
        args = self._checked_args(args)
        self._init_iterative(args, comparator, replay_mode)  # their errors come before any model loads
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, **kwargs)
        self._post_init_iterative()

    def _init_iterative(self, args, comparator: Any = None, replay_mode: Any = None) -> None:
        """Before the models load: build (or take) the comparator and the replay mode (their own validation)."""
        if comparator is None or isinstance(comparator, str):
            name = args.comparator_policy if comparator is None else comparator
            self.comparator = load_plugin(COMPARATOR_GROUP, name)(args, **(args.comparator_kwargs or {}))
            self.comparator_name = name
        else:
            if not callable(getattr(comparator, "generate", None)):
                raise TypeError(
                    f"comparator={type(comparator).__name__} has no generate(items, prompts_per_agent, "
                    "num_candidates, trainer) method; see trl_marl.plugins.comparators_protocol"
                )
            if args.comparator_kwargs:
                raise ValueError("comparator_kwargs configures a comparator built by name; this one is an instance")
            self.comparator, self.comparator_name = comparator, type(comparator).__name__
        if replay_mode is None or isinstance(replay_mode, str):
            self.replay_mode = make_replay_mode(
                args.preference_replay_mode if replay_mode is None else replay_mode,
                k=args.preference_replay_k,
                lam=args.preference_replay_lambda,
                sample_size=args.preference_replay_sample_size,
                **(args.replay_kwargs or {}),
            )
        else:
            if not callable(getattr(replay_mode, "select", None)):
                raise TypeError(
                    f"replay_mode={type(replay_mode).__name__} has no select(rounds, rng) method; see "
                    "trl_marl.plugins.replay.ReplayMode"
                )
            if args.replay_kwargs:
                raise ValueError("replay_kwargs configures a replay mode built by name; this one is an instance")
            self.replay_mode = replay_mode

    def _post_init_iterative(self) -> None:
        a = self.args
        self.replay_dir = a.preference_replay_dir or os.path.join(a.output_dir, "preference_replay")
        self.policy_dir = a.policy_checkpoint_dir or os.path.join(a.output_dir, "policy_history")
        self.completed_rounds = 0
        self.rounds: list[dict] = []  # this run's replay index: {"iteration", "path", "num_pairs"}
        self.policy_snapshots: dict[int, str] = {}  # rounds completed -> snapshot folder (0 = initial policy)
        self._last_batch_of_round = False
        self._rounds_done = False
        self._current_pairs: dict[int, PreferencePair] = {}
        self._round_batches_now: list | None = None  # the batches of the round in progress, and the next index
        self._round_next = 0
        self._resume_round: dict | None = None
        self.add_callback(_RoundCallback(self))

    # ---- the rounds ----
    @property
    def _comparator_candidates(self) -> int:
        return self.args.comparator_num_candidates or self.args.preference_num_candidates

    def _max_pairs_per_round(self) -> int:
        a = self.args
        if a.preference_replay_sample_size is not None:
            return a.preference_replay_sample_size
        per_item = min(a.preference_num_candidates, self._comparator_candidates)
        if a.preference_pairs_per_sample is not None:
            per_item = min(per_item, a.preference_pairs_per_sample)
        return len(self.train_dataset) * per_item

    def _cap_round(self, count_or_batches, batches: bool = False):
        """`max_steps` counts optimizer steps PER ROUND in the iterative trainers: a round trains at most
        `max_steps * gradient_accumulation_steps` batches (every round runs; `max_steps <= 0`: no cap)."""
        cap = self._user_max_steps()
        if cap is None:
            return count_or_batches
        limit = cap * self.args.gradient_accumulation_steps
        return count_or_batches[:limit] if batches else min(count_or_batches, limit)

    def _user_max_steps(self) -> int | None:
        user = getattr(self, "_round_max_steps", self.args.max_steps)
        return user if user is not None and user > 0 else None

    def _align(self, batches: list, multiple: int) -> list:
        """Pad a round's batches to a multiple of `multiple` (gradient accumulation) by wrapping around."""
        if not batches or len(batches) % multiple == 0:
            return batches
        extra = multiple - len(batches) % multiple
        return batches + [batches[k % len(batches)] for k in range(extra)]

    def _start_round(self, nu: int) -> list:
        """Collect, store and select round `nu`; return this process's training batches for it."""
        self._stream_round = nu  # round nu's random streams, from its collection through its training
        if self.args.comparator_policy == "history" or getattr(self.comparator, "needs_policy_history", False):
            self._snapshot_policy(nu - 1)
        prepare = getattr(self.comparator, "prepare", None)
        if prepare is not None:
            prepare(self, nu)
        pairs = self._collect_round(nu)
        records = [p.to_record() for p in pairs]
        path = os.path.join(self.replay_dir, f"iteration_{nu:04d}.json")
        if self.accelerator.is_main_process:
            write_round_file(path, nu, records)
        self.accelerator.wait_for_everyone()
        self.rounds.append({"iteration": nu, "path": path, "num_pairs": len(records)})
        self._current_pairs = {id(r): p for r, p in zip(records, pairs)}
        rounds = [
            _StoredRound(r["path"], r["num_pairs"], r["iteration"], self.num_agents) for r in self.rounds[:-1]
        ] + [records]
        selected = self.replay_mode.select(rounds, self.rng_streams.numpy("replay", nu))
        train_pairs = [self._pair_from_record(r) for r in selected]
        m = self._metrics["train"]
        m["iter/current_iteration"].append(float(nu))
        m["iter/current_preference_pairs"].append(float(len(records)))
        m["iter/total_preference_pairs"].append(float(sum(r["num_pairs"] for r in self.rounds)))
        m["iter/train_preference_pairs"].append(float(len(train_pairs)))
        if not train_pairs:
            msg = (
                f"{self._name} round {nu}: no preference pair to train on (all comparisons tied), so this round makes "
                "no update; raise preference_num_candidates or temperature, or check the reward"
            )
            if self.accelerator.is_main_process:
                logger.warning(msg)  # once: a printed copy would repeat it
            return []
        return self._round_batches(nu, train_pairs)

    def _snapshot_policy(self, rounds_done: int) -> None:
        if rounds_done in self.policy_snapshots:
            return
        path = os.path.join(self.policy_dir, f"iteration_{rounds_done:04d}")
        self.save_model(path, _internal_call=True)
        self.accelerator.wait_for_everyone()
        self.policy_snapshots[rounds_done] = path

    def _oracle_scores(self, completions_per_agent, task_prompts, items) -> tuple[torch.Tensor, torch.Tensor]:
        """(processed, raw) scores of joint responses; the task reward by default."""
        if not task_prompts:
            return torch.zeros(0), torch.zeros(0)
        return self.reward(completions_per_agent, task_prompts, items)

    @torch.no_grad()
    def _collect_round(self, nu: int) -> list[PreferencePair]:
        a, n = self.args, self.num_agents
        K, Kc = a.preference_num_candidates, self._comparator_candidates
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        # (item index, (pairs, target rewards, comparator rewards)) of this process's items
        local: list[tuple[int, tuple[list[PreferencePair], list[float], list[float]]]] = []
        chunks = collection_chunks(len(self.train_dataset), a.rollout_buffer_size, rank, world)
        for indices, filler in progress_bar(chunks, f"Round {nu}: collecting pairs", trainer_shows_progress(self)):
            # a filler chunk runs every step (generation and scoring may be collectives) and keeps nothing
            items = [self.train_dataset[j] for j in indices]
            with self.rng_streams.scoped("rollout", nu):
                rollout = self.rollout_engine.run(items, self.generate, num_generations=K)
            env_steps = rollout.env_steps
            prompts_per_agent = [[node.prompts[i] for node in rollout.nodes] for i in range(n)]
            task_prompts = [
                self.rollout_engine.task_prompt(item, node.prompts) for item, node in zip(items, rollout.nodes)
            ]
            # target side scores (rescored when the oracle is not the task reward)
            t_proc, t_raw = self._target_scores(rollout, items, task_prompts)
            with self.rng_streams.scoped("comparator", nu):  # its draws never shift the training stream's
                joint = self.comparator.generate(items, prompts_per_agent, Kc, self)
            joint = check_comparator_output(
                joint, num_items=len(items), num_candidates=Kc, num_agents=n, name=self.comparator_name
            )
            flat = [(b, c) for b in range(len(items)) for c in range(Kc) if joint[b][c] is not None]
            c_proc: list[list[float | None]] = [[None] * Kc for _ in items]
            c_raw: list[list[float | None]] = [[None] * Kc for _ in items]
            # a sharded reward-model oracle is a collective: called (with no rows) even where no candidate is left
            if flat or self.collective_generation:
                comps = [[joint[b][c][i] for b, c in flat] for i in range(n)]
                proc, raw = self._oracle_scores(comps, [task_prompts[b] for b, _ in flat], [items[b] for b, _ in flat])
                env_steps += len(flat)
                for (b, c), p, r in zip(flat, _shared_list(proc), _shared_list(raw)):
                    c_proc[b][c], c_raw[b][c] = p, r
            if filler:
                continue
            self.env_step += env_steps
            for b, node in enumerate(rollout.nodes):
                # the random selection is keyed by (round, item): the same whichever process collects the item
                rng = keyed_rng(a.seed, "pair_selection", nu, indices[b])
                kept = select_aligned_pairs(t_proc[b], c_proc[b], a.pair_selection, a.preference_pairs_per_sample, rng)
                present = [t_proc[b][c] for c in range(min(K, Kc))] + [
                    v for v in c_proc[b][: min(K, Kc)] if v is not None
                ]
                mean = sum(present) / len(present)
                pairs = [
                    self._aligned_pair(
                        rollout,
                        node,
                        joint[b][c],
                        c,
                        target_wins,
                        t_proc[b][c],
                        c_proc[b][c],
                        t_raw[b][c],
                        c_raw[b][c],
                        mean,
                    )
                    for c, target_wins in kept
                ]
                comp = [v for v in c_proc[b] if v is not None]
                local.append((indices[b], (pairs, list(t_proc[b]), comp)))
        # every process's pairs in item order: what one process collecting every item builds
        merged = merge_item_shares(gather_object([local]) if world > 1 else [local])
        local = [p for pairs, _, _ in merged for p in pairs]
        target_rewards = [r for _, rewards, _ in merged for r in rewards]
        comp_rewards = [r for _, _, rewards in merged for r in rewards]
        m = self._metrics["train"]
        if target_rewards:
            for key in self.candidate_reward_keys:
                m[key].append(sum(target_rewards) / len(target_rewards))
        if comp_rewards:
            m["iter/comparator_reward_mean"].append(sum(comp_rewards) / len(comp_rewards))
        failures = getattr(self.comparator, "parse_failures", None)
        if failures is not None:
            m["iter/comparator_parse_failures"].append(float(failures))
        return local

    def _target_scores(self, rollout, items, task_prompts):
        proc = [
            node.rewards.tolist() if node.rewards.ndim == 1 else node.rewards.mean(1).tolist()
            for node in rollout.nodes
        ]
        raw = [
            node.raw_rewards.tolist() if node.raw_rewards.ndim == 1 else node.raw_rewards.mean(1).tolist()
            for node in rollout.nodes
        ]
        return proc, raw

    def _aligned_pair(self, rollout, node, comp_texts, c, target_wins, t_score, c_score, t_raw, c_raw, mean):
        n = self.num_agents
        samples = [rollout.samples[node.samples[i][c]] for i in range(n)]
        target_texts = [s.completion for s in samples]
        target_ids = [s.completion_ids for s in samples]
        comp_ids = [self.tokenize_completion(i, comp_texts[i]) for i in range(n)]
        # how each side ended (the EOS token's text, None when cut at max_new_tokens), kept in the round file
        target_eos = [self.completion_eos_token(i, ids) for i, ids in enumerate(target_ids)]
        comp_eos = [self.completion_eos_token(i, ids) for i, ids in enumerate(comp_ids)]
        comp_texts = [str(t) for t in comp_texts]  # plain strings: pairs are pickled across processes
        w_texts, l_texts = (target_texts, comp_texts) if target_wins else (comp_texts, target_texts)
        w_ids, l_ids = (target_ids, comp_ids) if target_wins else (comp_ids, target_ids)
        w_eos, l_eos = (target_eos, comp_eos) if target_wins else (comp_eos, target_eos)
        w_score, l_score = (t_score, c_score) if target_wins else (c_score, t_score)
        w_raw, l_raw = (t_raw, c_raw) if target_wins else (c_raw, t_raw)
        return PreferencePair(
            prompts=[str(s.prompt) for s in samples],
            winner_completions=w_texts,
            loser_completions=l_texts,
            winner_reward=w_score,
            loser_reward=l_score,
            candidate_reward_mean=mean,
            prompt_ids=[s.prompt_ids for s in samples],
            winner_ids=w_ids,
            loser_ids=l_ids,
            raw_rewards=[w_raw, l_raw],
            target_raw_reward=t_raw,
            comparator_raw_reward=c_raw,
            winner_eos=w_eos,
            loser_eos=l_eos,
        )

    def _pair_from_record(self, record: dict) -> PreferencePair:
        """The training pair of a selected record: the in-memory pair for the current round (exact sampled token
        ids), else re-tokenized from the stored text."""
        exact = self._current_pairs.get(id(record))
        if exact is not None:
            return exact
        return self.pair_from_record(record)

    # ---- the Trainer plumbing ----
    def get_train_dataloader(self):
        return _RoundLoader(self, self._steps_upper_bound() * self.args.gradient_accumulation_steps)

    def train(self, resume_from_checkpoint=None, **kwargs):
        resume_from_checkpoint = self._restore_for_resume(resume_from_checkpoint)
        if resume_from_checkpoint:
            self.load_iterative_state(resume_from_checkpoint)
            self.args.ignore_data_skip = True  # the round loader resumes at the next round by itself
        user_max = self.args.max_steps
        self._round_max_steps = user_max  # per round (`_cap_round`); the Trainer's max_steps is the whole run's
        self.args.max_steps = self._steps_upper_bound()
        try:
            # the MultiAgentTrainer / Trainer loop (not MADPO's / MARLHF's one-shot collection)
            out = self._train_loop(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        finally:
            self.args.max_steps = user_max
            close = getattr(self.comparator, "close", None)
            if close is not None:
                close()
        return self._final_evaluation(out)

    def _save_checkpoint_extra(self, folder: str) -> None:
        super()._save_checkpoint_extra(folder)
        if self.args.should_save:
            self.save_iterative_state(folder)

    def _extra_resume_state(self) -> dict:
        extra = super()._extra_resume_state()
        if self._round_batches_now is not None and self._round_next < len(self._round_batches_now):
            # checkpoint inside a round (preemption): the rest of the round's batches
            extra["round_in_progress"] = {"batches": self._round_batches_now, "next": self._round_next}
        return extra

    def _restore_extra_state(self, checkpoint: str, extra: dict) -> None:
        super()._restore_extra_state(checkpoint, extra)
        self._resume_round = extra.get("round_in_progress")

    def save_iterative_state(self, folder: str) -> None:
        """Round counter, replay index (with copies of its round files), policy history and comparator state."""
        os.makedirs(os.path.join(folder, "preference_replay"), exist_ok=True)
        rounds = []
        for r in self.rounds:
            copy_path = os.path.join(folder, "preference_replay", os.path.basename(r["path"]))
            shutil.copyfile(r["path"], copy_path)
            rounds.append({**r, "checkpoint_copy": os.path.basename(r["path"])})
        state = {
            "completed_rounds": self.completed_rounds,
            "rounds": rounds,
            "policy_snapshots": {str(k): v for k, v in self.policy_snapshots.items()},
            "comparator": self.comparator.state_dict() if hasattr(self.comparator, "state_dict") else None,
            "env_step": self.env_step,
        }
        tmp = os.path.join(folder, STATE_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(folder, STATE_FILE))

    def load_iterative_state(self, folder: str) -> None:
        """Restore what `save_iterative_state` wrote; every file is validated (`CorruptedStateError` naming it)."""
        path = os.path.join(folder, STATE_FILE)
        if not os.path.isfile(path):
            raise CorruptedStateError(
                path,
                "the file is missing, so this is not a complete checkpoint of an iterative trainer",
                f"resume from another checkpoint of {os.path.dirname(os.path.abspath(folder))} "
                "(resume_from_checkpoint=True picks the latest complete one)",
            )
        fix = f"delete {folder} and resume from the checkpoint before it"
        state = read_json_state(path, fix)
        self.completed_rounds = require(state, "completed_rounds", int, path, fix)
        rounds = require(state, "rounds", list, path, fix)
        snapshots = require(state, "policy_snapshots", dict, path, fix)
        if len(rounds) != self.completed_rounds:
            raise CorruptedStateError(
                path, f"it records {len(rounds)} rounds but completed_rounds={self.completed_rounds}", fix
            )
        self.rounds = []
        for k, r in enumerate(rounds):
            if not isinstance(r, dict) or not all(key in r for key in ("iteration", "num_pairs", "checkpoint_copy")):
                raise CorruptedStateError(path, f"round entry {k} lacks iteration / num_pairs / checkpoint_copy", fix)
            copy_path = os.path.join(folder, "preference_replay", r["checkpoint_copy"])
            data = read_round_file(copy_path, r["iteration"], self.num_agents, fix)
            if data["num_pairs"] != r["num_pairs"]:
                raise CorruptedStateError(
                    copy_path, f"it holds {data['num_pairs']} pairs but {STATE_FILE} recorded {r['num_pairs']}", fix
                )
            target = os.path.join(self.replay_dir, os.path.basename(copy_path))
            if self.accelerator.is_main_process:
                write_round_file(target, r["iteration"], data["pairs"])
            self.rounds.append({"iteration": r["iteration"], "path": target, "num_pairs": r["num_pairs"]})
        self.accelerator.wait_for_everyone()
        self.policy_snapshots = {int(k): v for k, v in snapshots.items()}
        if state.get("comparator") is not None and hasattr(self.comparator, "load_state_dict"):
            self.comparator.load_state_dict(state["comparator"])
        self.env_step = int(state.get("env_step", 0))


def _shared_list(t: torch.Tensor) -> list[float]:
    return (t if t.ndim == 1 else t.mean(dim=1)).tolist()


# ----------------------------------------------------------------------------------------------- the trainers
class MADPOIterTrainer(IterativeMixin, MADPOTrainer):
    """Iterative MADPO (see the module docstring): each round trains `num_train_epochs` over B(nu) with the MADPO
    loss. Arguments are those of `MADPOTrainer`."""

    _name = "MADPOIter"
    _tag_names = ["trl", "trl_marl", "multi-agent", "madpo", "iterative-dpo"]
    config_class = MADPOIterConfig
    args_class = MADPOIterConfig
    _precompute_from_initial_agents = False  # later rounds' pairs are collected after updates

    def _steps_upper_bound(self) -> int:
        a = self.args
        per_step = a.per_device_train_batch_size * self.accelerator.num_processes
        batches = math.ceil(self._max_pairs_per_round() / per_step) * math.ceil(a.num_train_epochs)
        ga = a.gradient_accumulation_steps
        batches = self._cap_round(math.ceil(batches / ga) * ga)
        return max(1, a.num_iterations * math.ceil(batches / ga))

    def _round_batches(self, nu: int, pairs: list[PreferencePair]) -> list:
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
        return self._cap_round(self._align(batches, a.gradient_accumulation_steps), batches=True)

    def _prepare_inputs(self, batch):
        return {"pairs": batch}

    def _train_loop(self, **kwargs):
        return super(MADPOTrainer, self).train(**kwargs)


class _MARLHFIterMixin(IterativeMixin):
    """The rounds of iterative MARLHF on any MARLHF trainer (REINFORCE-family or actor-critic backend)."""

    _name = "MARLHFIter"
    _tag_names = ["trl", "trl_marl", "multi-agent", "marlhf", "iterative-rlhf"]

    def _rl_batches_per_round(self) -> int:
        """Training batches (micro-steps) of one round: whole rollouts, padded to a multiple of
        `lcm(steps_per_rollout, gradient_accumulation_steps)` (`_align_rollouts`), capped by `max_steps`."""
        a = self.args
        global_batch = a.rollout_buffer_size * self.accelerator.num_processes
        rollouts = len(self.train_dataset) // global_batch * math.ceil(a.num_train_epochs)
        unit = math.lcm(a.steps_per_rollout, a.gradient_accumulation_steps)
        count = math.ceil(rollouts * a.steps_per_rollout / unit) * unit
        return self._cap_round(count)

    def _steps_upper_bound(self) -> int:
        ga = self.args.gradient_accumulation_steps
        return max(1, self.args.num_iterations * math.ceil(self._rl_batches_per_round() / ga))

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

    def _prepare_inputs(self, items):
        """As `MultiAgentTrainer._prepare_inputs`, keyed on the step WITHIN the round: each round's first step rolls
        out (with the round's reward model), whatever the steps before it."""
        if not isinstance(items, list):
            return items
        K = self.args.steps_per_rollout
        k = getattr(self, "_round_step", 0) % K
        self._round_step = getattr(self, "_round_step", 0) + 1
        if k == 0 or self._buffered is None:
            self._buffered = self._rollout_step(items)
        return self._buffered[k]

    def _oracle_scores(self, completions_per_agent, task_prompts, items):
        if self.args.preference_scoring_reward == "reward_model" and self.reward_model is not None:
            scores = torch.tensor(self._learned_reward(*completions_per_agent, batch_items=items))
            return scores, scores
        return super()._oracle_scores(completions_per_agent, task_prompts, items)

    def _target_scores(self, rollout, items, task_prompts):
        if self.args.preference_scoring_reward == "reward_model" and self.reward_model is not None:
            # ONE reward-model call for every joint response of every item, then split per item
            sizes = [len(node.joint) for node in rollout.nodes]
            comps = [
                [
                    rollout.samples[node.samples[i][k]].completion
                    for node in rollout.nodes
                    for k in range(len(node.joint))
                ]
                for i in range(self.num_agents)
            ]
            batch_items = [item for item, size in zip(items, sizes) for _ in range(size)]
            scores = self._learned_reward(*comps, batch_items=batch_items)
            starts = np.cumsum([0, *sizes]).tolist()
            proc = [scores[a:b] for a, b in zip(starts, starts[1:])]
            return proc, proc
        return super()._target_scores(rollout, items, task_prompts)

    def _round_batches(self, nu: int, pairs: list[PreferencePair]) -> list:
        self.pairs = pairs
        self.reward_model = None
        self._fit_round_reward_model(pairs)
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
        return self._cap_round(self._align_rollouts(batches, a.steps_per_rollout), batches=True)

    def _fit_round_reward_model(self, pairs: list[PreferencePair]) -> None:
        """A NEWLY initialised reward model on this round's B(nu)."""
        self.fit_reward_model()

    def _train_loop(self, **kwargs):
        return super(_MARLHFMixin, self).train(**kwargs)  # the Trainer loop, past MARLHF's one-shot pipeline


class MARLHFIterTrainer(_MARLHFIterMixin, MARLHFTrainer):
    """Iterative MARLHF (see the module docstring): each round fits a NEWLY initialised joint reward model on B(nu),
    then runs `num_train_epochs` of RL over the task items on its scores. Arguments are those of `MARLHFTrainer`.
    With `rl_algorithm="maac"` or `"iac"` the instance built is a `MARLHFIterMAACTrainer` / `MARLHFIterIACTrainer`
    (the same rounds on `MAACTrainer` / `IACTrainer`; pass `critic_model` / `critics`); the critics carry over from
    round to round, only the reward model is new each round."""

    config_class = MARLHFIterConfig
    args_class = MARLHFIterConfig
    actor_critic_variants: dict[str, type] = {}


@dataclass
class MARLHFIterMAACConfig(MARLHFIterConfig, MAACConfig):
    """`MARLHFIterConfig` with `rl_algorithm="maac"`, as `MARLHFIterTrainer` builds it (fields of both)."""

    advantage_normalization: bool = field(default=True, metadata={"help": "Z-score TD errors per group."})


@dataclass
class MARLHFIterIACConfig(MARLHFIterConfig, IACConfig):
    """`MARLHFIterConfig` with `rl_algorithm="iac"`, as `MARLHFIterTrainer` builds it (fields of both)."""

    advantage_normalization: bool = field(default=True, metadata={"help": "Z-score TD errors per group."})


class MARLHFIterMAACTrainer(_MARLHFIterMixin, MARLHFMAACTrainer):
    """Iterative MARLHF with the MAAC backend (built by `MARLHFIterTrainer` for `rl_algorithm="maac"`)."""

    config_class = MARLHFIterMAACConfig
    args_class = MARLHFIterMAACConfig


class MARLHFIterIACTrainer(_MARLHFIterMixin, MARLHFIACTrainer):
    """Iterative MARLHF with the IAC backend (built by `MARLHFIterTrainer` for `rl_algorithm="iac"`)."""

    config_class = MARLHFIterIACConfig
    args_class = MARLHFIterIACConfig


MARLHFIterTrainer.actor_critic_variants = {"maac": MARLHFIterMAACTrainer, "iac": MARLHFIterIACTrainer}
