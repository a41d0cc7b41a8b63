"""Agents as LoRA adapters: one adapter per agent model, or every agent an adapter on ONE shared base."""

import os

import pytest
import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

from trl_marl import MADPOConfig, MADPOTrainer, MAGRPOTrainer
from trl_marl.models.adapters import AdapterAgent

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def reward(c1, c2):
    return [float(len(a) - len(b)) for a, b in zip(c1, c2)]


def lora_params(t, i):
    return {k: p.detach().clone() for k, p in t.team.agent_named_parameters(i)}


def test_shared_base_team_trains_adapters_only(make_args, items, tiny_path, tmp_path):
    args = make_args(share_base_model=True, max_steps=2, learning_rate=1e-2, reference_kl_enabled=True)
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items, peft_config=LORA)
    team = t.team
    assert team.shared_base and all(isinstance(a, AdapterAgent) for a in team.agents)
    base_before = {k: p.detach().clone() for k, p in team.shared.named_parameters() if "lora_" not in k}
    before = [lora_params(t, i) for i in range(2)]
    # one base: the team holds the base weights once
    n_base = sum(p.numel() for k, p in team.shared.named_parameters() if "lora_" not in k)
    n_all = sum(p.numel() for p in team.parameters())
    assert n_all < 1.1 * n_base
    t.train()
    after = [lora_params(t, i) for i in range(2)]
    for i in range(2):
        assert set(after[i]) and all(f".agent_{i + 1}." in k for k in after[i])
        assert any(not torch.equal(before[i][k], after[i][k]) for k in after[i])  # each adapter learned
    diff = [after[0][k] - after[1][k.replace("agent_1", "agent_2")] for k in after[0] if "lora_B" in k]
    assert any(d.abs().sum() > 0 for d in diff)  # the adapters differ
    for k, p in team.shared.named_parameters():
        if "lora_" not in k:
            assert torch.equal(p, base_before[k]), k  # the base is frozen
    assert "agent_1/kl" in t.state.log_history[0]
    # save: one adapter folder per agent, loadable on a fresh base
    t.save_model(str(tmp_path / "saved"))
    for i in (1, 2):
        folder = tmp_path / "saved" / f"agent_{i}"
        assert (folder / "adapter_config.json").exists() and (folder / "adapter_model.safetensors").exists()
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_path), folder)
        ids = torch.tensor([[5, 6, 7, 8]])
        with torch.no_grad():
            expected = team.agents[i - 1](input_ids=ids).logits
            torch.testing.assert_close(loaded(input_ids=ids).logits, expected)


def test_reference_logprobs_are_the_base_model(make_args, items, tiny_path):
    args = make_args(share_base_model=True, reference_kl_enabled=True)
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items, peft_config=LORA)
    with torch.no_grad():  # make the adapters matter (LoRA B starts at zero)
        for k, p in t.team.shared.named_parameters():
            if "lora_B" in k:
                p.add_(0.5)
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        ref = t.reference_models[0](input_ids=ids).logits
        torch.testing.assert_close(ref, base(input_ids=ids).logits)
        assert not torch.allclose(t.team.agents[0](input_ids=ids).logits, ref)


def test_mixed_adapter_generation_is_one_call(make_args, items, tiny_path, monkeypatch):
    args = make_args(share_base_model=True)
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items, peft_config=LORA)
    calls = []
    original = t.team.shared.generate

    def counting(*a, **kw):
        calls.append(kw.get("adapter_names"))
        return original(*a, **kw)

    monkeypatch.setattr(t.team.shared, "generate", counting)
    prompts = [[t._render(0, "hello"), t._render(0, "world")], [t._render(1, "foo"), t._render(1, "bar")]]
    outs = t.generate(prompts, 3)
    assert len(calls) == 1 and calls[0] == ["agent_1"] * 6 + ["agent_2"] * 6
    assert [len(o.texts) for o in outs] == [6, 6]


def test_one_adapter_per_agent_model_and_heterogeneous(make_args, items, tiny_path, tiny_qwen_path, tmp_path):
    from transformers import AutoTokenizer

    toks = [AutoTokenizer.from_pretrained(p) for p in (tiny_path, tiny_qwen_path)]
    args = make_args(MADPOConfig, preference_num_candidates=3, max_steps=1, learning_rate=1e-2)
    t = MADPOTrainer(
        model=[tiny_path, tiny_qwen_path],
        processing_class=toks,
        reward_funcs=reward,
        args=args,
        train_dataset=items,
        peft_config=LORA,
    )
    assert all(isinstance(a, PeftModel) for a in t.team.agents)
    t.train()
    t.save_model(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "agent_2" / "adapter_model.safetensors").exists()
    assert not (tmp_path / "saved" / "agent_2" / "model.safetensors").exists()


def test_resume_restores_every_adapter(make_args, items, tiny_path, tmp_path):
    args = make_args(
        share_base_model=True,
        max_steps=2,
        save_strategy="steps",
        save_steps=2,
        learning_rate=1e-2,
        output_dir=str(tmp_path / "ck"),
    )
    a = MAGRPOTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items, peft_config=LORA)
    a.train()
    b = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=reward,
        train_dataset=items,
        peft_config=LORA,
        args=make_args(share_base_model=True, max_steps=3, output_dir=str(tmp_path / "ck")),
    )
    b._load_from_checkpoint(str(tmp_path / "ck" / "checkpoint-2"))
    for i in range(2):
        for (k, x), (_, y) in zip(a.team.agent_named_parameters(i), b.team.agent_named_parameters(i)):
            torch.testing.assert_close(x, y, msg=k)
    b.train(resume_from_checkpoint=str(tmp_path / "ck" / "checkpoint-2"))
    assert b.state.global_step == 3


def test_lora_bad_inputs(make_args, items, tiny_path):
    with pytest.raises(ValueError, match="share_base_model=True needs a peft_config"):
        MAGRPOTrainer(model=tiny_path, reward_funcs=reward, train_dataset=items, args=make_args(share_base_model=True))
    with pytest.raises(ValueError, match="share_base_model=True needs a homogeneous team"):
        MAGRPOTrainer(
            model=[tiny_path, tiny_path],
            reward_funcs=reward,
            train_dataset=items,
            peft_config=LORA,
            args=make_args(share_base_model=True),
        )
    bad = LoraConfig(r=4, target_modules=["not_a_module"])
    with pytest.raises(ValueError, match="peft_config cannot wrap .*model type 'llama'"):
        MAGRPOTrainer(model=tiny_path, reward_funcs=reward, train_dataset=items, peft_config=bad, args=make_args())
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_actor_critic_with_lora_agents_and_no_shared_base(make_args, items, tiny_path):
    from trl_marl import MAACConfig, MAACTrainer

    args = make_args(MAACConfig, num_generations=1, max_steps=1)
    t = MAACTrainer(
        model=tiny_path,
        critic_model=tiny_path,
        reward_funcs=reward,
        args=args,
        train_dataset=items,
        peft_config=LORA,
    )
    t.train()
    assert all(isinstance(a, PeftModel) for a in t.team.agents)
    with pytest.raises(ValueError, match="MAACTrainer does not support share_base_model=True"):
        MAACTrainer(
            model=tiny_path,
            critic_model=tiny_path,
            reward_funcs=reward,
            train_dataset=items,
            peft_config=LORA,
            args=make_args(MAACConfig, num_generations=1, share_base_model=True),
        )


def test_madpo_trl_forward_through_a_shared_base_team(make_args, items, tiny_path):
    """MADPO's TRL concatenated forward (fused LM head on the base model under PEFT) through adapter views of ONE
    shared base: each agent's log-probs are its own adapter's (a plain forward with that adapter active), the
    gradient reaches only the adapters, and the shared model's forward is left as it was."""
    args = make_args(MADPOConfig, share_base_model=True, preference_num_candidates=3, learning_rate=1e-2)
    t = MADPOTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items, peft_config=LORA)
    team = t.team
    with torch.no_grad():  # make the two adapters differ (LoRA B starts at zero)
        for i in range(2):
            for k, p in team.agent_named_parameters(i):
                if "lora_B" in k:
                    p.normal_(0, 0.5 * (i + 1))
    pairs = t.collect_preference_pairs()[:3]
    c, r, _, _ = t.preference_logps(team, pairs)
    base = team.shared.get_base_model()
    assert "forward" not in vars(base)
    with torch.no_grad():
        for i, agent in enumerate(team.agents):
            for j, p in enumerate(pairs):
                ids = torch.cat([p.prompt_ids[i], p.winner_ids[i]])[None]
                logits = agent(input_ids=ids).logits[0, len(p.prompt_ids[i]) - 1 : -1]
                plain = torch.log_softmax(logits.float(), -1).gather(1, p.winner_ids[i][:, None]).sum()
                assert c[i, j].item() == pytest.approx(plain.item(), abs=1e-4)
    assert (c[0] - c[1]).abs().max() > 1e-3  # the agents' adapters give different log-probs
    (c.sum() - r.sum()).backward()
    grads = {k: p.grad for k, p in team.shared.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in k for k in grads)
