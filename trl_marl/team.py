"""The team: load, own and run the agents, their tokenizers and formatters.

`TeamModel` is ONE `nn.Module` holding every agent, so a single accelerate / DeepSpeed engine wraps the whole team
(accelerate cannot hold several DeepSpeed engines in one process) and one optimizer holds a parameter group per agent.
Its `forward` scores a batch of completions for every agent in one call: one masked forward pass per agent.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel

from .algorithms.logprobs import completion_mask, token_logprobs

__all__ = [
    "TeamConfig",
    "TeamModel",
    "AgentBatch",
    "PromptText",
    "collate_agent_batch",
    "load_agents",
    "load_tokenizers",
    "resolve_formatters",
    "render_prompt",
    "MODEL_CONFIG_KEYS",
    "loading_kwargs",
    "eos_token_ids",
]

# Loading options accepted in `model_config` (the reference library's names; TRL's ModelConfig is converted).
MODEL_CONFIG_KEYS = ("dtype", "torch_dtype", "attn_implementation", "trust_remote_code", "revision", "model_kwargs")


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

    With `shared` (a PEFT model carrying one adapter per agent, see `trl_marl.adapters`), `self.agents` holds
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
        # The sampling temperature the completions were drawn at: every log-prob of a sampled completion is taken on
        # logits / temperature (as TRL's GRPOTrainer does), so the gradient is that of the policy that sampled.
        self.temperature = 1.0
        # Per agent, the masked mean token entropy (nats, on logits / temperature) of the last forward pass that ran
        # with gradients (the loss's forward); None where an agent was skipped. Read by the trainer for logging.
        self.last_entropy: list[float | None] | None = None

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

    def forward(self, agent_batches: Sequence[AgentBatch | None]) -> list[torch.Tensor | None]:
        """Per-token log-probabilities of each agent's completions.

        `agent_batches[i]` is agent i's batch (or None to skip it). Returns, per agent, a `(B_i, C_i)` tensor of
        completion-token log-probs (multiply by `batch.completion_mask` and sum for sequence log-probs).
        One forward pass per agent, for the whole batch. A batch that is not an `AgentBatch` brings its own
        forward scheme: `batch.token_logps(agent, temperature, return_entropy)` returning `(log-probs, per-token
        entropy or None)` with `batch.shift_completion_mask` over them (MADPO's TRL-layout preference batch).
        """
        if len(agent_batches) != len(self.agents):
            raise ValueError(f"expected {len(self.agents)} agent batches, got {len(agent_batches)}")
        record = torch.is_grad_enabled()
        logps: list[torch.Tensor | None] = []
        entropies: list[float | None] = []
        for agent, batch in zip(self.agents, agent_batches):
            if batch is None:
                logps.append(None)
                entropies.append(None)
                continue
            if isinstance(batch, AgentBatch):
                _, logp, *entropy = forward_completions(agent, batch, self.temperature, return_entropy=record)
                mask = batch.completion_mask
            else:
                logp, *entropy = batch.token_logps(agent, self.temperature, return_entropy=record)
                mask = batch.shift_completion_mask
            logps.append(logp)
            entropies.append(masked_mean_entropy(entropy[0], mask) if record else None)
        if record:
            self.last_entropy = entropies
        return logps


@dataclass
class AgentBatch:
    """One agent's batch of prompt + completion sequences, laid out for a single masked forward pass.

    `input_ids = [left-padded prompt | right-padded completion]`; `completion_mask` marks the scored completion
    tokens (up to and including the first EOS).
    """

    input_ids: torch.Tensor  # (B, P + C)
    attention_mask: torch.Tensor  # (B, P + C)
    completion_ids: torch.Tensor  # (B, C)
    completion_mask: torch.Tensor  # (B, C)

    def to(self, device: torch.device | str) -> AgentBatch:
        return AgentBatch(
            *(t.to(device) for t in (self.input_ids, self.attention_mask, self.completion_ids, self.completion_mask))
        )

    @property
    def num_completion_tokens(self) -> int:
        return self.completion_ids.shape[1]


def collate_agent_batch(
    prompt_ids: Sequence[torch.Tensor], completion_ids: Sequence[torch.Tensor], pad_token_id: int
) -> AgentBatch:
    """Build an `AgentBatch` from unpadded prompt and completion token ids (completions include their EOS)."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError("prompt_ids and completion_ids must have the same length")
    B = len(prompt_ids)
    P = max(int(p.numel()) for p in prompt_ids)
    C = max(max(int(c.numel()) for c in completion_ids), 1)
    input_ids = torch.full((B, P + C), pad_token_id, dtype=torch.long)
    attention = torch.zeros((B, P + C), dtype=torch.long)
    comp = torch.full((B, C), pad_token_id, dtype=torch.long)
    cmask = torch.zeros((B, C), dtype=torch.long)
    for r, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        lp, lc = int(p.numel()), int(c.numel())
        input_ids[r, P - lp : P] = p
        attention[r, P - lp : P] = 1
        input_ids[r, P : P + lc] = c
        attention[r, P : P + lc] = 1
        comp[r, :lc] = c
        cmask[r, :lc] = 1
    return AgentBatch(input_ids, attention, comp, cmask)


def forward_completions(
    model: nn.Module,
    batch: AgentBatch,
    temperature: float = 1.0,
    output_hidden_states: bool = False,
    return_entropy: bool = False,
) -> tuple[Any, ...]:
    """One forward pass over `[prompt | completion]`: `(model output, completion-token log-probs (B, C))`, plus the
    `(B, C)` token entropies (detached) as a third element when `return_entropy`.

    The log-probs are `log_softmax(logits / temperature)` at the completion tokens: pass the temperature the
    completions were sampled at (TRL's GRPOTrainer divides by it too). The entropy is TRL's `entropy_from_logits`
    of the same tempered logits, computed without gradient from the logits this forward already produced.
    Position ids follow the attention mask (as `generate` computes them for left-padded prompts), so the scores
    match what the policy sampled. Only the last `C + 1` positions' logits are materialised (`logits_to_keep`).
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids,
        logits_to_keep=batch.num_completion_tokens + 1,
        use_cache=False,
        output_hidden_states=output_hidden_states,
    )
    logits = out.logits[:, :-1, :]  # prediction for each completion token
    logits = logits.float() if logits.dtype != torch.float32 else logits
    logp = token_logprobs(logits, batch.completion_ids, temperature)
    if not return_entropy:
        return out, logp
    from trl.trainer.utils import entropy_from_logits  # TRL's chunked entropy, as GRPOTrainer logs it

    with torch.no_grad():
        entropy = entropy_from_logits(logits.detach() / temperature)
    return out, logp, entropy


def masked_mean_entropy(token_entropy: torch.Tensor, completion_mask: torch.Tensor) -> float:
    """Mean of `(B, C)` token entropies over the scored completion tokens (`completion_mask` 1)."""
    mask = completion_mask.to(token_entropy.device, token_entropy.dtype)
    return float((token_entropy * mask).sum() / mask.sum().clamp(min=1.0))


def agent_token_logprobs(model: nn.Module, batch: AgentBatch, temperature: float = 1.0) -> torch.Tensor:
    """Completion-token log-probs `(B, C)` of `log_softmax(logits / temperature)` from one forward pass over
    `[prompt | completion]` (`forward_completions`)."""
    return forward_completions(model, batch, temperature)[1]


class PromptText(str):
    """A prompt string that remembers whether a chat template produced it (then no special tokens are added)."""

    chat: bool = False


def render_prompt(formatted: Any, tokenizer) -> PromptText:
    """Turn a formatter's output into prompt text: a string as is, or chat messages through the chat template."""
    if isinstance(formatted, str):
        return PromptText(formatted)
    if isinstance(formatted, (list, tuple)) and all(isinstance(m, dict) for m in formatted):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "a formatter returned chat messages but the agent's tokenizer has no chat_template; return a string "
                "or use a tokenizer with a chat template"
            )
        text = PromptText(tokenizer.apply_chat_template(list(formatted), tokenize=False, add_generation_prompt=True))
        text.chat = True
        return text
    raise TypeError(f"a formatter must return a string or a list of chat messages, got {type(formatted).__name__}")


def default_formatter(item: dict) -> str:
    """The default formatter: the item's `"prompt"` field."""
    if "prompt" not in item:
        raise KeyError(
            f"the default formatter reads item['prompt'], but the item has only {sorted(item)}; pass formatters="
        )
    return item["prompt"]


def resolve_formatters(formatters: Callable | Sequence[Callable] | None, num_agents: int) -> list[Callable]:
    """One formatter for all agents, or a per-agent list whose length must be `num_agents`."""
    if formatters is None:
        return [default_formatter] * num_agents
    if callable(formatters):
        return [formatters] * num_agents
    formatters = list(formatters)
    if len(formatters) != num_agents:
        raise ValueError(
            f"formatters has {len(formatters)} entries but num_agents is {num_agents}; pass one callable "
            f"for all agents or exactly {num_agents}"
        )
    for i, f in enumerate(formatters):
        if not callable(f):
            raise TypeError(f"formatters[{i}] is not callable ({type(f).__name__})")
    return formatters


def loading_kwargs(model_config: Any | None) -> dict:
    """`from_pretrained` keyword arguments from `model_config` (a dict or TRL's `ModelConfig`)."""
    if model_config is None:
        return {}
    if not isinstance(model_config, dict):  # trl.ModelConfig
        cfg = {
            "dtype": getattr(model_config, "dtype", None),
            "attn_implementation": getattr(model_config, "attn_implementation", None),
            "trust_remote_code": getattr(model_config, "trust_remote_code", False),
            "revision": getattr(model_config, "model_revision", None),
        }
        model_config = {k: v for k, v in cfg.items() if v not in (None, False)}
    unknown = sorted(set(model_config) - set(MODEL_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"model_config has unknown keys {unknown}; allowed keys are {list(MODEL_CONFIG_KEYS)}")
    kwargs = dict(model_config.get("model_kwargs") or {})
    dtype = model_config.get("dtype", model_config.get("torch_dtype"))
    if dtype is not None and dtype != "auto":
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dtype is not None:
        kwargs["dtype"] = dtype
    for key in ("attn_implementation", "trust_remote_code", "revision"):
        if model_config.get(key) is not None:
            kwargs[key] = model_config[key]
    return kwargs


def _name_or_path(model: Any) -> str:
    if isinstance(model, str):
        return model
    return getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__


def check_model_source(src: str) -> None:
    """A model id that can only be a local folder (absolute, `./`, `../`, `~`, or more than one `/`) must exist;
    transformers would otherwise report "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"."""
    if os.path.exists(os.path.expanduser(src)):
        return
    if os.path.isabs(src) or src.startswith((".", "~")) or src.count("/") > 1 or "\\" in src:
        raise FileNotFoundError(
            f"model folder not found: {src!r} (no such local folder; check the path -- a Hub id has the form "
            "'namespace/repo_name')"
        )


def load_agents(
    agent_model: str | None, agents: Sequence[Any] | None, num_agents: int, model_config: Any | None = None
) -> tuple[list[PreTrainedModel], list[str]]:
    """Load the team: `agent_model` (one id -> `num_agents` independent copies) or `agents` (ids or model objects).

    Each id is loaded separately, so homogeneous agents never share parameters.
    """
    kwargs = loading_kwargs(model_config)
    sources = [agent_model] * num_agents if agents is None else list(agents)
    models, names = [], []
    for src in sources:
        if isinstance(src, (str, os.PathLike)):
            check_model_source(str(src))
            models.append(AutoModelForCausalLM.from_pretrained(str(src), **kwargs))
            names.append(str(src))
        elif isinstance(src, nn.Module):
            models.append(src)
            names.append(_name_or_path(src))
        else:
            raise TypeError(f"an agent must be a model id / path or a model object, got {type(src).__name__}")
    if len({id(m) for m in models}) != len(models):
        raise ValueError(
            "the same model object appears twice in agents; pass distinct objects or ids (agents never "
            "share parameters)"
        )
    return models, names


def load_tokenizers(tokenizer: Any, names: Sequence[str], num_agents: int, sources: Sequence[Any]) -> list:
    """One tokenizer per agent: the shared one, the per-agent list, or each agent's own (loaded from its id)."""
    if tokenizer is None:
        toks, cache = [], {}
        for name, src in zip(names, sources):
            if not isinstance(src, (str, os.PathLike)):
                raise ValueError("tokenizer is required when agents are given as model objects")
            if name not in cache:
                cache[name] = AutoTokenizer.from_pretrained(name)
            toks.append(cache[name])
    elif isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != num_agents:
            raise ValueError(f"tokenizer list has {len(tokenizer)} entries but num_agents is {num_agents}")
        toks = list(tokenizer)
    else:
        toks = [tokenizer] * num_agents
    for t in toks:
        if t.pad_token_id is None:
            t.pad_token = t.eos_token
    return toks


def eos_token_ids(model: PreTrainedModel, tokenizer) -> list[int]:
    """Every token id that ends a completion: the generation config's EOS ids and the tokenizer's EOS."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update([source] if isinstance(source, int) else list(source))
    return sorted(ids)


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN_EOS"


UNKNOWN_EOS: Any = _Unknown()  # "how this completion ended is not known" (a plain text from a user or an API)


class CompletionText(str):
    """A completion's text that remembers how it was generated (a comparator's sample).

    Attributes:
        eos_token: the text of the EOS token the completion ended with, or None when it was cut at
            `max_new_tokens` (no EOS).
        token_ids: the exact generated ids (EOS included), valid for the tokenizer named by `tokenizer`; None
            when unknown.
        tokenizer: the tokenizer object `token_ids` belong to (ids are reused only for that very tokenizer).
    """

    eos_token: str | None = None
    token_ids: torch.Tensor | None = None
    tokenizer: Any = None

    def __new__(cls, text: str, eos_token: str | None = None, token_ids=None, tokenizer: Any = None):
        obj = super().__new__(cls, text)
        obj.eos_token, obj.token_ids, obj.tokenizer = eos_token, token_ids, tokenizer
        return obj


def default_eos_token_id(tokenizer, eos_ids: Sequence[int]) -> int:
    """The EOS id a finished completion is taken to end with when the id it emitted is unknown: the tokenizer's
    `eos_token_id` (what its chat template closes a turn with) when it is one of the model's EOS ids, else the first
    of them."""
    tok = getattr(tokenizer, "eos_token_id", None)
    if tok is not None and (not eos_ids or tok in eos_ids):
        return int(tok)
    if not eos_ids:
        raise ValueError("the agent has no EOS token id (neither its tokenizer nor its generation config has one)")
    return int(eos_ids[0])


def completion_token_ids(
    tokenizer, text: str, eos_ids: Sequence[int], max_new_tokens: int, eos_token: Any = UNKNOWN_EOS
) -> torch.Tensor:
    """The token ids to score for a completion given as text (a comparator's, or one re-read from a record).

    - A `CompletionText` carrying the exact ids of THIS tokenizer: those ids, unchanged.
    - `eos_token` a string (the EOS token the completion ended with): the text's ids, then that EOS's id when it is
      one of `eos_ids`, else the default EOS (`default_eos_token_id`); cut so the whole fits `max_new_tokens`.
    - `eos_token` None: the completion was cut at `max_new_tokens`; its ids, NO EOS appended.
    - unknown (`UNKNOWN_EOS`, a plain text): a finished completion ending with the default EOS, unless its text
      alone fills `max_new_tokens` (then it was cut: no EOS).
    A `CompletionText`'s own `eos_token` is used when `eos_token` is not given.
    """
    if isinstance(text, CompletionText):
        if text.token_ids is not None and text.tokenizer is tokenizer:
            return torch.as_tensor(text.token_ids, dtype=torch.long).clone()
        if eos_token is UNKNOWN_EOS:
            eos_token = text.eos_token
    ids = tokenizer(str(text), add_special_tokens=False)["input_ids"]
    if eos_token is UNKNOWN_EOS:
        eos_token = None if len(ids) >= max_new_tokens else ""
    if eos_token is None:
        return torch.tensor(ids[:max_new_tokens], dtype=torch.long)
    eos_id = tokenizer.convert_tokens_to_ids(eos_token) if eos_token else None
    if eos_id is None or eos_id not in eos_ids:
        eos_id = default_eos_token_id(tokenizer, eos_ids)
    return torch.tensor([*ids[: max_new_tokens - 1], eos_id], dtype=torch.long)


def ended_with_eos(tokenizer, completion_ids: torch.Tensor, eos_ids: Sequence[int]) -> str | None:
    """The text of the EOS token a generated completion ended with, or None when it has none (cut)."""
    if completion_ids.numel() and int(completion_ids[-1]) in eos_ids:
        return tokenizer.convert_ids_to_tokens(int(completion_ids[-1]))
    return None


__all__ += ["completion_mask", "agent_token_logprobs", "default_formatter"]
__all__ += ["CompletionText", "completion_token_ids", "default_eos_token_id", "ended_with_eos", "UNKNOWN_EOS"]
