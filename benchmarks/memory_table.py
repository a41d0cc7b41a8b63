"""The real-size table of docs/scaling.md ("How much memory, and which engine"): `trl_marl.distributed.memory.estimate` per rank
on 8 GPUs for Qwen2.5 0.5B / 1.5B / 7B bases, 2 and 4 agents, full fine-tuning and a LoRA team on one base.

    python benchmarks/memory_table.py [--output PATH]     # default benchmarks/results/memory_table.json

MAGRPO, bf16 weights, AdamW, gradient checkpointing, 2 items x 4 generations per process, 256 prompt + 256 new
tokens, no reference KL; LoRA r=16 on every Linear with `share_base_model=True`. The model configs are written out
(Qwen2.5's published config.json values), so the table needs no download. Prints the markdown rows and writes them
as JSON (GiB per rank) to `--output`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _common import RESULTS, write_json
from peft import LoraConfig

from trl_marl import MAGRPOConfig
from trl_marl.distributed.memory import ENGINES, GIB, estimate

QWEN25 = {  # Qwen2.5-{0.5B,1.5B,7B}/config.json
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}  # fmt: skip
WORLD_SIZE = 8


def row(base: str, agents: int, lora: bool) -> dict[str, Any]:
    """One table row: the estimate per rank in GiB for every engine, and the terms the table adds to it."""
    args = MAGRPOConfig(
        output_dir="estimate",
        num_agents=agents,
        num_generations=4,
        rollout_buffer_size=2,
        max_prompt_length=256,
        max_completion_length=256,
        gradient_checkpointing=True,
        share_base_model=lora,
        use_cpu=True,
        bf16=False,
    )
    args.bf16 = True  # bf16 weights (set after construction: this CPU machine rejects bf16=True in the config)
    peft = LoraConfig(r=16, target_modules="all-linear") if lora else None
    model = {"model_type": "qwen2", **QWEN25[base]}
    est = {e: estimate(args, model, e, WORLD_SIZE, peft_config=peft) for e in ENGINES}
    off = estimate(args, model, "zero3", WORLD_SIZE, peft_config=peft, zero3_init_flag=False)
    return {
        "base": base,
        "agents": agents,
        "team": "LoRA r=16, one base" if lora else "full",
        "resident_gib": {e: est[e].resident / GIB for e in ENGINES},
        "step_transient_gib": est["ddp"].activations / GIB,
        "zero3_layer_window_gib": est["zero3"].training_gather / GIB,
        "loading_zero3_flag_off_gib": off.loading / GIB,
        "loading_zero3_flag_on_gib": est["zero3"].loading / GIB,
    }


def markdown(r: dict[str, Any]) -> str:
    resident = " | ".join(f"{r['resident_gib'][e]:.1f}" for e in ENGINES)
    loading = f"{r['loading_zero3_flag_off_gib']:.1f} / {r['loading_zero3_flag_on_gib']:.1f}"
    return (
        f"| {r['base']} | {r['agents']} | {r['team']} | {resident} | {r['step_transient_gib']:.1f} "
        f"| {r['zero3_layer_window_gib']:.2f} | {loading} |"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", type=Path, default=RESULTS / "memory_table.json")
    opts = p.parse_args(argv)
    print(
        "| base | agents | team | DDP | ZeRO-2 | ZeRO-3 | FSDP2 | + step transient | + ZeRO-3 / FSDP2 layer window"
        " | loading, ZeRO-3 flag off / on |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for base in QWEN25:
        for agents in (2, 4):
            for lora in (False, True):
                rows.append(row(base, agents, lora))
                print(markdown(rows[-1]))
    write_json(opts.output, {"world_size": WORLD_SIZE, "rows": rows})


if __name__ == "__main__":
    main()
