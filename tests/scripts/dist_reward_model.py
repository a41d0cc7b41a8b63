"""Launched by tests/test_preference_trl.py (and benchmarks/preference.py --reward-fit) under `accelerate launch`:
fits MARLHF's joint reward model with TRL's RewardTrainer on fixed pairs, as `MARLHFTrainer.fit_reward_model`
does, and writes per rank the fitted weights (gathered), the number of optimizer steps, the fit time and what the rank
held of the reward model after each of the stage's steps (`shard_probe.shard_numel`).
Also runs as ONE plain process (no launcher), the baseline of the equivalence check.
Arguments: OUTPUT_DIR [NUM_PAIRS [EPOCHS [BATCH_SIZE]]]."""

import json
import os
import sys
import time

import torch

os.environ.setdefault("CI", "1")
torch.set_num_threads(1)


def main():
    out = sys.argv[1]
    num_pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    batch_size = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    from accelerate import PartialState
    from shard_probe import shard_numel
    from transformers import TrainerCallback

    from trl_marl import MARLHFConfig, MARLHFTrainer
    from trl_marl.testing import tiny_model_path
    from trl_marl.trainers.preference import PreferencePair
    from trl_marl.trainers.preference.reward_model import JointRewardModel

    state = PartialState()
    pairs = [
        PreferencePair([f"topic {i}", "x"], [f"good answer {i}", "yes good"], [f"bad answer {i}", "no"], 1.0, 0.0, 0.5)
        for i in range(num_pairs)
    ]
    args = MARLHFConfig(
        output_dir=os.path.join(out, "run"),
        num_agents=2,
        num_generations=2,
        max_completion_length=4,
        rollout_buffer_size=2,
        reward_learning_rate=1e-3,
        reward_num_train_epochs=epochs,
        reward_train_batch_size=batch_size,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = MARLHFTrainer(
        model=tiny_model_path(),
        reward_funcs=lambda a, b: [0.0] * len(a),
        args=args,
        train_dataset=[{"prompt": "p"}] * 4,
        preference_pairs=pairs,
    )
    held_during_fit = []

    class ShardProbe(TrainerCallback):  # what this rank holds of the reward model between the stage's steps
        def __init__(self, rm):
            self.rm = rm

        def on_step_end(self, *args, **kwargs):
            held_during_fit.append(shard_numel(self.rm.hf_model))

    fit = JointRewardModel.fit

    def probed_fit(self, *args, **kwargs):
        return fit(self, *args, callbacks=[ShardProbe(self)], **kwargs)

    JointRewardModel.fit = probed_fit
    t0 = time.perf_counter()
    rm = trainer.fit_reward_model()
    fit_s = time.perf_counter() - t0
    rank = state.process_index
    os.makedirs(out, exist_ok=True)
    weights = rm.full_state_dict() or rm.hf_model.state_dict()  # gathered when sharded (every rank)
    torch.save({k: v.detach().cpu() for k, v in weights.items()}, os.path.join(out, f"rank{rank}.pt"))
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("reward_model/")}
    info = {
        "num_processes": state.num_processes,
        "distributed_type": str(state.distributed_type),
        "fit_s": fit_s,
        "metrics": metrics,
        "steps": trainer._reward_fit_steps,
        "held_during_fit": held_during_fit,
        "held_while_scoring": shard_numel(rm.hf_model),
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(info, f)
    state.wait_for_everyone()
    if state.use_distributed:
        state.destroy_process_group()


if __name__ == "__main__":
    main()
