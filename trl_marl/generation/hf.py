"""Generation with transformers' `generate` (the default engine).

One `generate` call per agent covers all its prompts (prompt-major rows); a team of LoRA adapters on one shared base
(`share_base_model=True`) makes ONE call for every agent's rows, each row with its agent's adapter (PEFT's mixed
adapter batches). Under ZeRO-3 and FSDP2 the full parameters of ONE agent at a time are gathered, for its whole call,
and the call runs with transformers' `synced_gpus` (a collective: every process runs it until the longest is done; a
process with no prompts decodes a discarded placeholder row, greedily, so it draws nothing from its random stream).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig
from trl.models.utils import unwrap_model_for_generation

from trl_marl.algorithms.logprobs import completion_mask
from trl_marl.data_types.rollout import GenerationOutput
from trl_marl.data_types.text import PromptText
from trl_marl.distributed.collective import is_sharded
from trl_marl.distributed.fsdp import gathered_for_generation, is_fsdp2
from trl_marl.distributed.zero3 import gathered as zero3_gathered
from trl_marl.distributed.zero3 import hooks_removed, is_zero3
from trl_marl.generation.engine import GenerationEngine, SamplingSettings, prompt_token_ids
from trl_marl.models.adapters import mixed_adapter_generate
from trl_marl.models.loading import eos_token_ids
from trl_marl.models.scoring import cache_argument, is_dynamic_cache

__all__ = ["HFGeneration"]

logger = logging.getLogger(__name__)


def past_the_context(model: nn.Module, prompt_tokens: int, max_new_tokens: int) -> int | None:
    """`max_position_embeddings` of `model` when `prompt_tokens + max_new_tokens` go past it, else None (also for a
    model that states no limit). Past it a model with learned positions fails inside its forward, and one with
    rotary positions samples from positions it never saw."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    limit = getattr(config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and prompt_tokens + max_new_tokens > limit else None


class HFGeneration(GenerationEngine):
    """Samples with `model.generate` (see the module docstring).

    Args:
        accelerator: the trainer's accelerator (processes, ZeRO-3 / FSDP2).
        team: returns the model the accelerator prepared (the team module, or the engine wrapping it); called at
            each generation, since the Trainer wraps the team when training starts.
        tokenizers: one per agent.
        eos_ids: the EOS token ids of each agent.
        sampling: the sampling settings: one for every agent, or one per agent (agent i samples, and a model given
            to `generate_with` in place of agent i samples, with `sampling[i]`).
        parallel_agents: run the agents' `generate` calls in one thread each (agents placed on different devices,
            `parallel_training="mp"`); tokenizing and decoding stay on the calling thread.
    """

    def __init__(
        self,
        accelerator: Any,
        team: Callable[[], nn.Module],
        tokenizers: Sequence[Any],
        eos_ids: Sequence[list[int]],
        sampling: SamplingSettings | Sequence[SamplingSettings],
        parallel_agents: bool = False,
    ):
        self.accelerator = accelerator
        self._team = team
        self.tokenizers = list(tokenizers)
        self.eos_ids = list(eos_ids)
        self.agent_sampling = [sampling] if isinstance(sampling, SamplingSettings) else list(sampling)
        self.parallel_agents = parallel_agents
        self._past_context_told: set[int] = set()  # agents already warned of prompts past their context

    def _warn_past_context(self, model: nn.Module, agent: int, prompt_tokens: int) -> None:
        """Once per agent: its longest prompt and `max_completion_length` go past the model's context; TRL's cure is
        `max_prompt_length` (prompts keep their last tokens)."""
        s = self.agent_settings(agent)
        limit = past_the_context(model, prompt_tokens, s.max_completion_length)
        if limit is None or agent in self._past_context_told:
            return
        self._past_context_told.add(agent)
        logger.warning(
            "agent %d: a prompt of %d tokens plus max_completion_length=%d goes past the model's "
            "max_position_embeddings=%d (a model with learned positions fails there); set max_prompt_length (the "
            "prompt's last tokens are kept) to at most %d",
            agent + 1,
            prompt_tokens,
            s.max_completion_length,
            limit,
            limit - s.max_completion_length,
        )

    @property
    def team(self) -> nn.Module:
        """The team module, unwrapped from the engine the accelerator built."""
        return self.accelerator.unwrap_model(self._team())

    @property
    def sampling(self) -> SamplingSettings:
        """The first agent's sampling settings (every agent's `max_prompt_length`)."""
        return self.agent_sampling[0]

    def agent_settings(self, i: int) -> SamplingSettings:
        """Agent i's sampling settings."""
        return self.agent_sampling[i if len(self.agent_sampling) > 1 else 0]

    @property
    def zero3(self) -> bool:
        return is_zero3(self.accelerator)

    @property
    def collective(self) -> bool:
        return self.accelerator.num_processes > 1 and (self.zero3 or is_fsdp2(self.accelerator))

    @contextmanager
    def unwrapped_team(self) -> Iterator[nn.Module]:
        wrapped = self._team()
        zero3 = self.zero3
        # ZeRO-3: no whole-team gather; each agent is gathered for its own call (`generate_with`)
        with (
            unwrap_model_for_generation(wrapped, self.accelerator, gather_deepspeed3_params=not zero3) as team,
            hooks_removed(wrapped) if zero3 else nullcontext(),
        ):
            yield team

    @torch.no_grad()
    def generate(
        self, prompts_per_agent: Sequence[Sequence[PromptText]], num_generations: int, greedy: bool = False
    ) -> list[GenerationOutput]:
        with self.unwrapped_team() as team:
            if team.shared_base:
                return self._generate_shared(team, prompts_per_agent, num_generations, greedy)
            return self.generate_with(
                list(team.agents), self.tokenizers, prompts_per_agent, num_generations, self.eos_ids, greedy
            )

    def generate_with(
        self,
        models: Sequence[nn.Module],
        tokenizers: Sequence[Any],
        prompts_per_agent: Sequence[Sequence[PromptText]],
        num_generations: int,
        eos_ids: Sequence[list[int]] | None = None,
        greedy: bool = False,
    ) -> list[GenerationOutput]:
        if eos_ids is None:
            eos_ids = [eos_token_ids(m, t) for m, t in zip(models, tokenizers)]
        G = num_generations
        encoded = [self._encode(tok, prompts) for tok, prompts in zip(tokenizers, prompts_per_agent)]
        for i, (ids, _) in enumerate(encoded):
            if ids.numel():
                self._warn_past_context(models[i], i, ids.shape[1])
        configs = [self.generation_config(tokenizers[i], eos_ids[i], G, greedy, i) for i in range(len(models))]
        # a sharded agent's generate is a collective (transformers' `synced_gpus`, as TRL generates under ZeRO-3 /
        # FSDP): every process runs it until the longest is done; one without prompts decodes a placeholder
        synced = [self.collective and is_sharded(m) for m in models]

        def run(i: int) -> torch.Tensor:
            if prompts_per_agent[i] is None:  # takes no part in this call, on any process
                return torch.zeros(0, 0, dtype=torch.long)
            with self._gathered(models[i]):  # this agent only, for the whole generate call
                if len(prompts_per_agent[i]):
                    return _generate(models[i], *encoded[i], configs[i], synced[i])
                if synced[i]:  # no prompts here (trl_marl.distributed.collective): greedy (no random draw), discarded
                    ids = torch.full((1, 1), tokenizers[i].pad_token_id, dtype=torch.long)
                    placeholder = self.generation_config(tokenizers[i], eos_ids[i], 1, True, i)
                    _generate(models[i], ids, torch.ones_like(ids), placeholder, True)
                return torch.zeros(0, 0, dtype=torch.long)

        if self.parallel_agents and len(models) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=len(models)) as pool:
                completions = list(pool.map(run, range(len(models))))
        else:
            completions = [run(i) for i in range(len(models))]
        return [_decode(tokenizers[i], encoded[i], completions[i], eos_ids[i], G) for i in range(len(models))]

    def generation_config(
        self, tokenizer: Any, eos_ids: list[int], num_return_sequences: int = 1, greedy: bool = False, agent: int = 0
    ):
        """transformers' `GenerationConfig` of one call: agent `agent`'s sampling settings (its
        `generation_kwargs` override the others, as in TRL), or greedy decoding at its length."""
        s = self.agent_settings(agent)
        kwargs: dict[str, Any] = {}
        if not greedy:
            kwargs = {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k or 0}
            if s.min_p is not None:
                kwargs["min_p"] = s.min_p
            if s.repetition_penalty != 1.0:
                kwargs["repetition_penalty"] = s.repetition_penalty
            kwargs.update(s.generation_kwargs or {})
        return GenerationConfig(
            **{
                "num_return_sequences": num_return_sequences,
                "do_sample": not greedy,
                "max_new_tokens": s.max_completion_length,  # transformers' name
                "pad_token_id": tokenizer.pad_token_id,
                "eos_token_id": eos_ids,
                "use_cache": True,
                **kwargs,
            }
        )

    def _generate_shared(
        self, team: nn.Module, prompts_per_agent: Sequence[Sequence[PromptText]], G: int, greedy: bool = False
    ) -> list[GenerationOutput]:
        """Shared-base team: ONE `generate` call for the rows of every agent, each row with its agent's adapter (one
        call per group of agents with equal sampling settings when they differ per agent)."""
        per_agent = [GenerationOutput([], [], []) for _ in prompts_per_agent]
        groups: list[list[int]] = []
        for i in range(len(prompts_per_agent)):
            same = next((g for g in groups if self.agent_settings(g[0]) == self.agent_settings(i)), None)
            if same is None:
                groups.append([i])
            else:
                same.append(i)
        for agents in groups:  # the same groups on every process: each call is a collective when sharded
            if all(prompts_per_agent[i] is None for i in agents):  # none of them takes part, on any process
                continue
            self._generate_shared_group(team, prompts_per_agent, G, greedy, agents, per_agent)
        return per_agent

    def _generate_shared_group(
        self,
        team: nn.Module,
        prompts_per_agent: Sequence[Sequence[PromptText]],
        G: int,
        greedy: bool,
        agents: list[int],
        per_agent: list[GenerationOutput],
    ) -> None:
        """One mixed-adapter `generate` call for `agents` (equal sampling settings); fills their `per_agent` rows."""
        from trl.trainer.utils import pad

        cut = self.sampling.max_prompt_length
        rows, owners = [], []
        for i in agents:
            for ids in prompt_token_ids(self.tokenizers[i], prompts_per_agent[i] or [], cut):
                rows += [torch.tensor(ids, dtype=torch.long)] * G
                owners += [i] * G
        base = team.shared
        # a sharded base's generate is a collective (see generate_with): with no rows, a placeholder row, greedy
        synced = self.collective and is_sharded(base)
        if not rows and not synced:
            return
        pad_id = self.tokenizers[0].pad_token_id
        placeholder = not rows
        if placeholder:
            rows, owners = [torch.tensor([pad_id], dtype=torch.long)], [agents[0]]
        input_ids = pad(rows, pad_id, padding_side="left")
        mask = pad([torch.ones_like(r) for r in rows], 0, padding_side="left")
        if not placeholder:
            for i in agents:
                longest = max((len(r) for r, owner in zip(rows, owners) if owner == i), default=0)
                if longest:
                    self._warn_past_context(team.shared, i, longest)
        device = next(team.agents[0].parameters()).device
        was_training = base.training
        base.eval()
        try:
            with self._gathered(base):
                out = mixed_adapter_generate(
                    base,
                    input_ids.to(device),
                    mask.to(device),
                    [team.agents[i].adapter for i in owners],
                    self.generation_config(self.tokenizers[0], self.eos_ids[0], 1, greedy or placeholder, agents[0]),
                    synced_gpus=synced,
                )
        finally:
            base.train(was_training)
        if placeholder:
            return
        completions = out[:, input_ids.shape[1] :].cpu()
        lengths = completion_mask(completions, self.eos_ids[0]).sum(dim=1).tolist()
        comp_ids = [completions[r, : lengths[r]] for r in range(len(rows))]
        texts = self.tokenizers[0].batch_decode([c.tolist() for c in comp_ids], skip_special_tokens=True)
        for r, i in enumerate(owners):
            per_agent[i].texts.append(texts[r])
            per_agent[i].prompt_ids.append(rows[r])
            per_agent[i].completion_ids.append(comp_ids[r])

    def _gathered(self, model: nn.Module):
        """The full parameters of `model` (one agent) for its `generate` call under FSDP2 / ZeRO-3; else nothing."""
        if is_fsdp2(self.accelerator):
            return gathered_for_generation(model, self._team())
        if self.zero3:
            return zero3_gathered(model)
        return nullcontext()

    def _encode(self, tokenizer: Any, prompts: Sequence[PromptText] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and mask (`prompt_token_ids`: a prompt's own ids, else its tokens)."""
        rows = prompt_token_ids(tokenizer, prompts or [], self.sampling.max_prompt_length)
        if not rows:
            return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.long)
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            if row:
                ids[r, width - len(row) :] = torch.tensor(row, dtype=torch.long)
                mask[r, width - len(row) :] = 1
        return ids, mask


def _generate(
    model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, config: GenerationConfig, synced: bool
) -> torch.Tensor:
    """The completion ids (on the CPU) of one `generate` call, the model in eval mode for it: transformers'
    generation is ~25% faster on small models than in train mode, and sampling must not depend on the train/eval
    state anyway (dropout is disabled). Several samples per prompt share one prefill (`_shared_prefill`)."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        kwargs: dict[str, Any] = {}
        if config.num_return_sequences > 1 and ids.shape[1] > 1 and not synced:
            kwargs = _shared_prefill(model, ids, mask, config.num_return_sequences)
        if kwargs:
            G = config.num_return_sequences
            config = copy.copy(config)
            config.num_return_sequences = 1
            ids, mask = ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0)
        out = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=config, synced_gpus=synced, **kwargs
        )
        return out[:, ids.shape[1] :].cpu()
    finally:
        model.train(was_training)


def _shared_prefill(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, G: int) -> dict[str, Any]:
    """The KV cache of every prompt but its last token, computed once per prompt and repeated for its `G` samples
    (transformers' `generate` with `num_return_sequences=G` repeats the prompts first and prefills each copy). Passed
    to `generate` with the prompts repeated, it decodes from the last prompt token on: the same samples, for 1/G of
    the prefill. Position ids as `generate` computes them for left-padded prompts. `{}` when the model's cache is not
    transformers' dynamic cache (`generate` then prefills as usual)."""
    position_ids = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    name = cache_argument()
    out = model(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=position_ids[:, :-1],
        use_cache=True,
        logits_to_keep=1,
    )
    cache = getattr(out, name, None)
    if not is_dynamic_cache(cache):
        return {}
    cache.batch_repeat_interleave(G)
    return {name: cache}


def _decode(
    tokenizer: Any, encoded: tuple[torch.Tensor, torch.Tensor], completions: torch.Tensor, eos_ids: list[int], G: int
) -> GenerationOutput:
    """Completions cut after their first EOS, their text, and each row's prompt ids."""
    if completions.shape[0] == 0:  # no prompts
        return GenerationOutput([], [], [])
    ids, mask = encoded
    lengths = completion_mask(completions, eos_ids).sum(dim=1).tolist()
    comp_ids = [completions[r, : lengths[r]] for r in range(completions.shape[0])]
    prompt_rows = [ids[p][mask[p].bool()] for p in range(ids.shape[0])]
    texts = tokenizer.batch_decode([c.tolist() for c in comp_ids], skip_special_tokens=True)
    return GenerationOutput(texts, [prompt_rows[r // G] for r in range(len(comp_ids))], comp_ids)
