"""`MultiAgentConfig`: the fields every trainer shares, on top of TRL's base config (so every `TrainingArguments`
field works, and `TrlParser` exposes each one as a flag and in YAML)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar

import torch

if not torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") is None:
    # DeepSpeed picks the CPU by itself on a machine without a GPU but prints "Setting accelerator to CPU" at import;
    # naming the accelerator it would pick anyway silences that line (known harmless).
    os.environ["DS_ACCELERATOR"] = "cpu"

from trl.trainer.base_config import _BaseConfig  # noqa: E402

from trl_marl.environments.episode import TURN_ORDERS  # noqa: E402
from trl_marl.generation.vllm_backend import VLLM_MODES, check_unread_vllm_fields, validate_vllm_args  # noqa: E402
from trl_marl.rollout.engine import JOINT_MODES  # noqa: E402
from trl_marl.trainers.config_checks import (  # noqa: E402
    check_devices,
    check_field_values,
    check_mp_only,
    check_step_intervals,
    parse_json_field,
)  # noqa: E402
from trl_marl.trainers.per_agent import SAMPLING_FIELDS, agent_value, check_per_agent  # noqa: E402
from trl_marl.trainers.trl_settings import check_config_kwargs  # noqa: E402
from trl_marl.utils.deprecation import warn_deprecated  # noqa: E402

__all__ = ["MultiAgentConfig", "PARALLEL_MODES", "TEMPERATURE_RANGE", "training_args_quietly"]

PARALLEL_MODES = ("none", "mp")
# Sampling temperatures allowed: below 0.01 the log-probs of logits / T overflow (vLLM clamps there too), above 100
# sampling is uniform noise; `inf` and tiny values trained with a zero or NaN gradient.
TEMPERATURE_RANGE = (0.01, 100.0)


@contextlib.contextmanager
def training_args_quietly() -> Iterator[None]:
    """Build a `TrainingArguments` (ours, or the reward-model stage's `RewardConfig`) without transformers >= 5.24's
    `gradient_checkpointing` FutureWarning: it renamed the field (`activation_checkpointing`) and warns whenever the
    old one exists, which TRL 1.16's base config still declares. Harmless, and not the user's doing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def _accelerator_available() -> bool:
    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


@dataclass
class MultiAgentConfig(_BaseConfig):
    r"""Configuration shared by every multi-agent trainer.

    Subclasses TRL's base config (itself a `transformers.TrainingArguments`), so `output_dir`, `num_train_epochs`,
    `max_steps`, `learning_rate`, `lr_scheduler_type`, `max_grad_norm`, `gradient_accumulation_steps`, `bf16`,
    `gradient_checkpointing`, `report_to`, `logging_steps`, `save_steps`, `push_to_hub`, `hub_model_id`, `seed`, ...
    all work as in TRL. Differences from TRL's defaults, on purpose: `bf16` is off when no GPU is present (TRL would
    fail on a CPU-only machine), `gradient_checkpointing` is off (turn it on for big agents); in multi-process runs on a machine with no GPU,
    `ddp_backend` is `"gloo"` and (except under DeepSpeed) `use_cpu` is set, which is what accelerate needs there; `learning_rate` is 5e-6.

    Batching: each process rolls out `rollout_buffer_size` task items at once (one batched `generate` per agent per
    turn covers all of them x `num_generations`) and then takes `rollout_buffer_size / train_batch_size` training
    steps, each on the samples of `train_batch_size` items (all turns of an item stay in one step, so a group is never
    split). `per_device_train_batch_size` is `train_batch_size` (task items, not completions): left unset it follows
    `train_batch_size`; set alone it IS `train_batch_size`; set to another value than `train_batch_size` it is refused.

    `remove_unused_columns` must stay False (TRL's GRPOConfig default; True is refused): task items reach the
    formatters, reward functions, tools and environments whole.

    Values are checked for meaning when the config is built (`trl_marl.trainers.config_checks`): from Python, a
    string is never taken as a bool or a number (`bf16="false"` is refused; the command line and YAML files convert
    their strings first), every float must be finite, and each field has its range (the error names the field, the
    entry of a per-agent list, and the allowed values).

    Parameters:
        num_agents: number of agents n in the team.
        num_generations: completions G each agent samples per prompt (per node of the rollout tree).
        joint_mode: how the agents' samples combine into joint actions: `"aligned"` (G joint actions, sample j with
            sample j) or `"cross"` (the Cartesian product, G^n joint actions).
        num_turns: turns per rollout; more than 1 needs an `external_transition`, or an agentic rollout (tools, an
            environment or a sequential turn order), where it is the most turns of an episode.
        turn_order: within a turn, `"simultaneous"` (no agent sees another's message of the same turn: the messages
            are exchanged when the turn ends) or `"sequential"` (agent i+1 sees the messages of agents 1..i of the
            same turn and branch; an agentic rollout, see `docs/agentic.md`).
        max_tool_calling_iterations: tool rounds an agent may run in one turn (TRL's name): after that many, the tool
            calls of its last completion are not run; `None` means no limit (the completion budget still ends it).
        discount: gamma, applied to the next turn's return in multi-turn rollouts (honoured, unlike the reference
            library's MAGRPO).
        early_termination_threshold: a rollout branch stops when its turn's mean processed reward exceeds this;
            `None` disables early termination.
        external_prompt_passthrough: use the prompts returned by `external_transition` verbatim instead of passing
            them through each agent's formatter (as `item["prompt"]`).
        max_completion_length: maximum completion length in tokens (TRL's name).
        max_new_tokens: deprecated alias of `max_completion_length` (warns; after construction it holds the same
            value).
        max_prompt_length: prompts longer than this are truncated from the left; `None` keeps them whole.
        temperature: sampling temperature, in [0.01, 100].
        top_p: nucleus sampling.
        top_k: top-k sampling; `None` disables it.
        agent_learning_rate: learning rate of the agents' parameter groups: one rate for every agent, or a list with
            one rate per agent (a list of one is that rate for every agent); `None` uses `learning_rate`.
        rollout_buffer_size: task items each process rolls out together before training on them.
        train_batch_size: task items per training step; `None` means `rollout_buffer_size`. Must divide it.
        reference_kl_enabled: subtract a KL penalty to a frozen copy of each agent's initial weights from the reward.
        reference_kl_coef: weight of that penalty (per-sequence k3 estimate summed over completion tokens).
        reference_devices: devices of the frozen references (one, or one per agent); `None` puts each beside its
            agent. Refused when the run scores no reference (`scores_reference`: nothing would read it).
        eval_interval: evaluate every this many training steps (sets `eval_strategy="steps"`); `None` keeps
            `eval_strategy` / `eval_steps` as given. Evaluation samples the current agents (one completion per agent,
            training sampling settings) on `eval_dataset` and scores them with the task reward.
        eval_num_samples: task items evaluated per evaluation (`None`: the whole eval dataset).
        eval_batch_size: task items rolled out together during evaluation (`per_device_eval_batch_size`).
        parallel_training: `"none"` (accelerate places everything) or `"mp"` (explicit per-agent devices).
        agent_devices: one device per agent (or one for all) in `"mp"` mode, e.g. `["cuda:0", "cuda:1"]`; read in
            `"mp"` mode only, so it is refused in `"none"` (accelerate places the agents there). Each entry of this
            and of `reference_devices` must be a device this machine has (refused at construction, naming the entry:
            `config_checks.check_devices`). `reference_devices` is read in both modes.
        share_base_model: with a `peft_config`, make every agent an adapter on ONE frozen base model (a homogeneous
            team given as `model`): n agents for the memory of about one model; generation runs one call for all
            agents with a per-row adapter; the reference model of the KL penalty is the base with adapters disabled.
        disable_dropout: disable dropout in the agents (as TRL's trainers do) so sampling and scoring agree.
        trace_dir: when set, every training step appends each agent's prompts, completions and rewards to
            `trace_dir/trace_rank{r}.jsonl` (one JSON record per joint action).
        use_vllm: sample with vLLM instead of `model.generate` (TRL's name): True, False, or `"auto"` (colocated
            engines where they were measured faster for the device and the model size, else `model.generate`; the
            choice and why are logged, and `use_vllm` holds it once the trainer is built; `trl_marl.generation.choice`).
            With False, a `vllm_*` field set to another value than its default is refused (nothing would read it;
            TRL ignores it), and so is a `vllm_server_*` field outside `vllm_mode="server"`, and a colocated engine's
            field (`vllm_gpu_memory_utilization` ... `vllm_enable_lora` below) with `vllm_mode="server"`, naming the
            `trl-marl vllm-serve` flag that sets it there.
            The engines only sample: the loss's log-probs stay computed by the training model, and the gap between
            vLLM's sampled log-probs and the trainer's is logged as `sampling/sampling_logp_difference/{mean,max}`.
            See `docs/vllm.md`.
        vllm_mode: `"colocate"` (the engines run inside the training process: one per agent, or ONE multi-LoRA
            engine for a shared-base team) or `"server"` (the team samples through `trl-marl vllm-serve` servers:
            one for the team, or one per agent; weights, or only the adapters of a LoRA team, pushed after each
            optimizer step).
        vllm_server_base_url: server mode: the server's URL (wins over `vllm_server_host` / `vllm_server_port`), or a
            list of one URL per agent (one server per agent).
        vllm_server_host: server mode: the server's host when `vllm_server_base_url` is None.
        vllm_server_port: server mode: the server's port when `vllm_server_base_url` is None.
        vllm_server_timeout: server mode: seconds to wait for the servers to be ready, and for one request; a request
            that fails is retried twice (1 s, 2 s backoff), then the run saves a checkpoint and stops with an error
            naming the server and the agent.
        vllm_group_port: TRL's port of its NCCL weight-update group; accepted for TRL configs and unused (weights
            travel to `trl-marl vllm-serve` over HTTP).
        vllm_gpu_memory_utilization: fraction of the GPU memory each colocated engine may take (weights + KV cache);
            on a CPU build the KV cache size comes from the `VLLM_CPU_KVCACHE_SPACE` environment variable (GiB).
        vllm_enable_sleep_mode: put the engines to sleep (weights and KV cache released) between rollouts; weights
            are re-pushed from the training model when they wake.
        vllm_max_model_length: engine context length (prompt + completion); `None` infers it from the model config.
        vllm_model_impl: `"vllm"` (vLLM's model implementation) or `"transformers"` (its transformers backend).
        vllm_tensor_parallel_size: must be 1 (one engine per agent per process).
        vllm_enable_lora: with `share_base_model=True`, serve every agent from ONE engine as a LoRA request
            (mixed adapters in one `generate` call, adapters pushed after each step); False gives one engine per
            agent with the agent's adapter merged into the base weights. Ignored for other teams.
        logprob_batch_size: rows of one agent scored by one forward pass (the loss's included): the rows are scored
            in chunks of this many, so a step's activation peak is one chunk. On one process the REINFORCE family
            backpropagates each chunk's share of the loss right after its forward (nothing recomputed:
            `trl_marl.trainers.agent_losses`); elsewhere every chunk but the last is recomputed in the backward
            (activation checkpointing). `None` sizes the chunks from a memory budget of four times one agent's
            weights (at least 64 MiB): a batch within it is one forward, as without chunks
            (`trl_marl.models.scoring`). Refused under ZeRO-3 / FSDP2, which score each agent in one forward.
        reward_weights: one weight per reward function (default 1 each), as in TRL's `GRPOConfig.reward_weights`;
            the team reward is the weighted sum. Another count than `reward_funcs` has is refused when the trainer
            is built.
        model_init_kwargs: keyword arguments for `from_pretrained` when the agents are given as ids (TRL's field),
            e.g. `{"dtype": "bfloat16", "attn_implementation": "sdpa"}`; joins the trainer's `model_config`.
        log_completions: print a table of a training rollout's joint actions (prompts, each agent's completion,
            reward, advantages) at every logging step, and log it as a W&B / trackio table when those are in
            `report_to` (TRL's `GRPOConfig.log_completions`).
        num_completions_to_print: rows of that table (`None`: all).
        hub_team_layout: how `push_to_hub` shares the team: `"team"` (ONE repo `hub_model_id` with a folder per agent,
            `team.json` and a team card) or `"per_agent"` (one repo per agent, `{hub_model_id}-agent-{i}`). Supported
            `hub_strategy` values: `"end"` and `"every_save"` in both layouts; `"checkpoint"` and `"all_checkpoints"`
            with `"team"` only (see `trl_marl.hub`).
    """

    # Trainer defaults that differ from TRL's
    learning_rate: float = field(default=5e-6, metadata={"help": "Default learning rate of every parameter group."})
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Enable gradient checkpointing in every agent (trades compute for memory)."}
    )
    logging_steps: float = field(default=1, metadata={"help": "Log every X training steps."})
    remove_unused_columns: bool = field(
        default=False,
        metadata={"help": "Must be False (True is refused): task items reach formatters, rewards and tools whole."},
    )
    per_device_train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Task items (preference trainers: pairs) per training step on each device: the same as "
            "train_batch_size. None: train_batch_size; set alone: it sets train_batch_size; another value than "
            "train_batch_size is refused."
        },
    )

    # Team
    num_agents: int = field(default=2, metadata={"help": "Number of agents n in the team."})

    # Rollout
    num_generations: int = field(default=4, metadata={"help": "Completions G per agent per prompt."})
    joint_mode: str = field(
        default="aligned",
        metadata={"help": "Joint actions: 'aligned' (G) or 'cross' (G^n).", "choices": list(JOINT_MODES)},
    )
    num_turns: int = field(
        default=1, metadata={"help": "Turns per rollout (>1 needs external_transition, tools or an environment)."}
    )
    turn_order: str = field(
        default="simultaneous",
        metadata={
            "help": "Within a turn: 'simultaneous' or 'sequential' (agent i+1 sees agents 1..i's messages).",
            "choices": list(TURN_ORDERS),
        },
    )
    max_tool_calling_iterations: int | None = field(
        default=None, metadata={"help": "Tool rounds per agent turn (TRL's name); None: no limit."}
    )
    discount: float = field(default=1.0, metadata={"help": "Discount gamma between turns."})
    early_termination_threshold: float | None = field(
        default=None, metadata={"help": "Stop a branch when its mean reward exceeds this; None disables."}
    )
    external_prompt_passthrough: bool = field(
        default=False, metadata={"help": "Use external_transition's prompts verbatim (no formatter)."}
    )
    max_completion_length: int = field(default=128, metadata={"help": "Maximum completion length in tokens."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Deprecated alias of max_completion_length."})
    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Truncate prompts to this many tokens (from the left); None keeps them."}
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature, in [0.01, 100]."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling probability mass."})
    top_k: int | None = field(default=None, metadata={"help": "Top-k sampling; None disables."})

    # Optimisation
    # `list[float]` for the command line (one value, or one per agent); a single float works from Python too
    agent_learning_rate: list[float] | None = field(
        default=None,
        metadata={"help": "Learning rate of the agents: one for all, or one per agent; None uses learning_rate."},
    )
    rollout_buffer_size: int = field(default=4, metadata={"help": "Task items rolled out together per process."})
    train_batch_size: int | None = field(
        default=None, metadata={"help": "Task items per training step (divides rollout_buffer_size); None = buffer."}
    )
    logprob_batch_size: int | None = field(
        default=None,
        metadata={"help": "Rows of one agent scored per forward (chunks); None: sized from a memory budget."},
    )

    # Reference KL
    reference_kl_enabled: bool = field(default=False, metadata={"help": "Penalise KL to the frozen initial agents."})
    reference_kl_coef: float = field(default=0.1, metadata={"help": "Weight of the reference-KL reward penalty."})
    reference_devices: list[str] | None = field(
        default=None, metadata={"help": "Devices of the frozen reference models (one or one per agent)."}
    )

    # Evaluation
    eval_interval: int | None = field(
        default=None, metadata={"help": "Evaluate every N training steps (sets eval_strategy='steps')."}
    )
    eval_num_samples: int | None = field(
        default=16, metadata={"help": "Task items per evaluation; None = the whole eval dataset."}
    )
    eval_batch_size: int | None = field(
        default=None, metadata={"help": "Task items rolled out together in evaluation (per device)."}
    )

    # Devices
    parallel_training: str = field(
        default="none",
        metadata={"help": "'none' or 'mp' (explicit per-agent devices).", "choices": list(PARALLEL_MODES)},
    )
    agent_devices: list[str] | None = field(default=None, metadata={"help": "One device per agent in 'mp' mode."})

    # PEFT
    share_base_model: bool = field(
        default=False, metadata={"help": "With peft_config: every agent an adapter on ONE shared frozen base."}
    )

    # vLLM generation (TRL's names; see trl_marl.generation.vllm_backend)
    # `bool | str`: True, False or "auto" (the command line's parser reads it with `trl_marl.generation.choice`)
    use_vllm: bool | str = field(
        default=False,
        metadata={"help": "Sample with vLLM: true, false or auto (the faster backend for the device and model)."},
    )
    vllm_mode: str = field(
        default="colocate",
        metadata={
            "help": "vLLM integration: 'colocate' (engines in the training process) or 'server' (trl-marl vllm-serve).",
            "choices": list(VLLM_MODES),
        },
    )
    vllm_server_base_url: list[str] | None = field(
        default=None,
        metadata={"help": "Server mode: the server's URL (wins over host and port), or one URL per agent."},
    )
    vllm_server_host: str = field(default="0.0.0.0", metadata={"help": "Server mode: the server's host."})
    vllm_server_port: int = field(default=8000, metadata={"help": "Server mode: the server's port."})
    vllm_server_timeout: float = field(
        default=240.0, metadata={"help": "Server mode: seconds to wait for the servers, and for one request."}
    )
    vllm_group_port: int = field(
        default=51216, metadata={"help": "TRL's NCCL weight-update port: accepted, unused (pushes go over HTTP)."}
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "GPU memory fraction of each colocated vLLM engine."}
    )
    vllm_enable_sleep_mode: bool = field(
        default=False, metadata={"help": "Release the vLLM engines' memory between rollouts."}
    )
    vllm_max_model_length: int | None = field(
        default=None, metadata={"help": "vLLM context length (prompt + completion); None infers it."}
    )
    vllm_model_impl: str = field(
        default="vllm", metadata={"help": "vLLM model implementation: 'vllm' or 'transformers'."}
    )
    vllm_tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM tensor parallel size (must be 1)."})
    vllm_enable_lora: bool = field(
        default=True,
        metadata={"help": "Shared-base team: ONE multi-LoRA engine (False: one engine per agent, merged adapters)."},
    )

    # TRL's fields
    reward_weights: list[float] | None = field(
        default=None, metadata={"help": "One weight per reward function (default 1 each)."}
    )
    model_init_kwargs: dict | str | None = field(
        default=None, metadata={"help": "from_pretrained keyword arguments for the agents (a dict or JSON string)."}
    )

    log_completions: bool = field(
        default=False, metadata={"help": "Print (and log to W&B/trackio) a table of sampled completions."}
    )
    num_completions_to_print: int | None = field(
        default=None, metadata={"help": "Rows of the log_completions table (None: all)."}
    )

    # Misc
    disable_dropout: bool = field(default=True, metadata={"help": "Disable dropout in the agents."})
    trace_dir: str | None = field(
        default=None, metadata={"help": "Write per-agent prompt/completion/reward traces (JSONL) here."}
    )
    hub_team_layout: str = field(
        default="team",
        metadata={
            "help": "push_to_hub layout: 'team' (one repo) or 'per_agent' (one repo per agent).",
            "choices": ["team", "per_agent"],
        },
    )

    # False where a training step is not a slice of a rollout (preference trainers: it counts pairs)
    _train_batch_counts_rollout_items = True
    # whether the sampling fields (`per_agent.SAMPLING_FIELDS`) take one value per agent (the MAGRPO family)
    _per_agent_settings = False
    _per_agent_fields: ClassVar[tuple[str, ...]] = ()  # beyond SAMPLING_FIELDS: fields that take one value per agent
    # deprecated alias -> TRL's (primary) name; subclasses extend it. After construction both hold the same value.
    _deprecated_aliases = {"max_new_tokens": "max_completion_length"}

    def _resolve_deprecated_aliases(self) -> None:
        """Move a value given under a deprecated alias to the primary name (with a FutureWarning), refuse two
        different values, then make the alias mirror the primary name (old code reading it keeps working)."""
        defaults = {f.name: f.default for f in fields(self)}
        for old, new in self._deprecated_aliases.items():
            old_value, new_value = getattr(self, old), getattr(self, new)
            if old_value is not None and old_value != new_value:
                if defaults.get(new, MISSING) != new_value:
                    raise ValueError(
                        f"{old}={old_value!r} and {new}={new_value!r} disagree: {old} is a deprecated alias of "
                        f"{new}; set only {new}"
                    )
                warn_deprecated(f"`{old}` is deprecated; use `{new}` (TRL's name)", stacklevel=4)
                setattr(self, new, old_value)
            setattr(self, old, getattr(self, new))

    def __new__(cls, *args, **kwargs):
        # before the dataclass __init__: a TRL setting this config does not take gets a pointer, not Python's bare
        # "unexpected keyword argument" (trl_marl.trainers.trl_settings)
        check_config_kwargs(cls, kwargs)
        return super().__new__(cls)

    def __post_init__(self):
        # before anything compares or converts a value; per-agent lists are checked entry by entry
        check_field_values(self, frozenset(SAMPLING_FIELDS) | frozenset(self._per_agent_fields))
        if self.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
            from trl_marl.utils.import_utils import require_extra

            require_extra("deepspeed")  # before transformers' own check, to name the extra
        self._resolve_deprecated_aliases()
        if isinstance(self.model_init_kwargs, str):  # from the command line, as in TRL
            self.model_init_kwargs = parse_json_field(
                "model_init_kwargs", self.model_init_kwargs, 'a JSON object such as \'{"dtype": "bfloat16"}\''
            )
        if self.model_init_kwargs is not None and not isinstance(self.model_init_kwargs, dict):
            raise ValueError(
                "model_init_kwargs must be a dict of from_pretrained keyword arguments (or a JSON object), got "
                f"{self.model_init_kwargs!r}"
            )
        if not _accelerator_available():
            if self.bf16 is None and not self.use_cpu:
                self.bf16 = False
            self.dataloader_pin_memory = False  # nothing to pin to; torch warns on every loader otherwise
        if not _accelerator_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # Several processes on a CPU-only machine: gloo, and (unless DeepSpeed runs, which use_cpu would drop)
            # use_cpu so that accelerate sees a MULTI_CPU run instead of one process per rank.
            if self.ddp_backend is None:
                self.ddp_backend = "gloo"
            if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
                self.use_cpu = True
        self._resolve_per_device_batch()
        self._validate_multi_agent()
        # after the subclass's checks, whose own messages say more (MADPO's reference is ref_model=)
        if self.reference_devices is not None and not self.scores_reference:
            raise ValueError(
                f"reference_devices={self.reference_devices!r} places the frozen references, and this run scores none "
                "(reference_kl_enabled=False, and no loss-side beta > 0): set reference_kl_enabled=True (or beta > 0 "
                "with TRL's loss) to use a reference, or leave reference_devices unset"
            )
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        self.per_device_train_batch_size = self.train_batch_size
        if self.eval_batch_size is not None:
            self.per_device_eval_batch_size = self.eval_batch_size
        if self.eval_interval is not None:
            self.eval_strategy = "steps"
            self.eval_steps = self.eval_interval
        with training_args_quietly():
            super().__post_init__()

    def _resolve_per_device_batch(self) -> None:
        """`per_device_train_batch_size` means `train_batch_size`: set alone it is taken as `train_batch_size`; set
        beside a different `train_batch_size` it would be overwritten, so it is refused."""
        pdtbs, tb = self.per_device_train_batch_size, self.train_batch_size
        if pdtbs is None or pdtbs == tb:
            return
        if tb is None:
            if self._train_batch_counts_rollout_items and pdtbs >= 1 and self.rollout_buffer_size % pdtbs:
                raise ValueError(
                    f"per_device_train_batch_size={pdtbs} (train_batch_size: the task items per step) must divide "
                    f"rollout_buffer_size={self.rollout_buffer_size}, the items rolled out together"
                )
            self.train_batch_size = pdtbs
            return
        unit = "task items per step" if self._train_batch_counts_rollout_items else "preference pairs per step"
        raise ValueError(
            f"per_device_train_batch_size={pdtbs} and train_batch_size={tb} disagree: both are the {unit} on each "
            "device; set one of them"
        )

    def _validate_multi_agent(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(self.num_agents >= 1, f"num_agents must be >= 1, got {self.num_agents}")
        need(
            self.max_steps == -1 or self.max_steps >= 1,
            f"max_steps must be >= 1, or -1 to train num_train_epochs epochs; got {self.max_steps}",
        )
        # TrainingArguments accepts these, then trains 0 steps and reports success / divides by zero in train()
        need(
            self.max_steps != -1 or self.num_train_epochs > 0,
            f"num_train_epochs must be > 0 when max_steps=-1 (training runs num_train_epochs epochs; 0 or less trains "
            f"0 steps), got {self.num_train_epochs}; or set max_steps >= 1",
        )
        check_step_intervals(self)  # save_steps=0 never saved; transformers accepts it
        need(
            not self.remove_unused_columns,
            "remove_unused_columns=True is not supported: trl_marl's trainers hand every task item whole to the "
            "formatters, the reward functions (batch_items=), tools and environments (TRL's GRPOTrainer with True "
            "keeps only the 'prompt' column, starving any of them that reads another; preference data needs all its "
            "columns). Leave it False (the default, as in TRL's GRPOConfig); to drop columns, call "
            "dataset.remove_columns(...) or dataset.select_columns(...) before passing the dataset",
        )
        gas = self.gradient_accumulation_steps
        need(gas >= 1, f"gradient_accumulation_steps must be >= 1 (1: no accumulation), got {gas}")
        nctp = self.num_completions_to_print
        need(nctp is None or nctp >= 0, f"num_completions_to_print must be None (every row) or >= 0, got {nctp}")
        need(self.learning_rate >= 0, f"learning_rate must be >= 0, got {self.learning_rate}")
        alr = self.agent_learning_rate
        if isinstance(alr, (list, tuple)):
            need(
                len(alr) in (1, self.num_agents),
                f"agent_learning_rate has {len(alr)} entries; give 1 or num_agents={self.num_agents}",
            )
            need(all(lr >= 0 for lr in alr), f"agent_learning_rate must be >= 0 for every agent, got {list(alr)}")
        else:
            need(alr is None or alr >= 0, f"agent_learning_rate must be None or >= 0, got {alr}")
        mpl = self.max_prompt_length
        need(mpl is None or mpl >= 1, f"max_prompt_length must be None (keep prompts whole) or >= 1, got {mpl}")
        need(self.num_generations >= 1, f"num_generations must be >= 1, got {self.num_generations}")
        need(self.joint_mode in JOINT_MODES, f"joint_mode must be one of {list(JOINT_MODES)}, got {self.joint_mode!r}")
        need(self.num_turns >= 1, f"num_turns must be >= 1, got {self.num_turns}")
        need(self.turn_order in TURN_ORDERS, f"turn_order must be one of {list(TURN_ORDERS)}, got {self.turn_order!r}")
        mti = self.max_tool_calling_iterations
        need(mti is None or mti >= 0, f"max_tool_calling_iterations must be None (no limit) or >= 0, got {mti}")
        need(0.0 <= self.discount <= 1.0, f"discount must be in [0, 1], got {self.discount}")
        check_per_agent(self, SAMPLING_FIELDS, self.num_agents, allowed=self._per_agent_settings)
        low, high = TEMPERATURE_RANGE
        for i in range(self.num_agents):  # one value, or one per agent (trl_marl.trainers.per_agent)
            temperature, top_p, top_k, length = (agent_value(getattr(self, name), i) for name in SAMPLING_FIELDS)
            need(length >= 1, f"max_completion_length must be >= 1, got {length}")
            need(low <= temperature <= high, f"temperature must be in [{low:g}, {high:g}], got {temperature}")
            need(0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}")
            need(top_k is None or top_k >= 1, f"top_k must be None or >= 1, got {top_k}")
        need(self.max_grad_norm >= 0, f"max_grad_norm must be >= 0 (0: no clipping), got {self.max_grad_norm}")
        need(self.rollout_buffer_size >= 1, f"rollout_buffer_size must be >= 1, got {self.rollout_buffer_size}")
        tb = self.train_batch_size
        need(tb is None or tb >= 1, f"train_batch_size must be None or >= 1, got {tb}")
        if self._train_batch_counts_rollout_items:
            need(
                tb is None or self.rollout_buffer_size % tb == 0,
                f"train_batch_size ({tb}) must be >= 1 and divide rollout_buffer_size ({self.rollout_buffer_size})",
            )
        need(self.reference_kl_coef >= 0, f"reference_kl_coef must be >= 0, got {self.reference_kl_coef}")
        need(
            self.parallel_training in PARALLEL_MODES,
            f"parallel_training must be one of {list(PARALLEL_MODES)}, got {self.parallel_training!r}",
        )
        # read by `building.place_agents` in "mp" only: elsewhere accelerate places the agents (it was ignored)
        check_mp_only("agent_devices", self.agent_devices, self.parallel_training, "the agents")
        # each entry a device this machine has, before any model loads ("cuda:0" on a CPU-only machine failed late)
        check_devices(
            "agent_devices", self.agent_devices, "with parallel_training='none' accelerate places the agents"
        )
        check_devices("reference_devices", self.reference_devices, "each reference beside its agent")
        if self.parallel_training == "mp":
            need(bool(self.agent_devices), "parallel_training='mp' needs agent_devices (one device per agent)")
        if self.agent_devices is not None:
            need(
                len(self.agent_devices) in (1, self.num_agents),
                f"agent_devices has {len(self.agent_devices)} entries; give 1 or num_agents={self.num_agents}",
            )
        if self.reference_devices is not None:
            need(
                len(self.reference_devices) in (1, self.num_agents),
                f"reference_devices has {len(self.reference_devices)} entries; give 1 or num_agents={self.num_agents}",
            )
        lbs = self.logprob_batch_size
        need(lbs is None or lbs >= 1, f"logprob_batch_size must be None (sized from memory) or >= 1, got {lbs}")
        need(self.eval_interval is None or self.eval_interval >= 1, "eval_interval must be None or >= 1")
        need(self.eval_num_samples is None or self.eval_num_samples >= 1, "eval_num_samples must be None or >= 1")
        check_unread_vllm_fields(self)  # vLLM fields set for a run that would not read them
        if self.use_vllm:
            validate_vllm_args(self)
        from trl_marl.hub.settings import check_hub_settings

        check_hub_settings(self.hub_team_layout, self.hub_strategy if self.push_to_hub else "end")

    @property
    def steps_per_rollout(self) -> int:
        """Training steps taken on each rollout: `rollout_buffer_size / train_batch_size`."""
        return self.rollout_buffer_size // (self.train_batch_size or self.rollout_buffer_size)

    @property
    def scores_reference(self) -> bool:
        """Whether the run scores a frozen reference policy: the reward-side KL (`reference_kl_enabled`) or, with
        TRL's loss (`uses_trl_loss`, the MAGRPO family), the loss-side `beta > 0` of any agent (MADPO's `beta` is
        DPO's, another field). `trl_marl.trainers.building.reference_models` builds the references then."""
        if self.reference_kl_enabled:
            return True
        if not getattr(self, "uses_trl_loss", False):
            return False
        beta = self.beta
        return any(b > 0 for b in (beta if isinstance(beta, (list, tuple)) else [beta]))

    @property
    def completions_per_item(self) -> int:
        """Completions each agent samples per task item in one rollout (`num_generations`; the preference trainers
        read theirs): the rows per item of one `generate` call (`trl_marl.distributed.memory.estimate`)."""
        return self.num_generations

    @property
    def training_rows_per_item(self) -> int:
        """Rows each agent scores in a training step per `train_batch_size` unit: the item's `num_generations`
        samples here, a pair's chosen and rejected responses for MADPO (`trl_marl.distributed.memory.estimate`)."""
        return self.num_generations
