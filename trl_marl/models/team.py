"""The team: the agents as ONE module.

`TeamModel` is ONE `nn.Module` holding every agent, so a single accelerate / DeepSpeed engine wraps the whole team
(accelerate cannot hold several DeepSpeed engines in one process) and one optimizer holds a parameter group per agent.
Its `forward` scores a batch of completions for every agent in one call (`trl_marl.models.scoring`: each prompt run
once for its samples, the rows in chunks under a memory budget), returning the log-probs and, on the loss's forward
(with gradients), each agent's token entropy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from trl_marl.data_types.batches import AgentBatch
from trl_marl.models.fused_head import fused_scoring
from trl_marl.models.loading import _name_or_path
from trl_marl.models.scoring import chunk_plan, completion_logits, completion_scores, score_completions

__all__ = ["TeamConfig", "TeamModel", "forward_completions", "masked_mean_entropy", "agent_token_logprobs"]


class TeamConfig(PretrainedConfig):
    """Config of the team wrapper, so that Trainer machinery (telemetry, model cards, logging) sees a `config`."""

    model_type = "trl_marl_team"

    def __init__(self, num_agents: int = 1, agent_names: list[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.num_agents = num_agents
        self.agent_names = agent_names or []


def _activation_checkpointing(model: nn.Module) -> bool:
    """Whether `model` checkpoints activations: `is_activation_checkpointing` (transformers >= 5.24), else the older
    `is_gradient_checkpointing` (read only then: on newer models it warns)."""
    value = getattr(model, "is_activation_checkpointing", None)
    return bool(value) if value is not None else bool(getattr(model, "is_gradient_checkpointing", False))


class TeamModel(nn.Module):
    """All agents of a team in one module (`self.agents[i]` is agent i+1's causal LM).

    With `shared` (a PEFT model carrying one adapter per agent, see `trl_marl.models.adapters`), `self.agents` holds
    adapter views of that one model instead, and the team's parameters are the shared model's, once.
    """

    def __init__(
        self,
        agents: Sequence[PreTrainedModel],
        agent_names: Sequence[str] | None = None,
        shared: nn.Module | None = None,
    ):
        super().__init__()
        if shared is None:
            self.agents = nn.ModuleList(agents)
        else:
            self.shared = shared
            self.agents = list(agents)  # AdapterAgent views of `shared`, not submodules
        names = list(agent_names) if agent_names else [_name_or_path(a) for a in agents]
        self.config = TeamConfig(num_agents=len(agents), agent_names=names)
        self.config._name_or_path = names[0] if len(set(names)) == 1 else ""
        # Trainer checks this attribute when deciding whether to pass `num_items_in_batch`.
        self.accepts_loss_kwargs = False
        # The sampling temperature the completions were drawn at (one for every agent, or a list: one per agent):
        # every log-prob of a sampled completion is taken on logits / temperature (as TRL's GRPOTrainer does), so the
        # gradient is that of the policy that sampled.
        self.temperature: float | list[float] = 1.0
        # Rows of one agent scored by one forward (`logprob_batch_size`); None: sized from a memory budget
        # (`trl_marl.models.scoring.score_completions`).
        self.logprob_batch_size: int | None = None

    def agent_temperature(self, i: int) -> float:
        """Agent i's sampling temperature (`temperature`, one value or one per agent)."""
        t = self.temperature
        return (t[0] if len(t) == 1 else t[i]) if isinstance(t, (list, tuple)) else t

    @property
    def shared_base(self) -> bool:
        """Whether the agents are adapters on one shared base model."""
        return "shared" in self._modules

    def agent_named_parameters(self, i: int) -> list[tuple[str, nn.Parameter]]:
        """Agent i's trainable parameters, named as in the team's `named_parameters()`."""
        prefix = "shared" if self.shared_base else f"agents.{i}"
        return [(f"{prefix}.{k}", p) for k, p in self.agents[i].named_parameters() if p.requires_grad]

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    # --- what Trainer / TRL helpers look for on a model ---
    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(_activation_checkpointing(a) for a in self._backbones())

    @property
    def is_activation_checkpointing(self) -> bool:
        return self.is_gradient_checkpointing

    def _backbones(self) -> list[nn.Module]:
        return [self.shared] if self.shared_base else list(self.agents)

    def activation_checkpointing_enable(
        self, activation_checkpointing_kwargs: dict | None = None, every_n_layers: int = 1, offload: bool = False
    ) -> None:
        """Activation (gradient) checkpointing in every agent's backbone, as `Trainer` asks for it."""
        for a in self._backbones():
            enable = getattr(a, "activation_checkpointing_enable", None)
            if enable is not None:  # transformers >= 5.24
                enable(
                    activation_checkpointing_kwargs=activation_checkpointing_kwargs,
                    every_n_layers=every_n_layers,
                    offload=offload,
                )
                continue
            if every_n_layers != 1 or offload:
                import transformers

                raise ValueError(
                    "activation checkpointing with every_n_layers != 1 or offload=True needs transformers >= 5.24 "
                    f"(installed: {transformers.__version__})"
                )
            # transformers < 5.24 (e.g. 5.17, what vLLM 0.31 pins): the older name, checkpointing every layer
            a.gradient_checkpointing_enable(gradient_checkpointing_kwargs=activation_checkpointing_kwargs)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None, **kwargs) -> None:
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def activation_checkpointing_disable(self) -> None:
        for a in self._backbones():
            disable = getattr(a, "activation_checkpointing_disable", None)
            (disable or a.gradient_checkpointing_disable)()  # the older name before transformers 5.24

    def gradient_checkpointing_disable(self) -> None:
        self.activation_checkpointing_disable()

    def enable_input_require_grads(self) -> None:
        for a in self._backbones():
            a.enable_input_require_grads()

    def forward(
        self, agent_batches: Sequence[AgentBatch | None], token_entropy: bool = False, entropy_grad: bool = False
    ) -> dict[str, list]:
        """Per-token log-probabilities of each agent's completions, and their entropy.

        `agent_batches[i]` is agent i's batch (or None to skip it), scored by `score_completions`: each prompt run
        once for its samples, the rows in the chunks of `chunk_plan` (`logprob_batch_size` rows; None: the team's
        batches as they are when their activations fit a memory budget, else as many rows as it holds), every
        chunk but the team's last recomputed in the backward. A batch that is not an `AgentBatch` brings its own
        forward scheme: `batch.token_logps(agent, temperature,
        return_entropy)` returning `(log-probs, per-token entropy or None)` with `batch.shift_completion_mask` over
        them (MADPO's TRL-layout preference batch).

        Each agent is scored at its own sampling temperature (`agent_temperature`).

        Returns a dict of lists, one entry per agent (None for a skipped agent):
            `logprobs[i]`: `(B_i, C_i)` completion-token log-probs (multiply by `batch.completion_mask` and sum for
                sequence log-probs);
            `entropy[i]`: the mean token entropy (nats, of logits / temperature) over the scored completion tokens, a
                float, when the forward runs with gradients (the loss's forward, the one to log); else None;
            `token_entropy[i]` (with `token_entropy=True`, `AgentBatch` batches): the `(B_i, C_i)` token entropies
                (TRL's high-entropy mask), carrying the gradient with `entropy_grad=True` (TRL's entropy bonus).
        """
        if len(agent_batches) != len(self.agents):
            raise ValueError(f"expected {len(self.agents)} agent batches, got {len(agent_batches)}")
        record = torch.is_grad_enabled()
        logps: list[torch.Tensor | None] = []
        entropies: list[float | None] = []
        per_token: list[torch.Tensor | None] = []
        plain = [b if isinstance(b, AgentBatch) else None for b in agent_batches]
        plan = chunk_plan(list(self.agents), plain, self.logprob_batch_size)
        for i, (agent, batch, chunks) in enumerate(zip(self.agents, agent_batches, plan)):
            temperature = self.agent_temperature(i)
            if batch is None:
                logps.append(None)
                entropies.append(None)
                per_token.append(None)
                continue
            if isinstance(batch, AgentBatch):
                logp, *entropy = score_completions(
                    agent, batch, temperature, record or token_entropy, *chunks, entropy_grad=entropy_grad
                )
                mask = batch.completion_mask
            else:
                logp, *entropy = batch.token_logps(agent, temperature, return_entropy=record)
                mask = batch.shift_completion_mask
            logps.append(logp)
            entropies.append(masked_mean_entropy(entropy[0].detach(), mask) if record else None)
            per_token.append(entropy[0] if token_entropy and entropy else None)
        out = {"logprobs": logps, "entropy": entropies}
        if token_entropy:
            out["token_entropy"] = per_token
        return out


def forward_completions(
    model: nn.Module,
    batch: AgentBatch,
    temperature: float = 1.0,
    output_hidden_states: bool = False,
    return_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[Any, ...]:
    """One forward pass over `[prompt | completion]`: `(model output, completion-token log-probs (B, C))`, plus the
    `(B, C)` token entropies as a third element when `return_entropy` (detached, unless `entropy_grad`: then they
    carry the gradient, for an entropy bonus).

    The log-probs are `log_softmax(logits / temperature)` at the completion tokens: pass the temperature the
    completions were sampled at (TRL's GRPOTrainer divides by it too). The entropy is TRL's `entropy_from_logits`
    of the same tempered logits (`trl_marl.models.scoring.completion_scores`). Position ids follow the attention
    mask (as `generate` computes them for left-padded prompts), so the scores match what the policy sampled. Only
    the last `C + 1` positions' logits are materialised (`logits_to_keep`), and none where the fused head applies
    (`trl_marl.models.fused_head`: the model output's `logits` are then the head's input; read `hidden_states`).
    Without `output_hidden_states` the model output is None and each prompt runs once for its samples
    (`trl_marl.models.scoring.completion_logits`).
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    out = None
    with fused_scoring(model) as head:
        if output_hidden_states:
            position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
            out = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=position_ids,
                logits_to_keep=batch.num_completion_tokens + 1,
                use_cache=False,
                output_hidden_states=True,
            )
            head_output = out.logits[:, :-1, :]  # prediction for each completion token
        else:
            head_output = completion_logits(model, batch)
    logp, entropy = completion_scores(
        head_output, batch.completion_ids, temperature, return_entropy, entropy_grad, head
    )
    return (out, logp, entropy) if return_entropy else (out, logp)


def masked_mean_entropy(token_entropy: torch.Tensor, completion_mask: torch.Tensor) -> float:
    """Mean of `(B, C)` token entropies over the scored completion tokens (`completion_mask` 1)."""
    mask = completion_mask.to(token_entropy.device, token_entropy.dtype)
    return float((token_entropy * mask).sum() / mask.sum().clamp(min=1.0))


def agent_token_logprobs(
    model: nn.Module, batch: AgentBatch, temperature: float = 1.0, rows: int | None = None
) -> torch.Tensor:
    """Completion-token log-probs `(B, C)` of `log_softmax(logits / temperature)` (`score_completions`: each prompt
    run once for its samples, the rows in chunks of `rows`, None: as many as a memory budget holds)."""
    return score_completions(model, batch, temperature, rows=rows)[0]
