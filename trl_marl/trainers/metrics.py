"""The trainers' metrics: TRL's metric names for a team's rollouts, TRL's `log_completions` table, rollout traces, and
`MetricsRecorder`, the part of a trainer that collects them between two logging steps.

TRL's GRPO dashboards key on `reward`, `reward_std`, `frac_reward_zero_std`, `rewards/<func>/mean`,
`completions/mean_length`, `completions/min_length`, `completions/max_length`, `completions/clipped_ratio`, `kl` and
`num_tokens`. The trainers log these (computed here, from a `Rollout`) beside the per-agent `agent_i/...` metrics.
`entropy` comes from the loss's forward (`TeamModel.forward` returns it with the log-probs).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from torch import nn

from trl_marl.data_types.rollout import Rollout, generated_tokens
from trl_marl.data_types.text import valid_texts
from trl_marl.rollout.returns import RolloutReturns

__all__ = [
    "MetricsRecorder",
    "team_rollout_metrics",
    "team_means_of_agent_metrics",
    "rollout_num_tokens",
    "log_completions_table",
    "append_trace",
]


def _shared(rewards: torch.Tensor) -> torch.Tensor:
    return rewards if rewards.ndim == 1 else rewards.mean(dim=1)


def team_rollout_metrics(rollout: Any, eos_ids: Sequence[Sequence[int]]) -> dict[str, float]:
    """TRL's names for one rollout (every turn, every agent):

    - `reward`: mean raw team reward over the joint actions (per-agent rewards averaged over the agents);
    - `reward_std`: mean over the rollout nodes (one prompt, G joint actions: TRL's groups) of the std of the raw
      rewards in the node;
    - `frac_reward_zero_std`: fraction of nodes whose raw rewards are all equal (std < 1e-8: no learning signal);
    - `completions/mean_length`, `/min_length`, `/max_length`: completion tokens over every agent's samples (the
      tokens the agents generated: tool results are not counted, as in TRL);
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
        lengths = torch.tensor([float(generated_tokens(s)) for s in samples])
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
    trackio when those are in `report_to`. Invalid unicode in a text (a lone surrogate) is shown as U+FFFD
    (`valid_text`): the console and the tables take valid text only."""
    from transformers.utils import is_rich_available

    if not records:
        return
    records = valid_texts(records)
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


def _as_json(value: Any) -> Any:
    """A record value JSON has no type for (a date, a timestamp, an array, bytes): a date or time in ISO 8601, an
    array as a list, anything else as its `str`."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def append_trace(path: str | Path, records: list[dict], step: int, env_step: int) -> None:
    """Append one JSON line per record (a joint action of a rollout) to `path`, tagged with the step and env step.
    The file is UTF-8 with non-ASCII text as it is; a lone surrogate in a text is written as U+FFFD (`valid_text`);
    values JSON has no type for are written as text (`_as_json`). Every line is encoded before the file is
    opened, so a record that cannot be written leaves the file as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(valid_texts({"step": step, "env_step": env_step, **rec}), ensure_ascii=False, default=_as_json)
        + "\n"
        for rec in records
    ]
    data = "".join(lines).encode("utf-8")
    with path.open("ab") as f:
        f.write(data)


class MetricsRecorder:
    """The metrics part of a trainer: per mode (`"train"`, `"eval"`), the values recorded since the last logging step,
    averaged (and merged over the processes) when the trainer logs.

    `recorder[mode][name].append(value)` records a value (TRL's `_metrics` layout, which is what the trainers keep
    it as). The recorder also keeps the time spent per phase (`timings`, logged as `time/<phase>_fraction`), the
    tokens rolled out since the last log (TRL's `num_tokens`) and the joint actions of the last training rollout
    (TRL's `log_completions` table).

    Args:
        accelerator: the trainer's accelerator (the merge over processes).
        num_agents: n.
        eos_ids: each agent's EOS token ids (terminated / clipped rates).
        metrics_callback: `callable(rollout_records) -> dict[str, float]` of domain metrics, called on every
            training rollout.
    """

    def __init__(
        self,
        accelerator: Any,
        num_agents: int,
        eos_ids: Sequence[Sequence[int]],
        metrics_callback: Callable[[list[dict]], dict] | None = None,
    ):
        self.accelerator = accelerator
        self.num_agents = num_agents
        self.eos_ids = eos_ids
        self.metrics_callback = metrics_callback
        self._values: dict[str, defaultdict[str, list[float]]] = {
            "train": defaultdict(list),
            "eval": defaultdict(list),
        }
        self.timings: defaultdict[str, float] = defaultdict(float)
        self.step_rollout_seconds = 0.0  # of the training step in progress: its time outside the update
        self.tokens_since_log = 0
        self.completion_records: list[dict] | None = None

    def __getitem__(self, mode: str) -> defaultdict[str, list[float]]:
        return self._values[mode]

    def add(self, mode: str, name: str, value: float) -> None:
        self._values[mode][name].append(value)

    # ------------------------------------------------------------------ what a training step records
    def record_rollout(
        self,
        rollout: Rollout,
        returns: RolloutReturns,
        advantages: Sequence[torch.Tensor] | None = None,
        reward_components: dict[str, float] | None = None,
        keep_records: bool = False,
    ) -> None:
        """A training rollout's metrics: per turn (`turn_k/...`), per agent (completion length, return mean / std,
        terminated rate), the domain metrics of `metrics_callback`, TRL's names (`reward`, `completions/...`,
        `rewards/<func>/mean` from `reward_components`) and its tokens. `advantages` (per agent, `(num_nodes, G)`)
        go into the records the callback and the completions table see; `keep_records` keeps those for the table."""
        m = self._values["train"]
        for k, v in rollout.turn_metrics(returns.team_to_go).items():
            m[k].append(v)
        for i in range(self.num_agents):
            samples = rollout.samples_of_agent(i)
            if not samples:
                continue
            lengths = torch.tensor([float(generated_tokens(s)) for s in samples])
            rets = returns.of_agent(i)
            m[f"agent_{i + 1}/completion_length"].append(lengths.mean().item())
            m[f"agent_{i + 1}/return_mean"].append(rets.mean().item())
            m[f"agent_{i + 1}/return_std"].append(rets.std(unbiased=False).item())
            eos = self.eos_ids[i]
            ended = sum(1 for s in samples if s.completion_ids.numel() and int(s.completion_ids[-1]) in eos)
            m[f"agent_{i + 1}/terminated_rate"].append(ended / len(samples))
        records = None
        if self.metrics_callback is not None or keep_records:
            records = rollout.records(returns.joint, advantages)
        if self.metrics_callback is not None:
            for k, v in (self.metrics_callback(records) or {}).items():
                m[k].append(float(v))
        for k, v in team_rollout_metrics(rollout, self.eos_ids).items():
            m[k].append(v)
        for name, mean in (reward_components or {}).items():
            m[f"rewards/{name}/mean"].append(mean)
        for k, v in rollout.metrics.items():  # the rollout engine's own (agentic: tools, episodes)
            m[k].append(v)
        self.tokens_since_log += rollout_num_tokens(rollout)
        if keep_records:
            self.completion_records = records

    def record_entropy(self, entropies: Sequence[float | None]) -> None:
        """`agent_{i}/entropy` and their mean `entropy`, from the loss's forward (`TeamModel.forward`'s `entropy`;
        None where an agent was skipped or the forward ran without gradients)."""
        m = self._values["train"]
        seen = [(i, e) for i, e in enumerate(entropies) if e is not None]
        for i, e in seen:
            m[f"agent_{i + 1}/entropy"].append(e)
        if seen:
            m["entropy"].append(sum(e for _, e in seen) / len(seen))

    def record_grad_norms(self, modules: Iterable[tuple[str, nn.Module]]) -> None:
        """`<name>/grad_norm`: the norm of each module's gradients (before clipping); a module without gradients
        (none, or an agent already stepped: `record_grad_norm`) records nothing."""
        for name, module in modules:
            grads = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
            if grads:
                self.record_grad_norm(name, torch.stack(grads).norm().item())

    def record_grad_norm(self, name: str, norm: float) -> None:
        """`<name>/grad_norm` = `norm`, the module's pre-clip gradient norm of this optimizer step."""
        self._values["train"][f"{name}/grad_norm"].append(float(norm))

    # ------------------------------------------------------------------ logging
    def summary(self, mode: str, env_step: int = 0, optimizer: Any = None, state: Any = None) -> dict[str, float]:
        """The mean of every value recorded in `mode` since the last `clear`, averaged over the processes. In
        training also: `env_step` (summed over the processes), each parameter group's `<name>/learning_rate`, the time
        fractions, the team means of per-agent metrics (TRL's `kl`) and TRL's `num_tokens` (kept in `state`)."""
        acc = self.accelerator
        metrics = {k: sum(v) / len(v) for k, v in self._values[mode].items() if v}
        if acc.num_processes > 1:
            merged: dict[str, list[float]] = defaultdict(list)
            for d in gather_object([metrics]):
                for k, v in d.items():
                    merged[k].append(v)
            metrics = {k: sum(v) / len(v) for k, v in merged.items()}
        if mode != "train":
            return metrics
        env = torch.tensor([float(env_step)], device=acc.device)
        metrics["env_step"] = acc.gather(env).sum().item() if acc.num_processes > 1 else float(env_step)
        if optimizer is not None:
            seen = set()
            for g in optimizer.param_groups:
                name = g.get("name")
                if name and name not in seen:
                    seen.add(name)
                    metrics[f"{name}/learning_rate"] = g["lr"]
        total = sum(self.timings.values())
        if total > 0:
            for k, v in self.timings.items():
                metrics[f"time/{k}_fraction"] = v / total
        metrics.update(team_means_of_agent_metrics(metrics))
        tokens = torch.tensor([float(self.tokens_since_log)], device=acc.device)
        self.tokens_since_log = 0
        if acc.num_processes > 1:
            tokens = acc.gather(tokens)
        state.num_input_tokens_seen += int(tokens.sum().item())  # TRL's num_tokens, kept in checkpoints
        if state.num_input_tokens_seen:  # trainers that train on rollouts (not on stored pairs)
            metrics["num_tokens"] = float(state.num_input_tokens_seen)
        return metrics

    def clear(self, mode: str) -> None:
        self._values[mode].clear()

    def print_completions(self, step: int, args: Any) -> None:
        """TRL's `log_completions` table of the last training rollout (once; nothing when there is none)."""
        if self.completion_records:
            log_completions_table(self.completion_records, step, args, args.num_completions_to_print)
            self.completion_records = None

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, dict[str, list[float]]]:
        """The values recorded since the last log (a checkpoint keeps them, so a resumed run logs the same means)."""
        return {mode: dict(m) for mode, m in self._values.items()}

    def load_state_dict(self, state: dict[str, dict[str, list[float]]]) -> None:
        for mode, values in state.items():
            self._values[mode] = defaultdict(list, values)
