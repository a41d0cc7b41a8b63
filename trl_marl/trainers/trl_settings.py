"""TRL settings a user brings that a trl_marl config or trainer does not take: what to use instead, or why not.

A TRL user moving from `GRPOTrainer`, `DPOTrainer` or `RewardTrainer` writes `GRPOConfig` / `DPOConfig` /
`RewardConfig` fields and `GRPOTrainer.__init__` arguments out of habit. Where trl_marl has the same setting under the
same name, it simply works. Where it does not, the config (`MultiAgentConfig.__new__`) or the trainer
(`MultiAgentTrainer.__init__`) raises a `TypeError` that names the setting and points at the nearest equivalent here,
or says plainly that it is not supported and why, instead of Python's bare "unexpected keyword argument".
`tests/test_trl_settings.py` walks TRL's own field lists, so the table stays complete when TRL grows.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable

__all__ = ["TRL_CONFIG_SETTINGS", "TRL_TRAINER_ARGUMENTS", "unknown_setting_error"]

_NO_DATASET_PROCESSING = (
    "not supported: trl_marl formats and tokenizes task items itself, per agent, when it rolls them out (there is no "
    "dataset preprocessing pass to parallelize or pad)"
)
_NO_LENGTH = (
    "use max_prompt_length (the prompt's tokens, cut from the left) and max_completion_length (the completion's); "
    "a sequence is at most their sum"
)
_TR_DPO = (
    "a setting of the MAGRPO family's loss-side reference (MAGRPOConfig(loss_type=..., beta=..., sync_ref_model=True)); "
    "the reference of the reward-side KL penalty and of MADPO is the initial policy, never synced"
)
_ADAPTIVE_ENTROPY = (
    "not supported yet: the MAGRPO family takes a static entropy bonus (MAGRPOConfig(loss_type=..., entropy_coef=...)); "
    "TRL's adaptive controller (use_adaptive_entropy, entropy_coef_min / _max / _delta, entropy_target) is not wired"
)

# field name -> what to use in trl_marl instead, or why it is not supported (for a config that lacks the field)
TRL_CONFIG_SETTINGS: dict[str, str] = {
    # shared by TRL's configs
    "trust_remote_code": "pass it to the model loading options: model_init_kwargs={'trust_remote_code': True}",
    "router_aux_loss_coef": "not supported: trl_marl adds no Mixture-of-Experts load-balancing loss",
    "pad_to_multiple_of": "not supported: batches are padded to their longest sequence",
    "dataset_num_proc": _NO_DATASET_PROCESSING,
    "max_length": _NO_LENGTH + "; the MARLHF reward model's is reward_max_length",
    "activation_offloading": "not supported; gradient_checkpointing (TrainingArguments) lowers activation memory",
    "pad_token": "set tokenizer.pad_token and pass the tokenizer as processing_class (TRL deprecates it too)",
    "eos_token": "set tokenizer.eos_token and pass the tokenizer as processing_class",
    "chat_template_path": "set tokenizer.chat_template and pass the tokenizer as processing_class",
    # GRPOConfig
    "num_generations_eval": "not supported: evaluation samples one completion per agent per item (eval_num_samples "
    "items)",
    "cast_lm_head_to_fp32": "not supported: log-probabilities are computed in float32 from the model's logits",
    "ds3_gather_for_generation": "not needed: under ZeRO-3 each agent is gathered for its own generate call, one agent "
    "at a time (docs/scaling.md)",
    "shuffle_dataset": "not supported: task items are always reshuffled every epoch with the run's seed",
    "generation_batch_size": "the MAGRPO family has it (MAGRPOConfig); elsewhere rollout_buffer_size (task items "
    "rolled out together) with steps_per_rollout (training steps taken on one rollout)",
    "steps_per_generation": "the MAGRPO family has it (MAGRPOConfig); elsewhere steps_per_rollout (training steps "
    "taken on one rollout)",
    "min_p": "not supported by this trainer's sampling settings (the MAGRPO family has it: MAGRPOConfig(min_p=...))",
    "generation_kwargs": "not supported by this trainer (the MAGRPO family has it: MAGRPOConfig(generation_kwargs=...))",
    "chat_template_kwargs": "return chat messages from a formatter, rendered with each agent's chat template; extra "
    "template arguments are not supported",
    "repetition_penalty": "not supported by this trainer (the MAGRPO family has it: MAGRPOConfig(repetition_penalty=...))",
    "cache_implementation": "the MAGRPO family passes it to transformers' GenerationConfig through "
    "generation_kwargs={'cache_implementation': ...}; elsewhere generation uses transformers' default cache",
    "vllm_structured_outputs_regex": "not supported: vLLM structured outputs are not wired for a team",
    "num_iterations": "on the MAGRPO family it is TRL's num_iterations (optimizer steps per generation); the "
    "iterative preference trainers count their rounds with num_rounds",
    "epsilon": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig(loss_type=..., epsilon=...)); MAPPO clips with "
    "clip_range",
    "epsilon_high": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "delta": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "sapo_temperature_neg": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "sapo_temperature_pos": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "vespo_k_pos": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "vespo_lambda_pos": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "vespo_k_neg": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "vespo_lambda_neg": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "importance_sampling_level": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "multi_objective_aggregation": "a GRPO setting of the MAGRPO family (MAGRPOConfig); elsewhere several reward "
    "functions are summed with reward_weights",
    "scale_rewards": "a GRPO setting of the MAGRPO family (MAGRPOConfig); actor-critic trainers normalize advantages "
    "with advantage_normalization (a critic's TD errors are not a group's rewards)",
    "mask_truncated_completions": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "sync_ref_model": _TR_DPO,
    "ref_model_mixup_alpha": _TR_DPO,
    "ref_model_sync_steps": _TR_DPO,
    "top_entropy_quantile": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "entropy_coef": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "use_adaptive_entropy": _ADAPTIVE_ENTROPY,
    "entropy_coef_min": _ADAPTIVE_ENTROPY,
    "entropy_coef_max": _ADAPTIVE_ENTROPY,
    "entropy_coef_delta": _ADAPTIVE_ENTROPY,
    "entropy_target": _ADAPTIVE_ENTROPY,
    "off_policy_mask_threshold": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "use_bias_correction_kl": "a GRPO loss setting of the MAGRPO family (MAGRPOConfig)",
    "vllm_importance_sampling_correction": "a setting of the MAGRPO family with use_vllm (MAGRPOConfig)",
    "vllm_importance_sampling_mode": "a setting of the MAGRPO family with use_vllm (MAGRPOConfig)",
    "vllm_importance_sampling_clip_max": "a setting of the MAGRPO family with use_vllm (MAGRPOConfig)",
    "vllm_importance_sampling_clip_min": "a setting of the MAGRPO family with use_vllm (MAGRPOConfig)",
    "vllm_importance_sampling_cap": "TRL deprecates it for vllm_importance_sampling_clip_max (MAGRPOConfig)",
    "log_multimodal": "not supported: agents read and write text",
    "log_unique_prompts": "not supported: log_completions prints every joint action of a rollout",
    "log_completions_hub_repo": "not supported: log_completions goes to the console and to report_to",
    "use_transformers_continuous_batching": "not supported: generation is one batched generate call per agent, or vLLM "
    "(use_vllm=True)",
    "transformers_continuous_batching_config": "not supported: generation is one batched generate call per agent, or "
    "vLLM (use_vllm=True)",
    "use_transformers_paged": "not supported (TRL deprecates it too): use vLLM (use_vllm=True)",
    "beta": "on the MAGRPO family it is TRL's loss-side KL coefficient; MADPO's DPO beta is MADPOConfig(beta=...); "
    "the actor-critic trainers' reference KL is reference_kl_coef",
    "loss_type": "on the MAGRPO family it is TRL's GRPO loss family; on MADPO TRL's DPO loss types "
    "(MADPOConfig(loss_type=...)); the actor-critic trainers have their own losses (docs/choosing-an-algorithm.md)",
    "reward_weights": "weights of a list of reward_funcs; a trainer that takes reward_funcs has it",
    # RLOOConfig
    "normalize_advantages": "scale_rewards='batch' (MARLOOConfig: the leave-one-out advantages scaled by the batch's "
    "std; TRL's normalization also centres them, which leave-one-out advantages already are within each group)",
    "reward_clip_range": "clip each reward with a reward processor: reward_processor=trl_marl.rewards.clip(min, max) "
    "(a trainer argument)",
    # DPOConfig
    "truncation_mode": _NO_LENGTH,
    "padding_free": "not supported: batches are padded (left-padded prompts, right-padded completions)",
    "precompute_ref_batch_size": "not supported: the reference is scored in the trainer's own batches "
    "(precompute_ref_log_probs splits the pairs over the processes)",
    "ld_alpha": "not supported: MADPO's margins sum every completion token (LD-DPO's weighting is not implemented)",
    "f_divergence_type": "not supported: MADPO's regularizer is the reverse KL of DPO (f-DPO is not implemented)",
    "f_alpha_divergence_coef": "not supported: MADPO's regularizer is the reverse KL of DPO (f-DPO is not implemented)",
    "use_weighting": "not supported: pairs are weighted equally (WPO's weighting is not implemented)",
    "loss_weights": "a DPO setting of MADPO (MADPOConfig(loss_type=[...], loss_weights=[...]))",
    "label_smoothing": "a DPO setting of MADPO (MADPOConfig(label_smoothing=...))",
    "discopop_tau": "a DPO setting of MADPO (MADPOConfig(discopop_tau=...))",
    "precompute_ref_log_probs": "a DPO setting of MADPO (MADPOConfig(precompute_ref_log_probs=...))",
    # RewardConfig
    "center_rewards_coefficient": "the MARLHF reward model's setting is reward_center_rewards_coefficient "
    "(MARLHFConfig)",
}

# GRPOTrainer / DPOTrainer / RewardTrainer __init__ argument -> what to use in trl_marl instead, or why not
TRL_TRAINER_ARGUMENTS: dict[str, str] = {
    "reward_processing_classes": "not supported: reward models are Python callables here (a learned joint reward model "
    "is MARLHF's)",
    "quantization_config": "load the agents yourself (e.g. with BitsAndBytesConfig) and pass the model objects as "
    "model=[...] with peft_config",
    "rollout_func": "not supported: the rollout is the team's joint rollout; a custom multi-turn step is "
    "external_transition=, an environment is environment_factory=",
    "ref_model": "not needed: the reference is each agent's initial weights (or its base with the adapter disabled, "
    "with peft_config)",
    "data_collator": "not supported: the trainers lay out their own batches (one masked forward pass per agent)",
    "compute_metrics": "use metrics_callback=callable(rollout_records) -> dict, called on every rollout and "
    "evaluation",
    "preprocess_logits_for_metrics": "not supported: evaluation scores joint actions with the task reward",
    "optimizer_cls_and_kwargs": "pass optimizers=(optimizer, scheduler) or set optim / optim_args in the config",
    # TRL's PPOTrainer (trl.experimental)
    "value_model": "the actor-critic trainers' critic: critic_model= (one critic, shared or copied per agent) or "
    "critics=[...] (one per agent) on MAACTrainer, IACTrainer, MAPPOTrainer",
    "reward_model": "rewards are Python callables (reward_funcs=); a learned joint reward model is MARLHF's "
    "(MARLHFConfig(reward_model_path=...))",
}


def unknown_setting_error(owner: str, name: str, known: Iterable[str], table: dict[str, str]) -> TypeError:
    """The error for a keyword `name` that `owner` (a config or trainer class name) does not take: TRL's setting with
    its pointer from `table`, else the closest names `owner` does take."""
    if name in table:
        return TypeError(f"{owner} got {name!r}, a TRL setting it does not take: {table[name]}")
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return TypeError(f"{owner} got an unexpected keyword argument {name!r}{hint}")


def check_config_kwargs(config_cls: type, kwargs: dict) -> None:
    """Raise `unknown_setting_error` for the first keyword that is not a field of the dataclass `config_cls`."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    for name in kwargs:
        if name not in fields:
            raise unknown_setting_error(config_cls.__name__, name, fields, TRL_CONFIG_SETTINGS)
