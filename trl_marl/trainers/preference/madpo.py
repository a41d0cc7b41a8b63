"""MADPO: multi-agent DPO on preferences between joint responses.

    m_i   = log pi_i(a_i^w | h_i^w) - log pi_i(a_i^l | h_i^l)
    Delta = sum_i m_i
    L     = - E[ log sigmoid( beta * Delta ) ]                 (loss_type="sigmoid", the default)
    grad_theta_i L = - beta * sigmoid(-beta * Delta) * grad m_i

Each agent's gradient flows through its own margin only; the weight `sigmoid(-beta * Delta)` is the team's. The
objective is reference-free by default (as specified; the RL trainers' reward-side `reference_kl_enabled` is
refused). TRL's DPO pieces: each agent's batch is padded by TRL's `DataCollatorForPreference` and scored in ONE
forward over winners and losers, `DPOTrainer._compute_loss`'s scheme with TRL's fused LM head (`dpo_forward.py`);
`loss_type` takes the names and formulas of TRL's `DPOTrainer`, all 15 (`joint_dpo_loss`, applied to the joint
response's log-ratios), and an optional per-agent reference model (`ref_model`, `precompute_ref_log_probs`, TRL's
names) turns each log-prob into `log pi_i - log pi_ref,i`. Metrics are DPO's: `rewards/chosen`, `rewards/rejected`,
`rewards/accuracies`, `rewards/margins`, `logps/chosen`, `logps/rejected` (of the joint response). The trainer first
collects preference pairs from the task items with the initial agents (see `pairs.py`), or takes the pairs it is
given (a preference dataset in TRL's format with one set of columns per agent, `preference_data.py`), then runs
`num_train_epochs` over them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object
from torch.utils.data import DataLoader
from transformers.trainer_utils import TrainOutput

from trl_marl.algorithms.losses import DPO_LOSS_TYPES, joint_dpo_loss
from trl_marl.data_types.rng import keyed_rng
from trl_marl.trainers.base import MultiAgentTrainer
from trl_marl.trainers.config import MultiAgentConfig
from trl_marl.trainers.data import identity_collate
from trl_marl.trainers.evaluation import final_evaluation
from trl_marl.trainers.names import check_reward_weights
from trl_marl.trainers.preference.collection import CollectionProgress, collecting
from trl_marl.trainers.preference.data_parallel import (
    EpochDataLoader,
    GlobalBatchSampler,
    collection_chunks,
    merge_item_shares,
    reference_chunks,
)
from trl_marl.trainers.preference.dpo_forward import PreferenceBatch
from trl_marl.trainers.preference.pair_checks import drop_unusable, usable_pairs
from trl_marl.trainers.preference.pairs import (
    PAIR_SELECTIONS,
    PreferencePair,
    as_preference_pairs,
    cut_completions,
    pairs_per_item,
)
from trl_marl.trainers.preference.preference_data import PreferenceInputs, resolve_inputs
from trl_marl.utils.progress import progress_bar, trainer_shows_progress

__all__ = ["PreferenceConfig", "MADPOConfig", "MADPOTrainer", "PreferenceCollectionMixin", "COLLABORATION_MODES"]

logger = logging.getLogger(__name__)

COLLABORATION_MODES = ("decentralized", "centralized")


@dataclass
class PreferenceConfig(MultiAgentConfig):
    r"""Fields shared by the preference trainers (on top of `MultiAgentConfig`).

    Parameters:
        preference_num_candidates: joint responses K sampled per task item to build pairs (every agent samples K
            completions of its own prompt; the same index forms one joint response).
        preference_pairs_per_sample: pairs kept per task item (`None`: no limit; required with `"all"`).
        pair_selection: `"reward_gap"` (largest score gaps first), `"all"` or `"random"`.
        collaboration_mode: `"decentralized"` (one model per agent) or `"centralized"` (ONE model writes every role's
            output as one tagged joint completion; `num_agents` is then the number of roles).
    """

    _train_batch_counts_rollout_items = False

    num_train_epochs: float = field(default=3.0, metadata={"help": "Epochs over the collected pairs."})
    train_batch_size: int | None = field(default=8, metadata={"help": "Preference pairs per training step."})
    preference_num_candidates: int = field(
        default=4, metadata={"help": "Joint responses K sampled per task item to build pairs."}
    )
    preference_pairs_per_sample: int | None = field(
        default=4, metadata={"help": "Pairs kept per task item (None: no limit)."}
    )
    pair_selection: str = field(
        default="reward_gap",
        metadata={"help": "Pair selection: reward_gap, all or random.", "choices": ["reward_gap", "all", "random"]},
    )
    collaboration_mode: str = field(
        default="decentralized",
        metadata={
            "help": "decentralized (a model per agent) or centralized (one model, tagged joint completion).",
            "choices": list(COLLABORATION_MODES),
        },
    )

    _allowed_pair_selections = ("reward_gap", "all", "random")

    @property
    def completions_per_item(self) -> int:
        """Pair collection samples `preference_num_candidates` joint responses per item (`num_generations` is not
        read)."""
        return self.preference_num_candidates

    @property
    def training_rows_per_item(self) -> int:
        """`train_batch_size` counts pairs; each agent scores a pair's chosen and rejected response in one forward."""
        return 2

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        name = type(self).__name__
        if self.num_turns != 1:
            raise ValueError(
                f"{name} needs num_turns=1 (preference pairs compare single-turn joint responses), got "
                f"{self.num_turns}"
            )
        if self.joint_mode != "aligned":
            raise ValueError(
                f"{name} needs joint_mode='aligned' (candidates are index-aligned joint responses), got "
                f"{self.joint_mode!r}"
            )
        if self.preference_num_candidates < 2:
            raise ValueError(
                f"preference_num_candidates must be >= 2 to form a pair, got {self.preference_num_candidates}"
            )
        if self.pair_selection not in self._allowed_pair_selections:
            raise ValueError(
                f"pair_selection must be one of {list(self._allowed_pair_selections)}, got {self.pair_selection!r}"
            )
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ValueError("pair_selection='all' keeps every pair: set preference_pairs_per_sample=None")
        if self.preference_pairs_per_sample is not None and self.preference_pairs_per_sample < 1:
            raise ValueError(
                f"preference_pairs_per_sample must be None or >= 1, got {self.preference_pairs_per_sample}"
            )
        if self.collaboration_mode not in COLLABORATION_MODES:
            raise ValueError(
                f"collaboration_mode must be one of {list(COLLABORATION_MODES)}, got {self.collaboration_mode!r}"
            )


@dataclass
class MADPOConfig(PreferenceConfig):
    r"""Configuration of `MADPOTrainer`: all `PreferenceConfig` fields, plus (names and meanings as in TRL's
    `DPOConfig`):

    Parameters:
        beta: eta, the scale of the joint margin in the loss (TRL's `beta`; for `ipo` the regularization tau).
        dpo_beta: deprecated alias of `beta` (with a FutureWarning).
        loss_type: one or more of TRL's DPO loss types (all 15 of TRL 1.16) applied to the JOINT response:
            `sigmoid` (default, the spec's MADPO), `hinge`, `ipo`, `exo_pair`, `nca_pair`, `robust`, `bco_pair`,
            `sppo_hard`, `aot`, `aot_unpaired`, `apo_zero`, `apo_down`, `discopop`, `sft`, `sigmoid_norm`
            (`aot` sorts the JOINT log-ratios across the batch; `sft` is the joint chosen responses' token-mean NLL;
            see `trl_marl.algorithms.losses.joint_dpo_loss`).
        loss_weights: one weight per `loss_type` when several are combined (`None`: all 1).
        label_smoothing: eps of the `robust`, `exo_pair`, `aot` and `aot_unpaired` losses (TRL's
            `label_smoothing`).
        discopop_tau: tau of the `discopop` loss.
        precompute_ref_log_probs: compute every pair's reference log-probs once before training (with `ref_model`,
            or, without one, with the INITIAL agents: the reference is then the starting policy at no memory cost),
            the pairs split over the processes and the values gathered to every process.
            Without it and without `ref_model` the loss is reference-free.

    `reference_kl_enabled` / `reference_devices` (the RL trainers' reward penalty) are refused: MADPO's reference is
    the DPO reference (`ref_model`, `precompute_ref_log_probs`). So is `num_generations` other than its default:
    the candidates per task item are `preference_num_candidates`.
    """

    beta: float = field(default=0.1, metadata={"help": "Scale eta of the joint margin (TRL's DPO beta)."})
    dpo_beta: float | None = field(default=None, metadata={"help": "Deprecated alias of beta."})
    loss_type: list[str] = field(
        default_factory=lambda: ["sigmoid"],
        metadata={"help": f"TRL DPO loss type(s) on the joint response: {', '.join(DPO_LOSS_TYPES)}."},
    )
    loss_weights: list[float] | None = field(
        default=None, metadata={"help": "Weights of several loss types (None: all 1)."}
    )
    label_smoothing: float = field(
        default=0.0, metadata={"help": "eps of the robust, exo_pair, aot and aot_unpaired losses."}
    )
    discopop_tau: float = field(default=0.05, metadata={"help": "tau of the discopop loss."})
    precompute_ref_log_probs: bool = field(
        default=False,
        metadata={"help": "Reference log-probs computed once before training (ref_model, else the initial agents)."},
    )
    _deprecated_aliases = {**PreferenceConfig._deprecated_aliases, "dpo_beta": "beta"}

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        if self.beta <= 0:  # `dpo_beta` (deprecated alias) was moved to `beta` by _resolve_deprecated_aliases
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if isinstance(self.loss_type, str):
            self.loss_type = [self.loss_type]
        bad = [t for t in self.loss_type if t not in DPO_LOSS_TYPES]
        if bad or not self.loss_type:
            raise ValueError(f"loss_type must be one or more of {list(DPO_LOSS_TYPES)}, got {self.loss_type!r}")
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_type):
            raise ValueError(
                f"loss_weights needs one weight per loss_type ({len(self.loss_type)}), got {len(self.loss_weights)}"
            )
        if "robust" in self.loss_type and not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"loss_type 'robust' needs 0 <= label_smoothing < 0.5, got {self.label_smoothing}")
        if {"aot", "aot_unpaired"} & set(self.loss_type) and not 0 <= self.label_smoothing <= 1:
            raise ValueError(
                f"loss_type 'aot'/'aot_unpaired' need 0 <= label_smoothing <= 1, got {self.label_smoothing}"
            )
        if "exo_pair" in self.loss_type and not 0 < self.label_smoothing < 1:
            raise ValueError(f"loss_type 'exo_pair' needs 0 < label_smoothing < 1, got {self.label_smoothing}")
        if self.discopop_tau <= 0:
            raise ValueError(f"discopop_tau must be > 0, got {self.discopop_tau}")
        # MultiAgentConfig's reward-side KL penalty belongs to the RL trainers: MADPO has no reward to penalise, and
        # would build a frozen copy of every agent that no loss reads
        if self.reference_kl_enabled:
            raise ValueError(
                f"reference_kl_enabled=True does nothing for {type(self).__name__} (it penalises an RL reward; "
                "MADPO has none). MADPO's reference is the DPO reference policy: pass ref_model= to the trainer, or "
                "set precompute_ref_log_probs=True to use the initial agents"
            )
        if self.reference_devices is not None:
            raise ValueError(
                f"reference_devices places the reference-KL copies, which {type(self).__name__} does not build; "
                "a DPO reference model (ref_model=) is placed beside its agent"
            )
        # MADPO samples preference_num_candidates joint responses per item (and evaluates one): G is read by nothing
        default_g = next(f.default for f in dataclasses.fields(self) if f.name == "num_generations")
        if self.num_generations != default_g:
            raise ValueError(
                f"num_generations={self.num_generations} does nothing for {type(self).__name__}: MADPO samples "
                "preference_num_candidates joint responses per task item to build its pairs (set "
                f"preference_num_candidates={self.num_generations} for that many); leave num_generations unset"
            )


assert set(PreferenceConfig._allowed_pair_selections) <= set(PAIR_SELECTIONS)


class PreferenceCollectionMixin:
    """The preference trainers' pairs: given (preference data, records, `PreferencePair`s; see `preference_data.py`)
    or collected from task items with the current agents and the task reward, and checked (`pair_checks.py`)."""

    resume_types = (PreferencePair,)
    runs_rounds = False  # True: the iterative trainers, which collect their pairs every round
    supports_agentic = False  # candidates are joint responses to one prompt, compared in pairs (no episodes)

    # where the collected candidates' mean task reward is logged. MADPO has no other rollouts, so it reuses the
    # rollout keys; MARLHF's RL rollouts log their LEARNED reward there, so it uses a key of its own (the Trainer
    # averages everything logged under one key between two logging steps).
    candidate_reward_keys: tuple[str, ...] = ("turn_1/reward_mean", "turn_1/expected_return")
    _collection: CollectionProgress | None = None  # a pair collection under way or stopped by a failure

    def _unsaved_collection(self) -> str | None:
        return self._collection.describe() if self._collection is not None and self._collection.finished else None

    def _extra_resume_state(self) -> dict:
        extra = super()._extra_resume_state()
        return extra if self._collection is None else {**extra, "collection": self._collection.state_dict()}

    def _restore_extra_state(self, checkpoint: str, extra: dict) -> None:
        super()._restore_extra_state(checkpoint, extra)
        if extra.get("collection") is not None:  # a checkpoint written when a failure stopped a collection
            self._collection = CollectionProgress.from_state_dict(extra["collection"])

    def pair_from_record(self, record: dict) -> PreferencePair:
        """A training pair from a record (`PreferencePair.to_record()`'s shape, e.g. a round file's entry),
        re-tokenized with each agent's tokenizer as this trainer tokenizes its own samples
        (`PreferencePair.from_record`)."""
        if not self._chat_known and len(self.train_dataset):
            # render one item: learns whether each agent's prompts are chat-template text (no special tokens)
            self.rollout_engine.first_prompts(self.train_dataset[0])
            self._chat_known = True
        return PreferencePair.from_record(
            record,
            self.tokenizers,
            self.args.max_completion_length,
            self.eos_ids,
            self.args.max_prompt_length,
            chat=list(self._chat_prompts) if self._chat_known else None,
        )

    def _preference_inputs(
        self,
        args,
        train_dataset: Any,
        eval_dataset: Any,
        preference_pairs: Any,
        reward_funcs: Any,
        kwargs: dict,
        needs_pairs: bool = True,
    ) -> PreferenceInputs:
        """Before any model loads: where the pairs and the task items come from (`preference_data.resolve_inputs`).
        Returns what the base trainer gets (`train_dataset`, `eval_dataset`, `reward_funcs`); the formatters the
        task items need are set in `kwargs` (the base trainer's keyword arguments)."""
        given = reward_funcs if reward_funcs is not None else kwargs.get("reward_func")  # the deprecated alias too
        check_reward_weights(given, args.reward_weights)  # before a missing reward becomes `no_task_reward`
        inputs = resolve_inputs(
            type(self).__name__,
            args.num_agents,
            train_dataset,
            eval_dataset,
            preference_pairs,
            given,
            kwargs.get("formatters"),
            collects_every_round=self.runs_rounds,
            centralized=args.collaboration_mode == "centralized",
            needs_pairs=needs_pairs,
        )
        kwargs["formatters"] = inputs.formatters
        if reward_funcs is None and given is not None:  # given as `reward_func=`: the base trainer resolves it
            inputs.reward_func = None
        return inputs

    def _accept_pairs(self, inputs: PreferenceInputs) -> list[PreferencePair] | None:
        """The given pairs as training pairs (tokenized by `pair_from_record`), checked: refused pairs raise, the
        ones that would train on nothing are dropped with a count in the log; None when none were given."""
        if inputs.pairs is None:
            return None
        pairs = as_preference_pairs(inputs.pairs, self.pair_from_record, inputs.source)
        kept, summary = drop_unusable(pairs)
        if not kept:
            raise ValueError(f"{inputs.source}: {summary}; there is no pair left to train on")
        if summary is not None and self.accelerator.is_main_process:
            logger.warning("%s (%s): %s", self._name, inputs.source, summary)
        cut = cut_completions(kept, self.tokenizers, self.args.max_completion_length)
        if cut and self.accelerator.is_main_process:  # TRL's DPOConfig cuts at max_length, 1024 tokens by default
            logger.warning(
                "%s (%s): %d of the %d given pairs' completions are longer than max_completion_length=%d tokens and "
                "are cut to it (their ends are not trained on); raise max_completion_length to keep them whole",
                self._name,
                inputs.source,
                cut,
                2 * self.num_agents * len(kept),
                self.args.max_completion_length,
            )
        return kept

    def _set_completion_ends(self, pairs: list[PreferencePair]) -> None:
        """Record, per agent, the EOS token each side ended with (None when cut), for `to_record()`."""
        for p in pairs:
            p.winner_eos = [self.completion_eos_token(i, ids) for i, ids in enumerate(p.winner_ids)]
            p.loser_eos = [self.completion_eos_token(i, ids) for i, ids in enumerate(p.loser_ids)]

    def _setup_roles(self, model, args, reward_func, formatters):
        """The preference part's state, set before the models load; in centralized mode, (args, reward, formatters)
        rewritten for one model writing every role (the adapter given as `adapter=`, `self.adapter`)."""
        self.num_roles = args.num_agents
        self._centralized_reward = None
        self._chat_known = False  # whether `_chat_prompts` is known (`pair_from_record` renders one item first)
        if args.collaboration_mode != "centralized":
            return args, reward_func, formatters
        from trl_marl.rollout.centralized import centralized_setup

        if isinstance(model, (list, tuple)):
            raise ValueError("collaboration_mode='centralized' trains ONE model: pass one model id / path, not a list")
        args, reward_func, formatters, self._centralized_reward, self.adapter = centralized_setup(
            args, reward_func, formatters, self.adapter
        )
        return args, reward_func, formatters

    def _end_without_pairs(self, consequence: str) -> TrainOutput:
        """No item yielded a non-tied pair: say so in ONE warning (main process) that says what to change, and end
        with no update (`state.global_step` stays 0; the recipes then exit non-zero)."""
        k = self.args.preference_num_candidates
        centralized = self._centralized_reward is not None
        hint = (
            " With collaboration_mode='centralized' the ONE model must write every role in the tagged format: a "
            "model that does not (a tiny or base model) scores every candidate alike; use an instruction-tuned "
            "model or collaboration_mode='decentralized'."
            if centralized
            else ""
        )
        msg = (
            f"{self._name}: no preference pair was collected: every one of the {k} candidates of every task item "
            f"got the same reward, so {consequence} and training ends with no policy update. To get pairs, raise "
            f"preference_num_candidates (now {k}) or temperature (now {self.args.temperature}), use more task items, "
            f"or check that the reward tells the candidates apart.{hint}"
        )
        if self.accelerator.is_main_process:
            logger.warning(msg)
        self.no_pairs_message = msg
        return TrainOutput(self.state.global_step, 0.0, {"num_pairs": 0})

    @torch.no_grad()
    def _after_training(self, out):
        return final_evaluation(self, out)  # a true post-update reward, unlike turn_1/reward_mean

    def collect_preference_pairs(self, dataset=None) -> list[PreferencePair]:
        """Sample K joint responses per item (this process's share, `rollout_buffer_size` items per `generate`),
        score them with the task reward, keep pairs by `pair_selection` (its random choices keyed by the item).
        Returns the pairs of ALL processes in item order, on every process: what one process collecting every item
        builds from the same candidates (`data_parallel.py`)."""
        ds = self.train_dataset if dataset is None else dataset
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        K, bs, nu = self.args.preference_num_candidates, self.args.rollout_buffer_size, self._rng_round()
        was_training = self.model.training
        chunks = collection_chunks(len(ds), bs, rank, world)
        # the trainer's own collection keeps its finished chunks through a failure, for the checkpoint (collection.py)
        with collecting(self, "the preference pair collection", nu, chunks, resumable=dataset is None) as progress:
            todo = progress_bar(
                progress.remaining(self, chunks),
                "Collecting preference pairs",
                trainer_shows_progress(self),
                total=len(chunks) - progress.finished,
            )
            for indices, filler in todo:
                items = [ds[j] for j in indices]
                with self.rng_streams.scoped("rollout", nu):
                    rollout = self.rollout_engine.run(items, self.generate, num_generations=K)
                if filler:  # rolled out only to join the other processes' collectives
                    continue
                self.env_step += rollout.env_steps
                per_item = pairs_per_item(
                    rollout,
                    self.args.pair_selection,
                    self.args.preference_pairs_per_sample,
                    lambda b, indices=indices: keyed_rng(self.args.seed, "pair_selection", nu, indices[b]),
                    formatters=self.rollout_engine.formatters,
                )
                for node, pairs in zip(rollout.nodes, per_item):
                    self._set_completion_ends(pairs)
                    r = node.rewards if node.rewards.ndim == 1 else node.rewards.mean(dim=1)
                    progress.results.append((indices[node.item], (pairs, r.tolist())))  # (item, (pairs, rewards))
        self.model.train(was_training)
        local = progress.results
        merged = merge_item_shares(gather_object([local]) if world > 1 else [local])
        pairs = [p for item_pairs, _ in merged for p in item_pairs]
        pairs = usable_pairs(pairs, f"{self._name} (collected)", log=self.accelerator.is_main_process)
        rewards = [r for _, item_rewards in merged for r in item_rewards]
        mean = sum(rewards) / max(len(rewards), 1)
        # documented: these are the collected candidates' mean, not the updated policy's reward
        for key in self.candidate_reward_keys:
            self._metrics["train"][key].append(mean)
        self._metrics["train"]["num_pairs"].append(float(len(pairs)))
        return pairs


class MADPOTrainer(PreferenceCollectionMixin, MultiAgentTrainer):
    """Multi-agent DPO (see the module docstring). Takes the `MultiAgentTrainer` arguments plus `adapter` (the
    centralized adapter, default tagged), `preference_pairs` (pairs collected elsewhere; skips collection) and
    `ref_model` (TRL's name): the frozen reference policy, one model / path for every agent or a list with one per
    agent (`None`: reference-free, unless `precompute_ref_log_probs` uses the initial agents).

    `train_dataset` holds task items, or preference data to train on as given: TRL's preference format with one set
    of columns per agent (`prompt_1`, `chosen_1`, `rejected_1`, ...), or a list of per-agent TRL preference datasets
    (see `preference_data.py`); `reward_funcs` is then needed only to evaluate. Given pairs are checked
    (`pair_checks.py`): malformed ones are refused, the ones that would train on nothing dropped with a count.

    `train()` collects pairs with the initial agents unless they were given, then trains `num_train_epochs` over
    them. If no item yields a non-tied pair, it logs that clearly and returns without any update. After training it
    evaluates the updated agents with the task reward (`eval_reward`) when an `eval_dataset` is given.
    """

    _name = "MADPO"
    _tag_names = ["trl", "trl_marl", "multi-agent", "madpo", "dpo"]
    config_class = MADPOConfig
    args_class = MADPOConfig

    def __init__(
        self,
        model=None,
        reward_funcs=None,
        args: MADPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        *,
        adapter=None,
        preference_pairs: Any = None,
        ref_model=None,
        **kwargs,
    ):
        args = self._checked_args(args)
        self.adapter = adapter  # the roles' adapter in centralized mode (`_setup_roles`)
        inputs = self._preference_inputs(args, train_dataset, eval_dataset, preference_pairs, reward_funcs, kwargs)
        super().__init__(
            model, inputs.reward_func, args, inputs.train_dataset, inputs.eval_dataset, processing_class, **kwargs
        )
        self.pairs: list[PreferencePair] | None = self._accept_pairs(inputs)
        self.ref_models = self._load_ref_models(ref_model)
        if self.ref_models is None and args.precompute_ref_log_probs and not self._precompute_from_initial_agents:
            raise ValueError(
                f"{self._name}: precompute_ref_log_probs=True without ref_model would use the CURRENT agents for pairs "
                "collected after updates; pass ref_model (the reference policy) for the iterative trainers"
            )

    # the initial agents can serve as the precomputed reference only where every pair exists before training
    _precompute_from_initial_agents = True

    @property
    def uses_reference(self) -> bool:
        return self.ref_models is not None or self.args.precompute_ref_log_probs

    def _load_ref_models(self, ref_model) -> list[torch.nn.Module] | None:
        """Frozen reference models, one per agent (a single model / path is shared by all agents)."""
        if ref_model is None:
            return None
        from trl_marl.trainers.preference.trl_pieces import disable_dropout_in_model, prepare_deepspeed

        given = list(ref_model) if isinstance(ref_model, (list, tuple)) else [ref_model] * self.num_agents
        if len(given) != self.num_agents:
            raise ValueError(f"ref_model: expected one model per agent ({self.num_agents}), got {len(given)}")
        loaded: dict[int, torch.nn.Module] = {}
        refs = []
        for i, src in enumerate(given):
            key = id(src)
            if key not in loaded:
                if isinstance(src, (str, os.PathLike)):
                    from transformers import AutoModelForCausalLM

                    model = AutoModelForCausalLM.from_pretrained(src)
                elif isinstance(src, torch.nn.Module):
                    model = src
                else:
                    raise TypeError(
                        f"ref_model entries must be a model or a path, got {type(src).__name__} for agent {i}"
                    )
                model.eval()
                disable_dropout_in_model(model)
                for p in model.parameters():
                    p.requires_grad_(False)
                if self.is_deepspeed_enabled:
                    model = prepare_deepspeed(model, self.accelerator)
                else:
                    model.to(self.agent_device(i))
                loaded[key] = model
            refs.append(loaded[key])
        return refs

    # ---- data: the collected pairs ----
    def get_train_dataloader(self) -> DataLoader:
        """This process's slices of each global batch of `train_batch_size x processes` pairs (`GlobalBatchSampler`):
        N processes train on exactly the batches of one process with `train_batch_size x N`."""
        if self.pairs is None:
            self.pairs = self.collect_preference_pairs()
        acc = self.accelerator
        sampler = GlobalBatchSampler(
            len(self.pairs),
            self.args.per_device_train_batch_size,
            acc.process_index,
            acc.num_processes,
            self.args.seed,
        )
        return EpochDataLoader(range(len(self.pairs)), batch_sampler=sampler, collate_fn=identity_collate)

    def _prepare_inputs(self, batch):
        return {"pairs": [self.pairs[i] for i in batch]}

    def _prepare_training(self, checkpoint):
        # the pairs: given, restored from `checkpoint`, or collected now (a preemption signal waits for the end)
        if not self._prepare_pairs():
            return self._end_without_pairs("there is nothing to learn from")
        return None

    def _prepare_pairs(self) -> bool:
        """Before the training loop: collect the pairs (unless given or restored) and precompute their reference
        log-probs when asked; False when there is no pair to train on."""
        if self.pairs is None:
            self.pairs = self.collect_preference_pairs()
        if not self.pairs:
            return False
        if self.args.precompute_ref_log_probs:
            self.precompute_reference_logps(self.pairs)
        return True

    def _extra_resume_state(self) -> dict:
        return {**super()._extra_resume_state(), "pairs": self.pairs}

    def _restore_extra_state(self, checkpoint: str, extra: dict) -> None:
        super()._restore_extra_state(checkpoint, extra)
        if extra.get("pairs") is not None:
            self.pairs = extra["pairs"]

    # ---- the loss ----
    def _agent_pair_batches(self, pairs: list[PreferencePair]) -> list[PreferenceBatch]:
        """Per agent, one batch from TRL's DPO collator: `[all winners ; all losers]` (`PreferenceBatch.collate`)."""
        return [
            PreferenceBatch.collate(
                [p.prompt_ids[i] for p in pairs],
                [p.winner_ids[i] for p in pairs],
                [p.loser_ids[i] for p in pairs],
                self.tokenizers[i].pad_token_id,
            )
            for i in range(self.num_agents)
        ]

    def preference_logps(self, model, pairs: list[PreferencePair]):
        """Per agent `(n, P)`: the winners' and losers' sequence log-probs and completion token counts, from ONE
        forward per agent over the winners and losers of the batch together (TRL's concatenated forward,
        `PreferenceBatch.token_logps`, run through the team so the engine wrapping it sees the forward)."""
        batches = self._agent_pair_batches(pairs)
        out = model(batches)
        self._metrics.record_entropy(out["entropy"])  # the loss's forward (with gradients) reports it
        token_logps = out["logprobs"]
        chosen, rejected, lw, ll = [], [], [], []
        device = token_logps[0].device
        for logp, batch in zip(token_logps, batches):
            w, lo = PreferenceBatch.chosen_rejected(logp)
            nw, nl = batch.lengths()
            chosen.append(w.to(device))
            rejected.append(lo.to(device))
            lw.append(nw.to(device))
            ll.append(nl.to(device))
        return torch.stack(chosen), torch.stack(rejected), torch.stack(lw), torch.stack(ll)

    def preference_margins(self, model, pairs: list[PreferencePair]) -> torch.Tensor:
        """Per-agent margins `(n, P)`: `log pi_i(winner) - log pi_i(loser)` (no reference)."""
        chosen, rejected, _, _ = self.preference_logps(model, pairs)
        return chosen - rejected

    @torch.no_grad()
    def _reference_forward(self, pairs: list[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference log-probs `(n, P)` of the winners and losers: the `ref_model`s, else the agents as they are.
        Scored exactly as the policy is (same TRL forward, same temperature), so a reference equal to the policy
        gives log-ratios of 0."""
        if self.ref_models is None:
            chosen, rejected, _, _ = self.preference_logps(self.team, pairs)
            return chosen, rejected
        outs_c, outs_r = [], []
        for ref, batch in zip(self.ref_models, self._agent_pair_batches(pairs)):
            logp, _ = batch.token_logps(ref, self.team.temperature)
            w, lo = PreferenceBatch.chosen_rejected(logp)
            outs_c.append(w.float().cpu())
            outs_r.append(lo.float().cpu())
        return torch.stack(outs_c), torch.stack(outs_r)

    def precompute_reference_logps(self, pairs: list[PreferencePair], batch_size: int | None = None) -> None:
        """Fill every pair's `ref_chosen_logps` / `ref_rejected_logps` (TRL's `precompute_ref_log_probs`).

        `pairs` must be the same list on every process (a collective with > 1 process). As TRL's `DPOTrainer`
        precomputes over each process's shard and gathers, each process scores its share of the pairs still missing
        them (`reference_chunks`), `batch_size` (default `per_device_train_batch_size`) per forward; the values are
        gathered (`gather_object`) and filled in on every process. Under ZeRO-3 / FSDP2 every process runs the same
        number of forwards (a filler batch where its share is empty, its values dropped)."""
        acc = self.accelerator
        rank, world = acc.process_index, acc.num_processes
        bs = batch_size or self.args.per_device_train_batch_size
        missing = [k for k, p in enumerate(pairs) if p.ref_chosen_logps is None]
        local: list[tuple[int, list[float], list[float]]] = []  # (pair index, chosen, rejected)
        was_training = self.team.training
        self.team.eval()
        for indices, filler in reference_chunks(missing, bs, rank, world, synced=self.collective_generation):
            c, r = self._reference_forward([pairs[k] for k in indices])
            if not filler:  # a filler only joins the other processes' forwards
                local += [(k, c[:, j].tolist(), r[:, j].tolist()) for j, k in enumerate(indices)]
        self.team.train(was_training)
        for share in gather_object([local]) if world > 1 else [local]:
            for k, c, r in share:
                pairs[k].ref_chosen_logps, pairs[k].ref_rejected_logps = c, r

    def _fill_reference_logps(self, pairs: list[PreferencePair]) -> None:
        """Fill the missing reference log-probs of this process's own batch (no gather: the batches differ)."""
        was_training = self.team.training
        self.team.eval()
        todo = [p for p in pairs if p.ref_chosen_logps is None]
        c, r = self._reference_forward(todo)
        for j, p in enumerate(todo):
            p.ref_chosen_logps, p.ref_rejected_logps = c[:, j].tolist(), r[:, j].tolist()
        self.team.train(was_training)

    def reference_logps(self, pairs: list[PreferencePair], device) -> tuple[torch.Tensor, torch.Tensor]:
        """`(n, P)` reference log-probs of a batch: cached on the pairs, else from the `ref_model`s (then cached
        only when `precompute_ref_log_probs`)."""
        if any(p.ref_chosen_logps is None for p in pairs):
            if self.ref_models is None:
                raise RuntimeError(
                    "reference log-probs are missing for a batch and there is no ref_model to compute them"
                )
            if self.args.precompute_ref_log_probs:  # this process's batch (pairs restored without them)
                self._fill_reference_logps(pairs)
            else:
                c, r = self._reference_forward(pairs)
                return c.to(device), r.to(device)
        c = torch.tensor([p.ref_chosen_logps for p in pairs], dtype=torch.float32).T
        r = torch.tensor([p.ref_rejected_logps for p in pairs], dtype=torch.float32).T
        return c.to(device), r.to(device)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        pairs = inputs["pairs"]
        a = self.args
        logp_c, logp_r, lw, ll = self.preference_logps(model, pairs)
        chosen, rejected, ref_c, ref_r = logp_c, logp_r, None, None
        if self.uses_reference:
            ref_c, ref_r = self.reference_logps(pairs, logp_c.device)
            ref_c, ref_r = ref_c.to(logp_c.dtype), ref_r.to(logp_r.dtype)
            chosen, rejected = logp_c - ref_c, logp_r - ref_r
        loss, joint = joint_dpo_loss(
            chosen,
            rejected,
            a.beta,
            a.loss_type,
            a.loss_weights,
            a.label_smoothing,
            lw,
            ll,
            a.discopop_tau,
            ref_c,
            ref_r,
        )
        self._log_dpo_metrics(chosen.detach(), rejected.detach(), logp_c.detach(), logp_r.detach(), joint)
        # value: the joint loss L (what is logged as `loss`); gradient: the per-agent terms of `joint_dpo_loss`
        return loss - loss.detach() + joint

    def _log_dpo_metrics(self, chosen, rejected, logp_c, logp_r, joint) -> None:
        """DPO's metrics for the JOINT response (gathered over processes as `DPOTrainer` does), plus per agent."""
        acc, beta = self.accelerator, self.args.beta
        m = self._metrics["train"]
        rc = acc.gather(beta * chosen.sum(dim=0))
        rr = acc.gather(beta * rejected.sum(dim=0))
        m["madpo/joint_loss"].append(acc.gather(joint.reshape(1)).mean().item())
        m["rewards/chosen"].append(rc.mean().item())
        m["rewards/rejected"].append(rr.mean().item())
        m["rewards/accuracies"].append((rc > rr).float().mean().item())
        m["rewards/margins"].append((rc - rr).mean().item())
        m["logps/chosen"].append(acc.gather(logp_c.sum(dim=0)).mean().item())
        m["logps/rejected"].append(acc.gather(logp_r.sum(dim=0)).mean().item())
        for i in range(chosen.shape[0]):
            m[f"agent_{i + 1}/margin"].append(acc.gather(chosen[i] - rejected[i]).mean().item())

    def _record_rollout_metrics(self, rollout, mode: str) -> None:
        super()._record_rollout_metrics(rollout, mode)
        r = self._centralized_reward
        if r is not None and r.parsed:
            self._metrics[mode]["centralized/parse_failure_rate"].append(r.parse_failures / r.parsed)
            r.parse_failures = r.parsed = 0
