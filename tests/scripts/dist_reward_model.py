"""Launched by tests/test_preference_trl.py (and benchmarks/preference.py --reward-fit) under `accelerate launch`:
fits MARLHF's joint reward model with TRL's RewardTrainer on fixed pairs, as `MARLHFTrainer.fit_reward_model`
does, and writes per rank the fitted weights, the number of optimizer steps and the fit time.
Arguments: OUTPUT_DIR [NUM_PAIRS [EPOCHS]]."""

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
    from accelerate import PartialState

    from trl_marl import MARLHFConfig, MARLHFTrainer
    from trl_marl.testing import tiny_model_path
    from trl_marl.trainers.preference import PreferencePair

    state = PartialState()
    pairs = [
        PreferencePair([f"topic {i}", "x"], [f"good answer {i}", "yes good"], [f"bad answer {i}", "no"], 1.0, 0.0, 0.5)
        for i in range(num_pairs)
    ]
    args = MARLHFConfig(
        output_dir=os.path.join(out, "run"),
        num_agents=2,
        num_generations=2,
        max_new_tokens=4,
        rollout_buffer_size=2,
        reward_learning_rate=1e-3,
        reward_num_train_epochs=epochs,
        reward_train_batch_size=4,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = MARLHFTrainer(
        agent_model=tiny_model_path(),
        reward_func=lambda a, b: [0.0] * len(a),
        args=args,
        train_dataset=[{"prompt": "p"}] * 4,
        preference_pairs=pairs,
    )
    t0 = time.perf_counter()
    rm = trainer.fit_reward_model()
    fit_s = time.perf_counter() - t0
    rank = state.process_index
    os.makedirs(out, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in rm.model.state_dict().items()}, os.path.join(out, f"rank{rank}.pt"))
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("reward_model/")}
    info = {
        "num_processes": state.num_processes,
        "distributed_type": str(state.distributed_type),
        "fit_s": fit_s,
        "metrics": metrics,
        "steps": trainer._reward_fit_steps,
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(info, f)
    state.wait_for_everyone()
    state.destroy_process_group()


if __name__ == "__main__":
    main()
