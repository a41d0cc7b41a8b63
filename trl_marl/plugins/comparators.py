"""The built-in comparators of iterative preference training (entry-point group `trl_marl.comparators`).

| name | the other side of every comparison | options (`comparator_kwargs`) |
|---|---|---|
| `current` | the live agents, sampled from the trainer's separate `"comparator"` random stream (checkpointed) | `LocalComparatorOptions` |
| `current_copy` | a frozen copy of the agents on `devices`, refreshed each round (the live agents when the devices are the agents') | `CurrentCopyComparatorOptions` |
| `model` | fixed models: `model_name` (one id for every agent) or `agents` (one per agent), loaded once, frozen | `ModelComparatorOptions` |
| `history` | the agents as they were `k` rounds back (the oldest snapshot while fewer exist), loaded once per round | `HistoryComparatorOptions` |
| `api` | a remote model (`trl_marl.plugins.api_clients`) | `APIComparatorOptions` |

Each is built as `ComparatorClass(args, **comparator_kwargs)`; its options are the fields of its `options_class`
(`trl_marl.plugins.comparator_options`), checked when the config is built. With `generation_mode="centralized"` ONE
comparator model (`centralized_agent_index`) writes all roles' responses as one tagged joint completion, parsed back
into roles; a candidate that fails to parse is dropped (`None` in its slot) and counted in `parse_failures`, never
silently emptied.

Each class follows `trl_marl.plugins.comparators_protocol.Comparator`.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trl_marl.data_types.text import CompletionText, PromptText
from trl_marl.models.loading import ended_with_eos, eos_token_ids
from trl_marl.plugins.comparator_options import (
    APIComparatorOptions,
    CurrentCopyComparatorOptions,
    HistoryComparatorOptions,
    LocalComparatorOptions,
    ModelComparatorOptions,
    build_options,
)
from trl_marl.rollout.centralized import CentralizedParseError, TaggedCentralizedAdapter

__all__ = [
    "ModelComparator",
    "CurrentComparator",
    "CurrentCopyComparator",
    "FixedModelComparator",
    "HistoryComparator",
    "APIComparator",
]

logger = logging.getLogger(__name__)


def parse_joint_completions(adapter, texts: Sequence[str], num_items: int, num_candidates: int):
    """Split centralized joint completions (item-major, `num_candidates` per item) into role outputs; a completion
    that does not parse becomes `None` (dropped, not emptied). Returns `(joint, number of parse failures)`."""
    joint: list[list[list[str] | None]] = []
    failures = 0
    for b in range(num_items):
        row = []
        for c in range(num_candidates):
            try:
                row.append(adapter.parse_completion(texts[b * num_candidates + c]))
            except CentralizedParseError:
                failures += 1
                row.append(None)
        joint.append(row)
    return joint, failures


class ModelComparator:
    """Shared machinery of the comparators that sample local models: decentralized or centralized generation.

    Built as `Class(args, **options)`, the options being the fields of `options_class`. Subclasses provide
    `models(trainer) -> (models, tokenizers)` (one per agent) and may override `sample`.
    """

    name = "model-base"
    options_class: type[LocalComparatorOptions] = LocalComparatorOptions

    def __init__(self, args: Any, **options: Any):
        self.options = build_options(self.options_class, self.name, options)
        self.options.check_team(args.num_agents)
        self.args = args
        self.centralized = self.options.generation_mode == "centralized"
        self.central_index = self.options.centralized_agent_index
        self.adapter = TaggedCentralizedAdapter(args.num_agents)
        self.parse_failures = 0

    def models(self, trainer) -> tuple[list[torch.nn.Module], list]:
        raise NotImplementedError

    def sample(self, trainer, models, tokenizers, prompts_per_agent, G: int):
        """Generation outputs per agent (or for the one centralized model)."""
        return trainer.generate_with(models, tokenizers, prompts_per_agent, G)

    def generate(
        self,
        items: Sequence[Mapping[str, Any]],
        prompts_per_agent: Sequence[Sequence[str]],
        num_candidates: int,
        trainer: Any,
    ) -> list[list[list[str] | None]]:
        models, tokenizers = self.models(trainer)
        B, n = len(items), len(prompts_per_agent)
        with torch.no_grad():
            if not self.centralized:
                outs = self.sample(trainer, models, tokenizers, [list(p) for p in prompts_per_agent], num_candidates)
                eos = [eos_token_ids(m, t) for m, t in zip(models, tokenizers)]

                def text(i: int, r: int) -> str:
                    # the text, how it ended (which EOS, or cut) and its exact ids, so the trainer scores exactly
                    # the generated tokens (trl_marl.models.loading.completion_token_ids)
                    if r >= len(outs[i].completion_ids):  # a sampler that reports texts only
                        return outs[i].texts[r]
                    ids = outs[i].completion_ids[r]
                    end = ended_with_eos(tokenizers[i], ids, eos[i])
                    return CompletionText(outs[i].texts[r], eos_token=end, token_ids=ids, tokenizer=tokenizers[i])

                return [
                    [[text(i, b * num_candidates + c) for i in range(n)] for c in range(num_candidates)]
                    for b in range(B)
                ]
            k = self.central_index
            joint_prompts = [
                PromptText(self.adapter.build_prompt(item, [prompts_per_agent[i][b] for i in range(n)]))
                for b, item in enumerate(items)
            ]
            out = self.sample(trainer, [models[k]], [tokenizers[k]], [joint_prompts], num_candidates)[0]
        joint, failures = parse_joint_completions(self.adapter, out.texts, B, num_candidates)
        self.parse_failures += failures
        return joint

    def state_dict(self) -> dict:
        return {"parse_failures": self.parse_failures}

    def load_state_dict(self, state: dict) -> None:
        self.parse_failures = int(state.get("parse_failures", 0))


class CurrentComparator(ModelComparator):
    """The live agents. The iterative trainers run every comparator's `generate` inside their `"comparator"` random
    stream (`trainer.rng_streams`, seeded from the seed and the round, checkpointed with the trainer), so the
    comparator's draws neither consume nor repeat the training rollouts' stream, on CPU and CUDA alike."""

    name = "current"

    def models(self, trainer):
        return list(trainer.team.agents), trainer.tokenizers

    def sample(self, trainer, models, tokenizers, prompts_per_agent, G):
        # the live agents may be sharded: as the trainer's own generation, no whole-team gather under ZeRO-3
        # (`generate_with` gathers one agent at a time; a team gather around it would nest two gathers of the same
        # parameters, which DeepSpeed refuses)
        with trainer.generation.unwrapped_team():
            return super().sample(trainer, models, tokenizers, prompts_per_agent, G)


class CurrentCopyComparator(CurrentComparator):
    """A frozen copy of the current agents on `devices`, refreshed at every collection phase. When the
    comparator devices are the agents' own (or unset) the live agents are used directly (no copy).

    Under DeepSpeed ZeRO-3 the live agents' parameters are partitioned across processes: the copy is then built from
    their GATHERED weights (`deepspeed.zero.GatheredParameters`, on every process) as a plain, full model, whenever
    `devices` is given (even on the agents' own device), so the comparator samples without re-gathering."""

    name = "current_copy"
    options_class = CurrentCopyComparatorOptions

    def __init__(self, args: Any, **options: Any):
        super().__init__(args, **options)
        self.devices = list(self.options.devices or [])
        self._copies: list[torch.nn.Module] | None = None

    def _device(self, i: int) -> str | None:
        if not self.devices:
            return None
        return self.devices[0] if len(self.devices) == 1 else self.devices[i]

    def prepare(self, trainer, iteration: int) -> None:
        live = list(trainer.team.agents)
        sharded = _zero3_partitioned(live)
        same = all(
            self._device(i) is None or torch.device(self._device(i)) == next(a.parameters()).device
            for i, a in enumerate(live)
        )
        if same and not (sharded and self.devices):
            self._copies = None
            return
        states = [full_state_dict(a) for a in live]  # collective under ZeRO-3: every process gathers
        if self._copies is None:
            self._copies = [
                _fresh_copy(a, state, self._device(i)) if sharded else copy.deepcopy(a).to(self._device(i))
                for i, (a, state) in enumerate(zip(live, states))
            ]
            self._copies = [c.eval().requires_grad_(False) for c in self._copies]
        else:
            for i, (dst, state) in enumerate(zip(self._copies, states)):
                dst.load_state_dict({k: v.to(self._device(i)) for k, v in state.items()})

    def models(self, trainer):
        if self._copies is None:
            return list(trainer.team.agents), trainer.tokenizers
        return self._copies, trainer.tokenizers

    def sample(self, trainer, models, tokenizers, prompts_per_agent, G):
        if self._copies is None:  # the live agents (gathered for generation under ZeRO-3)
            return super().sample(trainer, models, tokenizers, prompts_per_agent, G)
        return ModelComparator.sample(self, trainer, models, tokenizers, prompts_per_agent, G)

    def close(self) -> None:
        self._copies = None


def _zero3_partitioned(modules: Sequence[torch.nn.Module]) -> bool:
    """Whether any parameter is a DeepSpeed ZeRO-3 partition (it carries `ds_id`)."""
    return any(hasattr(p, "ds_id") for m in modules for p in m.parameters())


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's full weights as CPU tensors; ZeRO-3 partitioned parameters are gathered first (a collective:
    every process must call it)."""
    params = [p for p in module.parameters() if hasattr(p, "ds_id")]
    if not params:
        return {k: v.detach().clone() for k, v in module.state_dict().items()}
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        return {k: v.detach().clone().cpu() for k, v in module.state_dict().items()}


def _fresh_copy(agent: torch.nn.Module, state: dict[str, torch.Tensor], device: Any) -> torch.nn.Module:
    """A plain (unpartitioned) model of `agent`'s class and config holding `state`. Built with the class constructor,
    which, unlike `from_pretrained` / `from_config`, never enters DeepSpeed's `zero.Init`."""
    config = getattr(agent, "config", None)
    if config is None or not hasattr(agent, "generation_config"):
        raise ValueError(
            "comparator_policy='current_copy' under ZeRO-3 copies transformers models; this agent is a "
            f"{type(agent).__name__} (use comparator_policy='current', which samples the live agents)"
        )
    model = type(agent)(copy.deepcopy(config))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    bad = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")] + list(unexpected)
    if bad:
        raise RuntimeError(f"current_copy: the gathered weights do not fit a fresh {type(agent).__name__}: {bad}")
    model.generation_config = copy.deepcopy(agent.generation_config)
    return model.to(device if device is not None else "cpu")


def _load_causal_lm(source: Any, device: Any):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(source, (str, os.PathLike)):
        model = AutoModelForCausalLM.from_pretrained(str(source))
        tok = AutoTokenizer.from_pretrained(str(source))
    else:
        model, tok = source, None
    if tok is not None and tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = model.eval().requires_grad_(False)
    if device is not None:
        model.to(device)
    return model, tok


class FixedModelComparator(ModelComparator):
    """Fixed comparator models: `model_name` (one id or path, loaded once for every agent) or `agents` (one id /
    path per agent), loaded once on first use, frozen, on `devices` (or the trainer's device). Hub repositories and
    local checkpoints both work."""

    name = "model"
    options_class = ModelComparatorOptions

    def __init__(self, args: Any, **options: Any):
        super().__init__(args, **options)
        o = self.options
        self.sources = list(o.agents) if o.agents else [o.model_name] * args.num_agents
        self.devices = list(o.devices or [])
        self._models: list | None = None
        self._tokenizers: list | None = None

    def models(self, trainer):
        if self._models is None:
            cache: dict[str, tuple] = {}
            models, toks = [], []
            for i, src in enumerate(self.sources):
                dev = (
                    (self.devices[0] if len(self.devices) == 1 else self.devices[i])
                    if self.devices
                    else trainer.accelerator.device
                )
                key = f"{src}@{dev}"
                if key not in cache:
                    cache[key] = _load_causal_lm(src, dev)
                model, tok = cache[key]
                models.append(model)
                toks.append(tok if tok is not None else trainer.tokenizers[i])
            self._models, self._tokenizers = models, toks
        return self._models, self._tokenizers

    def close(self) -> None:
        self._models = self._tokenizers = None


class HistoryComparator(CurrentComparator):
    """The agents as they were `k` rounds back (default 1: the previous round's policy; the initial policy while
    fewer rounds exist). The trainer saves a policy snapshot at the start of every round (`needs_policy_history`);
    the comparator loads the right one ONCE per round (in `prepare`), not per item."""

    name = "history"
    options_class = HistoryComparatorOptions
    needs_policy_history = True

    def __init__(self, args: Any, **options: Any):
        super().__init__(args, **options)
        self.k = int(self.options.k)
        self.devices = list(self.options.devices or [])
        self._models: list | None = None
        self.loaded_from: str | None = None

    def snapshot_for(self, trainer, iteration: int) -> str:
        """The snapshot folder used in round `iteration`: round `iteration - k`'s, or the oldest one."""
        wanted = max(iteration - self.k, 0)  # snapshot r = the policy after round r (0 = the initial policy)
        snapshots = trainer.rounds.policy_snapshots
        available = sorted(snapshots)
        older = [r for r in available if r <= wanted]
        r = older[-1] if older else available[0]
        return snapshots[r]

    def prepare(self, trainer, iteration: int) -> None:
        path = self.snapshot_for(trainer, iteration)
        if path == self.loaded_from and self._models is not None:
            return
        from transformers import AutoModelForCausalLM

        models = []
        for i in range(trainer.num_agents):
            dev = (
                (self.devices[0] if len(self.devices) == 1 else self.devices[i])
                if self.devices
                else trainer.agent_device(i)
            )
            m = AutoModelForCausalLM.from_pretrained(os.path.join(path, f"agent_{i + 1}")).eval()
            models.append(m.requires_grad_(False).to(dev))
        self._models, self.loaded_from = models, path

    def models(self, trainer):
        if self._models is None:
            raise RuntimeError("the history comparator was not prepared for this round")
        return self._models, trainer.tokenizers

    def close(self) -> None:
        self._models = None


class APIComparator:
    """A remote model behind an HTTP API (options: `APIComparatorOptions`; see `trl_marl.plugins.api_clients`). Keys
    come from the environment variable named by the `key_env` option only.

    A candidate in which some agent's completion came back empty (the API returned no text: a refusal, a filtered
    or tool-call-only answer) is dropped (`None` in its slot, never compared) and counted in `empty_completions`,
    with a warning per `generate` call that drops any."""

    name = "api"
    options_class = APIComparatorOptions

    def __init__(self, args: Any, **options: Any):
        from trl_marl.plugins.api_clients import APIClient

        self.options = build_options(self.options_class, self.name, options)
        self.centralized = self.options.generation_mode == "centralized"
        self.adapter = TaggedCentralizedAdapter(args.num_agents)
        self.client = APIClient(self.options.client_config())
        self.parse_failures = 0
        self.empty_completions = 0

    def generate(self, items, prompts_per_agent, num_candidates, trainer):
        a = trainer.args
        gen = {
            "max_new_tokens": a.max_completion_length,
            "temperature": a.temperature,
            "top_p": a.top_p,
            "top_k": a.top_k,
        }
        B, n = len(items), len(prompts_per_agent)
        if not self.centralized:
            prompts = [str(prompts_per_agent[i][b]) for i in range(n) for b in range(B)]
            out = self.client.generate(
                prompts,
                num_candidates,
                agent_indices=[i for i in range(n) for _ in range(B)],
                items=[items[b] for _ in range(n) for b in range(B)],
                **gen,
            )
            return self._without_empty(
                [[[out[i * B + b][c] for i in range(n)] for c in range(num_candidates)] for b in range(B)]
            )
        prompts = [
            self.adapter.build_prompt(item, [str(prompts_per_agent[i][b]) for i in range(n)])
            for b, item in enumerate(items)
        ]
        out = self.client.generate(prompts, num_candidates, items=list(items), **gen)
        joint, failures = parse_joint_completions(self.adapter, [t for row in out for t in row], B, num_candidates)
        self.parse_failures += failures
        return self._without_empty(joint)

    def _without_empty(self, joint: list[list[list[str] | None]]) -> list[list[list[str] | None]]:
        """`joint` with every candidate that holds an empty completion dropped (`None`), counted and logged."""
        dropped = 0
        for row in joint:
            for c, candidate in enumerate(row):
                if candidate is not None and any(text == "" for text in candidate):
                    row[c] = None
                    dropped += 1
        if dropped:
            self.empty_completions += dropped
            logger.warning(
                "api comparator: dropped %d joint candidate(s) with an empty completion (the API returned no text); "
                "%d so far",
                dropped,
                self.empty_completions,
            )
        return joint

    def state_dict(self) -> dict:
        return {"parse_failures": self.parse_failures, "empty_completions": self.empty_completions}

    def load_state_dict(self, state: dict) -> None:
        self.parse_failures = int(state.get("parse_failures", 0))
        self.empty_completions = int(state.get("empty_completions", 0))

    def close(self) -> None:
        self.client.close()
