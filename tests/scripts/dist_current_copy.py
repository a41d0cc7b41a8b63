"""Launched by tests/test_distributed_current_copy.py under `accelerate launch` (ZeRO-3, 2 CPU processes): builds
MADPOIter with the `current_copy` comparator, checks that its copy equals the GATHERED live weights on every process,
then runs one round with it. Writes `rank{r}.json` into OUTPUT_DIR."""

import json
import os
import sys

import torch

os.environ.setdefault("CI", "1")
torch.set_num_threads(1)


def reward(c1, c2):
    return [float(sum(ch in "aeiou" for ch in a) - sum(ch in "aeiou" for ch in b)) for a, b in zip(c1, c2)]


def main():
    from accelerate import PartialState
    from datasets import Dataset

    from trl_marl import MADPOIterConfig, MADPOIterTrainer
    from trl_marl.plugins.comparators import full_state_dict
    from trl_marl.testing import tiny_model_path

    out = sys.argv[1]
    items = Dataset.from_list([{"prompt": f"Item {i}: say something about {w}."} for i, w in enumerate("abcd")])
    args = MADPOIterConfig(
        output_dir=out,
        max_completion_length=4,
        learning_rate=1e-3,
        preference_num_candidates=2,
        rollout_buffer_size=2,
        train_batch_size=2,
        num_rounds=1,
        comparator_policy="current_copy",
        comparator_kwargs={"devices": ["cpu"]},
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    t = MADPOIterTrainer(model=tiny_model_path(), reward_funcs=reward, args=args, train_dataset=items)
    t.train()  # the round's collection prepares the copy and samples it
    live = [full_state_dict(a) for a in t.team.agents]  # gathered (collective)
    t.rounds.comparator.prepare(t, 2)  # refresh after the update: the copy follows the trained weights
    copies = t.rounds.comparator._copies
    report = {
        "deepspeed": t.is_deepspeed_enabled,
        "partitioned": any(hasattr(p, "ds_id") for p in t.team.agents[0].parameters()),
        "live_numel": [sum(v.numel() for v in s.values()) for s in live],
        "copy_numel": [sum(v.numel() for v in c.state_dict().values()) for c in copies],
        "equal": all(torch.equal(c.state_dict()[k].cpu(), v) for c, s in zip(copies, live) for k, v in s.items()),
        "completed_rounds": t.rounds.completed,
        "global_step": t.state.global_step,
    }
    rank = PartialState().process_index
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    PartialState().wait_for_everyone()
    PartialState().destroy_process_group()


if __name__ == "__main__":
    main()
