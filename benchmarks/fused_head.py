"""Scoring completions through the fused head (TRL's chunked kernel on the head's input) against materialised logits.

    python benchmarks/fused_head.py                                   # CPU: a 2-layer model with Qwen2's vocabulary
    python benchmarks/fused_head.py --device cuda --shape qwen0.5b --tokens 128   # the GPU figure of benchmarks/README.md

One forward and backward of `score_completions` (as the loss forward runs it: each prompt once for its samples, log-
probs and entropies, under bf16 autocast by default) over 8 prompts x G=4 completions of up to `--tokens` tokens,
with the fused head (`trl_marl.models.fused_head`) and with it turned off, same model, batch and seed. `--rows auto`
(the default) cuts the rows as the loss forward does (`trl_marl.models.scoring.chunk_plan`: its estimate leaves the
logits out on the fused path, so the two paths' chunks, and what the backward recomputes, differ); `--rows batch`
scores them in one chunk on both paths: the head alone. Reported per
path: seconds (best of `--repeats` after a first call, which is reported apart: Triton compiles the kernel there on
CUDA), and the peak of memory held above what the model held before: CUDA's `max_memory_allocated` on a GPU, the peak
of live tensor bytes on CPU (every operation's output tracked until freed: a `TorchDispatchMode`, so the figure is
tensors, not the allocator's RSS). Then how far the fused path's log-probs, entropies and gradients are from the
materialised path's.

Shapes: `vllm_throughput.py`'s, plus `qwen_vocab` (Qwen2's vocabulary, 151,936 tokens, on a 2-layer hidden-256 body:
the head dominates, as it does for small models with large vocabularies).
"""

from __future__ import annotations

import argparse
import time
import weakref
from pathlib import Path

from _common import RESULTS, emit_result, machine, run_child, set_offline_env, write_json
from vllm_throughput import SHAPES

SHAPES = {
    **SHAPES,
    "qwen_vocab": dict(
        architecture="qwen2",
        vocab_size=151936,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        num_hidden_layers=2,
    ),
}


def _live_tensor_peak():
    """A dispatch mode recording the peak bytes of live tensor storages (CPU) produced inside it."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LivePeak(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live: dict[int, list[int]] = {}  # storage pointer -> [bytes, tensors alive]
            self.now = self.peak = 0

        def _release(self, key: int) -> None:
            entry = self.live.get(key)
            if entry is not None:
                entry[1] -= 1
                if entry[1] == 0:
                    self.now -= entry[0]
                    del self.live[key]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if not hasattr(t, "untyped_storage") or t.is_sparse:
                    continue
                storage = t.untyped_storage()
                key = storage.data_ptr()
                entry = self.live.get(key)
                if entry is None:
                    self.live[key] = [storage.nbytes(), 1]
                    self.now += storage.nbytes()
                    self.peak = max(self.peak, self.now)
                else:
                    entry[1] += 1
                weakref.finalize(t, self._release, key)
            return out

    return LivePeak()


def run_one(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from trl_marl.data_types.batches import collate_agent_batch
    from trl_marl.models import fused_head
    from trl_marl.models.scoring import score_completions
    from trl_marl.testing import tiny_model_path

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path(**SHAPES[args.shape])).to(args.device).train()
    g = torch.Generator().manual_seed(0)
    high = min(5000, model.config.vocab_size)
    prompts, completions = [], []
    for _ in range(args.prompts):
        prompt = torch.randint(3, high, (int(torch.randint(12, 24, (1,), generator=g)),), generator=g)
        for _ in range(args.num_generations):
            length = int(torch.randint(args.tokens // 2, args.tokens + 1, (1,), generator=g))
            prompts.append(prompt)
            completions.append(torch.randint(3, high, (length,), generator=g))
    batch = collate_agent_batch(prompts, completions, 0).to(args.device)
    mask = batch.completion_mask
    rows = len(prompts) if args.rows == "batch" else None
    cuda = args.device == "cuda"
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")

    def step():
        with autocast:
            logp, entropy = score_completions(model, batch, 1.0, return_entropy=True, rows=rows)
            loss = -(logp * mask).sum() / mask.sum()
        loss.backward()
        return logp.detach().float(), entropy.float()

    def measure(fused: bool) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor]:
        # the rule's one device condition, set both ways (the CPU has no Triton: the kernel folds tiles in torch)
        fused_head._triton_runs_on = (lambda device: True) if fused else (lambda device: False)
        assert (fused_head.fused_head(model) is not None) == fused
        seconds = []
        for _ in range(1 + args.repeats):
            model.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            logp, entropy = step()
            if cuda:
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            held = torch.cuda.memory_allocated()
            step()
            peak = (torch.cuda.max_memory_allocated() - held) / 2**20
        else:
            with _live_tensor_peak() as tracked:
                step()
            peak = tracked.peak / 2**20
        grad = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
        return {"first_s": seconds[0], "s": min(seconds[1:]), "peak_mb": peak}, logp, entropy, grad

    fused, logp_f, ent_f, grad_f = measure(True)
    plain, logp_m, ent_m, grad_m = measure(False)
    scored = mask.bool()
    return {
        "fused": fused,
        "materialised": plain,
        "logp_max_abs_diff": (logp_f - logp_m)[scored].abs().max().item(),
        "entropy_max_abs_diff": (ent_f - ent_m)[scored].abs().max().item(),
        "grad_cosine": torch.nn.functional.cosine_similarity(grad_f, grad_m, dim=0).item(),
        "grad_relative_diff": ((grad_f - grad_m).norm() / grad_m.norm()).item(),
        "rows": len(prompts),
        "completion_tokens": batch.num_completion_tokens,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shape", choices=list(SHAPES), default="qwen_vocab")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16", help="autocast dtype")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--num_generations", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64, help="completions of tokens/2 to tokens tokens")
    p.add_argument("--rows", choices=["auto", "batch"], default="auto", help="chunks: the loss forward's, or one")
    p.add_argument("--repeats", type=int, default=2, help="timed calls after the first")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", type=Path, default=RESULTS / "fused_head.json")
    args = p.parse_args(argv)
    set_offline_env()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        emit_result(run_one(args))
        return {}
    flags = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("child", "output")]
    result = run_child(__file__, ["--child", *flags])
    report = {"config": {k: str(v) for k, v in vars(args).items() if k != "child"}, "machine": machine(), **result}
    f, m = result["fused"], result["materialised"]
    print(
        f"{args.shape} on {args.device}, {result['rows']} rows x {result['completion_tokens']} tokens: fused "
        f"{f['s']:.3f} s, peak {f['peak_mb']:.0f} MB | materialised {m['s']:.3f} s, peak {m['peak_mb']:.0f} MB | "
        f"time x{f['s'] / m['s']:.2f}, peak x{f['peak_mb'] / m['peak_mb']:.2f} | log-prob diff "
        f"{result['logp_max_abs_diff']:.1e}, gradient cosine {result['grad_cosine']:.6f}",
        flush=True,
    )
    write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
