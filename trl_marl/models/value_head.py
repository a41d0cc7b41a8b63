"""Critics and value heads for the actor-critic trainers, and the team module that holds them.

- `ValueHead`: a scalar head on a transformer's final hidden state, `V = w . h + b`, or with a hidden layer,
  `V = w2 . tanh(W1 h + b1) + b2`.
- `CausalLMWithValueHead`: a separate critic, i.e. a causal-LM backbone (its LM head unused) plus a `ValueHead`.
  Its inputs are left-padded, so the value is read at the LAST position: the last prompt token for a V(h) critic
  (the input is the prompt / history), the last completion token for a Q(h, a) critic (prompt + completion).
- `ActorCriticTeam`: the `TeamModel` of the actor-critic trainers. The agents, the separate critics and the value
  heads on the actors are all submodules of ONE module, so a single accelerate / DeepSpeed engine and a single
  optimizer cover them, and ONE `forward` call returns everything a loss needs (per-agent completion log-probs,
  per-agent value-head values, per-critic values).

Critic sources (`load_critics`) follow the broadcasting rules of the spec: a model id / path is loaded once per
critic (independent parameters); distinct model objects stay independent; the SAME object given for several critics
(one preloaded object broadcast, or repeated in a list) is one critic whose parameters are shared. A critic reads an
agent's token ids, so `check_critic_tokenizer` verifies that it was trained with that agent's tokenizer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from trl_marl.data_types.batches import AgentBatch, CriticBatch
from trl_marl.models.team import TeamModel, forward_completions, masked_mean_entropy

__all__ = [
    "ValueHead",
    "CausalLMWithValueHead",
    "ActorCriticTeam",
    "load_critic",
    "load_critics",
    "check_critic_tokenizer",
    "agent_logprobs_and_values",
    "save_value_head",
    "load_value_head",
    "hidden_size_of",
    "VALUE_HEAD_WEIGHTS",
    "VALUE_HEAD_CONFIG",
]

VALUE_HEAD_WEIGHTS = "value_head.safetensors"
VALUE_HEAD_CONFIG = "value_head.json"
CRITIC_TYPES = ("v", "q")


def hidden_size_of(model: PreTrainedModel) -> int:
    """The hidden size of a (possibly multimodal) causal LM's text backbone."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.hidden_size)


class ValueHead(nn.Module):
    """Scalar value from a hidden state.

        V(h) = w . h + b                                  (hidden_dim None)
        V(h) = w2 . tanh(W1 h + b1) + b2                  (hidden_dim given)

    Weights start from N(0, 0.02^2) and biases at 0, so initial values are close to 0. The computation runs in the
    head's dtype and returns float32 values of shape `h.shape[:-1]`.
    """

    def __init__(self, hidden_size: int, hidden_dim: int | None = None):
        super().__init__()
        if hidden_dim is not None and hidden_dim < 1:
            raise ValueError(f"value head hidden_dim must be None or >= 1, got {hidden_dim}")
        self.hidden_size, self.hidden_dim = int(hidden_size), hidden_dim
        self.hidden = nn.Linear(hidden_size, hidden_dim) if hidden_dim else None
        self.out = nn.Linear(hidden_dim or hidden_size, 1)
        for layer in (self.hidden, self.out):
            if layer is not None:
                nn.init.normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.to(self.out.weight.dtype)
        if self.hidden is not None:
            x = torch.tanh(self.hidden(x))
        return self.out(x).squeeze(-1).float()

    def head_config(self) -> dict:
        return {"hidden_size": self.hidden_size, "hidden_dim": self.hidden_dim}


def save_value_head(head: ValueHead, folder: str, state_dict: dict | None = None) -> None:
    """Write `value_head.safetensors` and `value_head.json` (its shape) into `folder`."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    state = state_dict if state_dict else head.state_dict()
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, os.path.join(folder, VALUE_HEAD_WEIGHTS))
    with open(os.path.join(folder, VALUE_HEAD_CONFIG), "w", encoding="utf-8") as f:
        json.dump(head.head_config(), f, indent=2)


def load_value_head(folder: str) -> ValueHead:
    """Rebuild the `ValueHead` that `save_value_head` wrote into `folder`."""
    from safetensors.torch import load_file

    with open(os.path.join(folder, VALUE_HEAD_CONFIG), encoding="utf-8") as f:
        cfg = json.load(f)
    head = ValueHead(cfg["hidden_size"], cfg.get("hidden_dim"))
    head.load_state_dict(load_file(os.path.join(folder, VALUE_HEAD_WEIGHTS)))
    return head


def _last_hidden_state(model: PreTrainedModel, input_ids, attention_mask, position_ids) -> torch.Tensor:
    """`(B, L, H)` final (normalized) hidden states of a causal LM, without computing its LM head when possible."""
    backbone = getattr(model, "base_model", model)
    if backbone is not model:
        out = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return out.last_hidden_state
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        output_hidden_states=True,
        logits_to_keep=1,
    )
    return out.hidden_states[-1]


class CausalLMWithValueHead(nn.Module):
    """A separate critic: a causal-LM backbone plus a `ValueHead`, `value(input) = head(h_last)`.

    `forward(input_ids, attention_mask)` takes LEFT-padded inputs and returns the `(B,)` values read at the last
    position. An untied LM head of the backbone is frozen (it never receives a gradient). Save with `save_pretrained(folder)` (the backbone as a normal `save_pretrained` folder plus
    `value_head.safetensors` / `value_head.json`) and load with `CausalLMWithValueHead.from_pretrained(folder)`.
    """

    def __init__(self, model: PreTrainedModel, value_head_hidden_dim: int | None = None, value_head: ValueHead = None):
        super().__init__()
        self.model = model
        self.value_head = (
            value_head if value_head is not None else ValueHead(hidden_size_of(model), value_head_hidden_dim)
        )
        # The LM head is never used: freeze it unless it is tied to the input embeddings (then it IS the embeddings).
        out, emb = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and emb is not None and out.weight is not emb.weight:
            out.weight.requires_grad_(False)

    @property
    def config(self):
        return self.model.config

    @property
    def name_or_path(self) -> str:
        return getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = _last_hidden_state(self.model, input_ids, attention_mask, position_ids)
        return self.value_head(hidden[:, -1])

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.model.gradient_checkpointing_disable()

    def save_pretrained(self, folder: str, state_dict: dict | None = None, tokenizer: Any = None) -> None:
        """Write the backbone (`save_pretrained`), the value head and, when given, the tokenizer it reads."""
        model_state = head_state = None
        if state_dict:
            model_state = {k[len("model.") :]: v for k, v in state_dict.items() if k.startswith("model.")}
            head_state = {k[len("value_head.") :]: v for k, v in state_dict.items() if k.startswith("value_head.")}
        self.model.save_pretrained(folder, state_dict=model_state or None)
        save_value_head(self.value_head, folder, head_state)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, **kwargs) -> CausalLMWithValueHead:
        """Load a critic written by `save_pretrained` (`kwargs` go to `AutoModelForCausalLM.from_pretrained`)."""
        model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
        return cls(model, value_head=load_value_head(str(folder)))


def agent_logprobs_and_values(
    agent: PreTrainedModel,
    head: ValueHead,
    batch: AgentBatch,
    critic_type: str = "v",
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> tuple[torch.Tensor, ...]:
    """ONE forward pass of an actor with a value head on its backbone (IAC shared-model mode).

    Returns the `(B, C)` completion-token log-probs (as `agent_token_logprobs`) and the `(B,)` values read from the
    final hidden state at the last prompt token (`critic_type="v"`, V(h)) or at the last completion token
    (`"q"`, Q(h, a)). Prompts are left-padded in the batch, so the last prompt token is at position `P - 1`.
    The log-probs are of `logits / temperature` (the sampling temperature); with `return_entropy` the `(B, C)`
    token entropies follow as a third element (`forward_completions`).
    """
    if critic_type not in CRITIC_TYPES:
        raise ValueError(f"critic_type must be one of {CRITIC_TYPES}, got {critic_type!r}")
    device = next(agent.parameters()).device
    C = batch.num_completion_tokens
    res = forward_completions(agent, batch, temperature, output_hidden_states=True, return_entropy=return_entropy)
    out, logp = res[0], res[1]
    completion_mask = batch.completion_mask.to(device)
    hidden = out.hidden_states[-1]  # (B, P + C, H), after the final norm
    B, P = hidden.shape[0], hidden.shape[1] - C
    if critic_type == "v":
        pos = torch.full((B,), P - 1, dtype=torch.long, device=device)
    else:
        pos = P + completion_mask.sum(dim=1).long() - 1
    h = hidden[torch.arange(B, device=device), pos]
    return (logp, head(h), res[2]) if return_entropy else (logp, head(h))


class ActorCriticTeam(TeamModel):
    """The team of an actor-critic trainer: agents, separate critics and / or value heads in ONE module.

    Args:
        agents: the agents' causal LMs.
        agent_names: their sources (for the team config).
        critics: the UNIQUE separate critics (`CausalLMWithValueHead`); a critic shared by several value streams
            appears once (its parameters are shared).
        value_heads: one `ValueHead` per agent on the agent's own backbone (IAC shared-model mode), or None.
        critic_type: `"v"` or `"q"`: where a value head reads the actor's hidden states.
    """

    def __init__(
        self,
        agents: Sequence[PreTrainedModel],
        agent_names: Sequence[str] | None = None,
        critics: Sequence[CausalLMWithValueHead] = (),
        value_heads: Sequence[ValueHead] | None = None,
        critic_type: str = "v",
    ):
        super().__init__(agents, agent_names)
        if critic_type not in CRITIC_TYPES:
            raise ValueError(f"critic_type must be one of {CRITIC_TYPES}, got {critic_type!r}")
        if value_heads is not None and len(value_heads) != len(agents):
            raise ValueError(f"expected one value head per agent ({len(agents)}), got {len(value_heads)}")
        self.critics = nn.ModuleList(critics)
        self.value_heads = nn.ModuleList(value_heads) if value_heads is not None else None
        self.critic_type = critic_type
        self._critic_device_map: dict[str, str] = {}

    # `parallel_training="mp"`: the base trainer records the agents' devices here; the critics' are added so that the
    # Trainer sees the whole placement (and does not move the team onto one device).
    @property
    def hf_device_map(self) -> dict[str, Any]:
        agents = self.__dict__.get("_agent_device_map")
        if agents is None:
            raise AttributeError("hf_device_map")
        return {**agents, **self._critic_device_map}

    @hf_device_map.setter
    def hf_device_map(self, value: dict[str, Any]) -> None:
        self.__dict__["_agent_device_map"] = dict(value)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        super().gradient_checkpointing_enable(gradient_checkpointing_kwargs)
        for c in self.critics:
            c.gradient_checkpointing_enable(gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self) -> None:
        super().gradient_checkpointing_disable()
        for c in self.critics:
            c.gradient_checkpointing_disable()

    def forward(
        self,
        agent_batches: Sequence[AgentBatch | None],
        critic_batches: Sequence[CriticBatch | None] | None = None,
    ) -> dict[str, list[torch.Tensor | None]]:
        """Everything an actor-critic loss needs, in one call.

        Args:
            agent_batches: one `AgentBatch` per agent (None skips the agent).
            critic_batches: one `CriticBatch` per separate critic (None skips it), or None for no critic.

        Returns a dict of lists:
            `logprobs[i]`: `(B_i, C_i)` completion-token log-probs of agent i;
            `entropy[i]`: agent i's mean token entropy on the loss's forward (with gradients), else None
                (`TeamModel.forward`);
            `values[i]`: `(B_i,)` values of agent i's value head (None without value heads);
            `critic_values[k]`: `(B_k,)` values of critic k.
        """
        if len(agent_batches) != len(self.agents):
            raise ValueError(f"expected {len(self.agents)} agent batches, got {len(agent_batches)}")
        logprobs: list[torch.Tensor | None] = []
        values: list[torch.Tensor | None] = []
        entropies: list[float | None] = []
        record = torch.is_grad_enabled()  # the loss's forward: return the entropies for logging (TeamModel.forward)
        T = self.temperature
        for i, (agent, batch) in enumerate(zip(self.agents, agent_batches)):
            if batch is None:
                res = (None, None)
            elif self.value_heads is None:
                res = forward_completions(agent, batch, T, return_entropy=record)[1:]
                res = (res[0], None, *res[1:])
            else:
                res = agent_logprobs_and_values(agent, self.value_heads[i], batch, self.critic_type, T, record)
            logprobs.append(res[0])
            values.append(res[1])
            entropies.append(
                masked_mean_entropy(res[2], batch.completion_mask) if record and batch is not None else None
            )
        critic_values: list[torch.Tensor | None] = []
        if critic_batches is not None:
            if len(critic_batches) != len(self.critics):
                raise ValueError(f"expected {len(self.critics)} critic batches, got {len(critic_batches)}")
            for critic, cb in zip(self.critics, critic_batches):
                if cb is None:
                    critic_values.append(None)
                    continue
                cb = cb.to(next(critic.parameters()).device)
                critic_values.append(critic(cb.input_ids, cb.attention_mask))
        return {"logprobs": logprobs, "entropy": entropies, "values": values, "critic_values": critic_values}


# ---------------------------------------------------------------------------------------------------- loading
def load_critic(
    source: Any, value_head_hidden_dim: int | None = None, loading_kwargs: dict | None = None
) -> tuple[CausalLMWithValueHead, str]:
    """One critic from an id / path, a causal LM object or a `CausalLMWithValueHead`; returns `(critic, name)`.

    A folder written by `CausalLMWithValueHead.save_pretrained` (it holds `value_head.json`) is loaded WITH its value
    head; any other id / path or model object gets a fresh `ValueHead` of `value_head_hidden_dim`.
    """
    if isinstance(source, CausalLMWithValueHead):
        return source, source.name_or_path
    if isinstance(source, (str, os.PathLike)):
        path = str(source)
        if os.path.isfile(os.path.join(path, VALUE_HEAD_CONFIG)):
            return CausalLMWithValueHead.from_pretrained(path, **(loading_kwargs or {})), path
        model = AutoModelForCausalLM.from_pretrained(path, **(loading_kwargs or {}))
        return CausalLMWithValueHead(model, value_head_hidden_dim), path
    if isinstance(source, nn.Module) and hasattr(source, "config"):
        critic = CausalLMWithValueHead(source, value_head_hidden_dim)
        return critic, critic.name_or_path
    raise TypeError(
        f"a critic must be a model id / path, a causal LM object or a CausalLMWithValueHead, got {type(source).__name__}"
    )


def load_critics(
    sources: Sequence[Any], value_head_hidden_dim: int | None = None, loading_kwargs: dict | None = None
) -> tuple[list[CausalLMWithValueHead], list[int], list[str]]:
    """Load one critic per source, with the sharing rule of the spec.

    Each id / path is loaded separately (independent parameters, even when the same id repeats); distinct objects
    stay distinct; the SAME object appearing several times becomes ONE critic (shared parameters).

    Returns `(modules, index, names)`: the unique critic modules, `index[s]` the module serving source s, and the
    sources' names.
    """
    modules: list[CausalLMWithValueHead] = []
    index: list[int] = []
    names: list[str] = []
    by_object: dict[int, int] = {}
    for src in sources:
        if not isinstance(src, (str, os.PathLike)) and id(src) in by_object:
            k = by_object[id(src)]
            index.append(k)
            names.append(names[index.index(k)])
            continue
        critic, name = load_critic(src, value_head_hidden_dim, loading_kwargs)
        modules.append(critic)
        index.append(len(modules) - 1)
        names.append(name)
        if not isinstance(src, (str, os.PathLike)):
            by_object[id(src)] = len(modules) - 1
    return modules, index, names


def check_critic_tokenizer(
    critic: CausalLMWithValueHead, source: Any, tokenizer: Any, label: str, reader: str, why: str | None = None
):
    """Raise a clear `ValueError` when `critic` cannot read token ids produced by `tokenizer`.

    Two checks: when the critic comes from an id / path that has a tokenizer, its vocabulary must equal
    `tokenizer`'s; in every case the critic's embedding table must cover every id of `tokenizer`.

    Args:
        critic: the critic.
        source: what the critic was loaded from (an id / path enables the vocabulary comparison).
        tokenizer: the tokenizer whose ids the critic reads.
        label: how to name the critic in the message (e.g. `"critic 2 ('path')"`).
        reader: whose tokens it reads, a plain name (e.g. `"agent 2"`): it is used as `{reader}'s ...`.
        why: said once, after "The critic reads {reader}'s token ids", when the reader needs explaining (e.g.
            `"the joint critic input is tokenized with agent 1's tokenizer"`).
    """
    reads = f"The critic reads {reader}'s token ids" + (f" ({why})" if why else "")
    other = None
    if isinstance(source, (str, os.PathLike)):
        try:
            other = AutoTokenizer.from_pretrained(str(source))
        except (OSError, ValueError, TypeError, KeyError):
            other = None
    if other is not None:
        mine, theirs = other.get_vocab(), tokenizer.get_vocab()
        if mine != theirs:
            differing = len(set(mine.items()) ^ set(theirs.items()))
            raise ValueError(
                f"{label} is not tokenizer-compatible with {reader}: its tokenizer has {len(mine)} tokens, "
                f"{reader}'s has {len(theirs)}, and {differing} token-id entries differ. {reads}, so it must use the "
                "same tokenizer (pick a critic from the same model family)"
            )
    emb = critic.model.get_input_embeddings()
    rows = getattr(emb, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:
        raise ValueError(
            f"{label} is not tokenizer-compatible with {reader}: it has {rows} token embeddings but {reader}'s "
            f"tokenizer produces ids up to {len(tokenizer) - 1}. {reads}, so it must use the same tokenizer (pick a "
            "critic from the same model family)"
        )
