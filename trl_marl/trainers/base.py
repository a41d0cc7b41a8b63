"""`MultiAgentTrainer`: the TRL/transformers Trainer subclass every multi-agent trainer shares.

A trainer is (a) a rollout that turns task items into per-agent experience (`trl_marl.rollout`), (b) an algorithm
that turns experience into per-agent losses (`trl_marl.algorithms`), (c) the Trainer machinery that turns losses into
optimizer steps, checkpoints, logs and Hub pushes (inherited from TRL's `_BaseTrainer` / `transformers.Trainer`).

This class owns (c) and the plumbing of (a): the team as ONE module (so accelerate and DeepSpeed see one model), one
optimizer with a parameter group per agent, batched generation, evaluation with the task reward, per-agent metrics,
traces and saving one `save_pretrained` folder per agent. Subclasses implement `_rollout_step` (experience for a
batch of items) and `compute_loss`.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from torch.utils.data import DataLoader, Sampler
from transformers import GenerationConfig, PreTrainedModel, TrainerCallback
from trl.models.utils import unwrap_model_for_generation
from trl.trainer.base_trainer import _BaseTrainer
from trl.trainer.utils import disable_dropout_in_model

from trl_marl.algorithms.logprobs import completion_mask
from trl_marl.algorithms.losses import k3_kl
from trl_marl.checkpointing.checkpoint import (
    PREEMPTED_EXIT_CODE,
    CheckpointError,
    PreemptionHandler,
    is_staging_folder,
    load_resume_state,
    resolve_resume_checkpoint,
    save_checkpoint_atomically,
)
from trl_marl.checkpointing.checksums import write_folder_checksums
from trl_marl.data_types.batches import AgentBatch, collate_agent_batch
from trl_marl.data_types.rng import RNGStreams
from trl_marl.data_types.rollout import GenerationOutput, Node, Rollout, Sample
from trl_marl.data_types.text import UNKNOWN_EOS, PromptText
from trl_marl.distributed.collective import even_chunks, is_sharded
from trl_marl.distributed.fsdp import enable_fsdp_on_cpu, gathered_for_generation, is_fsdp2, shard_module, shard_team
from trl_marl.distributed.memory import return_freed_tensors_to_os
from trl_marl.distributed.zero3 import (
    fill_bucket_sizes,
    is_zero3,
    zero3_frozen_copy,
    zero3_init_enabled,
    zero3_init_flag_honoured,
)
from trl_marl.distributed.zero3 import gathered as zero3_gathered
from trl_marl.distributed.zero3 import hooks_removed as zero3_hooks_removed
from trl_marl.hub import (
    CARD_FILE,
    agent_role,
    clear_saved_team,
    init_trainer_repos,
    push_trainer,
    push_trainer_checkpoint,
    saved_team_entries,
    team_metadata,
    write_trainer_cards,
)
from trl_marl.models.adapters import AdapterDisabled, build_shared_base, mixed_adapter_generate, wrap_agents_with_peft
from trl_marl.models.loading import completion_token_ids, ended_with_eos, eos_token_ids, load_agents, load_tokenizers
from trl_marl.models.team import TeamModel
from trl_marl.rewards import RewardFunction
from trl_marl.rollout.engine import JointRollout
from trl_marl.rollout.prompts import render_prompt, resolve_formatters
from trl_marl.trainers.config import MultiAgentConfig
from trl_marl.trainers.metrics import (
    log_completions_table,
    rollout_num_tokens,
    team_means_of_agent_metrics,
    team_rollout_metrics,
)
from trl_marl.trainers.names import accept_trl_names
from trl_marl.utils.progress import progress_bar, trainer_shows_progress
from trl_marl.utils.secrets import redacted_args

__all__ = ["MultiAgentTrainer", "RolloutSampler"]

logger = logging.getLogger(__name__)

# transformers >= 5.24 deprecates `is_gradient_checkpointing`, which transformers.Trainer and TRL 1.16 still read on
# every model they handle: known harmless, not the user's doing, and printed on every run.
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)

TEAM_FILE = "team.json"


class RolloutSampler(Sampler[int]):
    """Index sampler that yields rollout batches, each repeated `repeat` times (once per training step taken on it).

    Like TRL's `RepeatSampler`: `global_batch` consecutive indices form one rollout batch across all processes
    (accelerate hands each process its `global_batch / num_processes` share); the same indices are yielded `repeat`
    times so every process sees its rollout batch on each of the steps taken on it. Incomplete trailing batches are
    dropped; the order is reshuffled each epoch with a seed shared by every process.
    """

    def __init__(self, num_items: int, global_batch: int, repeat: int, shuffle: bool = True, seed: int = 0):
        self.num_items, self.global_batch, self.repeat = num_items, global_batch, repeat
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_items, generator=g).tolist()
        else:
            order = list(range(self.num_items))
        self.epoch += 1
        for start in range(0, self.num_items - self.global_batch + 1, self.global_batch):
            chunk = order[start : start + self.global_batch]
            for _ in range(self.repeat):
                yield from chunk

    def __len__(self) -> int:
        return (self.num_items // self.global_batch) * self.global_batch * self.repeat


def _column_names(dataset: Any) -> list[str] | None:
    """The columns of a `datasets.Dataset` or of a list of dict rows (None when unknown)."""
    names = getattr(dataset, "column_names", None)
    if names is not None:
        return list(names)
    first = dataset[0] if len(dataset) else None
    return list(first) if isinstance(first, dict) else None


def _identity_collate(batch: list) -> list:
    return batch


class MultiAgentTrainer(_BaseTrainer):
    """Base trainer of a team of cooperating LLM agents.

    Args:
        model: TRL's name for the team: one model id / path, loaded `args.num_agents` times as independent copies
            (homogeneous team; a model object only when `num_agents == 1`), or a list with one model id / path /
            object per agent (heterogeneous teams allowed). Deprecated aliases: `agent_model=` (one), `agents=`
            (the list).
        reward_funcs: the joint reward (see `trl_marl.rewards` for the calling conventions), or a list of them
            summed with `args.reward_weights` (each logged as `rewards/<name>/mean`). Deprecated alias:
            `reward_func=`.
        args: the trainer's config.
        train_dataset: task items (`datasets.Dataset` or a list of dicts).
        eval_dataset: held-out task items for evaluation with the task reward.
        processing_class: one tokenizer for all agents, or one per agent; loaded from the agents' ids when omitted.
            Deprecated alias: `tokenizer=`.
        formatters: one callable for all agents, or one per agent, `formatter(item) -> str | chat messages`;
            default: `item["prompt"]`.
        reward_processor: optional `float -> float` applied to every reward (`trl_marl.rewards.scale`, `shift`, ...).
        external_transition: multi-turn transition, required when `num_turns > 1`.
        model_config: loading options for ids: `dtype`, `attn_implementation`, `trust_remote_code`, `revision`,
            `model_kwargs` (a dict), or a TRL `ModelConfig`; `args.model_init_kwargs` (TRL's) adds to them.
        metrics_callback: `callable(rollout_records) -> dict[str, float]` of domain metrics, called on every
            training rollout and evaluation.
        wandb_config: the reference library's W&B settings (`project`, `entity`, `name`, `tags`, `dir`, `id`,
            `resume`); sets the `WANDB_*` environment and adds `"wandb"` to `report_to`.
        callbacks, optimizers: as in `transformers.Trainer`.
    """

    _tag_names = ["trl", "trl_marl", "multi-agent"]
    _name = "MultiAgent"
    loss_is_scaled_for_ga = False  # compute_loss returns a per-step mean; Trainer divides by accumulation steps
    config_class = MultiAgentConfig  # built when args is None
    args_class: type | None = None  # what args must be an instance of (default: config_class)
    supports_per_agent_rewards = False
    supports_shared_base = True  # agents as adapters on one base model (share_base_model=True)
    # The group baseline of assign_returns; None for critic-based trainers.
    baseline: str | None = "mean"
    # Classes a checkpoint's resume state may hold besides tensors and containers (the `weights_only` allowlist of
    # trl_marl.checkpointing); a subclass lists the ones it adds, `all_resume_types` collects them over the MRO.
    resume_types: tuple[type, ...] = (Rollout, Node, Sample, GenerationOutput, PromptText, AgentBatch)

    @classmethod
    def all_resume_types(cls) -> tuple[type, ...]:
        """Every `resume_types` entry of this class and its bases (mixins included)."""
        return tuple(dict.fromkeys(t for c in cls.__mro__ for t in c.__dict__.get("resume_types", ())))

    @classmethod
    def _checked_args(cls, args: MultiAgentConfig | None) -> MultiAgentConfig:
        """`args`, or a default `config_class` when None; a TypeError when it is not an `args_class` instance."""
        if args is None:
            return cls.config_class(output_dir=f"{cls._name.lower()}-output")
        expected = cls.args_class or cls.config_class
        if not isinstance(args, expected):
            raise TypeError(f"args must be a {expected.__name__}, got {type(args).__name__}")
        return args

    def __init__(
        self,
        agent_model: str | PreTrainedModel | None = None,
        agents: Sequence[str | PreTrainedModel] | None = None,
        reward_func: Callable[..., Any] | None = None,
        args: MultiAgentConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        tokenizer: Any = None,
        formatters: Callable | Sequence[Callable] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        external_transition: Callable[..., Any] | None = None,
        model_config: Any = None,
        metrics_callback: Callable[[list[dict]], dict] | None = None,
        wandb_config: dict | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config: Any = None,
    ):
        args = self._checked_args(args)
        n = args.num_agents

        # ---- validation, before any model loads ----
        if agent_model is None and agents is None:
            raise ValueError(
                "pass model= (one id / path for a homogeneous team, or a list with one model or id per agent; "
                "deprecated aliases: agent_model=, agents=)"
            )
        if agent_model is not None and agents is not None:
            raise ValueError("pass either agent_model or agents, not both")
        if agent_model is not None and not isinstance(agent_model, (str, os.PathLike)) and n > 1:
            raise ValueError(
                f"agent_model is a model object but num_agents={n}: one object cannot be {n} independent agents; "
                "pass a model id / path (loaded once per agent) or agents=[...] with one object per agent"
            )
        if agents is not None:
            agents = list(agents)
            if len(agents) != n:
                raise ValueError(f"agents has {len(agents)} entries but num_agents is {n}")
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != n:
            raise ValueError(f"tokenizer list has {len(tokenizer)} entries but num_agents is {n}")
        self.formatters = resolve_formatters(formatters, n)
        if args.num_turns > 1 and external_transition is None:
            raise ValueError(
                f"num_turns={args.num_turns} needs an external_transition (it builds each next turn's prompts)"
            )
        if reward_func is None:
            raise ValueError("reward_funcs is required: it scores the joint response of the agents")
        if train_dataset is None or len(train_dataset) == 0:
            raise ValueError("train_dataset is empty: pass a datasets.Dataset (or list of dicts) of task items")
        reward = RewardFunction(
            reward_func,
            n,
            reward_processor,
            allow_per_agent=self.supports_per_agent_rewards,
            column_names=_column_names(train_dataset),
        )
        if eval_dataset is not None and len(eval_dataset) == 0:
            raise ValueError("eval_dataset is empty; pass None to disable evaluation")
        _check_formatters_on_first_items(self.formatters, train_dataset=train_dataset, eval_dataset=eval_dataset)
        if args.parallel_training == "mp" and args.agent_devices and len(args.agent_devices) not in (1, n):
            raise ValueError(f"agent_devices has {len(args.agent_devices)} entries; give 1 or num_agents={n}")
        if args.share_base_model:
            if peft_config is None:
                raise ValueError("share_base_model=True needs a peft_config: the agents are adapters on one base")
            if agents is not None or not isinstance(agent_model, (str, os.PathLike)):
                raise ValueError("share_base_model=True needs a homogeneous team given as agent_model=<one id>")
            if not self.supports_shared_base:
                raise ValueError(
                    f"{type(self).__name__} does not support share_base_model=True (its critics or value "
                    "heads need a model per agent); use peft_config with share_base_model=False"
                )
            if args.parallel_training == "mp":
                raise ValueError(
                    "share_base_model=True puts every agent on one model: parallel_training='mp' "
                    "cannot place them on different devices"
                )
        self._check_config(args)
        if args.use_vllm:  # before any model loads: a clear error when vLLM is missing or unsupported
            from trl_marl.generation.vllm_backend import check_vllm_available

            check_vllm_available()
        if wandb_config:
            _apply_wandb_config(args, wandb_config)

        # ---- the team ----
        if args.world_size > 1 and args.device.type == "cpu":  # weights in host memory (trl_marl.distributed.memory)
            return_freed_tensors_to_os()
        # agents and critics loaded partitioned only with zero3_init_flag (trl_marl.distributed.zero3)
        with zero3_init_flag_honoured(args):
            sources = [agent_model] * n if agents is None else agents
            shared = None
            if args.share_base_model:
                base, base_names = load_agents(agent_model, None, 1, model_config)
                names = base_names * n
                if args.disable_dropout:
                    disable_dropout_in_model(base[0])
                shared, models = build_shared_base(base[0], peft_config, n, names[0])
            else:
                models, names = load_agents(agent_model if agents is None else None, agents, n, model_config)
                if args.disable_dropout:
                    for m in models:
                        disable_dropout_in_model(m)
                if peft_config is not None:
                    models = wrap_agents_with_peft(models, peft_config, names)
            self.tokenizers = load_tokenizers(tokenizer, names, n, sources)
            self.peft_config = peft_config
            if shared is None:
                # Critics' and value heads' fresh weights are drawn here, before the Trainer seeds anything: draw them
                # from the "critic_init" stream of `args.seed` (rank 0 on every process: identical heads everywhere), so
                # the same seed builds the same heads whatever the global RNG holds, and the global RNG is left as found.
                with RNGStreams(args.seed).scoped("critic_init"):
                    team = self._build_team(models, names, args)
            else:
                team = TeamModel(models, names, shared=shared)
        team.temperature = args.temperature  # log-probs of sampled completions are taken on logits / temperature
        if args.parallel_training == "mp":
            devices = args.agent_devices * n if len(args.agent_devices) == 1 else args.agent_devices
            for agent, dev in zip(team.agents, devices):
                agent.to(dev)
            team.hf_device_map = {f"agents.{i}": d for i, d in enumerate(devices)}
        self.agent_names = names
        self.eos_ids = [eos_token_ids(shared if shared is not None else m, t) for m, t in zip(models, self.tokenizers)]
        self.reward = reward
        self._chat_prompts = [False] * n  # whether agent i's formatter produced chat messages (no special tokens)
        self.metrics_callback = metrics_callback
        self.external_transition = external_transition

        super().__init__(
            model=team,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=None,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        if self.is_deepspeed_enabled:  # DeepSpeed's buffers sized for this team, before any engine is built
            fill_bucket_sizes(self.accelerator.state.deepspeed_plugin.deepspeed_config, self.model)

        self.rollout_engine = JointRollout(
            num_agents=n,
            formatters=self.formatters,
            render=self._render,
            reward=reward,
            num_generations=args.num_generations,
            joint_mode=args.joint_mode,
            num_turns=args.num_turns,
            external_transition=external_transition,
            external_prompt_passthrough=args.external_prompt_passthrough,
            early_termination_threshold=args.early_termination_threshold,
            # ZeRO-3 / FSDP2: generation gathers each agent (a collective): every process runs every turn
            synced=self.collective_generation,
        )
        # Training rollouts may score with another reward than evaluation (MARLHF: a learned reward model); the
        # task reward of `rollout_engine` is what evaluation always uses.
        self.train_rollout_engine = self.rollout_engine
        self.reference_models = self._build_references() if args.reference_kl_enabled else None
        if is_fsdp2(self.accelerator):
            # shard the team before the optimizer is built (trl_marl.distributed.fsdp: per layer, per agent, then the team)
            shard_team(self.model, self.accelerator)
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._buffered: list | None = None
        self._step = 0
        # one random stream per purpose (trl_marl.data_types.rng); saved with every checkpoint
        self.rng_streams = RNGStreams(
            args.seed, self.accelerator.process_index, [self.agent_device(i) for i in range(n)]
        )
        self.env_step = 0  # joint-action reward evaluations on this process
        self._last_eval_reward: float | None = None
        self._preemption = PreemptionHandler()
        self._restored_from: str | None = None
        self.add_callback(_PreemptionCallback(self))
        self.vllm_generation = None  # use_vllm: the colocated engines (trl_marl.generation.vllm_backend)
        if args.use_vllm:
            from trl_marl.generation.vllm_backend import VLLMTeamGeneration

            self.vllm_generation = VLLMTeamGeneration(self)

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        if enable_fsdp_on_cpu(self.accelerator):  # FSDP2 over gloo on a CPU-only machine (trl_marl.distributed.fsdp)
            self.is_fsdp_enabled = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # TRL's names and positional order on every trainer (see names.py), mixins' __init__ included
        if not getattr(cls.__init__, "_accepts_trl_names", False):
            cls.__init__ = accept_trl_names(cls.__init__)

    def _render(self, i: int, formatted) -> PromptText:
        text = render_prompt(formatted, self.tokenizers[i])
        if text.chat:
            self._chat_prompts[i] = True
        return text

    # ------------------------------------------------------------------ hooks for subclasses
    def _check_config(self, args: MultiAgentConfig) -> None:
        """Trainer-specific checks of `args` (raise ValueError naming the field)."""

    def _build_team(self, models: list[PreTrainedModel], names: list[str], args: MultiAgentConfig) -> TeamModel:
        return TeamModel(models, names)

    # ------------------------------------------------------------------ the team
    @property
    def team(self) -> TeamModel:
        """The unwrapped team module."""
        return self.accelerator.unwrap_model(self.model) if hasattr(self, "accelerator") else self.model

    @property
    def num_agents(self) -> int:
        return self.args.num_agents

    def agent_device(self, i: int) -> torch.device:
        return next(self.team.agents[i].parameters()).device

    def _agent_learning_rate(self, i: int) -> float:
        lr = self.args.agent_learning_rate
        return self.args.learning_rate if lr is None else lr

    def _build_references(self) -> list[torch.nn.Module]:
        """Frozen copies of each agent's initial weights, for the reference-KL penalty. PEFT agents use their base
        with the adapters disabled instead (no copy)."""
        team = self.team
        if team.shared_base:
            return [AdapterDisabled(team.shared)] * self.num_agents
        if self.peft_config is not None:
            return [AdapterDisabled(agent) for agent in team.agents]
        devs = self.args.reference_devices
        refs = []
        for i, agent in enumerate(team.agents):
            # agents built inside deepspeed.zero.Init (zero3_init_flag) are copied partitioned (trl_marl.distributed.zero3)
            ref = zero3_frozen_copy(agent) if zero3_init_enabled() else copy.deepcopy(agent)
            ref = ref.eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            if self.is_deepspeed_enabled:
                from trl.models.utils import prepare_deepspeed

                ref = prepare_deepspeed(ref, self.accelerator)
            elif is_fsdp2(self.accelerator):
                ref = shard_module(ref, self.accelerator)
            else:
                dev = devs[0 if len(devs) == 1 else i] if devs else self.agent_device(i)
                ref.to(dev)
            refs.append(ref)
        return refs

    # ------------------------------------------------------------------ optimizer
    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """One optimizer, one parameter group per agent (decay / no-decay split), plus `_extra_param_groups()`."""
        if self.optimizer is not None:
            return self.optimizer
        team = self.model if model is None else model
        team = self.accelerator.unwrap_model(team)
        decay = set(self.get_decay_parameter_names(team))
        groups: list[dict] = []
        for i in range(team.num_agents):
            named = team.agent_named_parameters(i)
            groups += _decay_groups(
                named, decay, self.args.weight_decay, self._agent_learning_rate(i), f"agent_{i + 1}"
            )
        groups += self._extra_param_groups(team, decay)
        groups = [g for g in groups if g["params"]]
        if self.optimizer_cls_and_kwargs is not None:
            cls, kwargs = self.optimizer_cls_and_kwargs
        else:
            cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, team)
        self.optimizer = cls(groups, **kwargs)
        return self.optimizer

    def _extra_param_groups(self, team: torch.nn.Module, decay: set[str]) -> list[dict]:
        """Parameter groups beyond the agents' (critics, value heads); none here."""
        return []

    # ------------------------------------------------------------------ data
    def get_train_dataloader(self) -> DataLoader:
        n_proc = self.accelerator.num_processes
        global_batch = self.args.rollout_buffer_size * n_proc
        if len(self.train_dataset) < global_batch:
            raise ValueError(
                f"train_dataset has {len(self.train_dataset)} items, fewer than one rollout batch "
                f"(rollout_buffer_size={self.args.rollout_buffer_size} x {n_proc} processes)"
            )
        skipped = len(self.train_dataset) % global_batch
        if skipped and self.accelerator.is_main_process:
            logger.warning(
                "train_dataset has %d items, not a multiple of one rollout batch (%d = rollout_buffer_size x "
                "processes): each epoch rolls out %d and skips the %d left after the shuffle (another %d each "
                "epoch). Choose rollout_buffer_size so that it divides the dataset to use every item every epoch.",
                len(self.train_dataset),
                global_batch,
                len(self.train_dataset) - skipped,
                skipped,
                skipped,
            )
        sampler = RolloutSampler(
            len(self.train_dataset), global_batch, self.args.steps_per_rollout, True, self.args.seed
        )
        loader = DataLoader(
            self.train_dataset,
            batch_size=self.args.rollout_buffer_size,
            sampler=sampler,
            collate_fn=_identity_collate,
            num_workers=0,
        )
        return self.accelerator.prepare(loader)

    # ------------------------------------------------------------------ generation
    def _generation_config(
        self,
        i: int,
        num_return_sequences: int = 1,
        tokenizer=None,
        eos_ids: list[int] | None = None,
        greedy: bool = False,
    ) -> GenerationConfig:
        tok = tokenizer if tokenizer is not None else self.tokenizers[i]
        if greedy:
            return GenerationConfig(
                num_return_sequences=num_return_sequences,
                do_sample=False,
                max_new_tokens=self.args.max_completion_length,
                pad_token_id=tok.pad_token_id,
                eos_token_id=eos_ids if eos_ids is not None else self.eos_ids[i],
                use_cache=True,
            )
        return GenerationConfig(
            num_return_sequences=num_return_sequences,
            do_sample=True,
            max_new_tokens=self.args.max_completion_length,
            temperature=self.args.temperature,
            top_p=self.args.top_p,
            top_k=self.args.top_k or 0,
            pad_token_id=tok.pad_token_id,
            eos_token_id=eos_ids if eos_ids is not None else self.eos_ids[i],
            use_cache=True,
        )

    def generate(
        self, prompts_per_agent: list[list[PromptText]], num_generations: int, greedy: bool = False
    ) -> list[GenerationOutput]:
        """Sample `num_generations` completions per prompt for every agent: ONE `generate` call per agent covering
        all its prompts (prompt-major rows). Under ZeRO-3 and FSDP2 the full parameters of ONE agent at a time are
        gathered, for its whole call (`generate_with`). With `use_vllm`, the vLLM engines sample instead (after a
        weight push when the agents have stepped)."""
        if getattr(self, "vllm_generation", None) is not None:
            return self.vllm_generation.generate(prompts_per_agent, num_generations, greedy)
        zero3 = self._zero3()
        with (
            torch.no_grad(),
            # ZeRO-3: no whole-team gather; each agent is gathered for its own call (generate_with)
            unwrap_model_for_generation(
                self.model_wrapped, self.accelerator, gather_deepspeed3_params=not zero3
            ) as team,
            zero3_hooks_removed(self.model_wrapped) if zero3 else nullcontext(),
        ):
            if team.shared_base:
                return self._generate_shared(team, prompts_per_agent, num_generations, greedy)
            return self.generate_with(
                list(team.agents), self.tokenizers, prompts_per_agent, num_generations, self.eos_ids, greedy
            )

    def _generate_shared(
        self, team: TeamModel, prompts_per_agent, G: int, greedy: bool = False
    ) -> list[GenerationOutput]:
        """Shared-base team: ONE `generate` call for every agent's prompts x G, each row with its agent's adapter
        (PEFT mixed-adapter batches), instead of one call per agent."""
        from trl.trainer.utils import pad

        rows, owners = [], []
        for i, prompts in enumerate(prompts_per_agent):
            if not prompts:
                continue
            chat = getattr(prompts[0], "chat", False)
            for ids in self.tokenizers[i](list(prompts), add_special_tokens=not chat)["input_ids"]:
                if self.args.max_prompt_length is not None:
                    ids = ids[-self.args.max_prompt_length :]
                rows += [torch.tensor(ids, dtype=torch.long)] * G
                owners += [i] * G
        per_agent = [GenerationOutput([], [], []) for _ in prompts_per_agent]
        pm = team.shared
        # a sharded base's generate is a collective (see generate_with): with no rows, a placeholder row, greedy
        synced = self.collective_generation and is_sharded(pm)
        if not rows and not synced:
            return per_agent
        pad_id = self.tokenizers[0].pad_token_id
        placeholder = not rows
        if placeholder:
            rows, owners = [torch.tensor([pad_id], dtype=torch.long)], [0]
        input_ids = pad(rows, pad_id, padding_side="left")
        mask = pad([torch.ones_like(r) for r in rows], 0, padding_side="left")
        was_training = pm.training
        pm.eval()
        gathered = self._gathered_for_generation(pm)
        try:
            with gathered:
                out = mixed_adapter_generate(
                    pm,
                    input_ids.to(self.agent_device(0)),
                    mask.to(self.agent_device(0)),
                    [team.agents[i].adapter for i in owners],
                    self._generation_config(0, 1, greedy=greedy or placeholder),
                    synced_gpus=synced,
                )
        finally:
            pm.train(was_training)
        if placeholder:
            return per_agent
        completions = out[:, input_ids.shape[1] :].cpu()
        cmask = completion_mask(completions, self.eos_ids[0])
        lengths = cmask.sum(dim=1).tolist()
        comp_ids = [completions[r, : lengths[r]] for r in range(len(rows))]
        texts = self.tokenizers[0].batch_decode([c.tolist() for c in comp_ids], skip_special_tokens=True)
        for r, i in enumerate(owners):
            per_agent[i].texts.append(texts[r])
            per_agent[i].prompt_ids.append(rows[r])
            per_agent[i].completion_ids.append(comp_ids[r])
        return per_agent

    def generate_with(
        self,
        models: Sequence[torch.nn.Module],
        tokenizers: Sequence,
        prompts_per_agent,
        num_generations: int,
        eos_ids: Sequence[list[int]] | None = None,
        greedy: bool = False,
    ) -> list[GenerationOutput]:
        """Sample (or, with `greedy`, decode greedily) with the given models (one per agent; e.g. a comparator's) and the trainer's sampling settings.

        With `parallel_training="mp"` the agents' `generate` calls run in one thread each, so agents on different
        devices generate at the same time (tokenizing and decoding stay on the calling thread).
        """
        if eos_ids is None:
            eos_ids = [eos_token_ids(m, t) for m, t in zip(models, tokenizers)]
        G = num_generations
        encoded = [self._encode_prompts(tok, prompts) for tok, prompts in zip(tokenizers, prompts_per_agent)]
        configs = [self._generation_config(i, G, tokenizers[i], eos_ids[i], greedy) for i in range(len(models))]

        # a sharded agent's generate is a collective (transformers' `synced_gpus`, as TRL generates under ZeRO-3 /
        # FSDP): every process runs it until the longest is done; one without prompts decodes a placeholder
        synced = [self.collective_generation and is_sharded(m) for m in models]

        def run(i: int) -> torch.Tensor:
            with self._gathered_for_generation(models[i]):  # this agent only, for the whole generate call
                if len(prompts_per_agent[i]):
                    return _run(i, *encoded[i], configs[i])
                if synced[i]:  # no prompts here (trl_marl.distributed.collective): greedy (no random draw), discarded
                    ids = torch.full((1, 1), tokenizers[i].pad_token_id, dtype=torch.long)
                    placeholder = self._generation_config(i, 1, tokenizers[i], eos_ids[i], greedy=True)
                    _run(i, ids, torch.ones_like(ids), placeholder)
                return torch.zeros(0, 0, dtype=torch.long)

        def _run(i: int, ids: torch.Tensor, mask: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
            model = models[i]
            # eval mode: transformers' generation is ~25% faster on small models than in train mode, and sampling
            # must not depend on the train/eval state anyway (dropout is disabled)
            was_training = model.training
            model.eval()
            try:
                device = next(model.parameters()).device
                out = model.generate(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    generation_config=config,
                    synced_gpus=synced[i],
                )
                return out[:, ids.shape[1] :].cpu()
            finally:
                model.train(was_training)

        if self.args.parallel_training == "mp" and len(models) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=len(models)) as pool:
                completions = list(pool.map(run, range(len(models))))
        else:
            completions = [run(i) for i in range(len(models))]
        return [self._decode(tokenizers[i], encoded[i], completions[i], eos_ids[i], G) for i in range(len(models))]

    def _zero3(self) -> bool:
        return self.is_deepspeed_enabled and is_zero3(self.accelerator)

    @property
    def collective_generation(self) -> bool:
        """Whether generating (and scoring with a sharded model) is a collective: ZeRO-3 or FSDP2 with more than one
        process. Then every process must make the same calls in the same order; the trainer keeps them in step
        (`trl_marl.distributed.collective`): a process with less work makes the same calls with no rows."""
        return self.accelerator.num_processes > 1 and (self._zero3() or is_fsdp2(self.accelerator))

    def _gathered_for_generation(self, model: torch.nn.Module):
        """The full parameters of `model` (one agent) for its `generate` call under FSDP2 / ZeRO-3; else nothing."""
        if is_fsdp2(self.accelerator):
            return gathered_for_generation(model, self.model)
        if self._zero3():
            return zero3_gathered(model)
        return nullcontext()

    def _encode_prompts(self, tok, prompts: list[PromptText]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and mask (no special tokens after a chat template), cut to `max_prompt_length`."""
        if not prompts:
            return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.long)
        chat = bool(prompts) and getattr(prompts[0], "chat", False)
        enc = tok(list(prompts), padding=True, padding_side="left", return_tensors="pt", add_special_tokens=not chat)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        if self.args.max_prompt_length is not None and ids.shape[1] > self.args.max_prompt_length:
            ids, mask = ids[:, -self.args.max_prompt_length :], mask[:, -self.args.max_prompt_length :]
        return ids, mask

    @staticmethod
    def _decode(tok, encoded, completions: torch.Tensor, eos_ids: list[int], G: int) -> GenerationOutput:
        """Completions cut after their first EOS, their text, and each row's prompt ids."""
        if completions.shape[0] == 0:  # no prompts
            return GenerationOutput([], [], [])
        ids, mask = encoded
        cmask = completion_mask(completions, eos_ids)
        lengths = cmask.sum(dim=1).tolist()
        comp_ids = [completions[r, : lengths[r]] for r in range(completions.shape[0])]
        prompt_rows = [ids[p][mask[p].bool()] for p in range(ids.shape[0])]
        texts = tok.batch_decode([c.tolist() for c in comp_ids], skip_special_tokens=True)
        return GenerationOutput(texts, [prompt_rows[r // G] for r in range(len(comp_ids))], comp_ids)

    def tokenize_prompt(self, i: int, prompt: str) -> torch.Tensor:
        """Agent i's prompt token ids, as generation tokenizes them."""
        chat = getattr(prompt, "chat", False) or self._chat_prompts[i]
        ids = self.tokenizers[i](str(prompt), add_special_tokens=not chat)["input_ids"]
        if self.args.max_prompt_length is not None:
            ids = ids[-self.args.max_prompt_length :]
        return torch.tensor(ids, dtype=torch.long)

    def tokenize_completion(self, i: int, text: str, eos_token: Any = UNKNOWN_EOS) -> torch.Tensor:
        """Token ids of a completion given as text (a comparator's, or one re-read from a round file), as agent i
        scores it: exactly the generated ids for a comparator sample of agent i's tokenizer, else the text's ids plus
        the EOS it ended with (`eos_token`, or a `CompletionText`'s own), none when it was cut at `max_new_tokens`
        (see `trl_marl.models.loading.completion_token_ids`)."""
        return completion_token_ids(
            self.tokenizers[i], text, self.eos_ids[i], self.args.max_completion_length, eos_token
        )

    def completion_eos_token(self, i: int, completion_ids: torch.Tensor) -> str | None:
        """The text of the EOS token agent i's generated `completion_ids` ended with; None when cut (no EOS)."""
        return ended_with_eos(self.tokenizers[i], completion_ids, self.eos_ids[i])

    # ------------------------------------------------------------------ scoring
    def agent_batch(self, i: int, samples: Sequence) -> AgentBatch:
        return collate_agent_batch(
            [s.prompt_ids for s in samples], [s.completion_ids for s in samples], self.tokenizers[i].pad_token_id
        )

    @torch.no_grad()
    def _reference_penalties(self, rollout: Rollout) -> None:
        """Set `sample.penalty = reference_kl_coef * KL_k3(sample)` for every sample (one batched pass per agent)."""
        coef = self.args.reference_kl_coef
        team = self.team
        for i in range(self.num_agents):
            samples = rollout.samples_of_agent(i)
            if not samples:
                continue
            batch = self.agent_batch(i, samples)
            from trl_marl.models.team import agent_token_logprobs

            T = self.args.temperature  # both policies scored at the sampling temperature (as TRL's GRPO)
            logp = agent_token_logprobs(team.agents[i], batch, T)
            ref_logp = agent_token_logprobs(self.reference_models[i], batch, T).to(logp.device)
            kl = k3_kl(logp, ref_logp, batch.completion_mask.to(logp.device)).cpu()
            for s, v in zip(samples, kl.tolist()):
                s.penalty = coef * v
            self._metrics["train"][f"agent_{i + 1}/kl"].append(kl.mean().item())

    # ------------------------------------------------------------------ training loop plumbing
    def training_step(self, model, inputs, num_items_in_batch=None):
        t0 = time.perf_counter()
        self._rollout_seconds = 0.0
        self.team.last_entropy = None
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._record_entropy()
        self._step += 1
        self._timings["update"] += time.perf_counter() - t0 - self._rollout_seconds
        if self._step % self.args.gradient_accumulation_steps == 0 and self._will_log():
            self._record_grad_norms()
        return loss

    def _prepare_inputs(self, items: list[dict]) -> dict:
        """Roll out a new batch every `steps_per_rollout` steps; return the slice of the buffer for this step."""
        if not isinstance(items, list):  # evaluation goes through `evaluate`, never here
            return items
        K = self.args.steps_per_rollout
        if self._step % K == 0 or self._buffered is None:
            self._buffered = self._rollout_step(items)
        return self._buffered[self._step % K]

    @property
    def _timings(self) -> dict[str, float]:
        if not hasattr(self, "_timing_acc"):
            self._timing_acc = defaultdict(float)
        return self._timing_acc

    def _rollout_step(self, items: list[dict]) -> list[dict]:
        """Roll out `items`, compute returns and advantages, split into `steps_per_rollout` training inputs."""
        t0 = time.perf_counter()
        with self.rng_streams.scoped("rollout", self._rng_round()):
            rollout = self.train_rollout_engine.run(items, self.generate)
        t1 = time.perf_counter()
        if self.reference_models is not None:
            self._reference_penalties(rollout)
        self._assign_returns(rollout)
        self.env_step += rollout.env_steps
        self._record_rollout_metrics(rollout, "train")
        t2 = time.perf_counter()
        self._timings["generation"] += t1 - t0 - rollout.reward_seconds
        self._timings["reward"] += rollout.reward_seconds
        self._timings["scoring"] += t2 - t1
        self._rollout_seconds = getattr(self, "_rollout_seconds", 0.0) + (t2 - t0)
        if self.args.trace_dir:
            self._write_trace(rollout)
        K = self.args.steps_per_rollout
        per = len(items) // K
        return [{"rollout": rollout, "items": list(range(k * per, (k + 1) * per))} for k in range(K)]

    def _rng_round(self) -> int:
        """The round whose random streams are drawn from now (iterative trainers; 0 otherwise)."""
        return int(getattr(self, "_stream_round", 0))

    def _save_rng_state(self, output_dir: str) -> None:
        """transformers' RNG states, plus this process's `rng_streams` (`rng_streams_{rank}.pt`)."""
        super()._save_rng_state(output_dir)
        path = os.path.join(output_dir, f"rng_streams_{self.accelerator.process_index}.pt")
        torch.save(self.rng_streams.state_dict(), path)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        path = (
            None
            if checkpoint is None
            else os.path.join(checkpoint, f"rng_streams_{self.accelerator.process_index}.pt")
        )
        if path is not None and os.path.isfile(path):
            self.rng_streams.load_state_dict(torch.load(path, weights_only=True))

    def _assign_returns(self, rollout: Rollout) -> None:
        from trl_marl.rollout.engine import assign_returns

        assign_returns(rollout, self.args.discount, self.baseline, self._normalize_advantages())

    def _normalize_advantages(self) -> bool:
        return bool(getattr(self.args, "advantage_normalization", False))

    # ------------------------------------------------------------------ metrics
    def _record_rollout_metrics(self, rollout: Rollout, mode: str) -> None:
        m = self._metrics[mode]
        for k, v in rollout.turn_metrics().items():
            m[k].append(v)
        for i in range(self.num_agents):
            samples = rollout.samples_of_agent(i)
            if not samples:
                continue
            lengths = torch.tensor([float(s.completion_ids.numel()) for s in samples])
            rets = torch.tensor([s.ret for s in samples])
            m[f"agent_{i + 1}/completion_length"].append(lengths.mean().item())
            if mode == "train":
                m[f"agent_{i + 1}/return_mean"].append(rets.mean().item())
                m[f"agent_{i + 1}/return_std"].append(rets.std(unbiased=False).item())
                eos_rate = sum(
                    1 for s in samples if s.completion_ids.numel() and int(s.completion_ids[-1]) in self.eos_ids[i]
                ) / len(samples)
                m[f"agent_{i + 1}/terminated_rate"].append(eos_rate)
        if self.metrics_callback is not None:
            extra = self.metrics_callback(rollout.records())
            for k, v in (extra or {}).items():
                m[k].append(float(v))
        self._record_trl_metrics(rollout, mode)

    def _record_trl_metrics(self, rollout: Rollout, mode: str) -> None:
        """TRL's metric names (`reward`, `reward_std`, `completions/...`, `rewards/<func>/mean`, `num_tokens`)."""
        m = self._metrics[mode]
        for k, v in team_rollout_metrics(rollout, self.eos_ids).items():
            m[k].append(v)
        if mode == "train":
            engine = getattr(self, "train_rollout_engine", self.rollout_engine)
            for name, mean in engine.reward.drain_component_means().items():
                m[f"rewards/{name}/mean"].append(mean)
            self._tokens_since_log = getattr(self, "_tokens_since_log", 0) + rollout_num_tokens(rollout)
            if self.args.log_completions:
                self._completion_records = rollout.records()

    def _write_trace(self, rollout: Rollout) -> None:
        path = Path(self.args.trace_dir) / f"trace_rank{self.accelerator.process_index}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            for rec in rollout.records():
                rec = {"step": self.state.global_step, "env_step": self.env_step, **rec}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")

    def _clip_groups(self) -> list[list[torch.nn.Parameter]] | None:
        """The parameter sets clipped by their OWN norm: one per agent, plus `_extra_clip_groups()` (critics, value
        heads). None where the engine clips (DeepSpeed, FSDP) or the agents share one base (adapters)."""
        if self.is_deepspeed_enabled or self.is_fsdp_enabled or self.team.shared_base:
            return None
        team = self.team
        groups = [[p for _, p in team.agent_named_parameters(i)] for i in range(team.num_agents)]
        return groups + self._extra_clip_groups()

    def _extra_clip_groups(self) -> list[list[torch.nn.Parameter]]:
        return []

    def _clip_grad_norm(self, model):
        """Clip each agent's gradient (and each critic's) by its OWN norm to `max_grad_norm`, so one module's large
        gradient never shrinks another's update (each agent's loss touches only its own parameters: per-agent updates
        stay separate). Returns the pre-clip norm of all of them together, as transformers logs it."""
        groups = self._clip_groups()
        if groups is None:
            return super()._clip_grad_norm(model)
        self.accelerator.unscale_gradients()  # once, before any clipping (mixed precision)
        norms = []
        for params in groups:
            params = [p for p in params if p.grad is not None]
            if params:
                norms.append(torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm).float().cpu())
        return torch.stack(norms).norm() if norms else torch.tensor(0.0)

    def _record_entropy(self) -> None:
        """`agent_{i}/entropy` and their mean `entropy`: the token entropy of the sampled completions (TRL's
        `entropy_from_logits` on logits / temperature), read from the loss's own forward pass (`TeamModel.forward`
        keeps it), so no extra forward runs."""
        entropies = getattr(self.team, "last_entropy", None)
        if not entropies:
            return
        m = self._metrics["train"]
        seen = [(i, e) for i, e in enumerate(entropies) if e is not None]
        for i, e in seen:
            m[f"agent_{i + 1}/entropy"].append(e)
        if seen:
            m["entropy"].append(sum(e for _, e in seen) / len(seen))

    def _will_log(self) -> bool:
        """Whether the optimizer step about to happen is a logging step (per-agent grad norms are only computed
        then)."""
        every = self.state.logging_steps or 1
        return self.args.logging_strategy == "steps" and (self.state.global_step + 1) % every == 0

    def _record_grad_norms(self) -> None:
        """Per-agent gradient norms (before clipping), on optimizer steps; not available under DeepSpeed."""
        if self.is_deepspeed_enabled:
            return
        for i, agent in enumerate(self.team.agents):
            grads = [p.grad.detach().float().norm() for p in agent.parameters() if p.grad is not None]
            if grads:
                self._metrics["train"][f"agent_{i + 1}/grad_norm"].append(torch.stack(grads).norm().item())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = (
            "train"
            if self.model.training and "eval_loss" not in logs and not any(k.startswith("eval_") for k in logs)
            else "eval"
        )
        metrics = {k: sum(v) / len(v) for k, v in self._metrics[mode].items() if v}
        if self.accelerator.num_processes > 1:
            merged: dict[str, list[float]] = defaultdict(list)
            for d in gather_object([metrics]):
                for k, v in d.items():
                    merged[k].append(v)
            metrics = {k: sum(v) / len(v) for k, v in merged.items()}
        if mode == "train":
            env = torch.tensor([float(self.env_step)], device=self.accelerator.device)
            metrics["env_step"] = (
                self.accelerator.gather(env).sum().item()
                if self.accelerator.num_processes > 1
                else float(self.env_step)
            )
            if self.optimizer is not None:
                seen = set()
                for g in self.optimizer.param_groups:
                    name = g.get("name")
                    if name and name not in seen:
                        seen.add(name)
                        metrics[f"{name}/learning_rate"] = g["lr"]
            total = sum(self._timings.values())
            if total > 0:
                for k, v in self._timings.items():
                    metrics[f"time/{k}_fraction"] = v / total
            metrics.update(team_means_of_agent_metrics(metrics))
            tokens = torch.tensor([float(getattr(self, "_tokens_since_log", 0))], device=self.accelerator.device)
            self._tokens_since_log = 0
            if self.accelerator.num_processes > 1:
                tokens = self.accelerator.gather(tokens)
            self.state.num_input_tokens_seen += int(tokens.sum().item())  # TRL's num_tokens, kept in checkpoints
            if self.state.num_input_tokens_seen:  # trainers that train on rollouts (not on stored pairs)
                metrics["num_tokens"] = float(self.state.num_input_tokens_seen)
            prefix = ""
        else:
            prefix = "eval_"
        logs = {**logs, **{prefix + k: v for k, v in metrics.items()}}
        super().log(logs, start_time)
        self._metrics[mode].clear()
        records = getattr(self, "_completion_records", None)
        if mode == "train" and records and self.args.log_completions and self.accelerator.is_main_process:
            log_completions_table(records, self.state.global_step, self.args, self.args.num_completions_to_print)
            self._completion_records = None

    # ------------------------------------------------------------------ evaluation
    def _final_evaluation(self, out):
        """Evaluate after training (when there is an eval dataset), print the result on the main process and add
        it to the returned `TrainOutput.metrics` (as `eval_reward`, ...)."""
        if self.eval_dataset is None or out is None:
            return out
        from transformers.trainer_utils import TrainOutput

        metrics = self.evaluate()
        if self.accelerator.is_main_process:
            print(f"[trl_marl] final evaluation: eval_reward={metrics['eval_reward']:.4f}")
        return TrainOutput(out.global_step, out.training_loss, {**(out.metrics or {}), **metrics})

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Sample the current agents (one completion each, training sampling settings) on the eval items and
        score them with the TASK reward. Logs and returns `{prefix}_reward` (the mean undiscounted team return from
        the first turn), `{prefix}_turn_k/reward_mean`, `{prefix}_turn_k/expected_return` and the domain metrics.

        Sampling uses a fixed random stream (seeded from `args.seed`), so successive evaluations differ only by the
        weights; the training random state is left untouched.
        """
        metrics = self.evaluate_reward(eval_dataset, metric_key_prefix)
        self.log(dict(metrics))
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    @torch.no_grad()
    def evaluate_reward(self, eval_dataset=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluation without logging (see `evaluate`)."""
        ds = eval_dataset if eval_dataset is not None else self.eval_dataset
        if ds is None:
            raise ValueError("evaluation needs an eval_dataset")
        total = len(ds) if self.args.eval_num_samples is None else min(self.args.eval_num_samples, len(ds))
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        indices = list(range(total))[rank::world]
        bs = self.args.per_device_eval_batch_size or len(indices) or 1
        was_training = self.model.training
        self.model.eval()
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        extra: dict[str, list[float]] = defaultdict(list)
        devices = [d for d in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.args.seed + 1_000_003 * (rank + 1))
            # ZeRO-3 / FSDP2: as many batches on every process (the last ones empty where this share is shorter)
            chunks = even_chunks(indices, bs, synced=self.collective_generation)
            for chunk in progress_bar(chunks, "Evaluating", trainer_shows_progress(self)):
                items = [ds[j] for j in chunk]
                rollout = self.rollout_engine.run(items, self.generate, num_generations=1, greedy_baseline=False)
                if not items:  # an empty batch, run in step with the other processes: nothing to record
                    continue
                from trl_marl.rollout.engine import assign_returns

                assign_returns(rollout, 1.0, None, False)
                for node in rollout.nodes:
                    r = node.rewards if node.rewards.ndim == 1 else node.rewards.mean(dim=1)
                    key = f"turn_{node.turn + 1}"
                    sums[f"{key}/reward_mean"] += r.sum().item()
                    counts[f"{key}/reward_mean"] += r.numel()
                    sums[f"{key}/expected_return"] += node.undiscounted_returns.sum().item()
                    counts[f"{key}/expected_return"] += r.numel()
                for i in range(self.num_agents):
                    samples = rollout.samples_of_agent(i)
                    sums[f"agent_{i + 1}/completion_length"] += sum(s.completion_ids.numel() for s in samples)
                    counts[f"agent_{i + 1}/completion_length"] += len(samples)
                if self.metrics_callback is not None:
                    for k, v in (self.metrics_callback(rollout.records()) or {}).items():
                        extra[k].append(float(v))
        if was_training:
            self.model.train()
        keys = sorted(set(sums) | set(counts))
        if world > 1:
            gathered = gather_object([(dict(sums), dict(counts), dict(extra))])
            sums, counts, extra = defaultdict(float), defaultdict(float), defaultdict(list)
            for s, c, e in gathered:
                for k, v in s.items():
                    sums[k] += v
                for k, v in c.items():
                    counts[k] += v
                for k, v in e.items():
                    extra[k].extend(v)
            keys = sorted(set(sums) | set(counts))
        out = {f"{metric_key_prefix}_{k}": sums[k] / counts[k] for k in keys if counts[k]}
        out[f"{metric_key_prefix}_reward"] = out.get(f"{metric_key_prefix}_turn_1/expected_return", math.nan)
        for k, v in extra.items():
            out[f"{metric_key_prefix}_{k}"] = sum(v) / len(v)
        self._last_eval_reward = out[f"{metric_key_prefix}_reward"]
        return out

    # ------------------------------------------------------------------ checkpoints, resume, preemption
    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """`Trainer.train`, plus: `resume_from_checkpoint=True` resumes from the latest COMPLETE checkpoint (an
        incomplete one is skipped with a warning naming it), the step inside the rollout, the buffered rollout,
        `env_step` and every random stream are restored (exact resume), and SIGTERM / SIGUSR1 finish the current
        optimizer step, write a checkpoint and exit with status `PREEMPTED_EXIT_CODE` (75)."""
        checkpoint = self._restore_for_resume(resume_from_checkpoint)
        self._preemption.install()
        try:
            out = super().train(checkpoint, *args, **kwargs)
        finally:
            self._preemption.uninstall()
        if self._preemption.stop_now:
            self._exit_preempted()
        return out

    def _exit_preempted(self) -> None:
        msg = (
            f"{type(self).__name__}: stopped by {self._preemption.signal_name or 'another process'} at step {self.state.global_step}; "
            f"checkpoint saved in {self.args.output_dir}; resume with resume_from_checkpoint=True"
        )
        logger.warning(msg)
        raise SystemExit(PREEMPTED_EXIT_CODE)

    def _restore_for_resume(self, resume_from_checkpoint: str | bool | None) -> str | None:
        """Resolve the checkpoint (see `trl_marl.checkpointing.checkpoint.resolve_resume_checkpoint`) and restore this process's
        resume state from it, once."""
        checkpoint = resolve_resume_checkpoint(
            resume_from_checkpoint, self.args.output_dir, identity=self.checkpoint_identity()
        )
        if checkpoint is None or checkpoint == self._restored_from:
            return checkpoint
        state = load_resume_state(checkpoint, self.accelerator.process_index, self.all_resume_types())
        saved_world = state.get("num_processes", self.accelerator.num_processes)
        if saved_world != self.accelerator.num_processes:
            raise CheckpointError(
                f"{checkpoint} was written by {saved_world} process(es) and this run has "
                f"{self.accelerator.num_processes}: each process resumes its own rollout buffer and random streams; "
                f"resume with {saved_world} process(es)"
            )
        self._step = int(state["step"])
        self.env_step = int(state["env_step"])
        self._buffered = state["buffered"]
        self._last_eval_reward = state.get("last_eval_reward")
        for mode, metrics in state.get("metrics", {}).items():
            self._metrics[mode] = defaultdict(list, metrics)
        streams = getattr(self, "rng_streams", None)
        if streams is not None and state.get("rng_streams") is not None:
            streams.load_state_dict(state["rng_streams"])
        self._restore_extra_state(checkpoint, state.get("extra", {}))
        self._restored_from = checkpoint
        return checkpoint

    def _resume_state(self) -> dict:
        """What this process needs to continue exactly (saved in every checkpoint as `trl_marl_state_rank{r}.pt`;
        the global torch / numpy / python random states are transformers' `rng_state*.pth`)."""
        streams = getattr(self, "rng_streams", None)
        return {
            "num_processes": self.accelerator.num_processes,
            "step": self._step,
            "env_step": self.env_step,
            "buffered": self._buffered,
            "last_eval_reward": self._last_eval_reward,
            "metrics": {mode: dict(m) for mode, m in self._metrics.items()},
            "rng_streams": streams.state_dict() if streams is not None else None,
            "extra": self._extra_resume_state(),
        }

    def _extra_resume_state(self) -> dict:
        """Subclass state beyond `_resume_state` (collected pairs, ...); nothing here."""
        return {}

    def _restore_extra_state(self, checkpoint: str, extra: dict) -> None:
        """Restore what `_extra_resume_state` saved; nothing here."""

    def _save_checkpoint(self, model, trial) -> None:
        """Crash-safe checkpoint: staging folder, fsync, completion marker, rename, then rotation
        (`trl_marl.checkpointing.checkpoint.save_checkpoint_atomically`)."""
        save_checkpoint_atomically(self, trial)

    def _save_checkpoint_extra(self, folder: str) -> None:
        """Write more files into a checkpoint's staging folder before it is committed; nothing here."""

    # ------------------------------------------------------------------ saving
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write `agent_1/ ... agent_n/` (each a `save_pretrained` folder with its tokenizer and model card),
        `team.json` and the team card `README.md`."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        # a re-used output_dir: no stale agent_i/ (an adapter_config.json, a value head), critic or reward model of an
        # earlier run may stay beside this run's team for AgentTeam.from_pretrained or a reader to pick up
        clear_saved_team(output_dir)
        team = self.team
        if state_dict is None:
            state_dict = team.state_dict()
        for i, agent in enumerate(team.agents):
            prefix = "shared." if team.shared_base else f"agents.{i}."  # a LoRA team's agents share `shared`
            sub = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
            folder = os.path.join(output_dir, f"agent_{i + 1}")
            agent.save_pretrained(folder, state_dict=sub or None)
            self.tokenizers[i].save_pretrained(folder)
        self._save_extra(output_dir, state_dict)
        with open(os.path.join(output_dir, TEAM_FILE), "w", encoding="utf-8") as f:
            json.dump(self._team_description(), f, indent=2)
        write_trainer_cards(self, output_dir)
        # the config as TrainingArguments pickles it, minus anything secret (trl_marl.utils.secrets)
        torch.save(redacted_args(self.args), os.path.join(output_dir, "training_args.bin"))
        if not is_staging_folder(output_dir):  # a checkpoint's marker already holds the digest of every file
            write_folder_checksums(output_dir, saved_team_entries(output_dir), exclude_names=[CARD_FILE])

    def checkpoint_identity(self) -> dict:
        """What a checkpoint records about the run that wrote it, checked when one is resumed: the trainer, the
        algorithm and the team (a checkpoint of another trainer or team is refused as such, not called damaged)."""
        return {
            "trainer": type(self).__name__,
            "algorithm": self._name,
            "num_agents": self.num_agents,
            "agents": list(self.agent_names),
        }

    def _save_extra(self, output_dir: str, state_dict: dict) -> None:
        """Save critics / reward models beside the agents; nothing here."""

    def _team_description(self) -> dict:
        return {
            "algorithm": self._name,
            "num_agents": self.num_agents,
            "agents": [
                {
                    "folder": f"agent_{i + 1}",
                    "source": self.agent_names[i],
                    "formatter": getattr(self.formatters[i], "__qualname__", type(self.formatters[i]).__name__),
                    "role": agent_role(self.formatters[i], i),
                }
                for i in range(self.num_agents)
            ],
            "reward_func": self.reward.name,
            "joint_mode": self.args.joint_mode,
            "num_turns": self.args.num_turns,
            **team_metadata(self),
        }

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Load every agent from `agent_i/` of a checkpoint written by `_save`."""
        team = self.accelerator.unwrap_model(model if model is not None else self.model)
        for i, agent in enumerate(team.agents):
            folder = os.path.join(resume_from_checkpoint, f"agent_{i + 1}")
            _load_agent_weights(agent, folder)
        self._load_extra(resume_from_checkpoint, team)

    def _load_extra(self, checkpoint: str, team: torch.nn.Module) -> None:
        """Load what `_save_extra` wrote; nothing here."""

    # ------------------------------------------------------------------ Hub (trl_marl.hub)
    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None) -> None:
        """Write the team's cards in `output_dir`: one `README.md` per agent folder (algorithm, role, the other
        agents, training config) and the team `README.md` (TRL's card, extended; see `trl_marl.hub`)."""
        if self.is_world_process_zero():
            write_trainer_cards(self, self.args.output_dir, model_name, dataset_name, tags)

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create the repo(s) of `hub_team_layout`: the team repo `hub_model_id`, or `{hub_model_id}-agent-{i}`."""
        init_trainer_repos(self, token, private)

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs,
    ):
        """Save the team and push it in `args.hub_team_layout` (`trl_marl.hub.push_team_to_hub`'s layouts), with
        `hub_token` / `hub_private_repo` / `hub_revision` as transformers does; `kwargs` (`model_name`,
        `dataset_name`, `tags`) go to the cards. Returns the commit (`"team"`) or one commit per agent
        (`"per_agent"`); Futures when `blocking=False`."""
        return push_trainer(self, commit_message, blocking, token, revision, private, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Push a saved checkpoint's team by `hub_strategy` (see `trl_marl.hub.push_trainer_checkpoint`)."""
        push_trainer_checkpoint(self, checkpoint_folder)


def _check_formatters_on_first_items(formatters: Sequence[Callable], **datasets: Any) -> None:
    """Every agent's formatter on the first item of each dataset, at construction: a missing column fails now, naming
    the dataset, the agent and the formatter, not at the first evaluation after training."""
    from trl_marl.rollout.prompts import formatter_failure

    for which, ds in datasets.items():
        if ds is None:
            continue
        item = ds[0]
        for i, formatter in enumerate(formatters):
            try:
                formatter(item)
            except Exception as exc:
                raise ValueError(
                    f"{which}[0]: {formatter_failure(i, formatter, item, exc)}; every agent's formatter must accept "
                    f"every item of {which} (add the column, or pass formatters that read the columns it has)"
                ) from exc


class _PreemptionCallback(TrainerCallback):
    """After a preemption signal: save a checkpoint at the end of the current optimizer step, then stop."""

    def __init__(self, trainer: MultiAgentTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        requested = t._preemption.requested
        if t.accelerator.num_processes > 1:  # a signal to any process stops all of them at the same step
            flag = torch.tensor([1.0 if requested else 0.0], device=t.accelerator.device)
            requested = t.accelerator.reduce(flag, reduction="sum").item() > 0
        if requested:
            t._preemption.stop_now = True
            control.should_save = True
            control.should_training_stop = True
        return control


def _decay_groups(
    named: list[tuple[str, torch.nn.Parameter]], decay: set[str], weight_decay: float, lr: float, name: str
) -> list[dict]:
    return [
        {"params": [p for k, p in named if k in decay], "weight_decay": weight_decay, "lr": lr, "name": name},
        {"params": [p for k, p in named if k not in decay], "weight_decay": 0.0, "lr": lr, "name": name},
    ]


def _load_agent_weights(agent: torch.nn.Module, folder: str) -> None:
    """Load a saved agent (or critic backbone) folder of a checkpoint into `agent`; a missing or damaged file is a
    `CorruptedStateError` naming it."""
    from safetensors.torch import load_file as _load_file

    from trl_marl.checkpointing.state_files import CorruptedStateError

    fix = f"delete {os.path.dirname(os.path.abspath(folder))} and resume from the checkpoint before it"

    def load_file(path: str) -> dict:
        try:
            return _load_file(path)
        except Exception as exc:  # noqa: BLE001 -- safetensors / OS errors of a damaged file
            raise CorruptedStateError(path, f"unreadable weights ({type(exc).__name__}: {exc})", fix) from exc

    if not os.path.isdir(folder):
        raise CorruptedStateError(folder, "the folder is missing", fix)
    if hasattr(agent, "load_saved"):  # an adapter on a shared base
        agent.load_saved(folder)
        return
    adapter_file = os.path.join(folder, "adapter_model.safetensors")
    if os.path.isfile(adapter_file):  # a PEFT agent: its adapter
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(agent, load_file(adapter_file))
        return

    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(single):
        state = load_file(single)
    elif os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        state = {}
        for fn in files:
            state.update(load_file(os.path.join(folder, fn)))
    else:
        raise CorruptedStateError(folder, "no model weights (model.safetensors or model.safetensors.index.json)", fix)
    missing, unexpected = agent.load_state_dict(state, strict=False)
    tied = set(getattr(agent, "_tied_weights_keys", None) or [])
    tied |= {
        k for k in missing if k.endswith("lm_head.weight") and getattr(agent.config, "tie_word_embeddings", False)
    }
    bad = [k for k in missing if k not in tied]
    if bad or unexpected:
        raise RuntimeError(f"checkpoint {folder} does not match the agent: missing {bad}, unexpected {unexpected}")


def _apply_wandb_config(args: MultiAgentConfig, cfg: dict) -> None:
    env = {
        "project": "WANDB_PROJECT",
        "entity": "WANDB_ENTITY",
        "dir": "WANDB_DIR",
        "id": "WANDB_RUN_ID",
        "resume": "WANDB_RESUME",
    }
    for key, var in env.items():
        if cfg.get(key) is not None:
            os.environ[var] = str(cfg[key])
    if cfg.get("tags"):
        os.environ["WANDB_TAGS"] = ",".join(cfg["tags"])
    name = cfg.get("name") or cfg.get("run_name")
    if name:
        args.run_name = name
    report = args.report_to if isinstance(args.report_to, list) else [args.report_to]
    report = [r for r in report if r and r != "none"]
    if "wandb" not in report:
        args.report_to = report + ["wandb"]


MultiAgentTrainer.__init__ = accept_trl_names(MultiAgentTrainer.__init__)
