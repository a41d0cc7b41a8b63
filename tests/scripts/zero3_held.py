"""Launched by tests/test_zero3_held.py under `accelerate launch` with a ZeRO-3 config: MAGRPO with reference KL
(tiny team, 2 steps) while recording, for every agent and reference model, how many of its elements this rank
holds materialised (`shard_probe.shard_numel`):

- `built` / `prepared`: after the trainer's construction and once the engine exists (before the first step);
- `outside_generation`: the largest holding of each model seen right after each of DeepSpeed's parameter fetches
  (forward and backward, prefetches included) outside `generate`, i.e. whenever ZeRO-3 gathers anything to train
  or to score;
- `generating`: what each model holds inside each agent's generation gather.

Writes OUT/held_rank{r}.json. Arguments: OUTPUT_DIR.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dist_run import WORDS, _finish, reward  # noqa: E402
from shard_probe import shard_numel  # noqa: E402

torch.set_num_threads(1)


def main() -> None:
    from datasets import Dataset
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
    from transformers import TrainerCallback

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.testing import tiny_model_path

    out = sys.argv[1]
    items = Dataset.from_list([{"prompt": f"Item {i}: say something about {w}."} for i, w in enumerate(WORDS)])
    args = MAGRPOConfig(
        output_dir=out,
        num_generations=2,
        rollout_buffer_size=2,
        max_completion_length=6,
        max_steps=2,
        seed=0,
        learning_rate=1e-3,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        reference_kl_enabled=True,
    )
    record: dict = {"outside_generation": {}, "generating": [], "fetches": 0}
    models: dict[str, torch.nn.Module] = {}

    def holdings() -> dict[str, dict[str, int]]:
        return {name: shard_numel(m) for name, m in models.items()}

    state = {"generating": False}
    fetch = PartitionedParameterCoordinator.fetch_sub_module

    def recording_fetch(self, *a, **k):
        result = fetch(self, *a, **k)
        if not state["generating"]:
            record["fetches"] += 1
            for name, h in holdings().items():
                best = record["outside_generation"].get(name)
                if best is None or h["held"] > best["held"]:
                    record["outside_generation"][name] = h
        return result

    PartitionedParameterCoordinator.fetch_sub_module = recording_fetch

    class Prepared(TrainerCallback):
        def on_train_begin(self, *a, **k):
            record["prepared"] = holdings()

    trainer = MAGRPOTrainer(
        model=tiny_model_path(), reward_funcs=reward, args=args, train_dataset=items, callbacks=[Prepared()]
    )
    for i, agent in enumerate(trainer.team.agents):
        models[f"agent_{i + 1}"] = agent
    for i, ref in enumerate(trainer.reference_models):
        models[f"reference_{i + 1}"] = getattr(ref, "module", ref)
    record["built"] = holdings()

    gather = trainer.generation._gathered

    class Generating:
        def __init__(self, model):
            self.ctx = gather(model)

        def __enter__(self):
            m = self.ctx.__enter__()
            state["generating"] = True
            record["generating"].append(holdings())
            return m

        def __exit__(self, *exc):
            state["generating"] = False
            return self.ctx.__exit__(*exc)

    trainer.generation._gathered = Generating
    trainer.train()
    PartitionedParameterCoordinator.fetch_sub_module = fetch
    persistence = trainer.deepspeed._config.zero_config.param_persistence_threshold
    record["persistence_threshold"] = int(persistence)
    record["zero3_init_flag"] = bool(trainer.accelerator.state.deepspeed_plugin.zero3_init_flag)
    rank = trainer.accelerator.process_index
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"held_rank{rank}.json"), "w") as f:
        json.dump(record, f)
    _finish()


if __name__ == "__main__":
    main()
