"""TRL's GRPO loss family in a team trainer's step: what `GRPOTrainer` does around `_compute_loss`, per agent.

`GRPOLossStep` is the part of `MAGRPOTrainer` (and its siblings) that trains with `loss_type` set:

- `prepare`, once per generation, right after the rollout (TRL's `_generate_and_score_completions`): each agent's
  truncation flags, its scored-token count N over the whole generation batch (`dapo`/`cispo`/`vespo`), and, in one
  no-grad scoring pass per training step's chunk, the OLD log-probs (only when a step trains off the generating
  weights: `gradient_accumulation_steps` not a multiple of `steps_per_generation * num_iterations`, or vLLM's
  correction on, TRL's rule) and the REFERENCE log-probs (`beta > 0`), all at the agent's sampling temperature; with
  vLLM's correction, the importance-sampling ratio and TRL's `sampling/*` metrics. The scoring pass runs through the
  same team forward as the loss, so the ratio of the first step on the generating weights is exactly 1, as in TRL.
  (The logits of the generation pass are not reused: transformers' incremental decoding gives slightly different
  numbers than a full forward, which would put noise into every ratio, and keeping them costs B x T x V memory.)
- `loss`, every training step: one forward per agent (`TeamModel.forward`), `grpo_loss` on the agent's tokens with its
  own `GRPOLossSettings`, TRL's metrics under `agent_i/` and their team means under TRL's own names; on one process
  each agent's term is backpropagated before the next agent's forward (`trl_marl.trainers.agent_losses`).

The normalisers match TRL's with factor 1: the trainer divides the returned loss by the gradient-accumulation steps
(TRL's `_compute_loss` does it inside), so `grpo_loss` runs with `gradient_accumulation_steps=1` and `dapo`'s N is
`num_items / processes / steps_per_generation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainerCallback

from trl_marl.algorithms.grpo import (
    BatchTotals,
    dapo_normalizer,
    grpo_loss,
    truncated_completions,
    vllm_importance_sampling_metrics,
    vllm_importance_sampling_ratio,
)
from trl_marl.data_types.rollout import Node, Rollout, generated_tokens
from trl_marl.models.team import agent_token_logprobs
from trl_marl.trainers.agent_losses import sum_of_agent_losses
from trl_marl.trainers.per_agent import agent_values

__all__ = ["AgentGeneration", "GRPOLossStep", "ReferenceSyncCallback"]


@dataclass
class AgentGeneration:
    """What one agent's generation batch keeps for the training steps taken on it. Rows follow
    `Rollout.samples_of_agent(i)`: the samples of node `node` are rows `offsets[node] .. offsets[node] + G - 1`.

    Attributes:
        offsets: node id -> its first row.
        truncated: `(N,)` bool, completions cut at the agent's `max_completion_length` (no EOS at the end).
        num_tokens: the scored completion tokens of the whole generation batch over all processes (TRL's
            `num_items_in_batch`, truncated completions left out when they are masked).
        old_logps: `(N, C)` log-probs at generation (None: every step is on the generating weights).
        ref_logps: `(N, C)` reference log-probs (None without `beta`).
        sampling_logps: `(N, C)` vLLM's log-probs of the sampled tokens (NaN: not scored; None without vLLM's
            correction).
        is_ratio: vLLM's importance-sampling ratio, `(N, C)` or `(N, 1)` (None without the correction).
    """

    offsets: dict[int, int]
    truncated: torch.Tensor
    num_tokens: torch.Tensor
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    sampling_logps: torch.Tensor | None = None
    is_ratio: torch.Tensor | None = None

    def rows(self, nodes: Sequence[Node], G: int) -> torch.Tensor:
        """The rows of `nodes`' samples, in `Rollout.samples_of_agent(i, nodes)` order."""
        starts = torch.tensor([self.offsets[node.id] for node in nodes], dtype=torch.long)
        return (starts.unsqueeze(1) + torch.arange(G)).flatten()


class GRPOLossStep:
    """The loss-family part of a REINFORCE-family trainer (see the module docstring).

    Args:
        trainer: the trainer (a `MAGRPOTrainer` whose config has `loss_type` set).
    """

    def __init__(self, trainer: Any):
        args = trainer.args
        n = trainer.num_agents
        self.trainer = trainer
        self.settings = [args.loss_settings(i) for i in range(n)]
        self.mask_truncated = agent_values(args.mask_truncated_completions, n)
        self.vllm_correction = bool(args.use_vllm and args.vllm_importance_sampling_correction)
        if self.vllm_correction:  # the correction needs vLLM's sampled log-probs of every training rollout
            trainer.generation.keep_sampling_logprobs = True
        self.entropy_grad = any(s.entropy_coef != 0.0 for s in self.settings)

    @property
    def off_policy_steps(self) -> bool:
        """TRL's rule: old log-probs are kept when a step may train on weights that moved since generation
        (`gradient_accumulation_steps` not a multiple of `steps_per_generation * num_iterations`) or when vLLM
        sampled (its probabilities differ from the trainer's)."""
        a = self.trainer.args
        return a.gradient_accumulation_steps % (a.steps_per_rollout * a.num_iterations) != 0 or self.vllm_correction

    # ------------------------------------------------------------------ once per generation
    @torch.no_grad()
    def prepare(self, rollout: Rollout) -> list[AgentGeneration]:
        """Each agent's `AgentGeneration` for `rollout` (see the module docstring)."""
        t = self.trainer
        G, n = rollout.num_generations, t.num_agents
        generations = [self._flags(rollout, i) for i in range(n)]
        need_ref = [s.beta != 0.0 for s in self.settings]
        if self.off_policy_steps or any(need_ref):
            for chunk in t._update_chunks(len(rollout.items)):
                nodes = rollout.nodes_of_items(chunk)
                batches = [t.agent_batch(i, rollout.samples_of_agent(i, nodes)) for i in range(n)]
                old = t.model(batches)["logprobs"] if self.off_policy_steps else [None] * n
                for i, (gen, batch) in enumerate(zip(generations, batches)):
                    rows = gen.rows(nodes, G)
                    if old[i] is not None:
                        gen.old_logps = _scatter(gen.old_logps, rows, old[i], len(gen.truncated))
                    if need_ref[i]:
                        ref = agent_token_logprobs(t.reference_models[i], batch, t.team.agent_temperature(i))
                        gen.ref_logps = _scatter(gen.ref_logps, rows, ref, len(gen.truncated))
        if self.vllm_correction:
            for i, gen in enumerate(generations):
                self._vllm_ratio(rollout, i, gen)
        return generations

    def _flags(self, rollout: Rollout, i: int) -> AgentGeneration:
        """Agent i's row offsets, truncation flags and token count over the generation batch."""
        t = self.trainer
        offsets, row = {}, 0
        for node in rollout.nodes:
            if node.samples:
                offsets[node.id] = row
                row += len(node.samples[i])
        samples = rollout.samples_of_agent(i)
        lengths = torch.tensor([s.completion_ids.numel() for s in samples], dtype=torch.long)
        last = torch.tensor([int(s.completion_ids[-1]) if s.completion_ids.numel() else -1 for s in samples])
        ids, mask = last.unsqueeze(1), (lengths > 0).long().unsqueeze(1)
        truncated = truncated_completions(ids, mask, t.eos_ids[i], t.tokenizers[i].pad_token_id)
        # TRL's num_items_in_batch counts `completion_mask * tool_mask`: tool results inserted in a turn are not counted
        generated = torch.tensor([generated_tokens(s) for s in samples], dtype=torch.long)
        counted = generated * (~truncated).long() if self.mask_truncated[i] else generated
        tokens = counted.sum().to(torch.float32)
        if t.accelerator.num_processes > 1:
            tokens = t.accelerator.reduce(tokens.to(t.accelerator.device), reduction="sum").cpu()
        return AgentGeneration(offsets, truncated, tokens)

    def _vllm_ratio(self, rollout: Rollout, i: int, gen: AgentGeneration) -> None:
        """vLLM's importance-sampling ratio of agent i's tokens and TRL's `sampling/*` metrics (TRL computes both at
        generation)."""
        a = self.trainer.args
        samples = rollout.samples_of_agent(i)
        if gen.old_logps is None or any(s.sampling_logprobs is None for s in samples):
            raise RuntimeError(
                "vllm_importance_sampling_correction needs the engine's sampled log-probs of every completion"
            )
        C = gen.old_logps.shape[1]
        sampling = torch.full((len(samples), C), float("nan"))
        mask = torch.zeros(len(samples), C)
        for r, s in enumerate(samples):
            k = s.completion_ids.numel()
            sampling[r, :k] = s.sampling_logprobs[:k]
            # TRL's `completion_mask * tool_mask`: the tool results inserted in an agentic turn were not sampled
            mask[r, :k] = 1.0 if s.tool_mask is None else s.tool_mask[:k].float()
        if self.mask_truncated[i]:
            mask = mask * (~gen.truncated).unsqueeze(1)
        old = gen.old_logps.float().cpu()
        ratio = vllm_importance_sampling_ratio(
            old,
            sampling,
            mask,
            a.vllm_importance_sampling_mode,
            a.vllm_importance_sampling_clip_min,
            a.vllm_importance_sampling_clip_max,
        )
        gen.sampling_logps, gen.is_ratio = sampling, ratio
        metrics = vllm_importance_sampling_metrics(old, sampling, mask, ratio)
        self._record(i, {k: float(v) for k, v in metrics.items()})

    # ------------------------------------------------------------------ every training step
    def loss(
        self,
        model: torch.nn.Module,
        rollout: Rollout,
        nodes: Sequence[Node],
        advantages: Sequence[torch.Tensor],
        generations: Sequence[AgentGeneration],
    ) -> torch.Tensor:
        """The sum over agents of `grpo_loss` on `nodes`' samples (the training step's), each agent with its own
        settings, advantages (`(B_i,)`, `samples_of_agent` order) and generation data."""
        t = self.trainer
        G, n = rollout.num_generations, t.num_agents
        batches = [t.agent_batch(i, rollout.samples_of_agent(i, nodes)) for i in range(n)]
        processes, K = t.accelerator.num_processes, t.args.steps_per_rollout
        gen_rows = [None if b is None else gen.rows(nodes, G) for gen, b in zip(generations, batches)]
        masks = [
            None if b is None else self._mask(i, b, generations[i].truncated[gen_rows[i]])
            for i, b in enumerate(batches)
        ]
        kept: dict[int, dict[str, float]] = {}  # the metrics of an agent scored in one piece

        def agent_grpo_loss(i: int, logp, entropy, rows: slice, totals: BatchTotals | None = None):
            settings, gen = self.settings[i], generations[i]
            device, C = logp.device, logp.shape[1]
            rows_i = gen_rows[i][rows]
            mask = masks[i][rows, :C].to(device)
            pool = _entropy_pool(t.accelerator, entropy, mask) if settings.top_entropy_quantile < 1.0 else None
            return grpo_loss(
                logp,
                advantages[i][rows].to(device),
                mask,
                settings,
                old_logps=_take(gen.old_logps, rows_i, C, device),
                ref_logps=_take(gen.ref_logps, rows_i, C, device),
                entropies=entropy.to(device),
                importance_sampling_ratio=_take(gen.is_ratio, rows_i, C, device),
                sampling_logps=_take(gen.sampling_logps, rows_i, C, device),
                token_normalizer=dapo_normalizer(gen.num_tokens, processes, 1, K),
                gradient_accumulation_steps=1,
                entropy_pool=pool,
                totals=totals,
                with_metrics=totals is None,  # a part's: the batch's metrics come from the merged parts below
            )

        def agent_loss(i: int, out: dict[str, list], rows: slice) -> torch.Tensor:
            logp, entropy = out["logprobs"][i], out["token_entropy"][i]
            if rows == slice(None):
                loss_i, metrics = agent_grpo_loss(i, logp, entropy, rows)
                kept[i] = {k: float(v) for k, v in metrics.items()}
                return loss_i
            totals = BatchTotals(len(advantages[i]), float(masks[i].sum()))
            return agent_grpo_loss(i, logp, entropy, rows, totals)[0]

        in_parts = [s.top_entropy_quantile == 1.0 for s in self.settings]  # the quantile is over the whole batch
        loss, out, losses = sum_of_agent_losses(
            t, model, batches, agent_loss, in_parts, token_entropy=True, entropy_grad=self.entropy_grad
        )
        entropies, team = [], {}
        for i, loss_i in enumerate(losses):
            if loss_i is None:
                continue
            if i not in kept:  # scored in parts: the metrics of the whole batch, from the parts' merged outputs
                with torch.no_grad():
                    _, metrics = agent_grpo_loss(i, out["logprobs"][i], out["token_entropy"][i], slice(None))
                kept[i] = {k: float(v) for k, v in metrics.items()}
            values = dict(kept[i], loss=loss_i.item())
            entropies.append(values.pop("entropy"))
            self._record(i, values, team)
        t._metrics.record_entropy(entropies)
        for name, vals in team.items():
            if name not in ("kl", "loss"):  # `kl`: the recorder's team mean of agent_i/kl
                t._metrics["train"][name].append(sum(vals) / len(vals))
        return loss

    def _mask(self, i: int, batch: Any, truncated: torch.Tensor) -> torch.Tensor:
        """Agent i's scored tokens `(B, C)` in `batch`: the completion mask, the `truncated` `(B,)` rows masked out
        with `mask_truncated_completions`."""
        mask = batch.completion_mask
        return mask * (~truncated).unsqueeze(1) if self.mask_truncated[i] else mask

    def _record(self, i: int, values: dict[str, float], team: dict[str, list[float]] | None = None) -> None:
        """`agent_{i+1}/<name>` for every value (TRL's names after the prefix); with `team`, also collects them for
        the team means logged under TRL's own names. Without `team` (generation-time metrics) the team mean is the
        recorder's mean over the agents' values."""
        m = self.trainer._metrics["train"]
        for name, value in values.items():
            m[f"agent_{i + 1}/{name}"].append(value)
            if team is not None:
                team.setdefault(name, []).append(value)
            else:
                m[name].append(value)


class ReferenceSyncCallback(TrainerCallback):
    """`sync_ref_model`: every `ref_model_sync_steps` optimizer steps, each agent's reference moves toward it
    (`building.sync_reference_models`, TRL's `SyncRefModelCallback` per agent)."""

    def __init__(self, sync) -> None:
        self.sync = sync

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps == 0:
            self.sync(args.ref_model_mixup_alpha)


def _scatter(dest: torch.Tensor | None, rows: torch.Tensor, values: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Write `values` `(B, C)` into rows `rows` of `dest` `(N, C')` (on the CPU, zero-padded; widened to C when
    needed)."""
    values = values.detach().float().cpu()
    C = values.shape[1]
    if dest is None:
        dest = torch.zeros(num_rows, C)
    elif dest.shape[1] < C:
        dest = torch.cat([dest, torch.zeros(num_rows, C - dest.shape[1])], dim=1)
    dest[rows, :C] = values
    return dest


def _take(x: torch.Tensor | None, rows: torch.Tensor, width: int, device: torch.device) -> torch.Tensor | None:
    """Rows `rows` of a stored `(N, C')` tensor, cut to a step's `width` completion positions (a `(N, 1)` ratio
    stays one column), on `device`."""
    return None if x is None else x[rows, : min(width, x.shape[1])].to(device)


def _entropy_pool(accelerator: Any, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """The scored tokens' entropies of every process (TRL takes the entropy quantile over all of them); None on one
    process (the batch's own)."""
    if accelerator.num_processes == 1:
        return None
    local = entropy.detach()[mask.bool()].float()
    padded = accelerator.pad_across_processes(local, dim=0, pad_index=float("nan"))
    pool = accelerator.gather(padded)
    return pool[~torch.isnan(pool)]
