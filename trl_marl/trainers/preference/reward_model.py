"""`JointRewardModel`: one scalar score for the WHOLE team's response, fitted with TRL's `RewardTrainer`.

All agents' prompts and responses are written as ONE text (the joint transcript, `prompt + chosen` of the joint
dataset `pairs.to_dataset` writes); the model is transformers' `AutoModelForSequenceClassification(num_labels=1)`,
the scalar head on the backbone's last hidden state at the final non-padding token, as TRL's `RewardTrainer` uses it.
`fit` hands the pairs to TRL's `RewardTrainer` / `RewardConfig` (its Bradley-Terry loss

    L(psi) = - E_{(w, l)} [ log sigmoid( R(h^w, a^w) - R(h^l, a^l) ) ]  (+ center_rewards_coefficient term),

dropout off, accelerate / DDP / DeepSpeed, mixed precision, gradient accumulation, its metrics `accuracy`, `margin`,
`loss`) as a STAGE: the reward trainer shares the outer run's accelerate state, and its optimizer and engine are
released before the stage returns. Under ZeRO-3 and FSDP2 the stage shards the reward model's parameters over the
ranks (ZeRO-3: built inside `deepspeed.zero.Init` with `zero3_init_flag`, partitioned by the stage's engine; FSDP2:
per-layer units); for RL scoring `prepare_for_scoring` keeps the fitted model sharded under the outer engine (a
partitioned forward-only engine under ZeRO-3, as the reference models; FSDP2 units), gathered one layer at a time by
each scoring forward. It never falls back on the task reward. A reward model trained elsewhere (e.g.
`trl reward` on the exported joint dataset) loads with `JointRewardModel.load(path)` and is used as is.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from trl_marl.data_types.text import valid_text
from trl_marl.distributed.collective import even_chunks
from trl_marl.distributed.zero3 import is_zero3
from trl_marl.trainers.config import training_args_quietly
from trl_marl.trainers.preference.pairs import joint_prompt_text, joint_response_text

__all__ = ["JointRewardModel", "joint_text", "reward_dataset"]

logger = logging.getLogger(__name__)


def joint_text(prompts: Sequence[str], responses: Sequence[str]) -> str:
    """The joint transcript the reward model reads: every agent's prompt, then every agent's response
    (`joint_prompt_text + joint_response_text`, exactly the `prompt + chosen` of the joint dataset `to_dataset`
    writes, which TRL's `RewardTrainer` concatenates the same way).

    The responses come last, next to the final token the scalar head reads (and `reward_max_length` truncation
    keeps the end), so they dominate the score's input rather than the (often long) prompts.
    """
    return joint_prompt_text(prompts) + joint_response_text(responses)


class JointRewardModel(nn.Module):
    """A sequence-classification model (one label) and its tokenizer, scoring joint transcripts.

    Args:
        model: an `AutoModelForSequenceClassification` with `num_labels == 1`.
        tokenizer: its tokenizer (a pad token is required; EOS is used when there is none).
        max_length: truncate transcripts to this many tokens (keeping the END, where the responses are).
    """

    def __init__(self, model: nn.Module, tokenizer, max_length: int | None = None):
        super().__init__()
        if getattr(model.config, "num_labels", None) != 1:
            raise ValueError(f"the joint reward model needs num_labels == 1, got {model.config.num_labels}")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.collective = False  # set by `prepare_for_scoring`: scoring is a collective (sharded, several processes)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, tokenizer=None, max_length: int | None = None, seed: int | None = None, **kwargs
    ) -> JointRewardModel:
        """Load the backbone from `name_or_path` with a NEWLY initialised scalar head; with `seed`, the head is drawn
        from a random stream seeded with it (the global RNG streams are left as they were, never reseeded)."""
        with _rng_preserved(), _head_load_report_silenced():
            if seed is not None:
                torch.manual_seed(seed)
            model, info = AutoModelForSequenceClassification.from_pretrained(
                name_or_path, num_labels=1, output_loading_info=True, **kwargs
            )
        backbone = [k for k in info["missing_keys"] if k.split(".")[0] == model.base_model_prefix]
        if backbone or info.get("mismatched_keys"):  # what the silenced report would have said that matters
            logger.warning(
                f"reward model {name_or_path}: weights missing from the checkpoint {backbone} or of another shape "
                f"{info.get('mismatched_keys')}: they are newly initialised"
            )
        tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(name_or_path)
        return cls(model, tok, max_length)

    @classmethod
    def load(cls, path: str, max_length: int | None = None, **kwargs) -> JointRewardModel:
        """A reward model trained elsewhere (e.g. `trl reward` on the exported joint dataset), used as is: a
        sequence-classification checkpoint with `num_labels == 1` and its tokenizer."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        archs = getattr(config, "architectures", None) or []
        if not any(a.endswith("ForSequenceClassification") for a in archs) or getattr(config, "num_labels", 1) != 1:
            raise ValueError(
                f"reward_model_path={path!r} must be a sequence-classification model with num_labels=1 (as TRL's "
                f"RewardTrainer saves it), got architectures={archs} num_labels={getattr(config, 'num_labels', None)}"
            )
        model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
        rm = cls(model, AutoTokenizer.from_pretrained(path), max_length)
        rm.eval()
        for p in rm.parameters():
            p.requires_grad_(False)
        return rm

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def hf_model(self) -> nn.Module:
        """The transformers model (unwrapped from the DeepSpeed inference engine `prepare_for_scoring` may add)."""
        return getattr(self.model, "module", self.model)

    def prepare_for_scoring(self, accelerator, device: str | torch.device | None = None) -> JointRewardModel:
        """Put the (fitted, frozen) model under the outer run's engine for scoring; every rank must call it.

        - DeepSpeed ZeRO-3: a partitioned copy (`trl_marl.distributed.zero3.zero3_frozen_copy`) under a forward-only engine
          (TRL's `prepare_deepspeed`, as for the reference models), with TRL's persistence threshold
          (10 x hidden size) so that each rank keeps only its partition between forwards.
        - FSDP2: `fully_shard` per decoder layer and the model (`trl_marl.distributed.fsdp.shard_module`).
        - Otherwise (DDP, ZeRO-1/2, one process): a full copy on `device` (default: the accelerator's device).

        Under ZeRO-3 / FSDP2 with more than one process scoring is a collective: every process must call `score`
        the same number of times (the trainers do, `trl_marl.distributed.collective`); `score` itself then runs as many forward
        passes on every process (empty batches where a process has fewer texts)."""
        from trl_marl.distributed.fsdp import is_fsdp2, shard_module

        self.eval()
        for p in self.parameters():
            p.requires_grad_(False)
        if is_zero3(accelerator):
            from trl_marl.distributed.zero3 import _is_partitioned, zero3_frozen_copy
            from trl_marl.trainers.preference.trl_pieces import prepare_deepspeed

            model = self.hf_model
            model = zero3_frozen_copy(model) if _is_partitioned(model) else model
            with _stage3_persistence(accelerator.state.deepspeed_plugin, model):
                self.model = prepare_deepspeed(model, accelerator)
        elif is_fsdp2(accelerator):
            shard_module(self.model, accelerator)
        else:
            self.model.to(device if device is not None else accelerator.device)
        self.collective = accelerator.num_processes > 1 and (is_zero3(accelerator) or is_fsdp2(accelerator))
        return self

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full weights (on CPU, on every rank) when the model is sharded (ZeRO-3 partitions, FSDP2 DTensors),
        gathered one parameter at a time; a collective every rank must call. `None` when the model is not sharded
        (its own `state_dict` is full)."""
        from torch.distributed.tensor import DTensor

        model = self.hf_model
        named = dict(model.named_parameters(remove_duplicate=False))
        if not any(hasattr(p, "ds_id") or isinstance(p, DTensor) for p in named.values()):
            return None
        out = {}
        for name, value in model.state_dict().items():
            param = named.get(name)
            if param is not None and hasattr(param, "ds_id"):
                import deepspeed

                with deepspeed.zero.GatheredParameters([param]):
                    value = param.data.detach().cpu().clone()
            elif isinstance(value, DTensor):
                value = value.full_tensor().cpu()
            out[name] = value.detach().cpu().clone()
        return out

    def token_ids(self, text: str) -> list[int]:
        """The token ids the model reads for one transcript: as TRL's `RewardTrainer` tokenizes plain text (EOS
        appended, the tokenizer's special tokens), cut to the last `max_length` tokens; invalid unicode (a lone
        surrogate in a comparator's text) read as U+FFFD (`valid_text`)."""
        text = valid_text(text)
        eos = self.tokenizer.eos_token if self.tokenizer.eos_token_id != self.tokenizer.pad_token_id else None
        if eos and not text.endswith(eos):
            text = text + eos
        ids = self.tokenizer(text)["input_ids"]
        return ids[-self.max_length :] if self.max_length is not None else ids

    def encode(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """A padded batch of `token_ids` (the tokenizer's padding side). Every transcript ends with EOS (as TRL's
        RewardTrainer appends it to plain text): the head reads a summary position that attends over the whole
        transcript rather than the last response token."""
        from trl.trainer.utils import pad

        rows = [torch.tensor(self.token_ids(t), dtype=torch.long) for t in texts]
        side = self.tokenizer.padding_side
        ids = pad(rows, self.tokenizer.pad_token_id, padding_side=side)
        mask = pad([torch.ones_like(r) for r in rows], 0, padding_side=side)
        return {"input_ids": ids, "attention_mask": mask}

    def _placeholder_batch(self) -> dict[str, torch.Tensor]:
        """A placeholder batch (one pad token; its score is discarded): a forward on it gathers and releases the
        sharded parameters as a real batch does, so a process with nothing to score takes part in the others'."""
        ids = torch.full((1, 1), self.tokenizer.pad_token_id, dtype=torch.long)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores `(B,)`. Position ids follow the mask, so left and right padding give the same score."""
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            position_ids=position_ids.to(self.device),
        )
        return out.logits.squeeze(-1)

    @torch.no_grad()
    def score(
        self, prompts: Sequence[Sequence[str]], responses: Sequence[Sequence[str]], batch_size: int = 16
    ) -> list[float]:
        """Scores of joint responses: `prompts[j]` / `responses[j]` hold every agent's prompt / response."""
        was_training = self.training
        self.eval()
        texts = [joint_text(p, r) for p, r in zip(prompts, responses)]
        out: list[float] = []
        # sharded (`collective`): as many forwards as the process with the most batches, empty ones here
        for chunk in even_chunks(texts, batch_size, synced=self.collective):
            if chunk:
                out.extend(self(**self.encode(chunk)).float().cpu().tolist())
            else:
                self(**self._placeholder_batch())
        self.train(was_training)
        return out

    def fit(
        self,
        pairs: Sequence,
        learning_rate: float = 1e-5,
        num_epochs: float = 1,
        batch_size: int = 4,
        freeze_backbone: bool = False,
        seed: int = 0,
        output_dir: str = "reward_model_fit",
        callbacks: Sequence = (),
        **reward_config: Any,
    ) -> dict[str, Any]:
        """Fit on preference pairs (objects with `prompts`, `winner_completions`, `loser_completions`) with TRL's
        `RewardTrainer`; `reward_config` holds any further `RewardConfig` fields (`center_rewards_coefficient`,
        `gradient_accumulation_steps`, `bf16`, `ddp_backend`, ...); `callbacks` are added to the reward trainer.
        Every process passes the same pairs; the reward trainer shards them over the processes of the outer
        accelerate state (and, under ZeRO-3 and FSDP2, the parameters too).

        Returns `{"losses": per-step training losses, "train_loss", and TRL's evaluation metrics on the pairs:
        "accuracy", "margin", "loss"}`. The model is left in eval mode, frozen; the global RNG state is restored
        (the fit does not shift the outer run's random streams)."""
        from transformers import PrinterCallback

        from trl_marl.distributed.fsdp import is_fsdp2, shard_module
        from trl_marl.trainers.preference.trl_pieces import RewardConfig

        self._trainable(freeze_backbone)
        dataset = reward_dataset(pairs, self)
        config = dict(
            output_dir=output_dir,
            learning_rate=learning_rate,
            num_train_epochs=num_epochs,
            per_device_train_batch_size=batch_size,
            per_device_eval_batch_size=batch_size,
            lr_scheduler_type="constant",
            seed=seed,
            logging_steps=1,
            save_strategy="no",
            eval_strategy="no",
            report_to="none",
            disable_tqdm=True,
            gradient_checkpointing=False,
            max_length=None,
            use_cpu=not torch.cuda.is_available(),
            bf16=False,
            dataloader_pin_memory=torch.cuda.is_available(),  # nothing to pin to on a CPU (torch warns)
        )
        config.update(reward_config)
        with _rng_preserved(), _accelerate_state_preserved(), _one_process_group_note_silenced():
            with training_args_quietly():
                reward_config = RewardConfig(**config)
            trainer = _stage_reward_trainer_class()(
                model=self.model, args=reward_config, train_dataset=dataset, processing_class=self.tokenizer
            )
            if is_fsdp2(trainer.accelerator):  # per decoder layer, then the model, before the optimizer is built
                shard_module(self.model, trainer.accelerator)
                # accelerate's FSDP2 prepare then leaves the sharded model alone, but first looks its
                # `_no_split_modules` classes up by name, which `fully_shard` renamed (FSDP<name>): nothing to look up
                trainer.accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap = []
            trainer.remove_callback(PrinterCallback)
            for callback in callbacks:
                trainer.add_callback(callback)
            plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
            # ZeRO-3: each rank keeps only its partition between the stage's forwards
            stage3 = (
                _stage3_persistence(plugin, self.model) if is_zero3(trainer.accelerator) else contextlib.nullcontext()
            )
            with stage3:
                out = trainer.train()
            metrics = trainer.evaluate(dataset)
            losses = [h["loss"] for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]
            # one engine at a time: release the reward trainer's optimizer, scheduler and wrapped model
            trainer.accelerator.free_memory()
            trainer.optimizer = trainer.lr_scheduler = trainer.model_wrapped = None
            del trainer
            gc.collect()
        self.eval()
        for p in self.parameters():
            p.requires_grad_(False)
        return {
            "losses": losses,
            "train_loss": out.training_loss,
            "accuracy": metrics["eval_accuracy"],
            "margin": metrics["eval_margin"],
            "loss": metrics["eval_loss"],
        }

    def _trainable(self, freeze_backbone: bool) -> list[nn.Parameter]:
        for p in self.model.parameters():
            p.requires_grad_(not freeze_backbone)
        if freeze_backbone:
            head = getattr(self.model, "score", None) or getattr(self.model, "classifier", None)
            if head is None:
                raise ValueError("reward_freeze_backbone=True needs a model with a `score` or `classifier` head")
            for p in head.parameters():
                p.requires_grad_(True)
        return [p for p in self.model.parameters() if p.requires_grad]

    def save_pretrained(self, path: str, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """`save_pretrained` of the model (with `state_dict`: those weights, e.g. `full_state_dict()`'s) and
        tokenizer."""
        self.hf_model.save_pretrained(path, state_dict=state_dict)
        self.tokenizer.save_pretrained(path)


def reward_dataset(pairs: Sequence, rm: JointRewardModel):
    """The joint preference dataset, pre-tokenized the way `rm` scores (TRL's `chosen_ids` / `rejected_ids`
    columns, which `RewardTrainer` uses as they are): fit and scoring read exactly the same tokens."""
    from datasets import Dataset

    chosen = [rm.token_ids(joint_text(p.prompts, p.winner_completions)) for p in pairs]
    rejected = [rm.token_ids(joint_text(p.prompts, p.loser_completions)) for p in pairs]
    return Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": rejected})


@contextlib.contextmanager
def _messages_dropped(logger: str, drop: Callable[[str], bool]):
    """Drop the records of `logger` whose message `drop` matches, for the block. A filter, not a logger level:
    transformers runs extra checks (and warns) when its logger's level is raised."""

    def keep(record: logging.LogRecord) -> bool:
        return not drop(record.getMessage())

    target = logging.getLogger(logger)
    target.addFilter(keep)
    try:
        yield
    finally:
        target.removeFilter(keep)


def _head_load_report_silenced():
    """transformers logs a LOAD REPORT table for the weights a checkpoint lacks; a backbone loaded under a NEW scalar
    head always lacks the head (`score.weight`), which is initialised here by design: that known-harmless report is
    silenced for the load (`from_pretrained` reports a missing backbone weight itself)."""
    return _messages_dropped("transformers.modeling_utils", lambda message: "LOAD REPORT" in message)


def _one_process_group_note_silenced():
    """transformers warns that "torch.distributed process group is initialized, but parallel_mode !=
    ParallelMode.DISTRIBUTED" when a one-process run builds its `RewardConfig` after a colocated vLLM engine started
    its own one-process group (MARLHF with `use_vllm`): the stage trains in this one process as it should, so that
    known-harmless note is dropped while a world of one holds the group; any other message passes."""

    def the_note(message: str) -> bool:
        one_process = torch.distributed.is_initialized() and torch.distributed.get_world_size() == 1
        return one_process and "process group is initialized, but parallel_mode" in message

    return _messages_dropped("transformers.training_args", the_note)


@contextlib.contextmanager
def _rng_preserved():
    """Run a block (a Trainer that calls `set_seed`) without moving the global torch / random / numpy streams."""
    import numpy as np

    states = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])


@functools.cache
def _stage_reward_trainer_class() -> type:
    """TRL's `RewardTrainer` as a stage of a trl_marl run: like the outer trainer, it runs FSDP2 over gloo on a
    CPU-only machine when the launcher asked for FSDP (`trl_marl.distributed.fsdp.enable_fsdp_on_cpu`)."""
    from trl_marl.distributed.fsdp import enable_fsdp_on_cpu
    from trl_marl.trainers.preference.trl_pieces import RewardTrainer

    class StageRewardTrainer(RewardTrainer):
        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            if enable_fsdp_on_cpu(self.accelerator):
                self.is_fsdp_enabled = True

    return StageRewardTrainer


@contextlib.contextmanager
def _stage3_persistence(plugin, model: nn.Module):
    """ZeRO-3's `stage3_param_persistence_threshold` at TRL's value for models it partitions (10 x hidden size, as
    `trl.models.utils.prepare_deepspeed`) in `plugin`'s config for the block. DeepSpeed's default (1e5 elements)
    would keep every parameter of a small model gathered on every rank."""
    config = plugin.deepspeed_config.setdefault("zero_optimization", {})
    cfg = model.config
    hidden = max(cfg.hidden_sizes) if getattr(cfg, "hidden_sizes", None) else getattr(cfg, "hidden_size", None)
    missing = object()
    saved = config.get("stage3_param_persistence_threshold", missing)
    if hidden is not None:
        config["stage3_param_persistence_threshold"] = 10 * hidden
    try:
        yield
    finally:
        if saved is missing:
            config.pop("stage3_param_persistence_threshold", None)
        else:
            config["stage3_param_persistence_threshold"] = saved


@contextlib.contextmanager
def _accelerate_state_preserved():
    """Run a block that builds a nested Trainer (a stage) and give the outer run its accelerate state back.

    `TrainingArguments` resets accelerate's process-wide shared state when it is built (e.g. with `use_cpu`), and the
    nested `Accelerator` re-fills it for the stage; the outer trainer's `Accelerator` reads that same shared state
    afterwards (its FSDP plugin, distributed type, gradient accumulation). Snapshot and restore it, and
    transformers' ZeRO-3 marker (the stage's `TrainingArguments` points it at its own DeepSpeed config, which dies with
    the stage: models built afterwards would no longer be built inside `deepspeed.zero.Init`)."""
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from transformers.integrations import deepspeed as hf_deepspeed

    saved = [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]
    weak_ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    try:
        yield
    finally:
        for cls, state in saved:
            cls._shared_state.clear()
            cls._shared_state.update(state)
        hf_deepspeed._hf_deepspeed_config_weak_ref = weak_ref
