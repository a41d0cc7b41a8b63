"""How much memory a team needs per rank, before you launch it (in the spirit of `accelerate estimate-memory`).

`estimate(config, model_config_or_id, engine, world_size)` counts, per rank, the bytes of:

| part | what | sharded over ranks by |
|---|---|---|
| weights | n agents (one base + n adapters for a shared-base LoRA team) | ZeRO-3, FSDP2 |
| gradients | the trainable parameters' gradients (an upper bound for one-process REINFORCE-family runs, which hold one agent's at a time: `trl_marl.trainers.agent_losses`) | ZeRO-2, ZeRO-3, FSDP2 |
| comm buffers | DDP over several ranks: its gradient buckets, a second copy of the gradients (`gradient_as_bucket_view` off, accelerate's default) | none |
| master weights | DeepSpeed (ZeRO-2 / ZeRO-3): an fp32 copy of the trainable parameters' partition, 4 bytes each, ALSO for fp32 weights (see below) | ZeRO-2, ZeRO-3 |
| optimizer | AdamW's two fp32 moments per trainable parameter | ZeRO-2, ZeRO-3, FSDP2 |
| references | frozen copies for the reference-KL penalty (none for LoRA agents: the base with adapters off); MADPO's `ref_model` (`estimate(..., ref_model=)`: ONE model for a single id, one per distinct entry of a list, as the trainer loads them), whole except under ZeRO-3 (TRL's `prepare_deepspeed`) | reference KL: ZeRO-3, FSDP2; `ref_model`: ZeRO-3 |
| comparator | the iterative trainers' local comparator models (`comparator_policy` / `comparator_kwargs`): `history` n snapshots of the agents, `model` each distinct (`model_name` / `agents`, device) model, `current_copy` n copies when `devices` are given (an upper bound where they are the agents' own, outside ZeRO-3, where it copies nothing); `current`, `api` and plugins none. On `devices` when given: that device's memory, counted here as the rank's | none |
| critics | separate critics of the actor-critic trainers, trained like the agents (master weights included) | as the agents |
| reward model | the joint reward model MARLHF scores rollouts with (whole on every rank under DDP / ZeRO-2) | ZeRO-3, FSDP2 |
| generation gather | full weights of the ONE agent that generates (ZeRO-3, FSDP2) | (is the gather) |
| KV cache | one agent's `generate` call (agents generate one after another): rollout_buffer_size x num_generations rows (a config's `completions_per_item`: MADPO's `preference_num_candidates`) | none |
| activations | every agent's forward graph of one training step, kept until the one backward (logits included; an upper bound for one-process REINFORCE-family runs, which backpropagate one agent at a time: `trl_marl.trainers.agent_losses`, and on CUDA, where scoring holds no logits: `trl_marl.models.fused_head`) | none |
| training gather | ZeRO-3 / FSDP2 in the training step: two decoder layers of full weights (the one computing and the one prefetched; trl_marl sets ZeRO-3's live-parameter window to one layer, `trl_marl.distributed.zero3.fill_bucket_sizes`) | (is the gather) |
| loading | host memory while the trainer is built (before the first step): what each rank holds of the agents, references and critics as they are loaded; see below | ZeRO-3 with `zero3_init_flag` |
| optimizer step | AdamW's step: a temporary the size of what it updates at once, in fp32 (`sqrt` of the second moment): a parameter group with torch's foreach kernels (GPUs), one tensor on the CPU, where DeepSpeed's flat partition of a group IS one tensor; trl_marl has one group per agent, so one agent's trainable parameters x 4 bytes (an upper bound for DDP / FSDP2 on the CPU) | ZeRO-2, ZeRO-3, FSDP2 |

The peak is `weights + gradients + comm buffers + master weights + optimizer + references + critics + reward model +
comparator + max(generation, training, optimizer step)`, with generation = gather + KV cache and training =
activations + training gather. Parameter counts are exact (the model is built on the meta device from its config);
activation and KV sizes are standard first-order formulas. Validated on CPU against measured peak RSS, one process
and every engine with 2 processes (tests/test_memory.py, docs/scaling.md).

Loading (`MemoryEstimate.loading`, not part of `peak`, which is the training run's): every rank loads the full agents
(and full critics), except under ZeRO-3 with `zero3_init_flag` (the default of the shipped configs), where they are
built inside `deepspeed.zero.Init` and each rank holds its partition only. References are deep copies of the
agents: whole on every rank under DDP / ZeRO-2; under FSDP2 and ZeRO-3 without the flag each copy is sharded as soon
as it is made (one full copy in flight beside the shards made before); with the flag they are built partitioned
(`trl_marl.distributed.zero3.zero3_frozen_copy`). On GPUs this is host RAM (the models load on the CPU before they move), and
all ranks of a node load at once: a node needs about `ranks_per_node x loading`. On CPU-only runs it is part of the
RSS peak, and the flag lowers the run's peak only where `loading` exceeds the training `peak`: the sharded
training state is (4 weights + 4 master + 4 gradients + 8 AdamW) / W bytes per trainable fp32 parameter, against
the 4 bytes a flag-off rank loads, so from about W = 5 ranks on (W = 4 with references), plus what the
transients add.

Master weights, from DeepSpeed 0.19's code: ZeRO-2 (`stage_1_and_2.py`) always clones the rank's partition into
`single_partition_of_fp32_groups`; ZeRO-3 (`stage3.py::_create_fp32_partitions`) means to reuse an fp32 partition
(`fp16_partitioned_groups_flat`) as the master, but compares its `torch.device` with the engine's device NAME (a
string such as "cpu" or "cuda:0"), which is never equal, so it clones too (measured: separate storages, 73 MB per
rank on the model-shaped team). FSDP2 and DDP update the weights in place.

Not counted: a comparator plugin's models (only the built-in comparators are known here); the process's fixed
runtime (CUDA context on GPUs, about 1 GB; on the CPU, code pages and the Python modules an engine imports:
`deepspeed.initialize` imports torch's inductor / functorch.compile / networkx, measured 41 MB to import; 60-90 MB
per rank of non-tensor memory under DeepSpeed against about 30 MB under DDP, see docs/scaling.md).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "ENGINES",
    "MemoryEstimate",
    "estimate",
    "count_parameters",
    "layer_parameters",
    "first_block",
    "return_freed_tensors_to_os",
    "ONE_PROCESS_MMAP_THRESHOLD",
    "ONE_PROCESS_MMAP_MIN_AGENT_BYTES",
    "keep_freed_tensors",
    "largest_weights_bytes",
    "freed_tensors_reused",
    "main",
]

ENGINES = ("ddp", "zero2", "zero3", "fsdp2")
GIB = 1024**3


@dataclass
class MemoryEstimate:
    """Per-rank bytes of each part (see the module docstring) for one engine and world size."""

    engine: str
    world_size: int
    agent_parameters: int
    trainable_parameters: int
    weights: int
    gradients: int
    comm_buffers: int
    master_weights: int
    optimizer: int
    references: int
    critics: int
    reward_model: int
    generation_gather: int
    kv_cache: int
    activations: int
    training_gather: int
    optimizer_step: int
    loading: int = 0
    comparator: int = 0

    @property
    def resident(self) -> int:
        """What stays allocated for the whole run."""
        parts = (self.weights, self.gradients, self.comm_buffers, self.master_weights, self.optimizer)
        return sum(parts) + self.references + self.critics + self.reward_model + self.comparator

    @property
    def peak(self) -> int:
        """The per-rank peak: resident + the largest transient (generation, training step, optimizer step)."""
        generation = self.generation_gather + self.kv_cache
        training = self.activations + self.training_gather
        return self.resident + max(generation, training, self.optimizer_step)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "resident": self.resident, "peak": self.peak}

    def summary(self) -> str:
        """A small table in GiB."""
        rows = [
            "weights",
            "gradients",
            "comm_buffers",
            "master_weights",
            "optimizer",
            "references",
            "critics",
            "reward_model",
            "comparator",
            "generation_gather",
            "kv_cache",
            "activations",
            "training_gather",
            "optimizer_step",
            "peak",
            "loading",
        ]
        lines = [f"engine={self.engine} world_size={self.world_size} (GiB per rank)"]
        lines += [f"  {r:<18} {getattr(self, r) / GIB:10.3f}" for r in rows]
        return "\n".join(lines)


MMAP_THRESHOLD = 128 << 10  # bytes: host allocations from this size on get pages of their own
# One process: only allocations of activation size get pages of their own (the team's loss forward, the optimizer's
# temporaries); below it glibc's heap stays (mapping every allocation, 128 KiB, made a step ~30% slower). Measured on
# the model-shaped 2-agent team (hidden 512, 8 layers, 32 rows x 16 tokens): peak RSS 1497 -> 1389 MB at 1 MiB,
# 1386 MB at 512 KiB, 1481 MB at 2 MiB. At 1 MiB a step one token shorter (its row activations 960 KiB, the scoring
# that skips the last completion token) put them back on the heap: 1460-1491 MB; at 512 KiB 1357-1360 MB
# (benchmarks/comlrl_side_by_side.py, docs/scaling.md).
ONE_PROCESS_MMAP_THRESHOLD = 512 << 10
# One process, small agents: the threshold is lifted again once the team is loaded when its largest agent's weights are
# under this size. Their activations are tens of MB, so what the threshold gives back is a few percent of the RSS, while
# their pages' faults are a large share of a step whose products are small: on the tiny reference model (hidden 64,
# 16 tokens, 8 prompts x 4) 0.118-0.126 s a step against 0.101-0.111 s on the heap, 0.213-0.218 against 0.143-0.153 s
# with activation checkpointing, for at most 4% less peak RSS (522 against 542-545 MB). The model-shaped agents the
# threshold was measured on weigh 81 MiB and keep it (benchmarks/README.md).
ONE_PROCESS_MMAP_MIN_AGENT_BYTES = 64 << 20
_HEAP_THRESHOLD = 32 << 20  # glibc's largest M_MMAP_THRESHOLD on 64-bit: below it, allocations come from the heap
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters
_M_TRIM_THRESHOLD = -1
_TRIM_THRESHOLD = 128 << 10  # glibc's default: free memory above this at the heap's top is given back
_threshold: int | None = None  # what `return_freed_tensors_to_os` set in this process (None: nothing)


@functools.cache
def _libc() -> Any:
    """glibc, loaded once (`find_library` runs `ldconfig`: not on every rollout)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def return_freed_tensors_to_os(threshold: int = MMAP_THRESHOLD) -> bool:
    """Make glibc give the pages of freed tensors of `threshold` bytes or more back to the OS (process-wide).

    On CPU the weights, gradients and optimizer states live in host memory, allocated by glibc's malloc. By default
    glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so after the first frees,
    tensors of a few MiB come from the heap and stay resident once freed: a rank keeps the full agents it loaded
    before sharding, and every layer the engine gathered, as RSS. `mallopt(M_MMAP_THRESHOLD, threshold)` fixes the
    threshold, so such tensors are mapped on allocation and unmapped when freed (measured on the model-shaped
    team, 2 processes: FSDP2's per-rank peak RSS went from 0.95-1.00x of DDP's to 0.51x; docs/scaling.md). trl_marl
    calls it for CPU runs: at `MMAP_THRESHOLD` with several processes, at `ONE_PROCESS_MMAP_THRESHOLD` in one.
    Returns whether glibc took the setting (False elsewhere: musl, macOS, Windows)."""
    global _threshold
    try:
        libc = _libc()
        taken = libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False
    _threshold = int(threshold) if taken else _threshold
    return taken


def largest_weights_bytes(models: Any) -> int:
    """Bytes of the largest weights among `models` (torch modules; anything else, an API agent, counts 0)."""
    import torch

    return max(
        (sum(p.numel() * p.element_size() for p in m.parameters()) for m in models if isinstance(m, torch.nn.Module)),
        default=0,
    )


def keep_freed_tensors() -> bool:
    """Undo `return_freed_tensors_to_os` as far as glibc allows: host allocations below 32 MiB come from the heap again
    (glibc's own threshold, which rises with the blocks freed, cannot be restored once fixed; 32 MiB is its largest)
    and `freed_tensors_reused` does nothing. Returns whether a threshold set by `return_freed_tensors_to_os` was lifted.
    trl_marl calls it in one CPU process whose largest agent weighs under `ONE_PROCESS_MMAP_MIN_AGENT_BYTES`."""
    global _threshold
    if _threshold is None:
        return False
    try:
        libc = _libc()
        taken = libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, _HEAP_THRESHOLD))
    except (OSError, AttributeError):
        return False
    if taken:
        _threshold = None
    return taken


@contextlib.contextmanager
def freed_tensors_reused() -> Iterator[None]:
    """Inside: host allocations below 32 MiB come from glibc's heap, where a freed block is reused by the next one of
    its size; on exit the heap's free pages go back to the OS (`malloc_trim`) and the threshold
    `return_freed_tensors_to_os` set applies again. Nothing changes where it set none.

    For generation on CPU: every decode step grows each layer's KV cache by a `torch.cat` into a new tensor of a MiB
    or more. Mapped, each costs its pages' faults anew (measured on the model-shaped team: 68,000 minor faults and
    0.24 s of system time per rollout; on the heap 9,000 and 0.08 s); generation is not where a step's RSS peaks,
    and the trim returns what it freed before the loss's forward. Also keeps freed memory at the heap's top (glibc's
    trim threshold, restored to its default of 128 KiB on exit)."""
    libc = _libc() if _threshold is not None else None
    if libc is None or not libc.mallopt(_M_MMAP_THRESHOLD, _HEAP_THRESHOLD):
        yield
        return
    libc.mallopt(_M_TRIM_THRESHOLD, _HEAP_THRESHOLD)  # a freed block at the heap's top stays for the next one
    try:
        yield
    finally:
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
        libc.mallopt(_M_MMAP_THRESHOLD, _threshold)
        libc.malloc_trim(0)


def _load_config(model_config_or_id):
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model_config_or_id, PretrainedConfig):
        return model_config_or_id
    if isinstance(model_config_or_id, dict):
        cfg = dict(model_config_or_id)
        return AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    return AutoConfig.from_pretrained(str(model_config_or_id))


def _meta_model(model_config):
    """The causal LM of `model_config` on the meta device (no memory), built by its class's constructor: AutoModel's
    `from_config` would build it inside `deepspeed.zero.Init` and re-initialise its weights whenever the calling
    process runs ZeRO-3 (transformers registers the engine's config process-wide), which fails on meta tensors."""
    import torch
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    with torch.device("meta"):
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(model_config)](model_config)


def layer_parameters(model_config) -> int:
    """Parameters of one decoder layer (the first block of the model's largest `nn.ModuleList`), exact (meta
    device); the whole model when it has no such list."""

    model = _meta_model(model_config)
    return sum(p.numel() for p in (first_block(model) or model).parameters())


def first_block(model: Any) -> Any:
    """The first block of `model`'s largest `nn.ModuleList` (by parameters: a decoder's first layer), or None where it
    has no non-empty list."""
    from torch import nn

    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))[0] if lists else None


def count_parameters(model_config, peft_config=None) -> tuple[int, int]:
    """`(parameters of one model, LoRA parameters for peft_config)`, exact: the model is built on the meta device
    (no memory) and LoRA adds `r x (in + out)` per targeted Linear."""
    from torch import nn

    model = _meta_model(model_config)
    total = sum(p.numel() for p in model.parameters())
    lora = 0
    if peft_config is not None:
        targets = getattr(peft_config, "target_modules", None)
        r = int(getattr(peft_config, "r", 8))
        for name, m in model.named_modules():
            if not isinstance(m, nn.Linear) or name.endswith("lm_head"):
                continue
            leaf = name.rsplit(".", 1)[-1]
            if targets in (None, "all-linear") or (isinstance(targets, str) and leaf == targets):
                hit = True
            else:
                hit = not isinstance(targets, str) and leaf in set(targets)
            if hit:
                lora += r * (m.in_features + m.out_features)
    return total, lora


def _kv_bytes(cfg, rows: int, seq: int, act_bytes: int) -> int:
    layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * layers * kv_heads * head_dim * seq * rows * act_bytes


def _activation_bytes(cfg, rows: int, seq: int, completion: int, act_bytes: int, checkpointing: bool) -> int:
    """One agent's training forward graph: per layer about `34 h + 5 a s` bytes per token in 16-bit (Korthikanti
    et al. 2022; x2 in fp32), `2 h` bytes per token and layer with activation checkpointing; plus the fp32 logits
    and log-softmax of the completion positions."""
    h, a, layers = cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers
    tokens = rows * seq
    scale = act_bytes / 2
    per_layer = (2 * h) if checkpointing else (34 * h + 5 * a * seq)
    logits = 2 * rows * (completion + 1) * cfg.vocab_size * 4
    return int(tokens * layers * per_layer * scale) + logits


@dataclass(frozen=True)
class TrainingShape:
    """The numbers of a training run that the estimate needs; `from_config` reads them from any trainer config
    (so this module knows nothing of the trainers). `num_generations` is the completions each agent samples per
    task item in one rollout: a config's `completions_per_item` (`num_generations` for the RL trainers,
    `preference_num_candidates` for MADPO, the larger of the two for MARLHF)."""

    num_agents: int = 2
    num_generations: int = 4
    rollout_buffer_size: int = 4
    train_batch_size: int | None = None
    max_prompt_length: int | None = 512
    max_completion_length: int = 256
    bf16: bool = False
    gradient_checkpointing: bool = False
    share_base_model: bool = False
    reference_kl: bool = False
    num_critics: int = 0  # separate critics (actor-critic trainers); 0: none
    reward_model: bool = False  # a joint reward model beside the team (MARLHF)
    # rows each agent scores per `train_batch_size` unit in a training step; None: num_generations (an item's
    # samples). MADPO: 2, a pair's chosen and rejected responses (its train_batch_size counts pairs)
    train_rows_per_item: int | None = None
    # the iterative trainers' local comparator models (`comparator_models`): AGENT_COPY for a copy of an agent, else
    # the model id / path (or config) it loads
    comparator_models: tuple = ()

    @classmethod
    def from_config(cls, config: Any) -> TrainingShape:
        """The shape of a trainer config (`MAGRPOConfig`, `MAPPOConfig`, ...), or of a `TrainingShape`."""
        if isinstance(config, TrainingShape):
            return config
        length = config.max_completion_length  # one value, or one per agent (the MAGRPO family)
        beta = getattr(config, "beta", 0.0) if getattr(config, "uses_trl_loss", False) else 0.0  # TRL's loss-side KL
        return cls(
            num_agents=int(config.num_agents),
            # what the config samples per item (MADPO: preference_num_candidates), else num_generations
            num_generations=int(
                getattr(config, "completions_per_item", None) or getattr(config, "num_generations", 1) or 1
            ),
            rollout_buffer_size=int(config.rollout_buffer_size),
            train_batch_size=getattr(config, "train_batch_size", None),
            max_prompt_length=getattr(config, "max_prompt_length", None),
            max_completion_length=int(max(length) if isinstance(length, (list, tuple)) else length),
            bf16=bool(getattr(config, "bf16", False)),
            gradient_checkpointing=bool(getattr(config, "gradient_checkpointing", False)),
            share_base_model=bool(getattr(config, "share_base_model", False)),
            reference_kl=bool(getattr(config, "reference_kl_enabled", False))
            or any(b > 0 for b in (beta if isinstance(beta, (list, tuple)) else [beta])),
            num_critics=int(getattr(config, "num_critics", 1))
            if getattr(config, "uses_separate_critics", False)
            else 0,
            reward_model=hasattr(config, "reward_model_name"),
            train_rows_per_item=getattr(config, "training_rows_per_item", None),
            comparator_models=comparator_models(config),
        )


AGENT_COPY = "agent"  # a comparator model of the agents' architecture (`TrainingShape.comparator_models`)


def comparator_models(config: Any) -> tuple:
    """The models an iterative trainer's local comparator holds (`trl_marl.plugins.comparators`), read from its
    `comparator_policy` and `comparator_kwargs`: `AGENT_COPY` for a snapshot / copy of an agent, else the id / path it
    loads. `history`: one snapshot per agent; `current_copy`: one copy per agent when `devices` are given (the live
    agents otherwise); `model`: one per distinct (source, device), as `FixedModelComparator` caches them. `current`,
    `api`, plugins and the other trainers: none."""
    policy = getattr(config, "comparator_policy", None)
    options = getattr(config, "comparator_kwargs", None) or {}
    n = int(config.num_agents)
    devices = list(options.get("devices") or [])
    if policy == "history" or (policy == "current_copy" and devices):
        return (AGENT_COPY,) * n
    if policy == "model":
        sources = list(options.get("agents") or []) or [options.get("model_name")] * n
        placed = {}
        for i, src in enumerate(sources):
            dev = (devices[0] if len(devices) == 1 else devices[i]) if devices else None
            placed.setdefault((str(src), dev), src)
        return tuple(placed.values())
    return ()


def _ref_models(ref_model: Any, num_agents: int) -> list:
    """MADPO's `ref_model` as `MADPOTrainer._load_ref_models` loads it: one model for a single entry, one per
    distinct entry of a list (the trainer shares an entry given twice; ids / paths compared by value)."""
    given = list(ref_model) if isinstance(ref_model, (list, tuple)) else [ref_model] * num_agents
    if len(given) != num_agents:
        raise ValueError(f"ref_model: expected one model per agent ({num_agents}), got {len(given)}")
    distinct: list = []
    for src in given:
        if not any((d == src) if isinstance(src, str) else (d is src) for d in distinct):
            distinct.append(src)
    return distinct


def estimate(
    config: TrainingShape | Any,
    model_config_or_id,
    engine: str = "ddp",
    world_size: int = 1,
    *,
    peft_config=None,
    critic_model_config=None,
    reward_model_config=None,
    weight_bytes: int | None = None,
    prompt_length: int | None = None,
    zero3_init_flag: bool = True,
    ref_model=None,
) -> MemoryEstimate:
    """Predict per-rank memory of training a team with `config` (a `TrainingShape`, or a trl_marl trainer config it
    is read from) on `model_config_or_id`
    (a transformers config, a config dict with `model_type`, or a model id / path) under `engine` (`"ddp"`,
    `"zero2"`, `"zero3"`, `"fsdp2"`) on `world_size` ranks.

    `peft_config` makes the agents LoRA agents (with `config.share_base_model`: n adapters on ONE base).
    `critic_model_config` / `reward_model_config`: the critics' / reward model's backbone (default: the agents').
    `weight_bytes`: bytes per weight as loaded (default: 2 with `config.bf16`, else 4). `prompt_length`: the prompt
    tokens to plan for (default: `config.max_prompt_length`, else 512). `zero3_init_flag`: the accelerate config's
    flag (ZeRO-3 only; it changes `loading`, see the module docstring). `ref_model`: MADPO's DPO reference, as its
    trainer takes it (a model config / id for every agent, or a list of one per agent), counted in `references`;
    refused for a config of another trainer.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if (
        ref_model is not None
        and not isinstance(config, TrainingShape)
        and not hasattr(config, "precompute_ref_log_probs")
    ):
        raise ValueError(
            f"ref_model is MADPO's DPO reference model (MADPOTrainer(ref_model=...)); {type(config).__name__}'s "
            "trainer takes none: leave ref_model unset (the RL trainers' frozen references come from "
            "reference_kl_enabled / beta in the config)"
        )
    config = TrainingShape.from_config(config)
    cfg = _load_config(model_config_or_id)
    n = config.num_agents
    wb = weight_bytes or (2 if config.bf16 else 4)
    P, lora = count_parameters(cfg, peft_config)
    shared = config.share_base_model and peft_config is not None

    # the agents
    base_params = P if shared else n * P
    trainable = n * lora if peft_config is not None else n * P
    weights_all = base_params * wb + (n * lora * wb if peft_config is not None else 0)
    master = 4 if engine in ("zero2", "zero3") else 0  # DeepSpeed's fp32 copy, whatever wb (module docstring)
    shard_w = world_size if engine in ("zero3", "fsdp2") else 1
    shard_go = world_size if engine != "ddp" else 1
    weights = math.ceil(weights_all / shard_w)
    gradients = math.ceil(trainable * wb / shard_go)
    comm_buffers = trainable * wb if engine == "ddp" and world_size > 1 else 0  # DDP's gradient buckets
    master_weights = math.ceil(trainable * master / shard_go)
    optimizer = math.ceil(trainable * 8 / shard_go)

    # references: frozen copies of full agents; LoRA agents use their base with adapters off
    references = 0
    if config.reference_kl and peft_config is None:
        references = math.ceil(n * P * wb / shard_w)
    # MADPO's ref_model: loaded whole, placed beside the agents (FSDP2 included), partitioned by ZeRO-3 only
    ref_bytes = [
        count_parameters(_load_config(src))[0] * wb for src in (_ref_models(ref_model, n) if ref_model else [])
    ]
    shard_ref = world_size if engine == "zero3" else 1
    dpo_references = sum(math.ceil(b / shard_ref) for b in ref_bytes)

    # the iterative trainers' local comparator models: whole, on the agents' device or the comparator's `devices`
    agent_copy = (P + lora) * wb
    comparator = sum(
        agent_copy if src == AGENT_COPY else count_parameters(_load_config(src))[0] * wb
        for src in config.comparator_models
    )

    # separate critics (actor-critic trainers), trained like the agents
    critics = 0
    if config.num_critics:
        k = config.num_critics
        Pc = P if critic_model_config is None else count_parameters(_load_config(critic_model_config))[0]
        critics = math.ceil(k * Pc * wb / shard_w) + math.ceil(k * Pc * (wb + master + 8) / shard_go)

    # the joint reward model of MARLHF while it scores rollouts: whole on every rank, partitioned under ZeRO-3 /
    # FSDP2 (JointRewardModel.prepare_for_scoring)
    reward_model = 0
    if config.reward_model:
        Pr = P if reward_model_config is None else count_parameters(_load_config(reward_model_config))[0]
        reward_model = math.ceil(Pr * wb / shard_w)

    # generation: one agent after another (one call for all agents on a shared base)
    gen = config.num_generations
    rows = config.rollout_buffer_size * gen * (n if shared else 1)
    prompt = prompt_length or config.max_prompt_length or 512
    seq = prompt + config.max_completion_length
    kv = _kv_bytes(cfg, rows, seq, wb)
    if engine in ("zero3", "fsdp2"):  # ONE agent (the shared base of a LoRA team) gathered at a time
        gather = (P if not shared else P + n * lora) * wb - math.ceil(P * wb / world_size)
    else:
        gather = 0

    # training: every agent's graph until the one backward; ZeRO-3 / FSDP2 hold the layer computing and the next
    train_rows = (config.train_batch_size or config.rollout_buffer_size) * (config.train_rows_per_item or gen)
    checkpointing = config.gradient_checkpointing
    act = n * _activation_bytes(cfg, train_rows, seq, config.max_completion_length, wb, checkpointing)
    training_gather = 2 * layer_parameters(cfg) * wb if engine in ("zero3", "fsdp2") else 0

    # loading: full models on every rank, except ZeRO-3 with zero3_init_flag (built partitioned)
    built_sharded = engine == "zero3" and zero3_init_flag
    loading = math.ceil(weights_all / world_size) if built_sharded else weights_all
    if references:
        if built_sharded:
            loading += references
        elif engine in ("zero3", "fsdp2"):  # one full copy in flight beside the shards made before it
            loading += P * wb + math.ceil((n - 1) * P * wb / world_size)
        else:
            loading += references
    if ref_bytes:  # built inside zero.Init with the flag; else each loaded whole, then partitioned (ZeRO-3) or kept
        if built_sharded:
            loading += dpo_references
        elif engine == "zero3":
            loading += (
                max(ref_bytes)
                + sum(math.ceil(b / world_size) for b in ref_bytes)
                - math.ceil(max(ref_bytes) / world_size)
            )
        else:
            loading += dpo_references
    if critics:
        whole_critics = k * Pc * wb
        loading += math.ceil(whole_critics / world_size) if built_sharded else whole_critics

    # the optimizer step: AdamW's temporary for what it updates at once (at most one agent's group, in fp32)
    optimizer_step = math.ceil((lora if peft_config is not None else P) * 4 / shard_go)

    return MemoryEstimate(
        engine=engine,
        world_size=world_size,
        agent_parameters=P,
        trainable_parameters=trainable,
        weights=weights,
        gradients=gradients,
        comm_buffers=comm_buffers,
        master_weights=master_weights,
        optimizer=optimizer,
        references=references + dpo_references,
        critics=critics,
        reward_model=reward_model,
        generation_gather=gather,
        kv_cache=kv,
        activations=act,
        training_gather=training_gather,
        optimizer_step=optimizer_step,
        loading=loading,
        comparator=comparator,
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m trl_marl.distributed.memory MODEL --num_agents 2 --engine zero3 --world_size 8 [--lora_r 16] ...`: print the
    per-rank estimate for each requested engine."""
    p = argparse.ArgumentParser(prog="trl-marl estimate", description=main.__doc__)
    p.add_argument("model", help="model id / path (its config.json is read)")
    p.add_argument("--num_agents", type=int, default=2)
    p.add_argument("--engine", choices=[*ENGINES, "all"], default="all")
    p.add_argument("--world_size", type=int, default=1)
    p.add_argument("--lora_r", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    p.add_argument("--share_base_model", action="store_true")
    p.add_argument("--reference_kl", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--rollout_buffer_size", type=int, default=4)
    p.add_argument("--num_generations", type=int, default=None, help="completions per agent per item (default 4)")
    p.add_argument(
        "--preference_num_candidates",
        type=int,
        default=None,
        help="MADPO: candidates per item (instead of --num_generations); training scores a pair's 2 responses",
    )
    p.add_argument(
        "--train_batch_size",
        type=int,
        default=None,
        help="task items per training step (MADPO: pairs); default --rollout_buffer_size",
    )
    p.add_argument("--max_prompt_length", type=int, default=512)
    p.add_argument("--max_completion_length", type=int, default=256)
    p.add_argument(
        "--no_zero3_init_flag", action="store_true", help="ZeRO-3 with zero3_init_flag: false (every rank loads all)"
    )
    a = p.parse_args(argv)
    preference = a.preference_num_candidates is not None
    if preference and a.num_generations is not None:
        p.error(
            "--num_generations is the RL trainers' samples per item; MADPO samples --preference_num_candidates per "
            "item (its num_generations is not read): give one of them"
        )
    cfg = TrainingShape(
        num_agents=a.num_agents,
        num_generations=a.preference_num_candidates if preference else (a.num_generations or 4),
        train_rows_per_item=2 if preference else None,
        train_batch_size=a.train_batch_size,
        rollout_buffer_size=a.rollout_buffer_size,
        max_prompt_length=a.max_prompt_length,
        max_completion_length=a.max_completion_length,
        share_base_model=a.share_base_model,
        reference_kl=a.reference_kl,
        bf16=a.bf16,
    )
    peft = None
    if a.lora_r:
        from peft import LoraConfig

        peft = LoraConfig(r=a.lora_r, target_modules="all-linear")
    for engine in ENGINES if a.engine == "all" else (a.engine,):
        est = estimate(cfg, a.model, engine, a.world_size, peft_config=peft, zero3_init_flag=not a.no_zero3_init_flag)
        print(est.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
