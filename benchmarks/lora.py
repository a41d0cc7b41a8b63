"""LoRA teams: memory of n agents as adapters on ONE shared base, and one mixed-adapter `generate` call against one
call per agent. Every figure is measured in this run; memory configurations each run in their own process.

    python benchmarks/lora.py              # writes benchmarks/results/lora.json
    python benchmarks/lora.py --memory_model tiny --repeats 1 --output /tmp/lora.json   # smallest: a smoke run

Memory: peak RSS growth of a process (over its RSS right after the imports) while it builds the team and takes two
MAGRPO steps, on a model big enough that weights dominate (Llama-shaped, hidden 2048, 4 layers, ~200M parameters,
fp32). Compared: 1 agent with LoRA; 4 agents as adapters on one shared base; 4 agents each with its own base + LoRA.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import scratch_dir

ROOT = Path(__file__).resolve().parents[1]
BIG = dict(
    hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16
)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _current_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return _rss_mb()


# the memory runs' model: `big` (the figures: weights dominate) or `tiny` (a quick smoke run of the script)
MEMORY_MODELS = {"big": BIG, "tiny": {}}


def memory_child(agents: int, shared: bool, model: str = "big") -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.testing import tiny_model_path

    torch.set_num_threads(1)
    path = tiny_model_path(**MEMORY_MODELS[model])
    base = _current_rss_mb()
    data = Dataset.from_list([{"prompt": f"Topic {i}."} for i in range(8)])
    cfg = MAGRPOConfig(
        output_dir=scratch_dir("lora"),
        num_agents=agents,
        num_generations=2,
        max_completion_length=8,
        rollout_buffer_size=2,
        max_steps=2,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        share_base_model=shared,
        learning_rate=1e-4,
        logging_steps=10,
    )
    lora = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    reward = lambda *c: [float(len(c[0][j])) for j in range(len(c[0]))]  # noqa: E731
    trainer = MAGRPOTrainer(agent_model=path, reward_func=reward, args=cfg, train_dataset=data, peft_config=lora)
    trainer.train()
    params = sum(p.numel() for p in trainer.team.parameters())
    return {"agents": agents, "shared_base": shared, "peak_rss_growth_mb": _rss_mb() - base, "team_parameters": params}


def generation_speed(repeats: int) -> dict:
    """4 agents on a shared base (the tiny C0 model), 8 prompts x G=4 each, 16 new tokens."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.testing import tiny_model_path

    torch.set_num_threads(1)
    data = Dataset.from_list([{"prompt": f"Topic {i}."} for i in range(8)])
    cfg = MAGRPOConfig(
        output_dir=scratch_dir("lora"),
        num_agents=4,
        num_generations=4,
        max_completion_length=16,
        rollout_buffer_size=8,
        report_to="none",
        disable_tqdm=True,
        share_base_model=True,
    )
    lora = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    t = MAGRPOTrainer(
        agent_model=tiny_model_path(),
        reward_func=lambda *c: [0.0] * len(c[0]),
        args=cfg,
        train_dataset=data,
        peft_config=lora,
    )
    prompts = [[t._render(i, f"Agent {i}, topic {k}: write.") for k in range(8)] for i in range(4)]
    team = t.team

    def mixed():
        with torch.no_grad():
            return t.generation._generate_shared(team, prompts, 4)

    def per_agent():
        with torch.no_grad():
            return t.generate_with(team.agents, t.tokenizers, prompts, 4, t.eos_ids)

    timings = {}
    for name, fn in (("mixed_one_call", mixed), ("one_call_per_agent", per_agent)):
        fn()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        timings[name] = statistics.median(samples)
    timings["speedup"] = timings["one_call_per_agent"] / timings["mixed_one_call"]
    return timings


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--child", default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--memory_model", choices=list(MEMORY_MODELS), default="big", help="model of the memory runs")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "lora.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("CI", "1")
    if args.child:
        agents, shared = args.child.split(",")
        print("RESULT " + json.dumps(memory_child(int(agents), shared == "1", args.memory_model)))
        return {}
    from trl_marl.testing import tiny_model_path

    tiny_model_path(**MEMORY_MODELS[args.memory_model])  # build once, outside the measured processes
    memory = []
    for spec in ("1,0", "4,1", "4,0"):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", spec, "--memory_model", args.memory_model],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
            raise SystemExit(f"memory run {spec} failed")
        memory.append(json.loads(line[len("RESULT ") :]))
    single = memory[0]["peak_rss_growth_mb"]
    for m in memory:
        m["vs_single_agent"] = m["peak_rss_growth_mb"] / single
    speed = generation_speed(args.repeats)
    report = {"model": MEMORY_MODELS[args.memory_model] or "tiny", "memory": memory, "generation_4_agents": speed}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    for m in memory:
        label = f"{m['agents']} agent(s), {'shared base' if m['shared_base'] else 'own base each'}"
        print(f"{label:34s} peak RSS growth {m['peak_rss_growth_mb']:8.0f} MB  x{m['vs_single_agent']:.2f}")
    print(
        f"generation, 4 agents: one mixed-adapter call {speed['mixed_one_call']:.3f} s, one call per agent "
        f"{speed['one_call_per_agent']:.3f} s -> {speed['speedup']:.2f}x"
    )
    return report


if __name__ == "__main__":
    main()
