"""TRL's metric names for a team's rollouts, and TRL's `log_completions` table.

TRL's GRPO dashboards key on `reward`, `reward_std`, `frac_reward_zero_std`, `rewards/<func>/mean`,
`completions/mean_length`, `completions/min_length`, `completions/max_length`, `completions/clipped_ratio`, `kl` and
`num_tokens`. The trainers log these (computed here, from a `Rollout`) beside the per-agent `agent_i/...` metrics.
`entropy` comes from the log-prob pass (see the trainers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["team_rollout_metrics", "team_means_of_agent_metrics", "rollout_num_tokens", "log_completions_table"]


def _shared(rewards: torch.Tensor) -> torch.Tensor:
    return rewards if rewards.ndim == 1 else rewards.mean(dim=1)


def team_rollout_metrics(rollout: Any, eos_ids: Sequence[Sequence[int]]) -> dict[str, float]:
    """TRL's names for one rollout (every turn, every agent):

    - `reward`: mean raw team reward over the joint actions (per-agent rewards averaged over the agents);
    - `reward_std`: mean over the rollout nodes (one prompt, G joint actions: TRL's groups) of the std of the raw
      rewards in the node;
    - `frac_reward_zero_std`: fraction of nodes whose raw rewards are all equal (std < 1e-8: no learning signal);
    - `completions/mean_length`, `/min_length`, `/max_length`: completion tokens over every agent's samples;
    - `completions/clipped_ratio`: fraction of samples that stop without an EOS token (cut at
      `max_completion_length`).
    """
    rewards = [_shared(n.raw_rewards).float() for n in rollout.nodes if n.raw_rewards is not None]
    out: dict[str, float] = {}
    if rewards:
        out["reward"] = torch.cat(rewards).mean().item()
        stds = torch.stack([r.std(unbiased=False) if r.numel() > 1 else torch.tensor(0.0) for r in rewards])
        out["reward_std"] = stds.mean().item()
        out["frac_reward_zero_std"] = (stds < 1e-8).float().mean().item()
    samples = rollout.samples
    if samples:
        lengths = torch.tensor([float(s.completion_ids.numel()) for s in samples])
        out["completions/mean_length"] = lengths.mean().item()
        out["completions/min_length"] = lengths.min().item()
        out["completions/max_length"] = lengths.max().item()
        clipped = [
            not (s.completion_ids.numel() and int(s.completion_ids[-1]) in set(eos_ids[s.agent])) for s in samples
        ]
        out["completions/clipped_ratio"] = sum(clipped) / len(clipped)
    return out


def rollout_num_tokens(rollout: Any) -> int:
    """Prompt plus completion tokens of every sample of the rollout (TRL's `num_tokens` adds these up)."""
    return int(sum(s.prompt_ids.numel() + s.completion_ids.numel() for s in rollout.samples))


def team_means_of_agent_metrics(metrics: dict[str, float], names: Sequence[str] = ("kl",)) -> dict[str, float]:
    """`name` = the mean of `agent_i/name` over the agents that logged it (e.g. TRL's `kl` from `agent_i/kl`)."""
    out = {}
    for name in names:
        values = [v for k, v in metrics.items() if k.startswith("agent_") and k.split("/", 1)[-1] == name]
        if values and name not in metrics:
            out[name] = sum(values) / len(values)
    return out


def log_completions_table(records: list[dict], step: int, args: Any, num_to_print: int | None = None) -> None:
    """TRL's `log_completions`: print a rich table of the rollout's joint actions (each agent's prompt and
    completion, the reward, the advantages; TRL's `print_prompt_completions_sample`) and log it as a table to W&B /
    trackio when those are in `report_to`."""
    from transformers.utils import is_rich_available

    if not records:
        return
    n = len(records[0]["completions"])
    prompts = [
        r["prompts"][0] if n == 1 else "\n".join(f"[{i + 1}] {p}" for i, p in enumerate(r["prompts"])) for r in records
    ]
    completions = [
        r["completions"][0] if n == 1 else "\n".join(f"[{i + 1}] {c}" for i, c in enumerate(r["completions"]))
        for r in records
    ]
    rewards = [r["raw_reward"] if isinstance(r["raw_reward"], float) else sum(r["raw_reward"]) / n for r in records]
    advantages = [sum(a) / len(a) for a in (r["advantages"] for r in records)]
    if is_rich_available():
        from trl.trainer.utils import print_prompt_completions_sample  # TRL's own table

        print_prompt_completions_sample(prompts, completions, {"reward": rewards}, advantages, step, num_to_print)
    report_to = args.report_to or []
    report_to = [report_to] if isinstance(report_to, str) else report_to
    table = {"step": [str(step)] * len(records), "prompt": prompts, "completion": completions, "reward": rewards}
    for i in range(n):
        table[f"agent_{i + 1}/completion"] = [r["completions"][i] for r in records]
    if "wandb" in report_to:
        import wandb

        if wandb.run is not None:
            import pandas as pd

            wandb.log({"completions": wandb.Table(dataframe=pd.DataFrame(table))})
    if "trackio" in report_to:
        import pandas as pd
        import trackio

        trackio.log({"completions": trackio.Table(dataframe=pd.DataFrame(table))})
