"""What the trainers score is what they sampled: temperature, EOS ids, entropy (issue 13)."""

import pytest
import torch

from trl_marl import MAGRPOTrainer, MAPPOConfig, MAPPOTrainer


def length_reward(c1, c2):
    return [float(len(a) - len(b)) / 10 for a, b in zip(c1, c2)]


def _tempered_reference(model, batch, T):
    """log_softmax(logits / T) gathered at the completion tokens, by hand (no trl_marl code)."""
    with torch.no_grad():
        pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos).logits
        C = batch.completion_ids.shape[1]
        logits = logits[:, -C - 1 : -1].float()
        return torch.log_softmax(logits / T, dim=-1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)


def test_policy_and_reference_logprobs_use_the_sampling_temperature(make_args, items, tiny_path):
    T = 0.7
    args = make_args(temperature=T, reference_kl_enabled=True, reference_kl_coef=0.1, max_new_tokens=5)
    t = MAGRPOTrainer(agent_model=tiny_path, reward_func=length_reward, args=args, train_dataset=items)
    rollout = t.rollout_engine.run([items[0], items[1]], t.generate)
    batches = [t.agent_batch(i, rollout.samples_of_agent(i)) for i in range(2)]
    with torch.no_grad():
        got = t.model(batches)
    for i in range(2):
        mask = batches[i].completion_mask.bool()
        want = _tempered_reference(t.team.agents[i], batches[i], T)
        torch.testing.assert_close(got[i][mask], want[mask], rtol=1e-5, atol=1e-5)
        at_one = _tempered_reference(t.team.agents[i], batches[i], 1.0)
        assert not torch.allclose(got[i][mask], at_one[mask], atol=1e-3)
    # the reference-KL penalty: k3 on tempered policy and reference log-probs
    with torch.no_grad():
        for p in t.reference_models[0].parameters():
            p.add_(0.05 * torch.randn_like(p))
    t._reference_penalties(rollout)
    from trl_marl.algorithms.losses import k3_kl

    samples = rollout.samples_of_agent(0)
    b = batches[0]
    want = 0.1 * k3_kl(
        _tempered_reference(t.team.agents[0], b, T),
        _tempered_reference(t.reference_models[0], b, T),
        b.completion_mask,
    )
    torch.testing.assert_close(torch.tensor([s.penalty for s in samples]), want, rtol=1e-4, atol=1e-6)


def test_ppo_old_logprobs_use_the_sampling_temperature(make_args, items, tiny_path):
    T = 1.6
    args = make_args(MAPPOConfig, temperature=T, max_new_tokens=5)
    t = MAPPOTrainer(
        agent_model=tiny_path, critic_model=tiny_path, reward_func=length_reward, args=args, train_dataset=items
    )
    rollout = t.rollout_engine.run([items[0], items[1]], t.generate)
    t._assign_returns(rollout)
    data = t._critic_targets(rollout)
    for i in range(2):
        batch = t.agent_batch(i, rollout.samples_of_agent(i))
        want = _tempered_reference(t.team.agents[i], batch, T)
        for r, old in enumerate(data.old_logprobs[i]):
            torch.testing.assert_close(old, want[r, : old.numel()], rtol=1e-5, atol=1e-5)


def test_entropy_is_logged_per_agent_from_the_loss_forward(make_args, items, tiny_path):
    T = 0.8
    args = make_args(temperature=T, max_steps=1)
    t = MAGRPOTrainer(agent_model=tiny_path, reward_func=length_reward, args=args, train_dataset=items)
    t.train()
    logged = t.state.log_history[0]
    assert {"agent_1/entropy", "agent_2/entropy", "entropy"} <= set(logged)
    assert logged["entropy"] == pytest.approx((logged["agent_1/entropy"] + logged["agent_2/entropy"]) / 2)
    # the loss takes ONE forward per agent; the entropy comes from it
    inputs = t._rollout_step([items[0], items[1]])[0]
    calls = []
    for agent in t.team.agents:
        agent.register_forward_hook(lambda *a: calls.append(1))
    t.team.last_entropy = None
    t.compute_loss(t.model, inputs)
    assert len(calls) == 2 and all(e is not None for e in t.team.last_entropy)
    # the value equals TRL's entropy_from_logits of the tempered logits on the scored tokens
    from trl.trainer.utils import entropy_from_logits

    rollout = t.rollout_engine.run([items[0]], t.generate)
    batch = t.agent_batch(0, rollout.samples_of_agent(0))
    t.team([batch, None])
    with torch.no_grad():
        pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = t.team.agents[0](
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos
        ).logits
        C = batch.completion_ids.shape[1]
        ent = entropy_from_logits(logits[:, -C - 1 : -1].float() / T)
        mask = batch.completion_mask.float()
        want = float((ent * mask).sum() / mask.sum())
    assert t.team.last_entropy[0] == pytest.approx(want, rel=1e-5)
    assert t.team.last_entropy[1] is None
