"""Agents as PEFT (LoRA) adapters.

Two layouts, chosen by `peft_config` (a trainer argument, as in TRL) and `share_base_model` (a config field):

- **one adapter per agent model** (`share_base_model=False`): every agent is its own base model wrapped by PEFT
  with its own adapter; heterogeneous teams allowed.
- **a shared base** (`share_base_model=True`): ONE frozen base model carries one adapter per agent (`agent_1`,
  `agent_2`, ...). n agents cost the memory of about one model. `team.agents[i]` is an `AdapterAgent`, a view that
  runs the shared model with adapter i active; the team's state dict holds the base and every adapter once.
  Generation runs ONE batched `generate` call for all agents with a per-row adapter (PEFT's mixed-adapter
  batches); the loss runs one forward per agent with its adapter.

In both layouts the reference model of the KL penalty is the base with the adapters disabled (no copy), and
`save_model` writes each agent's adapter folder (`adapter_config.json` + `adapter_model.safetensors`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from trl_marl.utils.import_utils import require_extra

__all__ = [
    "AdapterAgent",
    "AdapterDisabled",
    "adapter_name",
    "build_shared_base",
    "causal_lm",
    "mixed_adapter_generate",
    "wrap_agents_with_peft",
]


def adapter_name(i: int) -> str:
    """The adapter of agent i (0-based) on a shared base."""
    return f"agent_{i + 1}"


def _tuner_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextlib.contextmanager
def _active(model: nn.Module, layers: Sequence[nn.Module], name: str) -> Iterator[None]:
    """Make `name` the only active adapter WITHOUT touching `requires_grad` (PEFT's `set_adapter` would freeze the
    other agents' adapters, whose graphs may still be awaiting their backward pass)."""
    previous = [layer._active_adapter for layer in layers]
    for layer in layers:
        layer._active_adapter = [name]
    try:
        yield
    finally:
        for layer, prev in zip(layers, previous):
            layer._active_adapter = prev


class AdapterAgent(nn.Module):
    """Agent i of a shared-base team: the shared PEFT model with adapter `name` active.

    It does NOT register the shared model as a submodule (the team does, once), so its `parameters()` are this
    adapter's parameters only — what the agent's optimizer group and gradient norm need.
    """

    def __init__(self, shared: nn.Module, name: str, layers: Sequence[nn.Module]):
        super().__init__()
        object.__setattr__(self, "_shared", shared)
        object.__setattr__(self, "_layers", list(layers))
        self.adapter = name

    @property
    def shared(self) -> nn.Module:
        return self._shared

    @property
    def config(self):
        return self._shared.config

    @property
    def generation_config(self):
        return self._shared.generation_config

    def activated(self):
        return _active(self._shared, self._layers, self.adapter)

    def forward(self, *args, **kwargs):
        with self.activated():
            return self._shared(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with self.activated():
            return self._shared.generate(*args, **kwargs)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        tag = f".{self.adapter}."
        for name, p in self._shared.named_parameters():
            if tag in name:
                yield (f"{prefix}.{name}" if prefix else name), p

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters():
            yield p

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self._shared, adapter_name=self.adapter)

    def save_pretrained(self, folder: str, state_dict: dict | None = None, **kwargs) -> None:
        """Write this agent's adapter as a standalone PEFT folder (loadable with `PeftModel.from_pretrained`).

        `state_dict`: the shared model's full state dict to take the adapter from (what a sharded engine gathered,
        e.g. under FSDP2); default: the shared model's own parameters."""
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(folder))) as tmp:
            self._shared.save_pretrained(tmp, selected_adapters=[self.adapter], state_dict=state_dict)
            src = os.path.join(tmp, self.adapter) if os.path.isdir(os.path.join(tmp, self.adapter)) else tmp
            for f in os.listdir(src):
                if os.path.isfile(os.path.join(src, f)):
                    shutil.copy2(os.path.join(src, f), os.path.join(folder, f))

    def load_saved(self, folder: str) -> None:
        """Load this agent's adapter weights from a folder written by `save_pretrained`."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        state = load_file(os.path.join(folder, "adapter_model.safetensors"))
        set_peft_model_state_dict(self._shared, state, adapter_name=self.adapter)


class AdapterDisabled(nn.Module):
    """The reference policy of a PEFT agent: the base model with every adapter disabled (no copy).

    The adapters are switched off on the tuner layers directly: PEFT's `disable_adapter()` context re-activates
    adapters on exit through `set_adapter`, which would also change which adapters are trainable.
    """

    def __init__(self, peft_model: nn.Module):
        super().__init__()
        object.__setattr__(self, "_peft", peft_model)
        object.__setattr__(self, "_layers", _tuner_layers(peft_model))

    def parameters(self, recurse: bool = True):
        return self._peft.parameters()

    def forward(self, *args, **kwargs):
        previous = [layer._disable_adapters for layer in self._layers]
        for layer in self._layers:
            layer._disable_adapters = True
        try:
            with torch.no_grad():
                return self._peft(*args, **kwargs)
        finally:
            for layer, prev in zip(self._layers, previous):
                layer._disable_adapters = prev


def _peft_wrap(model: nn.Module, peft_config, name: str, who: str):
    get_peft_model = require_extra("peft", "peft_config (LoRA agents)").get_peft_model

    try:
        return get_peft_model(model, copy.deepcopy(peft_config), adapter_name=name)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ValueError(
            f"peft_config cannot wrap {who} (model type {model_type!r}): {exc}. Check target_modules against the "
            "model's module names."
        ) from exc


def wrap_agents_with_peft(models: list[nn.Module], peft_config, names: list[str]) -> list[nn.Module]:
    """One adapter per agent model (`share_base_model=False`)."""
    return [_peft_wrap(m, peft_config, "default", f"agent {i + 1} ({names[i]})") for i, m in enumerate(models)]


def build_shared_base(base: nn.Module, peft_config, num_agents: int, name: str):
    """ONE PEFT model with one trainable adapter per agent on a frozen base; returns (peft_model, agent views)."""
    pm = _peft_wrap(base, peft_config, adapter_name(0), f"the shared base ({name})")
    for i in range(1, num_agents):
        pm.add_adapter(adapter_name(i), copy.deepcopy(peft_config))
    names = [adapter_name(i) for i in range(num_agents)]
    # every adapter trainable (the tuner-level call; PeftModel.set_adapter takes one name), adapter 1 active
    pm.base_model.set_adapter(names)
    layers = _tuner_layers(pm)
    for layer in layers:
        layer._active_adapter = [names[0]]
    return pm, [AdapterAgent(pm, n, layers) for n in names]


def mixed_adapter_generate(
    pm: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    adapter_names: list[str],
    generation_config,
    synced_gpus: bool | None = None,
) -> torch.Tensor:
    """ONE `generate` call whose row r runs adapter `adapter_names[r]` (PEFT mixed-adapter batches); `synced_gpus`
    as transformers' `generate` takes it."""
    return pm.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        adapter_names=adapter_names,
        generation_config=generation_config,
        synced_gpus=synced_gpus,
    )


def causal_lm(model: nn.Module) -> nn.Module:
    """The transformers model under our adapter views (`AdapterAgent`: the shared PEFT model; `AdapterDisabled`: the
    PEFT model), PEFT's wrapper (`get_base_model`) and engine wrappers (`.module`: DeepSpeed, DDP); the model itself
    when it is none of these."""
    while True:
        if isinstance(model, AdapterAgent):
            model = model.shared
        elif isinstance(model, AdapterDisabled):
            model = model._peft
        elif callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
        elif isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            return model
