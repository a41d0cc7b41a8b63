"""Scoring completions (their per-token log-probs under an agent): the prompt run once for all its samples, and the
rows scored in chunks under a memory budget.

**Shared prompts.** The G samples of a prompt share its tokens: in a batch laid out as `samples_of_agent` orders it,
consecutive rows with the same prompt form a group. The prompt is run once per group with transformers' KV cache
(`use_cache=True`), its keys and values are repeated for the group's rows (`Cache.batch_repeat_interleave`: a
differentiable copy, so the gradient of every row flows back into the one prompt forward), and only the completion
tokens run per row, attending to the repeated cache. The log-probs are those of one forward over
`[prompt | completion]` per row (up to float rounding: the same math on other shapes); the prompt's compute and
activations shrink by the group size (with G=4, 23 prompt and 16 completion tokens: 44% fewer tokens per forward).
Not used under activation checkpointing (transformers turns the cache off there), when a caller needs the hidden
states (value heads), with a cache other than transformers' dynamic one, or on a ZeRO-3 / FSDP2-sharded model (one
forward per step keeps the engine's parameter fetching in its recorded order: a second one made a rank hold all
115,008 elements of an agent while training, and its peak rise 34%).

**Chunks.** Without a limit one agent's whole batch is one forward, and its graph is kept until the backward: every
agent's graph at once when one team forward scores them all, the peak of a step (on one process the REINFORCE family
scores one agent per team forward and backpropagates it before the next, and cuts an agent's rows into the parts of
`backward_parts`, each backpropagated right after its forward: `trl_marl.trainers.agent_losses`).
`score_completions` cuts the rows into chunks of `rows` rows (`logprob_batch_size`; the short one first, so the last
chunk is a full one); every chunk but the last runs under non-reentrant activation checkpointing
(`torch.utils.checkpoint`): its forward keeps only its inputs and log-probs, and the backward recomputes its graph,
one chunk at a time. The peak transient is one chunk's graph instead of every agent's, for one more forward of the
checkpointed chunks. Without gradients (reference and gap scoring) chunks simply run one after another. The automatic
size (`rows=None`) keeps a chunk's activations within `budget_bytes`: four times one agent's weights, at least
64 MiB, by the first-order activation formula of `trl_marl.distributed.memory` (a batch within the budget is one
chunk, as before).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trl_marl.algorithms.logprobs import token_logprobs
from trl_marl.data_types.batches import AgentBatch
from trl_marl.distributed.collective import is_sharded
from trl_marl.models.fused_head import fused_head, fused_scoring, head_logprobs

__all__ = [
    "MIN_BUDGET_BYTES",
    "backward_parts",
    "batch_rows",
    "budget_bytes",
    "cache_argument",
    "chunk_plan",
    "is_dynamic_cache",
    "completion_logits",
    "completion_scores",
    "prompt_groups",
    "row_activation_bytes",
    "score_completions",
]

MIN_BUDGET_BYTES = 64 * 2**20


def prompt_groups(batch: AgentBatch) -> torch.Tensor:
    """The sizes of the runs of consecutive rows with the same prompt (tokens and padding), in row order."""
    P = batch.input_ids.shape[1] - batch.num_completion_tokens
    prompts = torch.cat([batch.input_ids[:, :P], batch.attention_mask[:, :P]], dim=1)
    starts = torch.ones(prompts.shape[0], dtype=torch.bool, device=prompts.device)
    starts[1:] = (prompts[1:] != prompts[:-1]).any(dim=1)
    first = torch.nonzero(starts).flatten()
    ends = torch.cat([first[1:], torch.tensor([prompts.shape[0]], device=first.device)])
    return ends - first


@functools.cache
def cache_argument() -> str:
    """The name transformers gives the KV cache, as a model argument and output field: `cache` from transformers 5.24
    on (which warns on the older name), `past_key_values` before."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def is_dynamic_cache(cache: Any) -> bool:
    """Whether `cache` is transformers' dynamic cache of plain (or sliding-window) attention layers, whose batch
    dimension can be repeated."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return isinstance(cache, DynamicCache) and all(isinstance(layer, DynamicLayer) for layer in cache.layers)


def _activation_checkpointing(model: nn.Module) -> bool:
    value = getattr(model, "is_activation_checkpointing", None)
    if value is None:
        value = getattr(model, "is_gradient_checkpointing", False)
    return bool(value) and model.training


def completion_logits(model: nn.Module, batch: AgentBatch) -> torch.Tensor:
    """`(B, C, V)` logits predicting each completion token (position t of a row predicts its completion token t), from
    one forward over `[prompt | completion]` without the last completion token (nothing it predicts is scored: one
    token per row less to run forward and backward), or with each group's prompt run once (module docstring).
    `batch` must be on the model's device. Position ids follow the attention mask (as `generate` computes them for
    left-padded prompts), so the scores match what the policy sampled; causal attention makes every kept position's
    logits those of the full sequence."""
    C = batch.num_completion_tokens
    P = batch.input_ids.shape[1] - C
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    counts = prompt_groups(batch)
    if len(counts) < batch.input_ids.shape[0] and not _activation_checkpointing(model) and not is_sharded(model):
        first = torch.cumsum(counts, 0) - counts
        prompt = model(
            input_ids=batch.input_ids[first, :P],
            attention_mask=batch.attention_mask[first, :P],
            position_ids=position_ids[first, :P],
            use_cache=True,
            logits_to_keep=1,
        )
        cache = getattr(prompt, cache_argument(), None)
        if is_dynamic_cache(cache):
            first_token = prompt.logits.repeat_interleave(counts, dim=0)
            if C == 1:
                return first_token
            cache.batch_repeat_interleave(counts)
            out = model(
                input_ids=batch.input_ids[:, P:-1],
                attention_mask=batch.attention_mask[:, :-1],
                position_ids=position_ids[:, P:-1],
                use_cache=True,
                logits_to_keep=C - 1,
                **{cache_argument(): cache},
            )
            return torch.cat([first_token, out.logits], dim=1)
    out = model(
        input_ids=batch.input_ids[:, :-1],
        attention_mask=batch.attention_mask[:, :-1],
        position_ids=position_ids[:, :-1],
        logits_to_keep=C,
        use_cache=False,
    )
    return out.logits


def _score(model: nn.Module, batch: AgentBatch, temperature: float, entropy: bool, entropy_grad: bool = False):
    """`(log-probs (B, C), token entropies (B, C) or None)` of one forward (`completion_logits`), through the fused
    head where it applies (`trl_marl.models.fused_head`)."""
    with fused_scoring(model) as head:
        head_output = completion_logits(model, batch)
    return completion_scores(head_output, batch.completion_ids, temperature, entropy, entropy_grad, head)


def completion_scores(
    head_output: torch.Tensor,
    completion_ids: torch.Tensor,
    temperature: float,
    entropy: bool,
    entropy_grad: bool = False,
    head: nn.Linear | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(log-probs (B, C), token entropies (B, C) or None)` of `log_softmax(logits / temperature)` at
    `completion_ids`, from the forward's output at the positions predicting them: the logits `(B, C, V)`, or with
    `head` (a forward inside `fused_scoring`) the head's input `(B, C, H)`, scored by TRL's chunked kernel without
    materialising the logits. The entropies carry the gradient only with `entropy_grad` (an entropy bonus)."""
    grad = entropy_grad and torch.is_grad_enabled()
    if head is not None:
        logp, ent = head_logprobs(head_output, head, completion_ids, temperature, entropy)
        return logp, (ent if ent is None or grad else ent.detach())
    logits = head_output.float() if head_output.dtype != torch.float32 else head_output
    logp = token_logprobs(logits, completion_ids, temperature)
    if not entropy:
        return logp, None
    from trl.trainer.utils import entropy_from_logits  # TRL's chunked entropy, as GRPOTrainer logs it

    with torch.set_grad_enabled(grad):
        return logp, entropy_from_logits((logits if entropy_grad else logits.detach()) / temperature)


def budget_bytes(model: nn.Module) -> int:
    """The automatic activation budget of a team's loss forward: four times the agent's weights (in fp32, about its
    weights, gradients and two AdamW moments: activations stay at most the size of the training state; the full
    size under ZeRO-3, whose partitioned parameters report `ds_numel`), at least `MIN_BUDGET_BYTES`."""
    size = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in model.parameters())
    return max(4 * int(size), MIN_BUDGET_BYTES)


def row_activation_bytes(
    config: Any, tokens: float, sequence: int, completion: int, element_size: int, logits: bool = True
) -> int:
    """Activations one row keeps for the backward when it runs `tokens` tokens of a `sequence`-token sequence
    (`completion` of them scored): per decoder layer and token `34 h + 5 a s` bytes in 16-bit (Korthikanti et al.
    2022, scaled by `element_size / 2`), plus, with `logits` (not on the fused head's path), the fp32 logits and
    log-softmax of the completion positions (`trl_marl.distributed.memory`'s formula, for one row)."""
    h, a = config.hidden_size, config.num_attention_heads
    per_token = config.num_hidden_layers * (34 * h + 5 * a * sequence) * element_size / 2
    return int(tokens * per_token) + (2 * (completion + 1) * config.vocab_size * 4 if logits else 0)


def _per_row(model: nn.Module, batch: AgentBatch) -> tuple[int, int] | None:
    """(activation bytes per row, rows per prompt group) of `batch`, each row counting its completion and its share of
    its group's prompt; None for a model without a decoder config."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        return None
    B, C = batch.input_ids.shape[0], batch.num_completion_tokens
    P = batch.input_ids.shape[1] - C
    groups = len(prompt_groups(batch))
    element = next(model.parameters()).element_size()
    logits = fused_head(model) is None
    return max(row_activation_bytes(config, C + P * groups / B, P + C, C, element, logits), 1), B // groups


def chunk_plan(
    models: list[nn.Module], batches: list[AgentBatch | None], rows: int | None = None
) -> list[tuple[int, bool] | None]:
    """How a team's loss forward scores each agent's batch: `(rows per chunk, keep its last chunk)` per agent (None
    for a skipped agent). Every chunk is recomputed in the backward (checkpointed) except the team's last one, so the
    forward keeps one chunk's graph, not every agent's.

    `rows` (`logprob_batch_size`) sets the chunk size. `None`: when the estimated activations of every agent's batch
    together fit `budget_bytes` (of the largest agent), each agent is one forward and nothing is recomputed (as
    without chunks); above it, chunks of as many rows as the budget holds (a multiple of the prompt groups' size when
    one fits).

    Sharded agents (ZeRO-3, FSDP2) are one forward each, kept, whatever `rows` says: every process must run the same
    forwards of an agent (each gathers its shards), and processes hold different numbers of rows; the trainer refuses
    `logprob_batch_size` there (`trl_marl.trainers.arguments.check_sharded_scoring`)."""
    scored = [i for i, b in enumerate(batches) if b is not None]
    whole = [None if b is None else (b.input_ids.shape[0], True) for b in batches]
    if any(is_sharded(models[i]) for i in scored):
        return whole
    plan: list[tuple[int, bool] | None] = [None] * len(batches)
    if rows is None:
        estimates = {i: _per_row(models[i], batches[i]) for i in scored}
        if any(e is None for e in estimates.values()):
            return whole
        total = sum(estimates[i][0] * batches[i].input_ids.shape[0] for i in scored)
        budget = max((budget_bytes(models[i]) for i in scored), default=MIN_BUDGET_BYTES)
        if total <= budget:
            return whole
    for i in scored:
        B = batches[i].input_ids.shape[0]
        if rows is None:
            per_row, group = estimates[i]
            size = max(1, budget // per_row)
            size = size if size >= B or size < group else size - size % group
        else:
            size = rows
        plan[i] = (min(size, B), i == scored[-1])
    return plan


def backward_parts(model: nn.Module, batch: AgentBatch, rows: int | None = None) -> list[tuple[int, int]]:
    """Row ranges `(start, stop)` that cut `batch` into the parts of a loss backpropagated part by part, each right
    after its own forward (`trl_marl.trainers.agent_losses`): a step holds one part's graph, and unlike the
    checkpointed chunks of `score_completions` nothing is recomputed. `rows` (`logprob_batch_size`) rows per part;
    None: one part while the batch's estimated activations fit `budget_bytes(model)` (as `chunk_plan` keeps a batch
    whole), above it as many whole prompt groups as the budget holds, at least one group (as many rows as fit where
    a group does not). A model without a decoder config, or a sharded one, is one part."""
    B = batch.input_ids.shape[0]
    if rows is None:
        estimate = None if is_sharded(model) else _per_row(model, batch)
        if estimate is None:
            return [(0, B)]
        per_row, group = estimate
        rows = max(1, budget_bytes(model) // per_row)
        rows = rows if rows >= B or rows < group else rows - rows % group
    return [(start, min(start + rows, B)) for start in range(0, B, rows)]


def batch_rows(batch: AgentBatch, start: int, stop: int) -> AgentBatch:
    """Rows `start:stop` of `batch`, without the columns that are padding in all of them."""
    C = batch.num_completion_tokens
    mask = batch.attention_mask[start:stop]
    P = mask.shape[1] - C
    used_prompt = mask[:, :P].any(dim=0).nonzero()
    first = int(used_prompt[0]) if used_prompt.numel() else P - 1
    used_completion = mask[:, P:].any(dim=0).nonzero()  # attended, scored or not (tool-result tokens are not scored)
    c = int(used_completion[-1]) + 1 if used_completion.numel() else 1
    cols = slice(first, P + c)
    return AgentBatch(
        batch.input_ids[start:stop, cols],
        mask[:, cols],
        batch.completion_ids[start:stop, :c],
        batch.completion_mask[start:stop, :c],
    )


def score_completions(
    model: nn.Module,
    batch: AgentBatch,
    temperature: float = 1.0,
    return_entropy: bool = False,
    rows: int | None = None,
    keep_last: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs `(B, C)` of `log_softmax(logits / temperature)` at the completion tokens of `batch`, and
    with `return_entropy` the `(B, C)` token entropies (detached unless `entropy_grad`; else None), scored in chunks
    of `rows` rows (None: the plan of `chunk_plan` for this one agent). With gradients every chunk is checkpointed
    except the last one when `keep_last` (see the module docstring). Entries past a row's completion are 0."""
    device = next(model.parameters()).device
    batch = batch.to(device)
    B, C = batch.input_ids.shape[0], batch.num_completion_tokens
    if rows is None:
        rows, keep_last = chunk_plan([model], [batch])[0]
    if rows >= B and keep_last:
        return _score(model, batch, temperature, return_entropy, entropy_grad)
    logps, entropies = [], []
    # the short chunk first: the kept last one is full, so the backward recomputes B - rows rows, not B - B % rows
    starts = sorted({0, *range(B % rows, B, rows)})
    for k, (start, stop) in enumerate(zip(starts, starts[1:] + [B])):
        chunk = batch_rows(batch, start, stop)
        kept = keep_last and k == len(starts) - 1  # the backward needs the last chunk's graph first
        if torch.is_grad_enabled() and not kept:
            logp, ent = checkpoint(
                _score, model, chunk, temperature, return_entropy, entropy_grad, use_reentrant=False
            )
        else:
            logp, ent = _score(model, chunk, temperature, return_entropy, entropy_grad)
        pad = (0, C - logp.shape[1])
        logps.append(nn.functional.pad(logp, pad))
        if ent is not None:
            entropies.append(nn.functional.pad(ent, pad))
    return torch.cat(logps), (torch.cat(entropies) if return_entropy else None)
