"""The options of the built-in comparators: what `comparator_kwargs` holds for each of them.

An iterative config names its comparator (`comparator_policy`) and gives the comparator's own options in ONE field,
`comparator_kwargs` (a dict in code, a JSON object on the command line or in a YAML file). The comparator is built as
`ComparatorClass(args, **comparator_kwargs)`; a built-in comparator declares its options as a small dataclass
(`options_class`), which the config checks when it is built, before any model loads:

| `comparator_policy` | options dataclass | keys of `comparator_kwargs` |
|---|---|---|
| `current` | `LocalComparatorOptions` | `generation_mode`, `centralized_agent_index` |
| `current_copy` | `CurrentCopyComparatorOptions` | those, and `devices` |
| `model` | `ModelComparatorOptions` | those, `model_name` or `agents`, and `devices` |
| `history` | `HistoryComparatorOptions` | those, `k` and `devices` |
| `api` | `APIComparatorOptions` | `generation_mode` and the client's settings (`APIClientConfig`: `url`, `format`, ...) |

    MADPOIterConfig(comparator_policy="history", comparator_kwargs={"k": 2})
    options = APIComparatorOptions(url=..., model=..., format="openai")
    MADPOIterConfig(comparator_policy="api", comparator_kwargs=options)
    --comparator_policy model --comparator_kwargs '{"model_name": "Qwen/Qwen3-0.6B", "devices": ["cuda:1"]}'

An options dataclass given as `comparator_kwargs` is stored as the dict of its fields. A third-party comparator
without `options_class` receives `comparator_kwargs` as its constructor's keyword arguments and checks them itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trl_marl.plugins.api_clients import APIClientConfig
from trl_marl.plugins.comparators_protocol import option_name
from trl_marl.utils.secrets import is_secret_name

__all__ = [
    "GENERATION_MODES",
    "LocalComparatorOptions",
    "CurrentCopyComparatorOptions",
    "ModelComparatorOptions",
    "HistoryComparatorOptions",
    "APIComparatorOptions",
    "build_options",
]

GENERATION_MODES = ("decentralized", "centralized")


def _check_generation_mode(mode: str) -> None:
    if mode not in GENERATION_MODES:
        raise ValueError(f"{option_name('generation_mode')} must be one of {list(GENERATION_MODES)}, got {mode!r}")


def _check_devices(devices: Any, num_agents: int) -> None:
    if devices is not None and len(devices) not in (1, num_agents):
        raise ValueError(f"{option_name('devices')} has {len(devices)} entries; give 1 or num_agents={num_agents}")


@dataclasses.dataclass
class LocalComparatorOptions:
    """Options of the comparators that sample local models (`current`, and the base of the others).

    Attributes:
        generation_mode: `"decentralized"` (one response per role) or `"centralized"` (ONE comparator model writes
            the whole joint response as one tagged completion, parsed back into roles; a candidate that fails to
            parse is dropped and counted in `parse_failures`).
        centralized_agent_index: which comparator model writes the joint response in centralized mode.
    """

    generation_mode: str = "decentralized"
    centralized_agent_index: int = 0

    def __post_init__(self) -> None:
        _check_generation_mode(self.generation_mode)
        if isinstance(self.centralized_agent_index, bool) or int(self.centralized_agent_index) < 0:
            raise ValueError(
                f"{option_name('centralized_agent_index')} must be >= 0, got {self.centralized_agent_index!r}"
            )

    def check_team(self, num_agents: int) -> None:
        """The checks that need the team's size (the config's `num_agents`)."""
        if self.centralized_agent_index >= num_agents:
            raise ValueError(
                f"{option_name('centralized_agent_index')} must be in [0, {num_agents - 1}], got "
                f"{self.centralized_agent_index}"
            )


@dataclasses.dataclass
class CurrentCopyComparatorOptions(LocalComparatorOptions):
    """Options of `current_copy`: those of `LocalComparatorOptions`, plus

    Attributes:
        devices: devices of the frozen copy (one, or one per agent); unset or the agents' own devices sample the
            live agents directly.
    """

    devices: list[str] | None = None

    def check_team(self, num_agents: int) -> None:
        super().check_team(num_agents)
        _check_devices(self.devices, num_agents)


@dataclasses.dataclass
class ModelComparatorOptions(LocalComparatorOptions):
    """Options of `model` (fixed comparator models): those of `LocalComparatorOptions`, plus

    Attributes:
        model_name: one model id / path for every agent (loaded once).
        agents: one model id / path per agent (instead of `model_name`).
        devices: devices of the comparator models (one, or one per agent; default: the trainer's device).
    """

    model_name: str | None = None
    agents: list[str] | None = None
    devices: list[str] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model_name and not self.agents:
            raise ValueError(
                f"comparator_policy='model' needs {option_name('model_name')} (one model for every agent) or "
                f"{option_name('agents')} (one per agent)"
            )
        if self.model_name and self.agents:
            raise ValueError(f"pass {option_name('model_name')} or {option_name('agents')}, not both")

    def check_team(self, num_agents: int) -> None:
        super().check_team(num_agents)
        if self.agents is not None and len(self.agents) != num_agents:
            raise ValueError(f"{option_name('agents')} has {len(self.agents)} entries but num_agents is {num_agents}")
        _check_devices(self.devices, num_agents)


@dataclasses.dataclass
class HistoryComparatorOptions(LocalComparatorOptions):
    """Options of `history` (the agents as they were rounds ago): those of `LocalComparatorOptions`, plus

    Attributes:
        k: how many rounds back (the oldest snapshot while fewer exist); default 1, the previous round's policy.
        devices: devices of the loaded snapshots (one, or one per agent; default: each agent's own device).
    """

    k: int = 1
    devices: list[str] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.k, bool) or int(self.k) < 1:
            raise ValueError(f"{option_name('k')} must be >= 1, got {self.k!r}")

    def check_team(self, num_agents: int) -> None:
        super().check_team(num_agents)
        _check_devices(self.devices, num_agents)


@dataclasses.dataclass
class APIComparatorOptions(APIClientConfig):
    """Options of `api` (a remote model behind an HTTP API): the client's settings (`APIClientConfig`: the key is
    read from the environment variable `key_env` names, never from a config), plus

    Attributes:
        generation_mode: `"decentralized"` (one request per role and item) or `"centralized"` (one joint prompt per
            item, the joint completion parsed back into roles).
    """

    generation_mode: str = "decentralized"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_generation_mode(self.generation_mode)

    def check_team(self, num_agents: int) -> None:
        """Nothing depends on the team's size."""

    def client_config(self) -> APIClientConfig:
        """The client's settings alone."""
        names = {f.name for f in dataclasses.fields(APIClientConfig)}
        return APIClientConfig(**{k: v for k, v in dataclasses.asdict(self).items() if k in names})


def build_options(options_class: type, policy: str, kwargs: Mapping[str, Any] | None) -> Any:
    """`options_class(**kwargs)`, with errors that name `comparator_kwargs`: an unknown key lists the comparator's
    options (a secret-looking one says where keys go instead), a missing required one is named."""
    kwargs = dict(kwargs or {})
    fields = [f for f in dataclasses.fields(options_class) if f.init]
    known = [f.name for f in fields]
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        hint = ""
        if any(is_secret_name(k) and k != "key_env" for k in unknown):
            hint = (
                "; keys never go into a config: put the key in an environment variable and name it in "
                f"{option_name('key_env')}"
            )
        raise ValueError(
            f"comparator_kwargs: {unknown} {'is not an option' if len(unknown) == 1 else 'are not options'} of the "
            f"{policy!r} comparator; its options are {known}{hint}"
        )
    missing = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in kwargs
    ]
    if missing:
        raise ValueError(f"comparator_policy={policy!r} needs {', '.join(option_name(m) for m in missing)}")
    return options_class(**kwargs)
