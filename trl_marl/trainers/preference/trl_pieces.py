"""The TRL pieces the preference trainers reuse, imported in ONE place (pinned to TRL 1.16; tested for existence in
tests/test_preference_trl.py so a TRL upgrade that moves them fails loudly there, not deep inside a run).

| TRL piece | used for |
|---|---|
| `trl.RewardTrainer`, `trl.RewardConfig` | fitting MARLHF's joint reward model (Bradley-Terry loss, `center_rewards_coefficient`, its metrics `accuracy` / `margin` / `loss`, dropout off, its model card) |
| `trl.trainer.dpo_config.DPOConfig` | the names (and defaults) of MADPO's `loss_type` family; `joint_dpo_loss` reproduces its `_compute_loss` formulas on the joint margin |
| `trl.trainer.dpo_trainer.DataCollatorForPreference` | MADPO's per-agent batches: `[all chosen ; all rejected]`, prompt + completion right-padded, `completion_mask` (`dpo_forward.PreferenceBatch.collate`) |
| `trl.trainer.utils.add_fused_lm_head` | MADPO's ONE forward per agent over chosen and rejected, as `DPOTrainer._compute_loss` runs it (`model(..., labels=..., fused_lm_head=True).log_probs`; `dpo_forward.PreferenceBatch.token_logps`) |
| `trl.models.utils.prepare_deepspeed` | MADPO's frozen per-agent reference models under DeepSpeed (ZeRO-3 stays sharded) |
| `trl.trainer.utils.disable_dropout_in_model` | frozen reference / reward models in eval-equivalent mode |
| `trl.data_utils.is_conversational` | recognising conversational preference rows |
"""

from __future__ import annotations

from trl import RewardConfig, RewardTrainer
from trl.data_utils import is_conversational
from trl.models.utils import prepare_deepspeed
from trl.trainer.dpo_config import DPOConfig
from trl.trainer.dpo_trainer import DataCollatorForPreference
from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

__all__ = [
    "DPOConfig",
    "DataCollatorForPreference",
    "RewardConfig",
    "RewardTrainer",
    "add_fused_lm_head",
    "disable_dropout_in_model",
    "is_conversational",
    "prepare_deepspeed",
    "trl_dpo_loss_types",
]


def trl_dpo_loss_types() -> str:
    """The help text of TRL's `DPOConfig.loss_type` (lists every loss type name the installed TRL implements)."""
    import dataclasses

    field = next(f for f in dataclasses.fields(DPOConfig) if f.name == "loss_type")
    return field.metadata["help"]
