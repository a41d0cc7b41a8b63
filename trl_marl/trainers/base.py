"""`MultiAgentTrainer`: the TRL/transformers Trainer subclass every multi-agent trainer shares.

It composes the parts every algorithm shares: the team as ONE module (so accelerate and DeepSpeed see one model) with
one optimizer holding a parameter group per agent (`building`), the generation engine picked once
(`trl_marl.generation`), the rollout (`trl_marl.rollout`), the metrics recorder (`metrics`), evaluation with the task
reward (`evaluation`), and the team folders and resume state of checkpoints (`checkpoints`); TRL's `_BaseTrainer` /
`transformers.Trainer` turn losses into optimizer steps, checkpoints, logs and Hub pushes. An algorithm implements
`_experience` (its advantages, as tensors, from a rollout and its returns) and `compute_loss`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import PreTrainedModel
from trl.trainer.base_trainer import _BaseTrainer

import trl_marl.trainers.agent_losses as agent_losses
import trl_marl.trainers.arguments as arguments
import trl_marl.trainers.building as building
import trl_marl.trainers.checkpoints as checkpoints
import trl_marl.trainers.finite as finite
from trl_marl.checkpointing.checkpoint import PreemptionHandler, resolve_resume_checkpoint, save_checkpoint_atomically
from trl_marl.data_types.batches import AgentBatch, collate_agent_batch
from trl_marl.data_types.rng import RNGStreams
from trl_marl.data_types.rollout import GenerationOutput, Node, Rollout, Sample
from trl_marl.data_types.text import UNKNOWN_EOS, PromptText, valid_text
from trl_marl.distributed.collective import destroy_process_group_at_exit
from trl_marl.distributed.fsdp import enable_fsdp_on_cpu, is_fsdp2, shard_team
from trl_marl.distributed.memory import (
    MMAP_THRESHOLD,
    ONE_PROCESS_MMAP_MIN_AGENT_BYTES,
    ONE_PROCESS_MMAP_THRESHOLD,
    freed_tensors_reused,
    keep_freed_tensors,
    largest_weights_bytes,
    return_freed_tensors_to_os,
)
from trl_marl.distributed.zero3 import fill_bucket_sizes, is_zero3, zero3_init_flag_honoured
from trl_marl.hub import init_trainer_repos, push_trainer, push_trainer_checkpoint, write_trainer_cards
from trl_marl.models.loading import completion_token_ids, ended_with_eos, eos_token_ids
from trl_marl.models.team import TeamModel
from trl_marl.rollout.prompts import PromptRenderer, resolve_formatters
from trl_marl.rollout.returns import RolloutReturns, rollout_returns
from trl_marl.trainers import warmup
from trl_marl.trainers.agentic import AgenticSetup, build_rollout
from trl_marl.trainers.config import MultiAgentConfig
from trl_marl.trainers.data import Experience, RolloutSampler, consecutive_chunks, rollout_dataloader
from trl_marl.trainers.evaluation import TaskEvaluator
from trl_marl.trainers.metrics import MetricsRecorder, append_trace
from trl_marl.trainers.names import combine_reward_funcs, merge_model_init_kwargs, resolve_deprecated_kwargs
from trl_marl.trainers.per_agent import agent_value
from trl_marl.utils.progress import trainer_shows_progress

__all__ = ["MultiAgentTrainer", "RolloutSampler"]

logger = logging.getLogger(__name__)

# transformers >= 5.24 deprecates `is_gradient_checkpointing`, which transformers.Trainer and TRL 1.16 still read on
# every model they handle: known harmless, not the user's doing, and printed on every run.
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)


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
        external_transition: multi-turn transition, required when `num_turns > 1` (without tools or environment).
        tools, environment_factory: TRL's `tools=` and `environment_factory=`, for a team (`docs/agentic.md`).
        model_config: loading options for ids: `dtype`, `attn_implementation`, `trust_remote_code`, `revision`,
            `model_kwargs` (a dict), or a TRL `ModelConfig`; `args.model_init_kwargs` (TRL's) adds to them.
        metrics_callback: `callable(rollout_records) -> dict[str, float]` of domain metrics, called on every
            training rollout and evaluation.
        wandb_config: the reference library's W&B settings (`project`, `entity`, `name`, `tags`, `dir`, `id`,
            `resume`); sets the `WANDB_*` environment and adds `"wandb"` to `report_to`.
        callbacks, optimizers: as in `transformers.Trainer`.
        peft_config: a PEFT config: every agent trains an adapter (with `share_base_model`, on ONE shared base).
    """

    _tag_names = ["trl", "trl_marl", "multi-agent"]
    _name = "MultiAgent"
    loss_is_scaled_for_ga = False  # compute_loss returns a per-step mean; Trainer divides by accumulation steps
    config_class = MultiAgentConfig  # built when args is None
    args_class: type | None = None  # what args must be an instance of (default: config_class)
    supports_per_agent_rewards = False
    supports_shared_base = True  # agents as adapters on one base model (share_base_model=True)
    supports_agentic = True  # tools, environment_factory, turn_order="sequential" (trainers.agentic)
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
            hint = ""
            if type(args).__module__.split(".")[0] == "trl":  # a TRL config brought over
                hint = (
                    f"; {expected.__name__} takes TRL's field names: pass the keyword arguments you gave "
                    f"{type(args).__name__} to {expected.__name__}(...) (docs/comparison.md lists what differs)"
                )
            raise TypeError(f"args must be a {expected.__name__}, got {type(args).__name__}{hint}")
        return args

    def __init__(
        self,
        model: str | PreTrainedModel | Sequence[str | PreTrainedModel] | None = None,
        reward_funcs: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
        args: MultiAgentConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        *,
        formatters: Callable | Sequence[Callable] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        external_transition: Callable[..., Any] | None = None,
        tools: Sequence[Callable[..., Any] | Sequence[Callable[..., Any]]] | None = None,
        environment_factory: Callable[[], Any] | dict[str, Callable[[], Any]] | None = None,
        model_config: Any = None,
        metrics_callback: Callable[[list[dict]], dict] | None = None,
        wandb_config: dict | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config: Any = None,
        **deprecated_kwargs: Any,
    ):
        model, reward_funcs, processing_class = resolve_deprecated_kwargs(
            type(self), model, reward_funcs, processing_class, deprecated_kwargs
        )
        args = self._checked_args(args)
        reward_func = combine_reward_funcs(reward_funcs, args.reward_weights)
        args, reward_func, formatters = self._setup_roles(model, args, reward_func, formatters)
        model_config = self._loading_config(model_config, args)
        n = args.num_agents

        # ---- validation, before any model loads ----
        sources = arguments.agent_sources(model, n)
        self.formatters = formatters = resolve_formatters(formatters, n)
        self.agentic = agentic = AgenticSetup.build(
            type(self), args, tools, environment_factory, reward_func, train_dataset, external_transition
        )
        train_dataset = agentic.train_dataset if agentic else train_dataset
        arguments.check_run_arguments(
            args, processing_class, reward_func, train_dataset, eval_dataset, formatters, external_transition, agentic
        )
        columns = arguments.column_names(train_dataset)
        allow = self.supports_per_agent_rewards
        reward = arguments.team_reward(reward_func, n, reward_processor, allow, columns, agentic)
        arguments.check_peft_config(peft_config)
        if args.share_base_model:
            arguments.check_shared_base(model, args, peft_config, type(self).__name__, self.supports_shared_base)
        self._check_config(args)
        if args.use_vllm is True and args.vllm_mode == "colocate":  # before any model loads: a clear error when
            from trl_marl.generation.vllm_backend import check_vllm_available  # vLLM is missing or unsupported

            check_vllm_available()
        if wandb_config:
            arguments.apply_wandb_config(args, wandb_config)

        # ---- the team ----
        if args.device.type == "cpu":  # weights in host memory (trl_marl.distributed.memory)
            return_freed_tensors_to_os(MMAP_THRESHOLD if args.world_size > 1 else ONE_PROCESS_MMAP_THRESHOLD)
        self.peft_config = peft_config
        self._agent_sources = sources
        # agents and critics loaded partitioned only with zero3_init_flag (trl_marl.distributed.zero3)
        with zero3_init_flag_honoured(args):
            models, names, self.tokenizers, shared = building.load_team_members(
                sources, args, processing_class, model_config, peft_config
            )
            if shared is None:
                # Critics' and value heads' fresh weights are drawn here, before the Trainer seeds anything: draw them
                # from the "critic_init" stream of `args.seed` (rank 0 on every process: identical heads everywhere), so
                # the same seed builds the same heads whatever the global RNG holds, and the global RNG is left as found.
                with RNGStreams(args.seed).scoped("critic_init"):
                    team = self._build_team(models, names, args)
            else:
                team = TeamModel(models, names, shared=shared)
        small = largest_weights_bytes(models) < ONE_PROCESS_MMAP_MIN_AGENT_BYTES
        if args.device.type == "cpu" and args.world_size == 1 and small:
            keep_freed_tensors()  # small agents: their pages' faults cost more than the RSS they give back
        team.temperature = args.temperature  # log-probs of sampled completions are taken on logits / temperature
        team.logprob_batch_size = args.logprob_batch_size  # rows per scoring forward (trl_marl.models.scoring)
        if args.parallel_training == "mp":
            building.place_agents(team, args.agent_devices)
        self.agent_names = names
        self.eos_ids = [eos_token_ids(shared if shared is not None else m, t) for m, t in zip(models, self.tokenizers)]
        self.reward = reward
        self._render = PromptRenderer(self.tokenizers)  # the rollout's prompts, through each agent's chat template
        self._chat_prompts = self._render.chat  # whether agent i's formatter produced chat messages (the same list)
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
        arguments.check_sharded_scoring(args, is_zero3(self.accelerator) or is_fsdp2(self.accelerator))

        # ---- the parts ----
        self._metrics = MetricsRecorder(self.accelerator, n, self.eos_ids, metrics_callback)
        self.reference_models = building.reference_models(self) if args.scores_reference else None
        if is_fsdp2(self.accelerator):
            # shard the team before the optimizer is built (trl_marl.distributed.fsdp: per layer, per agent, then the team)
            shard_team(self.model, self.accelerator)
        self._buffered: list | None = None
        self._step = 0
        # this step's agents stepped right after their backward: name -> pre-clip gradient norm (`record_early_agent_step`)
        self._early_steps: dict[str, float] = {}
        self._stream_round = 0  # the round whose random streams are drawn from now (iterative trainers; else 0)
        # one random stream per purpose (trl_marl.data_types.rng); saved with every checkpoint
        self.rng_streams = RNGStreams(
            args.seed, self.accelerator.process_index, [self.agent_device(i) for i in range(n)]
        )
        self.env_step = 0  # joint-action reward evaluations on this process
        self._last_eval_reward: float | None = None
        self._preemption = PreemptionHandler()
        self._restored_from: str | None = None
        self.add_callback(checkpoints.PreemptionCallback(self._preemption, self.accelerator))
        self.generation = building.generation_engine(self)
        # ZeRO-3 / FSDP2: generation gathers each agent (a collective): every process runs every turn (`synced`)
        self.rollout_engine = build_rollout(self, agentic, reward, external_transition)
        # Training rollouts may score with another reward than evaluation (MARLHF: a learned reward model); the
        # task reward of `rollout_engine` is what evaluation always uses.
        self.train_rollout_engine = self.rollout_engine
        self.evaluator = TaskEvaluator(
            self.rollout_engine, self.generation, self.accelerator, n, args.seed, metrics_callback
        )
        checkpoints.check_output_space(self)  # a read-only or full disk found now, not after training
        warmup.warm_up(self)  # the first optimizer step costs about a steady one (trl_marl.trainers.warmup)

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        if enable_fsdp_on_cpu(self.accelerator):  # FSDP2 over gloo on a CPU-only machine (trl_marl.distributed.fsdp)
            self.is_fsdp_enabled = True

    # ------------------------------------------------------------------ hooks for subclasses
    def _setup_roles(
        self, model: Any, args: MultiAgentConfig, reward_func: Callable | None, formatters: Any
    ) -> tuple[MultiAgentConfig, Callable | None, Any]:
        """Before anything loads, adapt `(args, reward_func, formatters)` to the roles the team plays: one agent per
        role here; the centralized trainers make ONE model write every role (`trl_marl.rollout.centralized`)."""
        return args, reward_func, formatters

    def _loading_config(self, model_config: Any, args: MultiAgentConfig) -> Any:
        """The agents' loading options: `model_config` plus TRL's `args.model_init_kwargs`. A trainer that loads other
        models (critics) takes their options out here."""
        return merge_model_init_kwargs(model_config, args.model_init_kwargs)

    def _check_config(self, args: MultiAgentConfig) -> None:
        """Trainer-specific checks of `args` (raise ValueError naming the field)."""

    def _build_team(self, models: list[PreTrainedModel], names: list[str], args: MultiAgentConfig) -> TeamModel:
        return TeamModel(models, names)

    def _experience(self, rollout: Rollout, returns: RolloutReturns) -> Experience:
        """The algorithm's view of a training rollout (its advantages, as tensors): implemented by each trainer."""
        raise NotImplementedError(f"{type(self).__name__} does not train on rollouts")

    def _update_chunks(self, num_items: int) -> list[list[int]]:
        """The item indices of each training step taken on one rollout: `steps_per_rollout` consecutive slices."""
        return consecutive_chunks(num_items, self.args.steps_per_rollout)

    def _record_rollout_metrics(self, rollout: Rollout, mode: str) -> None:
        """Metrics a trainer adds for each training rollout, after the shared ones (`MetricsRecorder.record_rollout`)."""

    # ------------------------------------------------------------------ the team
    @property
    def team(self) -> TeamModel:
        """The unwrapped team module."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def num_agents(self) -> int:
        return self.args.num_agents

    def agent_device(self, i: int) -> torch.device:
        return next(self.team.agents[i].parameters()).device

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """One optimizer, one parameter group per agent at its own learning rate (decay / no-decay split), plus
        `_extra_param_groups()`."""
        if self.optimizer is not None:
            return self.optimizer
        team = self.accelerator.unwrap_model(self.model if model is None else model)
        decay = set(self.get_decay_parameter_names(team))
        groups = building.agent_param_groups(team, self.args, decay) + self._extra_param_groups(team, decay)
        cls, kwargs = self.optimizer_cls_and_kwargs or self.get_optimizer_cls_and_kwargs(self.args, team)
        self.optimizer = cls([g for g in groups if g["params"]], **kwargs)
        return self.optimizer

    def _extra_param_groups(self, team: nn.Module, decay: set[str]) -> list[dict]:
        """Parameter groups beyond the agents' (critics, value heads); none here."""
        return []

    def _extra_clip_groups(self) -> list[list[torch.nn.Parameter]]:
        """Parameter sets clipped by their own norm beyond the agents' (critics, value heads); none here."""
        return []

    def _clip_grad_norm(self, model):
        """Clip each agent's (and critic's) gradient by its OWN norm (`building.clip_agents_each`); the engine clips
        under DeepSpeed and FSDP, and for agents sharing one base (adapters)."""
        if self.is_deepspeed_enabled or self.is_fsdp_enabled or self.team.shared_base:
            return super()._clip_grad_norm(model)
        return building.clip_agents_each(self)

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm)
        if self._early_steps:  # agents stepped right after their backward (`agent_losses.step_each_agent`)
            grad_norm = agent_losses.combined_grad_norm(grad_norm, list(self._early_steps.values()))
        finite.check_grad_norm(self, grad_norm)  # before the optimizer step applies it
        return grad_norm

    def record_early_agent_step(self, i: int, grad_norm: float) -> None:
        """Agent i took its part of this optimizer step right after its backward (`agent_losses.
        optimizer_step_of_agent`), its pre-clip gradient norm `grad_norm`: logged as `agent_{i+1}/grad_norm` and in
        the step's `grad_norm`, and named if a later check stops the step (`finite`)."""
        self._early_steps[f"agent_{i + 1}"] = grad_norm
        if self._will_log():
            self._metrics.record_grad_norm(f"agent_{i + 1}", grad_norm)

    def _grad_norm_modules(self) -> list[tuple[str, nn.Module]]:
        """The modules whose gradient norm is logged (`<name>/grad_norm`): the agents, plus critics and value heads."""
        return [(f"agent_{i + 1}", agent) for i, agent in enumerate(self.team.agents)]

    # ------------------------------------------------------------------ data and generation
    def get_train_dataloader(self) -> DataLoader:
        return rollout_dataloader(self.train_dataset, self.args, self.accelerator)

    def generate(
        self, prompts_per_agent: list[list[PromptText]], num_generations: int, greedy: bool = False
    ) -> list[GenerationOutput]:
        """Sample `num_generations` completions per prompt for every agent with the trainer's engine (rows
        prompt-major, `GenerationEngine.generate`)."""
        return self.generation.generate(prompts_per_agent, num_generations, greedy)

    def generate_with(
        self,
        models: Sequence[torch.nn.Module],
        tokenizers: Sequence,
        prompts_per_agent,
        num_generations: int,
        eos_ids: Sequence[list[int]] | None = None,
        greedy: bool = False,
    ) -> list[GenerationOutput]:
        """Sample with the given models (one per agent; e.g. a comparator's) at the trainer's sampling settings
        (`GenerationEngine.generate_with`)."""
        return self.generation.generate_with(models, tokenizers, prompts_per_agent, num_generations, eos_ids, greedy)

    @property
    def collective_generation(self) -> bool:
        """Whether generating (and scoring with a sharded model) is a collective (`GenerationEngine.collective`)."""
        return self.generation.collective

    def tokenize_prompt(self, i: int, prompt: str) -> torch.Tensor:
        """Agent i's prompt token ids, as generation tokenizes them."""
        chat = getattr(prompt, "chat", False) or self._chat_prompts[i]
        ids = self.tokenizers[i](valid_text(str(prompt)), add_special_tokens=not chat)["input_ids"]
        if self.args.max_prompt_length is not None:
            ids = ids[-self.args.max_prompt_length :]
        return torch.tensor(ids, dtype=torch.long)

    def tokenize_completion(self, i: int, text: str, eos_token: Any = UNKNOWN_EOS) -> torch.Tensor:
        """Token ids of a completion given as text (a comparator's, or one re-read from a round file), as agent i
        scores it (`trl_marl.models.loading.completion_token_ids`)."""
        return completion_token_ids(
            self.tokenizers[i], text, self.eos_ids[i], agent_value(self.args.max_completion_length, i), eos_token
        )

    def completion_eos_token(self, i: int, completion_ids: torch.Tensor) -> str | None:
        """The text of the EOS token agent i's generated `completion_ids` ended with; None when cut (no EOS)."""
        return ended_with_eos(self.tokenizers[i], completion_ids, self.eos_ids[i])

    def agent_batch(self, i: int, samples: Sequence) -> AgentBatch:
        ids = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
        return collate_agent_batch(*ids, self.tokenizers[i].pad_token_id, [s.tool_mask for s in samples])

    # ------------------------------------------------------------------ the training step
    def training_step(self, model, inputs, num_items_in_batch=None):
        t0 = time.perf_counter()
        self._metrics.step_rollout_seconds = 0.0
        self._early_steps = {}
        loss = super().training_step(model, inputs, num_items_in_batch)
        finite.check_loss(self, loss)  # a non-finite loss stops the run before the optimizer step
        self._step += 1
        self._metrics.timings["update"] += time.perf_counter() - t0 - self._metrics.step_rollout_seconds
        at_update = self._step % self.args.gradient_accumulation_steps == 0
        if at_update and self._will_log() and not self.is_deepspeed_enabled:  # no per-module grads under DeepSpeed
            self._metrics.record_grad_norms(self._grad_norm_modules())
        return loss

    def _will_log(self) -> bool:
        """Whether the optimizer step about to happen is a logging step (grad norms are computed only then)."""
        every = self.state.logging_steps or 1
        return self.args.logging_strategy == "steps" and (self.state.global_step + 1) % every == 0

    def _prepare_inputs(self, items: list[dict]) -> dict:
        """Roll out a new batch every `steps_per_rollout` steps; return the slice of the buffer for this step."""
        if not isinstance(items, list):  # evaluation goes through `evaluate`, never here
            return items
        K = self.args.steps_per_rollout
        if self._step % K == 0 or self._buffered is None:
            self._buffered = self._rollout_step(items)
        return self._buffered[self._step % K]

    def _rollout_step(self, items: list[dict]) -> list[dict]:
        """Roll out `items` (training reward), set the KL penalties, compute the returns and the `_experience`, record
        it all; return each training step's inputs (`{"rollout", "items", **experience.inputs}`, `_update_chunks`)."""
        t0 = time.perf_counter()
        self.generation.before_rollout()
        # one process on CPU: the rollout's tensors from glibc's heap (trl_marl.distributed.memory)
        heap = freed_tensors_reused() if self.args.world_size == 1 else contextlib.nullcontext()
        with self.rng_streams.scoped("rollout", self._rng_round()), heap:
            rollout = self.train_rollout_engine.run(items, self.generation.generate)
        t1 = time.perf_counter()
        if self.args.reference_kl_enabled:
            self._reference_penalties(rollout)
        returns = rollout_returns(rollout, self.args.discount)
        experience = self._experience(rollout, returns)
        self.env_step += rollout.env_steps
        components = self.train_rollout_engine.reward.drain_component_means()
        keep = self.args.log_completions
        self._metrics.record_rollout(rollout, returns, experience.advantages, components, keep_records=keep)
        self._record_rollout_metrics(rollout, "train")
        t2 = time.perf_counter()
        timings = self._metrics.timings
        timings["generation"] += t1 - t0 - rollout.reward_seconds
        timings["reward"] += rollout.reward_seconds
        timings["scoring"] += t2 - t1
        self._metrics.step_rollout_seconds += t2 - t0
        if self.args.trace_dir:
            records = rollout.records(returns.joint, experience.advantages)
            path = os.path.join(self.args.trace_dir, f"trace_rank{self.accelerator.process_index}.jsonl")
            append_trace(path, records, self.state.global_step, self.env_step)
        return [{"rollout": rollout, "items": chunk, **experience.inputs} for chunk in self._update_chunks(len(items))]

    def _reference_penalties(self, rollout: Rollout) -> None:
        """Set `sample.penalty = reference_kl_coef * KL_k3(sample)` for every sample (`set_kl_penalties`)."""
        for i, kl in enumerate(building.set_kl_penalties(self, rollout)):
            if kl is not None:
                self._metrics["train"][f"agent_{i + 1}/kl"].append(kl)

    def _rng_round(self) -> int:
        return self._stream_round

    def _save_rng_state(self, output_dir: str) -> None:
        """transformers' RNG states, plus this process's `rng_streams` (`rng_streams_{rank}.pt`)."""
        super()._save_rng_state(output_dir)
        checkpoints.save_rng_streams(self.rng_streams, output_dir, self.accelerator.process_index)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        with checkpoints.damaged_rng_state_named(checkpoint, self.accelerator.process_index):
            super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            checkpoints.load_rng_streams(self.rng_streams, checkpoint, self.accelerator.process_index)

    # ------------------------------------------------------------------ metrics and evaluation
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training and not any(k.startswith("eval_") for k in logs) else "eval"
        metrics = self._metrics.summary(mode, self.env_step, self.optimizer, self.state)
        prefix = "" if mode == "train" else "eval_"
        super().log({**logs, **{prefix + k: v for k, v in metrics.items()}}, start_time)
        self._metrics.clear(mode)
        if mode == "train" and self.args.log_completions and self.accelerator.is_main_process:
            self._metrics.print_completions(self.state.global_step, self.args)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Sample the current agents on the eval items and score them with the TASK reward (`TaskEvaluator`); logs
        and returns `{prefix}_reward` (the mean undiscounted team return from the first turn) and the other metrics.
        Called outside `train()` (an evaluation-only script), a successful evaluation has the process group destroyed
        at exit, as a successful `train()` does (`destroy_process_group_at_exit`: its collectives' gloo workers)."""
        metrics = self.evaluate_reward(eval_dataset, metric_key_prefix)
        self.log(dict(metrics))
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        if not self.is_in_train:  # inside train() the hook waits for the run's success (checkpoints.run_training)
            destroy_process_group_at_exit()
        return metrics

    def evaluate_reward(self, eval_dataset=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluation without logging (see `evaluate`)."""
        ds = eval_dataset if eval_dataset is not None else self.eval_dataset
        if ds is None:
            raise ValueError("evaluation needs an eval_dataset")
        a = self.args
        show = trainer_shows_progress(self)
        out = self.evaluator.evaluate(
            self.model, ds, a.eval_num_samples, a.per_device_eval_batch_size, metric_key_prefix, show_progress=show
        )
        self._last_eval_reward = out[f"{metric_key_prefix}_reward"]
        return out

    # ------------------------------------------------------------------ checkpoints, resume, preemption
    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """`Trainer.train`, plus: `resume_from_checkpoint=True` resumes from the latest COMPLETE checkpoint, exactly
        (the step inside the rollout, the buffered rollout, `env_step`, every random stream); SIGTERM / SIGUSR1, from
        the first phase to the last (`_prepare_training`, the loop, `_after_training`), write a complete checkpoint
        at the next safe point and exit with status 75 (`checkpoints.run_training`)."""
        return checkpoints.run_training(self, super().train, resume_from_checkpoint, *args, **kwargs)

    def _training_context(self, checkpoint: str | None) -> contextlib.AbstractContextManager:
        """Around the phases of `train()` (the iterative trainers' rounds); nothing here."""
        return contextlib.nullcontext()

    def _prepare_training(self, checkpoint: str | None) -> Any:
        """Before the training loop (pair collection, reward-model fitting): None to train, or what `train()` returns
        instead of training; nothing here."""
        return None

    def _after_training(self, out: Any) -> Any:
        """After the training loop (the final evaluation of the preference trainers); `out` unchanged here."""
        return out

    def _restore_for_resume(self, resume_from_checkpoint: str | bool | None) -> str | None:
        """Resolve the checkpoint to resume from and restore this process's state from it, once (`checkpoints`)."""
        identity = checkpoints.checkpoint_identity(self)  # another trainer's or team's checkpoint is refused as such
        checkpoint = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir, identity)
        if checkpoint is not None and checkpoint != self._restored_from:
            checkpoints.restore(self, checkpoint)
            self._restored_from = checkpoint
        return checkpoint

    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ):
        """`Trainer._init_training_state`, plus: a run resumed from a checkpoint of its last step (`max_steps` reached:
        a finished run, one whose final evaluation failed) trains no further step. transformers would train one more
        when `max_steps` ends inside an epoch (its loop checks the end after a step); the loop is skipped, and only
        what follows it runs (`_after_training`: the final evaluation)."""
        epochs_trained, steps_trained = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        if resume_from_checkpoint is not None and self.state.global_step >= max_steps:
            return num_train_epochs, 0
        return epochs_trained, steps_trained

    def _resume_state(self) -> dict:
        """What this process needs to continue exactly (`trainers.resume_state`)."""
        return checkpoints.resume_state(self)

    def _unsaved_collection(self) -> str | None:
        """A collection stopped by a failure after some of its chunks, in words, for `save_after_failure` to
        checkpoint (the preference trainers' pairs); None here."""
        return None

    def _extra_resume_state(self) -> dict:
        """Subclass state beyond `_resume_state` (collected pairs, ...); nothing here."""
        return {}

    def _restore_extra_state(self, checkpoint: str, extra: dict) -> None:
        """Restore what `_extra_resume_state` saved; nothing here."""

    def _save_checkpoint(self, model, trial) -> None:
        """Crash-safe checkpoint (`trl_marl.checkpointing.checkpoint.save_checkpoint_atomically`)."""
        save_checkpoint_atomically(self, trial, checkpoints.checkpoint_identity(self))

    def _save_checkpoint_extra(self, folder: str) -> None:
        """Write more files into a checkpoint's staging folder before it is committed; nothing here."""

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write the team folders (`trainers.save_team`)."""
        if self.args.should_save:
            checkpoints.save_team(self, output_dir if output_dir is not None else self.args.output_dir, state_dict)

    def _save_extra(self, output_dir: str, state_dict: dict) -> None:
        """Save critics / reward models beside the agents; nothing here."""

    def _team_description(self) -> dict:
        """What `team.json` says of the team (`trainers.team_description`); subclasses add to it."""
        return checkpoints.team_description(self)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Load every agent from `agent_i/` of a checkpoint written by `_save`."""
        team = self.accelerator.unwrap_model(model if model is not None else self.model)
        checkpoints.load_agents_from(resume_from_checkpoint, team)
        self._load_extra(resume_from_checkpoint, team)

    def _load_extra(self, checkpoint: str, team: torch.nn.Module) -> None:
        """Load what `_save_extra` wrote; nothing here."""

    # ------------------------------------------------------------------ Hub (trl_marl.hub)
    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None) -> None:
        """Write the team's cards in `output_dir`: one per agent folder and the team's (`trl_marl.hub`)."""
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
        """Save the team and push it in `args.hub_team_layout` (`trl_marl.hub.push_trainer`): returns the commit
        (`"team"`) or one commit per agent (`"per_agent"`); Futures when `blocking=False`."""
        return push_trainer(self, commit_message, blocking, token, revision, private, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Push a saved checkpoint's team by `hub_strategy` (see `trl_marl.hub.push_trainer_checkpoint`)."""
        push_trainer_checkpoint(self, checkpoint_folder)
