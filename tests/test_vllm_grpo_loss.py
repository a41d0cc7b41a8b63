"""TRL's loss family with vLLM sampling (marker `vllm`; vLLM's CPU build): the importance-sampling correction per agent.

Every training rollout brings vLLM's sampled log-probs (also those whose step is not logged), each agent's ratio is
`vllm_importance_sampling_ratio` of its old log-probs (at its own temperature) against vLLM's, the per-agent sampling
settings reach the engines, and TRL's sampling metrics are logged per agent and for the team.
"""

import gc
import os

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from trl_marl import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from trl_marl.algorithms.grpo import vllm_importance_sampling_ratio  # noqa: E402
from trl_marl.models.team import agent_token_logprobs  # noqa: E402
from trl_marl.testing import tiny_model_path  # noqa: E402


def test_importance_sampling_correction_per_agent(tmp_path):
    args = MAGRPOConfig(
        output_dir=str(tmp_path),
        num_agents=2,
        num_generations=2,
        max_completion_length=[4, 6],
        temperature=[0.7, 1.0],
        rollout_buffer_size=2,
        learning_rate=1e-3,
        max_steps=2,
        num_iterations=2,
        logging_steps=2,  # the rollout of step 1 is not a logged step: it must still bring vLLM's log-probs
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        loss_type="dapo",
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=2.0,
        use_vllm=True,
        vllm_gpu_memory_utilization=0.05,
        vllm_max_model_length=128,
    )
    items = [{"prompt": f"Write about topic {i}."} for i in range(2)]
    path = tiny_model_path(hidden_size=128, num_attention_heads=2, num_key_value_heads=2)
    t = MAGRPOTrainer(
        model=path,
        reward_funcs=lambda c1, c2: [float(len(a) - len(b)) for a, b in zip(c1, c2)],
        args=args,
        train_dataset=items,
    )
    seen, calls = {}, [0]
    prepare, generate = t.rl_step.grpo_step.prepare, t.generation.generate

    def capture(rollout):
        seen["rollout"] = rollout
        seen["initial"] = [{k: v.clone() for k, v in a.state_dict().items()} for a in t.team.agents]
        seen["generations"] = prepare(rollout)
        return seen["generations"]

    def count(*a, **k):
        calls[0] += 1
        return generate(*a, **k)

    t.rl_step.grpo_step.prepare, t.generation.generate = capture, count
    try:
        t.train()
        assert calls[0] == 1  # num_iterations=2: one generation for both steps
        rollout = seen["rollout"]
        log = t.state.log_history[0]
        for i, limit in enumerate((4, 6)):
            samples = rollout.samples_of_agent(i)
            assert all(s.sampling_logprobs is not None for s in samples)
            assert all(s.completion_ids.numel() <= limit for s in samples)
            gen = seen["generations"][i]
            batch = t.agent_batch(i, samples)
            agent = t.team.agents[i]
            current = {k: v.clone() for k, v in agent.state_dict().items()}
            agent.load_state_dict(seen["initial"][i])
            with torch.no_grad():
                old = agent_token_logprobs(agent, batch, args.temperature[i])
            agent.load_state_dict(current)
            C = old.shape[1]
            mask = batch.completion_mask.float()
            torch.testing.assert_close(gen.old_logps[:, :C] * mask, old * mask, atol=1e-5, rtol=1e-5)
            full = torch.zeros_like(gen.old_logps)
            for r, s in enumerate(samples):
                full[r, : s.completion_ids.numel()] = 1
            expected = vllm_importance_sampling_ratio(
                gen.old_logps, gen.sampling_logps, full, "token_truncate", None, 2.0
            )
            torch.testing.assert_close(gen.is_ratio, expected)
            scored = full.bool() & ~torch.isnan(gen.sampling_logps)
            gap = (gen.sampling_logps - gen.old_logps)[scored].abs()
            assert gap.max() < 0.1 and gap.max() > 0  # vLLM sampled at the agent's own temperature, not bit-equal
            assert not torch.all(gen.is_ratio[scored] == 1)
            for name in ("sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/max"):
                assert f"agent_{i + 1}/{name}" in log and name in log
    finally:
        t.generation.close()
        gc.collect()
