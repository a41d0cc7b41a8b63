"""MADPO: multi-agent DPO on preferences between joint responses.

    m_i   = log pi_i(a_i^w | h_i^w) - log pi_i(a_i^l | h_i^l)
    Delta = sum_i m_i
    L     = - E[ log sigmoid( beta * Delta ) ]                 beta = dpo_beta
    grad_theta_i L = - beta * sigmoid(-beta * Delta) * grad m_i

Each agent's gradient flows through its own margin only; the weight `sigmoid(-beta * Delta)` is the team's. The
objective is reference-free (as specified; the inherited reference-KL fields add no term). The trainer first
collects preference pairs from the task items with the initial agents (see `pairs.py`), then runs
`num_train_epochs` over them.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import torch
from accelerate.utils import gather_object
from torch.utils.data import DataLoader
from transformers.trainer_utils import TrainOutput

from ...algorithms.logprobs import sequence_logprobs
from ...algorithms.losses import madpo_loss
from ...progress import progress_bar, trainer_shows_progress
from ...team import collate_agent_batch
from ..base import MultiAgentTrainer, _identity_collate
from ..config import MultiAgentConfig
from .pairs import PAIR_SELECTIONS, PreferencePair, pairs_from_rollout

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
    r"""Configuration of `MADPOTrainer`: all `PreferenceConfig` fields, plus:

    Parameters:
        beta: eta, the scale of the joint margin in the loss (TRL's `DPOConfig.beta`).
        dpo_beta: deprecated alias of `beta`.
    """

    beta: float = field(default=0.1, metadata={"help": "Scale eta of the joint margin (DPO's beta)."})
    dpo_beta: float | None = field(default=None, metadata={"help": "Deprecated alias of beta."})
    _deprecated_aliases = {**PreferenceConfig._deprecated_aliases, "dpo_beta": "beta"}

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")


assert set(PreferenceConfig._allowed_pair_selections) <= set(PAIR_SELECTIONS)


class PreferenceCollectionMixin:
    """Collect preference pairs from task items with the current agents and the task reward."""

    # where the collected candidates' mean task reward is logged. MADPO has no other rollouts, so it reuses the
    # rollout keys; MARLHF's RL rollouts log their LEARNED reward there, so it uses a key of its own (the Trainer
    # averages everything logged under one key between two logging steps).
    candidate_reward_keys: tuple[str, ...] = ("turn_1/reward_mean", "turn_1/expected_return")

    def _setup_collaboration(self, args, reward_func, formatters, agents, adapter):
        """Centralized mode: rewrite (args, reward, formatters) for one model writing every role."""
        self.num_roles = args.num_agents
        self._centralized_reward = None
        if args.collaboration_mode != "centralized":
            return args, reward_func, formatters
        from ...centralized import centralized_setup

        if agents is not None:
            raise ValueError("collaboration_mode='centralized' trains ONE model: pass agent_model, not agents")
        args, reward_func, formatters, self._centralized_reward, self.adapter = centralized_setup(
            args, reward_func, formatters, adapter
        )
        return args, reward_func, formatters

    def _end_without_pairs(self, consequence: str) -> TrainOutput:
        """No item yielded a non-tied pair: say so clearly (a warning and a printed line) and end with no update."""
        msg = (
            f"{self._name}: the task items yielded no preference pair without a tie (every candidate of every item "
            f"scored the same), so {consequence}: training ends with no policy update. Raise "
            "preference_num_candidates or temperature, or check the reward."
        )
        logger.warning(msg)
        if self.accelerator.is_main_process:
            print(msg)
        self.no_pairs_message = msg
        return TrainOutput(self.state.global_step, 0.0, {"num_pairs": 0})

    @torch.no_grad()
    def collect_preference_pairs(self, dataset=None) -> list[PreferencePair]:
        """Sample K joint responses per item (this process's share, `rollout_buffer_size` items per `generate`),
        score them with the task reward, keep pairs by `pair_selection`. Returns the pairs of ALL processes, in the
        same order on every process."""
        ds = self.train_dataset if dataset is None else dataset
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        indices = list(range(len(ds)))[rank::world]
        rng = random.Random(self.args.seed + rank)
        K, bs = self.args.preference_num_candidates, self.args.rollout_buffer_size
        local: list[PreferencePair] = []
        rewards: list[float] = []
        was_training = self.model.training
        starts = range(0, len(indices), bs)
        for start in progress_bar(starts, "Collecting preference pairs", trainer_shows_progress(self)):
            items = [ds[j] for j in indices[start : start + bs]]
            rollout = self.rollout_engine.run(items, self.generate, num_generations=K)
            self.env_step += rollout.env_steps
            for node in rollout.nodes:
                r = node.rewards if node.rewards.ndim == 1 else node.rewards.mean(dim=1)
                rewards.extend(r.tolist())
            local.extend(
                pairs_from_rollout(rollout, self.args.pair_selection, self.args.preference_pairs_per_sample, rng)
            )
        self.model.train(was_training)
        if world > 1:
            gathered = gather_object([(local, rewards)])
            local = [p for chunk, _ in gathered for p in chunk]
            rewards = [r for _, chunk in gathered for r in chunk]
        mean = sum(rewards) / max(len(rewards), 1)
        # documented: these are the collected candidates' mean, not the updated policy's reward
        for key in self.candidate_reward_keys:
            self._metrics["train"][key].append(mean)
        self._metrics["train"]["num_pairs"].append(float(len(local)))
        return local


class MADPOTrainer(PreferenceCollectionMixin, MultiAgentTrainer):
    """Multi-agent DPO (see the module docstring). Takes the `MultiAgentTrainer` arguments plus `adapter` (the
    centralized adapter, default tagged) and `preference_pairs` (pairs collected elsewhere; skips collection).

    `train()` collects pairs with the initial agents, then trains `num_train_epochs` over them. If no item yields a
    non-tied pair, it logs that clearly and returns without any update. After training it evaluates the updated
    agents with the task reward (`eval_reward`) when an `eval_dataset` is given.
    """

    _name = "MADPO"
    _tag_names = ["trl", "trl_marl", "multi-agent", "madpo", "dpo"]
    config_class = MADPOConfig
    args_class = MADPOConfig

    def __init__(
        self,
        agent_model=None,
        agents=None,
        reward_func=None,
        args: MADPOConfig | None = None,
        formatters=None,
        adapter=None,
        preference_pairs: list[PreferencePair] | None = None,
        **kwargs,
    ):
        args = self._checked_args(args)
        args, reward_func, formatters = self._setup_collaboration(args, reward_func, formatters, agents, adapter)
        super().__init__(
            agent_model=agent_model, agents=agents, reward_func=reward_func, args=args, formatters=formatters, **kwargs
        )
        self.pairs: list[PreferencePair] | None = preference_pairs

    # ---- data: the collected pairs ----
    def get_train_dataloader(self) -> DataLoader:
        if self.pairs is None:
            self.pairs = self.collect_preference_pairs()
        g = torch.Generator().manual_seed(self.args.seed)
        loader = DataLoader(
            list(range(len(self.pairs))),
            batch_size=self.args.per_device_train_batch_size,
            shuffle=True,
            generator=g,
            collate_fn=_identity_collate,
        )
        return self.accelerator.prepare(loader)

    def _prepare_inputs(self, batch):
        return {"pairs": [self.pairs[i] for i in batch]}

    def train(self, *args, **kwargs):
        if self.pairs is None:
            self.pairs = self.collect_preference_pairs()
        if not self.pairs:
            return self._end_without_pairs("there is nothing to learn from")
        return self._final_evaluation(super().train(*args, **kwargs))  # a true post-update reward

    # ---- the loss ----
    def preference_margins(self, model, pairs: list[PreferencePair]) -> torch.Tensor:
        """Per-agent margins `(n, P)`: ONE forward per agent over the winners and losers of the batch together."""
        batches = []
        for i in range(self.num_agents):
            prompts = [p.prompt_ids[i] for p in pairs] * 2
            completions = [p.winner_ids[i] for p in pairs] + [p.loser_ids[i] for p in pairs]
            batches.append(collate_agent_batch(prompts, completions, self.tokenizers[i].pad_token_id))
        token_logps = model(batches)
        margins = []
        for logp, batch in zip(token_logps, batches):
            seq = sequence_logprobs(logp, batch.completion_mask.to(logp.device))
            w, lo = seq.chunk(2)
            margins.append(w - lo)
        device = margins[0].device
        return torch.stack([m.to(device) for m in margins])

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        pairs = inputs["pairs"]
        margins = self.preference_margins(model, pairs)
        loss, joint = madpo_loss(margins, self.args.beta)
        m = self._metrics["train"]
        delta = margins.detach().sum(dim=0)
        m["madpo/joint_loss"].append(joint.item())
        # DPO's names: the fraction of pairs ranked right, and the beta-scaled joint margin
        m["rewards/accuracies"].append((delta > 0).float().mean().item())
        m["rewards/margins"].append(self.args.beta * delta.mean().item())
        for i in range(margins.shape[0]):
            m[f"agent_{i + 1}/margin"].append(margins[i].detach().mean().item())
        # value: the joint loss L (what is logged as `loss`); gradient: the per-agent terms of `madpo_loss`
        return loss - loss.detach() + joint

    def _record_rollout_metrics(self, rollout, mode: str) -> None:
        super()._record_rollout_metrics(rollout, mode)
        r = getattr(self, "_centralized_reward", None)
        if r is not None and r.parsed:
            self._metrics[mode]["centralized/parse_failure_rate"].append(r.parse_failures / r.parsed)
            r.parse_failures = r.parsed = 0
