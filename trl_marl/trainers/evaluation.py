"""The evaluation part of a trainer: sample the current agents on held-out items and score them with the TASK reward.

Whatever a trainer learns from (a learned reward model, preference pairs, critics), its evaluation rolls out one
joint action per item with the training sampling settings and the task's own reward, so runs of different algorithms
report comparable numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate.utils import gather_object

from trl_marl.data_types.rollout import generated_tokens
from trl_marl.distributed.collective import even_chunks
from trl_marl.generation.engine import GenerationEngine
from trl_marl.rollout.engine import JointRollout
from trl_marl.rollout.returns import rollout_returns
from trl_marl.utils.progress import progress_bar

__all__ = ["TaskEvaluator", "final_evaluation"]


class TaskEvaluator:
    """Evaluation with the task reward (see the module docstring).

    Args:
        rollout_engine: the rollout that scores with the TASK reward.
        generation: the trainer's generation engine.
        accelerator: the trainer's accelerator (each process evaluates its share; the sums are gathered).
        num_agents: n.
        seed: evaluation samples from a fixed random stream derived from it (`seed + 1_000_003 * (rank + 1)`), so
            successive evaluations differ only by the weights; the training random state is left untouched.
        metrics_callback: `callable(rollout_records) -> dict[str, float]` of domain metrics, averaged over the
            evaluation's batches.
    """

    def __init__(
        self,
        rollout_engine: JointRollout,
        generation: GenerationEngine,
        accelerator: Any,
        num_agents: int,
        seed: int,
        metrics_callback: Callable[[list[dict]], dict] | None = None,
    ):
        self.rollout_engine = rollout_engine
        self.generation = generation
        self.accelerator = accelerator
        self.num_agents = num_agents
        self.seed = seed
        self.metrics_callback = metrics_callback

    @torch.no_grad()
    def evaluate(
        self,
        model: torch.nn.Module,
        dataset: Sequence[dict],
        num_items: int | None = None,
        batch_size: int | None = None,
        prefix: str = "eval",
        show_progress: bool = False,
    ) -> dict[str, float]:
        """Roll out the first `num_items` items of `dataset` (all when None), `batch_size` per generation call (all of
        this process's share when None), with `model` (the team, as the trainer holds it) in eval mode. Returns `{prefix}_reward` (the mean undiscounted team return from the first
        turn), `{prefix}_turn_k/reward_mean`, `{prefix}_turn_k/expected_return`, `{prefix}_agent_i/completion_length`
        and the domain metrics."""
        total = len(dataset) if num_items is None else min(num_items, len(dataset))
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        indices = list(range(total))[rank::world]
        was_training = model.training
        model.eval()
        try:
            sums, counts, extra = self._roll_out(dataset, indices, batch_size, rank, show_progress)
        finally:
            model.train(was_training)
        keys = sorted(set(sums) | set(counts))
        if world > 1:
            gathered = gather_object([(dict(sums), dict(counts), dict(extra))])
            sums, counts, extra = defaultdict(float), defaultdict(float), defaultdict(list)
            for s, c, e in gathered:
                for k, v in s.items():
                    sums[k] += v
                for k, v in c.items():
                    counts[k] += v
                for k, v in e.items():
                    extra[k].extend(v)
            keys = sorted(set(sums) | set(counts))
        out = {f"{prefix}_{k}": sums[k] / counts[k] for k in keys if counts[k]}
        out[f"{prefix}_reward"] = out.get(f"{prefix}_turn_1/expected_return", math.nan)
        for k, v in extra.items():
            out[f"{prefix}_{k}"] = sum(v) / len(v)
        return out

    def _roll_out(
        self, dataset: Sequence[dict], indices: list[int], batch_size: int | None, rank: int, show_progress: bool
    ) -> tuple[dict[str, float], dict[str, float], dict[str, list[float]]]:
        """This process's sums and counts of every metric, and the domain metrics of each batch."""
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        extra: dict[str, list[float]] = defaultdict(list)
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed + 1_000_003 * (rank + 1))
            # ZeRO-3 / FSDP2: as many batches on every process (the last ones empty where this share is shorter)
            chunks = even_chunks(indices, batch_size or len(indices) or 1, synced=self.generation.collective)
            for chunk in progress_bar(chunks, "Evaluating", show_progress):
                items = [dataset[j] for j in chunk]
                rollout = self.rollout_engine.run(
                    items, self.generation.generate, num_generations=1, greedy_baseline=False
                )
                if not items:  # an empty batch, run in step with the other processes: nothing to record
                    continue
                returns = rollout_returns(rollout, 1.0)
                for node in rollout.nodes:
                    r = node.rewards if node.rewards.ndim == 1 else node.rewards.mean(dim=1)
                    key = f"turn_{node.turn + 1}"
                    sums[f"{key}/reward_mean"] += r.sum().item()
                    counts[f"{key}/reward_mean"] += r.numel()
                    sums[f"{key}/expected_return"] += returns.team_to_go[node.id].sum().item()
                    counts[f"{key}/expected_return"] += r.numel()
                for i in range(self.num_agents):
                    samples = rollout.samples_of_agent(i)
                    sums[f"agent_{i + 1}/completion_length"] += sum(generated_tokens(s) for s in samples)
                    counts[f"agent_{i + 1}/completion_length"] += len(samples)
                for k, v in rollout.metrics.items():  # the rollout engine's own (agentic: tools, episodes)
                    extra[k].append(float(v))
                if self.metrics_callback is not None:
                    for k, v in (self.metrics_callback(rollout.records(returns.joint)) or {}).items():
                        extra[k].append(float(v))
        return sums, counts, extra


def final_evaluation(trainer: Any, out: Any) -> Any:
    """Evaluate `trainer` after training (when it has an eval dataset): print `eval_reward` and add the metrics to
    `out`, the `TrainOutput` of the training loop (the preference trainers' `_after_training`)."""
    if trainer.eval_dataset is None or out is None:
        return out
    from transformers.trainer_utils import TrainOutput

    metrics = trainer.evaluate()
    if trainer.accelerator.is_main_process:
        print(f"[trl_marl] final evaluation: eval_reward={metrics['eval_reward']:.4f}")
    return TrainOutput(out.global_step, out.training_loss, {**(out.metrics or {}), **metrics})
