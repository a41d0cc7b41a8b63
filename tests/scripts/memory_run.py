"""Launched by tests/test_memory.py: trains a team two MAGRPO steps in ONE process and writes the memory it
measured (RSS before the trainer is built, peak RSS at the end) beside trl_marl.distributed.memory's estimate.
Arguments: OUTPUT_JSON tiny|shaped."""

import json
import os
import resource
import sys

import torch

os.environ.setdefault("CI", "1")
torch.set_num_threads(1)

SHAPES = {
    "tiny": {},
    # a model-shaped team member: hidden 512, 8 layers (about 21M parameters)
    "shaped": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8},
}


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def main():
    out, shape = sys.argv[1], sys.argv[2]
    from datasets import Dataset

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.distributed.memory import estimate
    from trl_marl.testing import tiny_model_path

    path = tiny_model_path(**SHAPES[shape])
    items = Dataset.from_list([{"prompt": f"Item {i}: say something."} for i in range(8)])
    args = MAGRPOConfig(
        output_dir=os.path.dirname(out),
        num_generations=2,
        rollout_buffer_size=2,
        max_completion_length=16,
        max_steps=2,
        learning_rate=1e-3,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
    )
    prompt_tokens = 16
    before = rss_bytes()
    trainer = MAGRPOTrainer(
        model=path, reward_funcs=lambda a, b: [float(len(x)) for x in a], args=args, train_dataset=items
    )
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    est = estimate(args, path, "ddp", 1, prompt_length=prompt_tokens)
    with open(out, "w") as f:
        json.dump({"before": before, "peak": peak, "estimate": est.as_dict()}, f)


if __name__ == "__main__":
    main()
