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
    args = make_args(temperature=T, reference_kl_enabled=True, reference_kl_coef=0.1, max_completion_length=5)
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)
    rollout = t.rollout_engine.run([items[0], items[1]], t.generate)
    batches = [t.agent_batch(i, rollout.samples_of_agent(i)) for i in range(2)]
    with torch.no_grad():
        got = t.model(batches)["logprobs"]
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
    args = make_args(MAPPOConfig, temperature=T, max_completion_length=5)
    t = MAPPOTrainer(
        model=tiny_path, critic_model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items
    )
    rollout = t.rollout_engine.run([items[0], items[1]], t.generate)
    data = t.rl_step.critic_targets(rollout)
    for i in range(2):
        batch = t.agent_batch(i, rollout.samples_of_agent(i))
        want = _tempered_reference(t.team.agents[i], batch, T)
        for r, old in enumerate(data.old_logprobs[i]):
            torch.testing.assert_close(old, want[r, : old.numel()], rtol=1e-5, atol=1e-5)


def test_entropy_is_logged_per_agent_from_the_loss_forward(make_args, items, tiny_path):
    T = 0.8
    args = make_args(temperature=T, max_steps=1)
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)
    t.train()
    logged = t.state.log_history[0]
    assert {"agent_1/entropy", "agent_2/entropy", "entropy"} <= set(logged)
    assert logged["entropy"] == pytest.approx((logged["agent_1/entropy"] + logged["agent_2/entropy"]) / 2)
    # the loss's forward per agent (its prompts run once, then its completions: trl_marl.models.scoring) gives the
    # entropy: no forward of its own
    inputs = t._rollout_step([items[0], items[1]])[0]
    calls = []
    for agent in t.team.agents:
        agent.register_forward_hook(lambda *a: calls.append(1))
    t._metrics.clear("train")
    t.compute_loss(t.model, inputs)
    logged = t._metrics["train"]
    assert len(calls) == 4 and all(len(logged[f"agent_{i}/entropy"]) == 1 for i in (1, 2))
    # the value equals TRL's entropy_from_logits of the tempered logits on the scored tokens
    from trl.trainer.utils import entropy_from_logits

    rollout = t.rollout_engine.run([items[0]], t.generate)
    batch = t.agent_batch(0, rollout.samples_of_agent(0))
    entropy = t.team([batch, None])["entropy"]
    with torch.no_grad():
        pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = t.team.agents[0](
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos
        ).logits
        C = batch.completion_ids.shape[1]
        ent = entropy_from_logits(logits[:, -C - 1 : -1].float() / T)
        mask = batch.completion_mask.float()
        want = float((ent * mask).sum() / mask.sum())
    assert entropy[0] == pytest.approx(want, rel=1e-5)
    assert entropy[1] is None


# ---------------------------------------------------------------- EOS: score exactly the generated tokens
@pytest.fixture
def two_eos_trainer(make_args, items, tiny_path):
    """A MAGRPO trainer whose agents end on `<|endoftext|>` (id 1) OR `<|im_end|>` (id 3); the tokenizer's own EOS is
    `<|endoftext|>`, so the smallest id is NOT the one emitted below."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    agents = []
    for _ in range(2):
        m = AutoModelForCausalLM.from_pretrained(tiny_path)
        m.generation_config.eos_token_id = ids
        agents.append(m)
    args = make_args(max_completion_length=5)
    t = MAGRPOTrainer(model=agents, processing_class=tok, reward_funcs=length_reward, args=args, train_dataset=items)
    assert t.eos_ids[0] == sorted(ids) and ids[1] > ids[0]
    return t, ids


def _force_token(model, token_id, sign=1.0):
    """Every forward's logits favour (`sign=1`) or forbid (`sign=-1`) `token_id` (hook on the output)."""

    def hook(module, inputs, out):
        out.logits[..., token_id] = sign * 1e4
        return out

    return model.register_forward_hook(hook)


def test_comparator_completion_keeps_the_emitted_eos_and_a_cut_completion_gets_none(two_eos_trainer, items):
    from trl_marl.plugins.comparators import CurrentComparator

    t, (eos_small, eos_large) = two_eos_trainer
    comp = CurrentComparator(t.args)
    # the policy emits the LARGER eos id right away
    handles = [_force_token(a, eos_large) for a in t.team.agents]
    joint = comp.generate([items[0]], [["p"], ["q"]], 2, t)
    for h in handles:
        h.remove()
    for i in range(2):
        ids = t.tokenize_completion(i, joint[0][0][i])
        assert ids.tolist() == [eos_large]
    # a completion cut at max_new_tokens: both EOS forbidden, nothing appended
    handles = [_force_token(a, e, -1.0) for a in t.team.agents for e in (eos_small, eos_large)]
    joint = comp.generate([items[0]], [["p"], ["q"]], 1, t)
    for h in handles:
        h.remove()
    text = joint[0][0][0]
    ids = t.tokenize_completion(0, text)
    assert ids.numel() == t.args.max_completion_length and not set(ids.tolist()) & {eos_small, eos_large}
    assert ids.tolist() == text.token_ids.tolist()


def test_text_completions_take_the_right_eos(two_eos_trainer, tiny_tokenizer):
    from trl_marl.models.loading import completion_token_ids

    t, (eos_small, eos_large) = two_eos_trainer
    body = tiny_tokenizer("the cat", add_special_tokens=False)["input_ids"]
    # the record says which EOS it ended with
    assert t.tokenize_completion(0, "the cat", "<|im_end|>").tolist() == [*body, eos_large]
    # cut: no EOS
    assert t.tokenize_completion(0, "the cat", None).tolist() == body
    # a tokenizer whose own EOS is <|im_end|> (a chat model): unknown endings take that one, not the smallest id
    tok = type(tiny_tokenizer).from_pretrained(t.tokenizers[0].name_or_path)
    tok.eos_token = "<|im_end|>"
    assert completion_token_ids(tok, "the cat", [eos_small, eos_large], 5).tolist() == [*body, eos_large]
    # unknown ending of a text that fills max_new_tokens: taken as cut
    long = completion_token_ids(tok, "the cat the dog the sun the moon", [eos_small, eos_large], 5)
    assert long.numel() == 5 and long[-1].item() not in (eos_small, eos_large)
