"""Configurations of the iterative preference trainers: `MADPOIterConfig` and `MARLHFIterConfig`.

Both add the fields of `IterativeConfigMixin` (rounds, replay, comparator) to their one-shot trainer's config. The
comparator's own options live in ONE field, `comparator_kwargs` (see `trl_marl.plugins.comparator_options`); the
flat `comparator_*` fields of earlier releases are deprecated aliases of its keys for one release.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from trl_marl.plugins.comparator_options import build_options
from trl_marl.plugins.comparators_protocol import option_name
from trl_marl.plugins.registry import COMPARATOR_GROUP, load_plugin
from trl_marl.plugins.replay import make_replay_mode
from trl_marl.trainers.config_checks import check_devices
from trl_marl.trainers.preference.madpo import MADPOConfig
from trl_marl.trainers.preference.marlhf import MARLHFConfig, removed_name
from trl_marl.trainers.preference.pairs import PAIR_SELECTIONS
from trl_marl.utils.secrets import check_no_secrets

__all__ = [
    "IterativeConfigMixin",
    "MADPOIterConfig",
    "MARLHFIterConfig",
    "DEPRECATED_COMPARATOR_FIELDS",
    "PREFERENCE_SCORING",
]

# deprecated flat field -> its key in comparator_kwargs (one release)
DEPRECATED_COMPARATOR_FIELDS = {
    "comparator_generation_mode": "generation_mode",
    "comparator_centralized_agent_index": "centralized_agent_index",
    "comparator_model_name": "model_name",
    "comparator_agents": "agents",
    "comparator_devices": "devices",
    "comparator_history_k": "k",
    "comparator_api_url": "url",
    "comparator_api_format": "format",
    "comparator_api_model": "model",
    "comparator_api_key_env": "key_env",
    "comparator_api_timeout": "timeout",
    "comparator_api_max_response_bytes": "max_response_bytes",
    "comparator_api_headers": "headers",
    "comparator_api_extra_body": "extra_body",
    "comparator_api_max_n_per_request": "max_n_per_request",
    "comparator_api_response_field": "response_field",
    "comparator_api_max_retries": "max_retries",
    "comparator_api_retry_backoff": "backoff_base",
    "comparator_api_max_concurrency": "max_concurrency",
}


def _deprecated(key: str) -> str:
    return f"Deprecated: set comparator_kwargs['{key}']."


@dataclass
class IterativeConfigMixin:
    r"""Fields of the iterative trainers (`MADPOIterConfig`, `MARLHFIterConfig`), put before their one-shot config.

    Parameters:
        num_rounds: rounds of collect -> store -> select -> train.
        num_iterations: refused: the rounds are `num_rounds` (TRL's `num_iterations` is GRPO's policy updates per
            batch of generations, another concept).
        preference_replay_mode: which stored rounds each round trains on: `current`, `nearest_k`, `all_history`,
            `lambda_decay` (or a plugin's name; entry-point group `trl_marl.replay_modes`).
        preference_replay_k: `nearest_k`: the latest k non-empty rounds; `lambda_decay`: the latest K (optional).
        preference_replay_lambda: `lambda_decay`'s lambda in [0, 1] (weights `lambda ** age`).
        preference_replay_sample_size: pairs drawn per round in the historical modes (default: the current round's
            pair count, or the latest non-empty round's when the current one is empty).
        preference_replay_dir: where round files go (default `output_dir/preference_replay`). Files already there
            from an earlier run are NOT imported.
        policy_checkpoint_dir: where policy snapshots for the `history` comparator go (default
            `output_dir/policy_history`).
        comparator_policy: the comparator: `current`, `current_copy`, `model`, `history`, `api` (or a plugin's
            name; entry-point group `trl_marl.comparators`). In code, the trainer's `comparator=` also takes an
            instance.
        comparator_kwargs: the comparator's options, passed to its constructor after the config (a dict, an options
            dataclass such as `APIComparatorOptions`, or a JSON object on the command line). The built-in
            comparators' options (`trl_marl.plugins.comparator_options`): `generation_mode`,
            `centralized_agent_index` (all local ones), `devices` (`current_copy`, `model`, `history`), `model_name`
            / `agents` (`model`), `k` (`history`), and `url`, `format`, `model`, `key_env`, `timeout`, `headers`,
            `extra_body`, ... (`api`, see `APIComparatorOptions`). Checked when the config is built; the URL,
            headers and body fields must not carry a secret (keys come from the variable `key_env` names).
        comparator_num_candidates: candidates the comparator samples per item (default: `preference_num_candidates`).
        replay_kwargs: keyword arguments for the replay mode's constructor, besides `k`, `lam`, `sample_size` (a
            dict or a JSON object): a plugin's own options.
        comparator_*: deprecated aliases of keys of `comparator_kwargs` (`DEPRECATED_COMPARATOR_FIELDS`): a value
            given here moves there with a FutureWarning, and giving a key both ways is an error. They are
            `comparator_generation_mode`, `comparator_centralized_agent_index`, `comparator_model_name`,
            `comparator_agents`, `comparator_devices`, `comparator_history_k`, `comparator_api_url`,
            `comparator_api_format`, `comparator_api_model`, `comparator_api_key_env`, `comparator_api_timeout`,
            `comparator_api_max_response_bytes`, `comparator_api_headers`, `comparator_api_extra_body`,
            `comparator_api_max_n_per_request`, `comparator_api_response_field`, `comparator_api_max_retries`,
            `comparator_api_retry_backoff` and `comparator_api_max_concurrency`.
    """

    num_rounds: int = field(default=3, metadata={"help": "Rounds of collect -> store -> select -> train."})
    num_iterations: int | None = field(
        default=None,
        metadata={"help": "Refused: the rounds are num_rounds (GRPO's num_iterations is another concept)."},
    )
    preference_replay_mode: str = field(default="current", metadata={"help": "Replay mode (plugin name)."})
    preference_replay_k: int | None = field(default=None, metadata={"help": "Rounds k of nearest_k / lambda_decay."})
    preference_replay_lambda: float | None = field(default=None, metadata={"help": "lambda of lambda_decay."})
    preference_replay_sample_size: int | None = field(
        default=None, metadata={"help": "Pairs drawn per round in the historical modes."}
    )
    preference_replay_dir: str | None = field(default=None, metadata={"help": "Directory of the round files."})
    policy_checkpoint_dir: str | None = field(default=None, metadata={"help": "Directory of policy snapshots."})
    comparator_policy: str = field(default="current", metadata={"help": "Comparator (plugin name)."})
    comparator_kwargs: dict | str | None = field(
        default=None, metadata={"help": "The comparator's options (JSON object), e.g. '{\"k\": 2}' for history."}
    )
    comparator_num_candidates: int | None = field(
        default=None, metadata={"help": "Comparator candidates per item (default: preference_num_candidates)."}
    )
    replay_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Options for the replay mode's constructor (JSON object)."}
    )
    # deprecated aliases of comparator_kwargs keys (one release)
    comparator_generation_mode: str | None = field(default=None, metadata={"help": _deprecated("generation_mode")})
    comparator_centralized_agent_index: int | None = field(
        default=None, metadata={"help": _deprecated("centralized_agent_index")}
    )
    comparator_model_name: str | None = field(default=None, metadata={"help": _deprecated("model_name")})
    comparator_agents: list[str] | None = field(default=None, metadata={"help": _deprecated("agents")})
    comparator_devices: list[str] | None = field(default=None, metadata={"help": _deprecated("devices")})
    comparator_history_k: int | None = field(default=None, metadata={"help": _deprecated("k")})
    comparator_api_url: str | None = field(default=None, metadata={"help": _deprecated("url")})
    comparator_api_format: str | None = field(default=None, metadata={"help": _deprecated("format")})
    comparator_api_model: str | None = field(default=None, metadata={"help": _deprecated("model")})
    comparator_api_key_env: str | None = field(default=None, metadata={"help": _deprecated("key_env")})
    comparator_api_timeout: float | None = field(default=None, metadata={"help": _deprecated("timeout")})
    comparator_api_max_response_bytes: int | None = field(
        default=None, metadata={"help": _deprecated("max_response_bytes")}
    )
    comparator_api_headers: dict | str | None = field(default=None, metadata={"help": _deprecated("headers")})
    comparator_api_extra_body: dict | str | None = field(default=None, metadata={"help": _deprecated("extra_body")})
    comparator_api_max_n_per_request: int | None = field(
        default=None, metadata={"help": _deprecated("max_n_per_request")}
    )
    comparator_api_response_field: str | None = field(default=None, metadata={"help": _deprecated("response_field")})
    comparator_api_max_retries: int | None = field(default=None, metadata={"help": _deprecated("max_retries")})
    comparator_api_retry_backoff: float | None = field(default=None, metadata={"help": _deprecated("backoff_base")})
    comparator_api_max_concurrency: int | None = field(default=None, metadata={"help": _deprecated("max_concurrency")})

    def __post_init__(self) -> None:
        if self.num_iterations is not None:
            raise ValueError(
                f"num_iterations={self.num_iterations!r} is not an option of {type(self).__name__}: set num_rounds, "
                "the rounds of collect -> select -> train. (TRL's num_iterations belongs to the GRPO loss family: "
                "policy updates per batch of generations.)"
            )
        self.comparator_kwargs = _as_options_dict("comparator_kwargs", self.comparator_kwargs)
        self.replay_kwargs = _as_options_dict("replay_kwargs", self.replay_kwargs)
        self._move_deprecated_comparator_fields()
        super().__post_init__()

    def _move_deprecated_comparator_fields(self) -> None:
        """A flat `comparator_*` value moves into `comparator_kwargs` (FutureWarning); the flat field is then None,
        so that the config holds each option in one place."""
        for old, key in DEPRECATED_COMPARATOR_FIELDS.items():
            value = getattr(self, old)
            if value is None:
                continue
            if old in ("comparator_api_headers", "comparator_api_extra_body"):
                value = _as_options_dict(old, value)
            kwargs = self.comparator_kwargs if self.comparator_kwargs is not None else {}
            if key in kwargs:  # values left out: they may hold secrets
                raise ValueError(
                    f"{old} and {option_name(key)} are both set: {old} is a deprecated alias; set only "
                    f"{option_name(key)}"
                )
            warnings.warn(
                f"`{old}` is deprecated; set {option_name(key)} (a comparator's options live in comparator_kwargs)",
                FutureWarning,
                stacklevel=4,
            )
            self.comparator_kwargs = {**kwargs, key: value}
            setattr(self, old, None)

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        if self.num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {self.num_rounds}")
        if self.comparator_num_candidates is not None and self.comparator_num_candidates < 1:
            raise ValueError(f"comparator_num_candidates must be >= 1, got {self.comparator_num_candidates}")
        # plugin names and options fail here, with the registered names, before any model loads
        make_replay_mode(
            self.preference_replay_mode,
            k=self.preference_replay_k,
            lam=self.preference_replay_lambda,
            sample_size=self.preference_replay_sample_size,
            **(self.replay_kwargs or {}),
        )
        comparator_class = load_plugin(COMPARATOR_GROUP, self.comparator_policy)
        options = self.comparator_kwargs or {}
        # whatever the comparator: a config never holds a secret (it is saved in checkpoints and model cards)
        secret_fields = (options.get("url"), options.get("headers"), options.get("extra_body"))
        check_no_secrets("comparator_kwargs", *secret_fields, option_name("key_env"))
        options_class = getattr(comparator_class, "options_class", None)
        if options_class is not None:
            built = build_options(options_class, self.comparator_policy, options)
            # the local comparators' `devices`: each one this machine has, before any model loads
            check_devices(
                option_name("devices"), getattr(built, "devices", None), "the comparator's default placement"
            )
            check_team = getattr(built, "check_team", None)  # optional: the checks that need num_agents
            if check_team is not None:
                check_team(self.num_agents)


def _as_options_dict(name: str, value: object) -> dict | None:
    """A dict from a dict, a JSON object (the command line) or an options dataclass; None stays None."""
    if value is None or isinstance(value, dict):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} must be a JSON object, got {value!r}") from exc
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(f"{name} must be a dict or a JSON object, got {type(value).__name__}")


_ITER_PAIR_SELECTION = field(
    default="comparator_reward",
    metadata={"help": "comparator_reward, reward_gap, all or random.", "choices": list(PAIR_SELECTIONS)},
)


@dataclass
class MADPOIterConfig(IterativeConfigMixin, MADPOConfig):
    r"""Configuration of `MADPOIterTrainer`: the `MADPOConfig` fields, the iterative fields of
    `IterativeConfigMixin`, and these defaults: `num_train_epochs=1` (per round), `pair_selection="comparator_reward"`.
    """

    num_train_epochs: float = field(default=1.0, metadata={"help": "Epochs over B(nu) in each round."})
    pair_selection: str = _ITER_PAIR_SELECTION
    _allowed_pair_selections = PAIR_SELECTIONS


PREFERENCE_SCORING = ("task", "reward_model")


@dataclass
class MARLHFIterConfig(IterativeConfigMixin, MARLHFConfig):
    r"""Configuration of `MARLHFIterTrainer`: the `MARLHFConfig` fields, the iterative fields of
    `IterativeConfigMixin`, plus:

    Parameters:
        preference_scoring_reward: the oracle of new comparisons: `"task"` (the task reward) or `"reward_model"`
            (the most recently fitted reward model; the task reward while none exists yet).

    Defaults changed: `num_train_epochs=1` (RL epochs per round), `reward_num_train_epochs=2`,
    `pair_selection="comparator_reward"`.
    """

    num_train_epochs: float = field(default=1.0, metadata={"help": "RL epochs over the items in each round."})
    reward_num_train_epochs: int = field(default=2, metadata={"help": "Bradley-Terry epochs per round."})
    pair_selection: str = _ITER_PAIR_SELECTION
    preference_scoring_reward: str = field(
        default="task",
        metadata={"help": "Oracle of new comparisons: task or reward_model.", "choices": list(PREFERENCE_SCORING)},
    )
    _allowed_pair_selections = PAIR_SELECTIONS

    def _validate_multi_agent(self) -> None:
        super()._validate_multi_agent()
        if self.preference_scoring_reward not in PREFERENCE_SCORING:
            raise ValueError(
                f"preference_scoring_reward must be one of {list(PREFERENCE_SCORING)}, got "
                f"{self.preference_scoring_reward!r}"
            )
        if self.reward_model_path is not None:
            raise ValueError(
                "reward_model_path is a reward model used as is, but the iterative trainers fit a NEW reward model "
                "every round: use MARLHFTrainer with reward_model_path, or leave it unset"
            )


# removed in favour of `MARLHFIterConfig(rl_algorithm=...)`, forwarded for one release (`marlhf.removed_name`)
_REMOVED = {"MARLHFIterMAACConfig": ("MARLHFIterConfig", "maac"), "MARLHFIterIACConfig": ("MARLHFIterConfig", "iac")}


def __getattr__(name: str) -> Any:
    return removed_name(__name__, name, _REMOVED, globals())
