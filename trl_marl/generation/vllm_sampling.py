"""What the two vLLM engines share, colocated (`vllm_backend.VLLMTeamGeneration`) or served
(`vllm_server_engine.VLLMServerGeneration`): prompts in as token ids, one seed per prompt, completions out cut after
their first EOS with vLLM's sampled log-probs, and the log-prob gap metric.

**Seeds.** Every sampled prompt carries a seed of its own (`vllm_protocol.prompt_seeds`: the call's base seed plus
`r * n` for prompt r; vLLM gives the j-th of its n samples seed + j), and the base seed of each agent's call is drawn
from the global torch RNG, which the trainer sets to its `"rollout"` stream for training rollouts
(`trl_marl.data_types.rng`); a colocated engine's own draws from that generator (it makes some while it syncs and
samples) are kept out of the stream (`torch.random.fork_rng`). What an agent samples then depends only on its
weights, its prompts and the trainer's stream: not on the engine's history, not on which engine samples (a colocated one or a server, restarted or not),
not on what else the engine serves. So a run with a server samples what a colocated run samples for the same seed,
and a resumed run samples what the uninterrupted one did. (vLLM applies a per-request generator row by row, a
small cost per decoding step.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trl_marl.data_types.rollout import GenerationOutput
from trl_marl.data_types.text import PromptText
from trl_marl.generation.engine import GenerationEngine, prompt_token_ids

if TYPE_CHECKING:
    from trl_marl.generation.hf import HFGeneration

__all__ = ["SampledRow", "VLLMSampling", "draw_seed"]

# One sampled completion as an engine returns it: its token ids (possibly past the first EOS) and, when asked for, the
# log-prob of each (None where the engine did not score a token).
SampledRow = tuple[list[int], list[float | None] | None]


def draw_seed() -> int:
    """A base seed for one agent's sampling call, drawn from the global torch RNG (the trainer's `"rollout"` stream
    during training rollouts)."""
    return int(torch.randint(0, 2**31 - 1, (1,)).item())


class VLLMSampling(GenerationEngine):
    """The part of a vLLM engine that does not depend on where vLLM runs.

    Subclasses implement `_ensure_current` (the engines hold the current weights before sampling) and `_sample` (the
    raw rows of every agent); `generate` does the rest. Other models than the team's agents (a comparator's) sample
    with the transformers engine this one wraps.

    Args:
        transformers_engine: the trainer's `HFGeneration` (accelerator, team, tokenizers, EOS ids).
        args: the trainer config (sampling settings, `logging_*`).
        policy_version: returns the trainer's `global_step`; the engines are re-synced when it moved.
        record_metric: `record_metric(name, value)` adds a training metric (the log-prob gap).

    Attributes (for benchmarks): `generate_seconds` (sampling calls), `gap_seconds` (the trainer-side scoring of the
    log-prob gap metric), `sync_seconds` / `num_syncs` (weight pushes).
    """

    def __init__(
        self,
        transformers_engine: HFGeneration,
        args: Any,
        policy_version: Callable[[], int],
        record_metric: Callable[[str, float], None],
    ):
        self.transformers = transformers_engine
        self.args = args
        self.accelerator = transformers_engine.accelerator
        self.tokenizers, self.eos_ids = transformers_engine.tokenizers, transformers_engine.eos_ids
        self._policy_version = policy_version
        self._record_metric = record_metric
        self.num_agents = self.team.num_agents
        self.generate_seconds = 0.0
        self.gap_seconds = 0.0
        self.sync_seconds = 0.0
        self.num_syncs = 0
        # every training rollout returns vLLM's sampled log-probs (a trainer's importance-sampling correction needs
        # them); otherwise only rollouts whose step is logged do (the gap metric)
        self.keep_sampling_logprobs = False

    @property
    def team(self) -> nn.Module:
        return self.transformers.team

    @property
    def collective(self) -> bool:
        return self.transformers.collective

    def unwrapped_team(self) -> AbstractContextManager[nn.Module]:
        return self.transformers.unwrapped_team()

    def generate_with(
        self,
        models: Sequence[nn.Module],
        tokenizers: Sequence[Any],
        prompts_per_agent: Sequence[Sequence[PromptText]],
        num_generations: int,
        eos_ids: Sequence[list[int]] | None = None,
        greedy: bool = False,
    ) -> list[GenerationOutput]:
        """Other models than the team's agents sample with transformers (`HFGeneration.generate_with`)."""
        return self.transformers.generate_with(models, tokenizers, prompts_per_agent, num_generations, eos_ids, greedy)

    # ------------------------------------------------------------------ what a subclass provides
    def _ensure_current(self) -> None:
        """Make the engines hold the agents' current weights (push them when the optimizer stepped)."""
        raise NotImplementedError

    def _sample(
        self,
        prompt_ids: list[list[list[int]]],
        n: int,
        greedy: bool,
        logprobs: bool,
        seeds: list[int | None],
    ) -> list[list[SampledRow]]:
        """`n` rows per prompt for every agent (prompt-major), agent i's prompts `prompt_ids[i]` sampled from base seed
        `seeds[i]` (None: greedy)."""
        raise NotImplementedError

    def _after_generate(self) -> None:
        """Called after every sampling call (the colocated engines go back to sleep here)."""

    # ------------------------------------------------------------------ generation
    def sampling_settings(self, agent: int, greedy: bool) -> dict[str, Any]:
        """Agent `agent`'s sampling settings (`SamplingSettings`) as vLLM's `SamplingParams` names them (greedy:
        temperature 0); `generation_kwargs` override, as in TRL."""
        s = self.transformers.agent_settings(agent)
        common = {"max_tokens": s.max_completion_length}
        if greedy:
            return {"temperature": 0.0, **common}
        extra = {"min_p": s.min_p} if s.min_p is not None else {}
        extra.update(s.generation_kwargs or {})
        return {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k or 0,
            "repetition_penalty": s.repetition_penalty,
            **common,
            **extra,
        }

    def _prompt_ids(self, i: int, prompts: Sequence[PromptText] | None) -> list[list[int]]:
        """Agent i's prompts as `generate` tokenizes them (`prompt_token_ids`), left-cut to `max_prompt_length`; none
        for an agent that takes no part (None)."""
        return prompt_token_ids(self.tokenizers[i], prompts or [], self.args.max_prompt_length)

    @torch.no_grad()
    def generate(
        self, prompts_per_agent: Sequence[Sequence[PromptText] | None], num_generations: int, greedy: bool = False
    ) -> list[GenerationOutput]:
        """`num_generations` samples per prompt for every agent (greedy: one greedy decode), rows prompt-major, as
        the transformers engine returns them; each output also carries vLLM's per-token `sampling_logprobs`, except
        on a training rollout whose step will not be logged (there they would feed nothing: None)."""
        G = 1 if greedy else num_generations
        # vLLM's sampled log-probs feed only the gap metric: a training rollout whose step is not logged does not
        # ask for them (building them costs about 13% of a tiny model's generate call on CPU); other calls
        # (evaluation, a user's) still return them
        training = self.team.training and not greedy
        gap_metric = training and self._logging_rollout()
        want_logprobs = gap_metric or not training or self.keep_sampling_logprobs
        prompt_ids = [self._prompt_ids(i, p) for i, p in enumerate(prompts_per_agent)]
        seeds = [None if greedy else draw_seed() for _ in prompt_ids]
        # a colocated engine draws from the global CPU generator while it syncs and samples: the trainer's stream
        # must not depend on that (the next rollout's seeds would differ from a served run's)
        with torch.random.fork_rng(devices=[]):
            self._ensure_current()
            t0 = time.perf_counter()
            rows = self._sample(prompt_ids, G, greedy, want_logprobs, seeds)
            self.generate_seconds += time.perf_counter() - t0
        outputs = [self._to_output(i, prompt_ids[i], rows[i], G) for i in range(len(prompt_ids))]
        self._after_generate()
        # the gap metric costs one no-grad forward per agent: only on rollouts whose step will be logged
        if gap_metric:
            t1 = time.perf_counter()
            self._record_logprob_gap(outputs)
            self.gap_seconds += time.perf_counter() - t1
        return outputs

    def _logging_rollout(self) -> bool:
        """Whether the step this rollout feeds will be logged (`logging_steps` from the config: the Trainer's state
        holds it only once its loop runs, and collection phases sample before that)."""
        args = self.args
        every = args.logging_steps
        if str(getattr(args.logging_strategy, "value", args.logging_strategy)) != "steps" or not every or every < 1:
            return True
        return (self._policy_version() + 1) % int(every) == 0

    def _to_output(self, i: int, prompt_ids: list[list[int]], rows: list[SampledRow], n: int) -> GenerationOutput:
        """One agent's rows: completions cut after their first EOS, their text, prompt ids and vLLM's log-probs (NaN
        for a token vLLM did not score)."""
        eos = set(self.eos_ids[i])
        comp, prompts, logps = [], [], []
        scored = False
        for r, (tokens, lps) in enumerate(rows):
            end = next((k + 1 for k, t in enumerate(tokens) if t in eos), len(tokens))
            comp.append(torch.tensor(tokens[:end], dtype=torch.long))
            prompts.append(torch.tensor(prompt_ids[r // n], dtype=torch.long))
            lp = [math.nan] * end
            if lps is not None:
                scored = True
                lp = [math.nan if v is None else float(v) for v in lps[:end]]
            logps.append(torch.tensor(lp, dtype=torch.float32))
        texts = self.tokenizers[i].batch_decode([c.tolist() for c in comp], skip_special_tokens=True)
        return GenerationOutput(texts, prompts, comp, sampling_logprobs=logps if scored else None)

    def _record_logprob_gap(self, outputs: list[GenerationOutput]) -> None:
        """Log |trainer log-prob - vLLM sampled log-prob| over completion tokens (TRL's
        `sampling/sampling_logp_difference/{mean,max}`; NaN entries, tokens vLLM did not score, are left out)."""
        from trl_marl.data_types.batches import collate_agent_batch
        from trl_marl.models.team import agent_token_logprobs

        team = self.team
        means, maxes = [], []
        for i, out in enumerate(outputs):
            temperature = team.agent_temperature(i)
            pad_id = self.tokenizers[i].pad_token_id
            if not out.completion_ids or all(c.numel() == 0 for c in out.completion_ids):
                if self.collective:  # the forward is a collective (ZeRO-3 / FSDP2): take part in it
                    pad = torch.tensor([pad_id])
                    agent_token_logprobs(team.agents[i], collate_agent_batch([pad], [pad], pad_id), temperature)
                continue
            batch = collate_agent_batch(out.prompt_ids, out.completion_ids, pad_id)
            ours = agent_token_logprobs(team.agents[i], batch, temperature).float().cpu()
            theirs = torch.full_like(ours, math.nan)
            for r, lp in enumerate(out.sampling_logprobs or []):
                theirs[r, : lp.numel()] = lp
            mask = batch.completion_mask.bool() & ~torch.isnan(theirs)
            delta = (ours - theirs).abs()[mask]
            if delta.numel() == 0:
                continue
            means.append(delta.mean().item())
            maxes.append(delta.max().item())
            self._record_metric(f"agent_{i + 1}/sampling/sampling_logp_difference/mean", means[-1])
        if means:
            self._record_metric("sampling/sampling_logp_difference/mean", sum(means) / len(means))
            self._record_metric("sampling/sampling_logp_difference/max", max(maxes))
