"""How a trainer builds its team: the agents and their tokenizers, the frozen references of the KL penalty (and the
penalty itself), the generation engine it samples with, and the optimizer's parameter groups (one per agent, at the
agent's own learning rate)."""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from trl.trainer.utils import disable_dropout_in_model

from trl_marl.algorithms.losses import k3_kl
from trl_marl.data_types.rollout import Rollout
from trl_marl.distributed.fsdp import is_fsdp2, shard_module
from trl_marl.distributed.zero3 import zero3_frozen_copy, zero3_init_enabled
from trl_marl.generation import GenerationEngine, HFGeneration, SamplingSettings
from trl_marl.generation.choice import choose_backend
from trl_marl.models.adapters import AdapterDisabled, build_shared_base, wrap_agents_with_peft
from trl_marl.models.loading import load_agents, load_tokenizers
from trl_marl.models.team import agent_token_logprobs

__all__ = [
    "clip_agents_each",
    "load_team_members",
    "generation_engine",
    "place_agents",
    "reference_models",
    "sync_reference_models",
    "set_kl_penalties",
    "agent_learning_rate",
    "agent_param_groups",
    "decay_groups",
    "clip_each",
]


def load_team_members(
    sources: Sequence[Any], args: Any, processing_class: Any, model_config: Any, peft_config: Any
) -> tuple[list[PreTrainedModel], list[str], list[Any], nn.Module | None]:
    """`(models, names, tokenizers, shared)`: the agents loaded from their sources (ids loaded once per agent, never
    sharing parameters), dropout disabled when `args.disable_dropout`, wrapped by `peft_config`; with
    `share_base_model` the agents are adapter views of ONE base model, `shared`, else `shared` is None."""
    n = args.num_agents
    shared = None
    if args.share_base_model:
        base, base_names = load_agents(sources[0], None, 1, model_config)
        names = base_names * n
        if args.disable_dropout:
            disable_dropout_in_model(base[0])
        shared, models = build_shared_base(base[0], peft_config, n, names[0])
    else:
        models, names = load_agents(None, sources, n, model_config)
        if args.disable_dropout:
            for m in models:
                disable_dropout_in_model(m)
        if peft_config is not None:
            models = wrap_agents_with_peft(models, peft_config, names)
    return models, names, load_tokenizers(processing_class, names, n, sources), shared


def place_agents(team: nn.Module, devices: Sequence[str]) -> None:
    """`parallel_training="mp"`: agent i on `devices[i]` (one device: all of them), recorded in `hf_device_map` so
    the Trainer leaves the placement alone."""
    devices = list(devices) * team.num_agents if len(devices) == 1 else list(devices)
    for agent, dev in zip(team.agents, devices):
        agent.to(dev)
    team.hf_device_map = {f"agents.{i}": d for i, d in enumerate(devices)}


logger = logging.getLogger(__name__)


def generation_engine(trainer: Any) -> GenerationEngine:
    """The engine `trainer` samples with, picked once: transformers' `generate`; with `use_vllm=True` colocated vLLM
    engines, or `trl-marl vllm-serve` servers (`vllm_mode="server"`); with `use_vllm="auto"` the faster of the first
    two for the device and the model (`trl_marl.generation.choice`), logged with the reason and written back to
    `args.use_vllm`."""
    args = trainer.args
    sampling, threaded = SamplingSettings.per_agent(args), args.parallel_training == "mp"
    engine = HFGeneration(
        trainer.accelerator, lambda: trainer.model_wrapped, trainer.tokenizers, trainer.eos_ids, sampling, threaded
    )
    if args.use_vllm == "auto":
        from trl_marl.generation.vllm_backend import check_vllm_available

        try:
            version = check_vllm_available()
        except ImportError:
            version = None
        configs = [agent.config for agent in trainer.team.agents]
        choice = choose_backend(args, configs, trainer.accelerator.device.type, version)
        logger.info("use_vllm='auto': %s, because %s", "vLLM" if choice.use_vllm else "transformers", choice.reason)
        args.use_vllm = choice.use_vllm
    if not args.use_vllm:
        return engine
    record = functools.partial(trainer._metrics.add, "train")
    policy_version = lambda: trainer.state.global_step  # noqa: E731
    if args.vllm_mode == "server":
        from trl_marl.generation.vllm_server_engine import VLLMServerGeneration

        return VLLMServerGeneration(engine, args, policy_version, record)
    from trl_marl.generation.vllm_backend import VLLMTeamGeneration

    return VLLMTeamGeneration(engine, args, trainer.peft_config, policy_version, record)


def reference_models(trainer: Any) -> list[nn.Module]:
    """Frozen copies of each agent's initial weights, for the reference-KL penalty, placed as the trainer's engine
    needs (DeepSpeed: TRL's `prepare_deepspeed`; FSDP2: sharded like the team; else beside the agent or on
    `reference_devices`). PEFT agents use their base with the adapters disabled instead (no copy)."""
    team = trainer.team
    if team.shared_base:
        return [AdapterDisabled(team.shared)] * team.num_agents
    if trainer.peft_config is not None:
        return [AdapterDisabled(agent) for agent in team.agents]
    devs = trainer.args.reference_devices
    refs = []
    for i, agent in enumerate(team.agents):
        # agents built inside deepspeed.zero.Init (zero3_init_flag) are copied partitioned (trl_marl.distributed.zero3)
        ref = zero3_frozen_copy(agent) if zero3_init_enabled() else copy.deepcopy(agent)
        ref = ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        if trainer.is_deepspeed_enabled:
            from trl.models.utils import prepare_deepspeed

            ref = prepare_deepspeed(ref, trainer.accelerator)
        elif is_fsdp2(trainer.accelerator):
            ref = shard_module(ref, trainer.accelerator)
        else:
            ref.to(devs[0 if len(devs) == 1 else i] if devs else next(agent.parameters()).device)
        refs.append(ref)
    return refs


@torch.no_grad()
def set_kl_penalties(trainer: Any, rollout: Rollout) -> list[float | None]:
    """Set `sample.penalty = reference_kl_coef * KL_k3(sample)` on every sample of `rollout`: the k3 estimate of the
    KL to agent i's reference, summed over the completion tokens, both policies scored at the sampling temperature
    (as TRL's GRPO), one batched pass per agent. Returns each agent's mean KL (None for an agent with no samples)."""
    coef = trainer.args.reference_kl_coef
    team = trainer.team
    means: list[float | None] = []
    for i in range(trainer.num_agents):
        samples = rollout.samples_of_agent(i)
        if not samples:
            means.append(None)
            continue
        batch = trainer.agent_batch(i, samples)
        T = team.agent_temperature(i)
        logp = agent_token_logprobs(team.agents[i], batch, T)
        ref_logp = agent_token_logprobs(trainer.reference_models[i], batch, T).to(logp.device)
        kl = k3_kl(logp, ref_logp, batch.completion_mask.to(logp.device)).cpu()
        for s, v in zip(samples, kl.tolist()):
            s.penalty = coef * v
        means.append(kl.mean().item())
    return means


@torch.no_grad()
def sync_reference_models(trainer: Any, alpha: float) -> None:
    """TR-DPO's reference update for every agent, `ref <- alpha * agent + (1 - alpha) * ref`, with TRL's
    `SyncRefModelCallback.sync_target_model` (which gathers ZeRO-3 parameters)."""
    from trl.trainer.callbacks import SyncRefModelCallback

    for agent, ref in zip(trainer.team.agents, trainer.reference_models):
        SyncRefModelCallback.sync_target_model(agent, ref, alpha)


def agent_learning_rate(args: Any, i: int) -> float:
    """Agent i's learning rate: `agent_learning_rate` (one rate for every agent, or one per agent), else
    `learning_rate`."""
    lr = args.agent_learning_rate
    if lr is None:
        return args.learning_rate
    if isinstance(lr, (list, tuple)):
        return lr[0] if len(lr) == 1 else lr[i]
    return lr


def decay_groups(
    named: Sequence[tuple[str, torch.nn.Parameter]], decay: set[str], weight_decay: float, lr: float, name: str
) -> list[dict]:
    """One module's two optimizer parameter groups, labelled `name` (logged as `<name>/learning_rate`): the
    parameters in `decay` at `weight_decay`, the others without."""
    return [
        {"params": [p for k, p in named if k in decay], "weight_decay": weight_decay, "lr": lr, "name": name},
        {"params": [p for k, p in named if k not in decay], "weight_decay": 0.0, "lr": lr, "name": name},
    ]


def agent_param_groups(team: nn.Module, args: Any, decay: set[str]) -> list[dict]:
    """The agents' parameter groups: `agent_{i}` at agent i's learning rate (`agent_learning_rate`), the parameters
    in `decay` (names in the team) at `args.weight_decay`."""
    groups: list[dict] = []
    for i in range(team.num_agents):
        lr = agent_learning_rate(args, i)
        groups += decay_groups(team.agent_named_parameters(i), decay, args.weight_decay, lr, f"agent_{i + 1}")
    return groups


def clip_agents_each(trainer: Any) -> torch.Tensor:
    """`MultiAgentTrainer._clip_grad_norm` where no engine clips: unscale once (mixed precision), then clip each
    agent's gradient, and each of `trainer._extra_clip_groups()` (critics, value heads), by its OWN norm to
    `max_grad_norm` (`clip_each`), so one module's large gradient never shrinks another's update (each agent's loss
    touches only its own parameters: per-agent updates stay separate). Returns the pre-clip norm of all of them
    together, as transformers logs it."""
    team = trainer.team
    trainer.accelerator.unscale_gradients()  # once, before any clipping (mixed precision)
    groups = [[p for _, p in team.agent_named_parameters(i)] for i in range(team.num_agents)]
    return clip_each(groups + trainer._extra_clip_groups(), trainer.args.max_grad_norm)


def clip_each(groups: Sequence[Sequence[torch.nn.Parameter]], max_norm: float) -> torch.Tensor:
    """Clip each parameter set's gradient by its OWN norm to `max_norm`; returns the pre-clip norm of them all
    together (what transformers logs as `grad_norm`)."""
    norms = []
    for params in groups:
        params = [p for p in params if p.grad is not None]
        if params:
            norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm).float().cpu())
    return torch.stack(norms).norm() if norms else torch.tensor(0.0)
