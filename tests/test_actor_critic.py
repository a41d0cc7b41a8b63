"""MAAC, IAC and MAPPO end to end on the tiny local models: credit assignment, critic sharing, value heads, saving,
bad input, and learning the coordination task."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import completions_read_as
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_marl import (
    CausalLMWithValueHead,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MAPPOConfig,
    MAPPOTrainer,
)
from trl_marl.algorithms import linked_gae
from trl_marl.models import collate_critic_batch, load_value_head
from trl_marl.trainers.actor_critic import joint_critic_text

MISSING = "/nonexistent/model/path"  # loading it would raise OSError: validation must fire first
ROOT = Path(__file__).resolve().parents[1]


def shared_reward(c1, c2):
    return [float(len(a) - len(b)) / 10 for a, b in zip(c1, c2)]


def per_agent_reward(c1, c2):
    """Agent 1 is paid for length, agent 2 for brevity: their TD errors must differ."""
    return [(len(a) / 10, -len(b) / 10 - 1.0) for a, b in zip(c1, c2)]  # one tuple per joint action


def transition(prompt, agent_completions, num_agents, **_):
    return [f"Improve: {c[:20]}" for c in agent_completions]


ROLE_FORMATTERS = [lambda x: f"ALPHA {x['prompt']}", lambda x: f"OMEGA {x['prompt']}"]


def rollout_data(trainer, items, n=2):
    """Roll out the first `n` items like a training step does; returns (rollout, frozen critic data)."""
    inputs = trainer._rollout_step([items[i] for i in range(n)])
    return inputs[0]["rollout"], inputs[0]["critic"]


@torch.no_grad()
def critic_values(critic, seqs, pad_id=0):
    batch = collate_critic_batch(seqs, pad_id)
    return critic(batch.input_ids, batch.attention_mask)


# ---------------------------------------------------------------------------------------------- credit assignment
def test_maac_gives_every_agent_the_same_td_error(make_args, items, tiny_path):
    args = make_args(MAACConfig, num_generations=2, advantage_normalization=False, discount=0.9)
    t = MAACTrainer(
        model=tiny_path,
        critic_model=tiny_path,
        reward_funcs=per_agent_reward,
        formatters=ROLE_FORMATTERS,
        args=args,
        train_dataset=items,
    )
    rollout, data = rollout_data(t, items)
    torch.testing.assert_close(data.advantages[0], data.advantages[1])
    # the TD error is the TEAM reward minus the centralized critic's value of the JOINT prompt text
    tok = t.tokenizers[0]
    texts, team_r = [], []
    for node in rollout.nodes:
        for j in range(len(node.joint)):
            texts.append(joint_critic_text(node.prompts))
            team_r.append(node.rewards[j].mean().item())
    seqs = [torch.tensor(ids) for ids in tok(texts)["input_ids"]]
    v = critic_values(t.team.critics[0], seqs)
    torch.testing.assert_close(data.advantages[0], torch.tensor(team_r) - v, atol=1e-5, rtol=1e-4)
    # with normalization the advantages stay identical
    t.args.advantage_normalization = True
    _, data = rollout_data(t, items)
    torch.testing.assert_close(data.advantages[0], data.advantages[1])


def test_iac_agents_get_their_own_td_errors_from_their_own_histories(make_args, items, tiny_path):
    args = make_args(IACConfig, num_generations=2, advantage_normalization=False)
    t = IACTrainer(
        model=tiny_path, reward_funcs=per_agent_reward, formatters=ROLE_FORMATTERS, args=args, train_dataset=items
    )
    rollout, data = rollout_data(t, items)
    tok = t.tokenizers[0]
    for i, (mine, other) in enumerate((("ALPHA", "OMEGA"), ("OMEGA", "ALPHA"))):
        texts = [tok.decode(ids) for ids in data.critic_inputs[i]]
        assert all(mine in s and other not in s for s in texts), texts[0]  # critic i never sees agent j's history
        samples = rollout.samples_of_agent(i)
        rewards = torch.tensor([rollout.nodes[s.node].rewards[s.index, i].item() for s in samples])
        v = critic_values(t.team.critics[i], [s.prompt_ids for s in samples])
        torch.testing.assert_close(data.advantages[i], rewards - v, atol=1e-5, rtol=1e-4)
    # agent 1 is paid for length, agent 2 against it: never the same TD error
    assert not torch.allclose(data.advantages[0], data.advantages[1])


def test_multi_turn_td_targets_bootstrap_with_the_next_q_value(make_args, items, tiny_path):
    args = make_args(
        MAACConfig, num_generations=1, num_turns=3, critic_type="q", discount=0.9, reference_kl_enabled=True
    )
    t = MAACTrainer(
        model=tiny_path,
        critic_model=tiny_path,
        reward_funcs=shared_reward,
        external_transition=transition,
        args=args,
        train_dataset=items,
    )
    rollout, data = rollout_data(t, items)
    assert len(rollout.nodes) == 2 * 3 and len(data.items) == 6
    from trl_marl.data_types.critic import build_transitions

    trans = build_transitions(rollout)
    expected = trans.rewards + 0.9 * torch.where(trans.has_next, data.old_values[0][trans.next_index], 0.0)
    torch.testing.assert_close(data.targets[0], expected)
    assert trans.has_next.tolist() == [True, True, True, True, False, False]
    # Q mode: the critic reads the joint action too
    assert "[Joint Action]" in t.tokenizers[0].decode(data.critic_inputs[0][0])
    t.train()
    log = t.state.log_history[0]
    assert {"turn_3/reward_mean", "turn_1/expected_return", "critic/value_loss", "agent_1/kl"} <= set(log)


def test_a_q_critic_reads_invalid_unicode_as_replacement_characters(make_args, items, tiny_path):
    # old code: TypeError (TextEncodeInput must be Union[...]) tokenizing the joint critic's text
    def bad_transition(prompt, agent_completions, num_agents, **_):
        return [f"Improve \ud800: {c[:10]}" for c in agent_completions]

    args = make_args(MAACConfig, num_generations=1, num_turns=2, critic_type="q", max_steps=1)
    t = MAACTrainer(
        model=tiny_path,
        critic_model=tiny_path,
        reward_funcs=shared_reward,
        external_transition=bad_transition,
        args=args,
        train_dataset=items,
    )
    completions_read_as(t, ["said \udfff", "ok"])
    t.train()
    assert t.state.global_step == 1 and "critic/value_loss" in t.state.log_history[0]


def test_mappo_gae_ratios_and_per_agent_joint_critics(make_args, items, tiny_path):
    args = make_args(
        MAPPOConfig,
        num_generations=1,
        num_turns=2,
        shared_critic=False,
        value_normalization=False,
        gae_lambda=0.5,
        ppo_epochs=2,
        max_steps=2,
    )
    t = MAPPOTrainer(
        model=tiny_path,
        critics=[tiny_path, tiny_path],
        reward_funcs=per_agent_reward,
        external_transition=transition,
        args=args,
        train_dataset=items,
    )
    assert len(t.team.critics) == 2 and args.steps_per_rollout == 2
    rollout, data = rollout_data(t, items)
    from trl_marl.data_types.critic import build_transitions

    for i in range(2):  # critic i learns agent i's reward on the JOINT history
        trans = build_transitions(rollout, agent=i)
        _, targets = linked_gae(trans.rewards, data.old_values[i], trans.next_index, 1.0, 0.5)
        torch.testing.assert_close(data.targets[i], targets)
        assert "[Agent 2]" in t.tokenizers[0].decode(data.critic_inputs[i][0])
    t.train()
    first = t.state.log_history[0]
    assert abs(first["agent_1/log_ratio_mean"]) < 1e-4  # first minibatch of the first epoch: pi == pi_old
    assert "agent_2/clip_fraction" in first and "critic_2/value_loss" in first


def test_mappo_value_normalization_and_popart(make_args, items, tiny_path):
    args = make_args(MAPPOConfig, popart=True, ppo_epochs=1, ratio_level="sequence")
    t = MAPPOTrainer(
        model=tiny_path, critic_model=tiny_path, reward_funcs=shared_reward, args=args, train_dataset=items
    )
    critic = t.team.critics[0]
    x = torch.tensor([[5, 6, 7, 8]])
    before = critic_values(critic, [x[0]]).item() * t.rl_step.normalizers[0].std + t.rl_step.normalizers[0].mean
    rollout_data(t, items)
    rms = t.rl_step.normalizers[0]
    assert rms.count == 2 * 2  # 2 items x 2 generations of targets
    after = critic_values(critic, [x[0]]).item() * rms.std + rms.mean
    assert after == pytest.approx(before, abs=1e-4)  # PopArt preserved the de-normalized output


# ---------------------------------------------------------------------------------------------- critics and heads
def test_broadcast_object_shares_parameters_ids_do_not(make_args, items, tiny_path):
    obj = AutoModelForCausalLM.from_pretrained(tiny_path)
    tok = AutoTokenizer.from_pretrained(tiny_path)
    shared = IACTrainer(
        model=tiny_path,
        critic_model=obj,
        processing_class=tok,
        reward_funcs=shared_reward,
        args=make_args(IACConfig),
        train_dataset=items,
    )
    assert len(shared.team.critics) == 1 and shared.team.critics[0].model is obj
    assert [s.module for s in shared.rl_step.streams] == [0, 0]
    groups = [g["name"] for g in shared.create_optimizer().param_groups]
    assert groups.count("critic") == 2  # one critic: one (decay / no-decay) pair of groups
    by_id = IACTrainer(
        model=tiny_path,
        critic_model=tiny_path,
        reward_funcs=shared_reward,
        args=make_args(IACConfig),
        train_dataset=items,
    )
    a, b = (c.model.get_input_embeddings().weight for c in by_id.team.critics)
    assert len(by_id.team.critics) == 2 and a.data_ptr() != b.data_ptr()
    objs = [AutoModelForCausalLM.from_pretrained(tiny_path) for _ in range(2)]
    distinct = IACTrainer(
        model=tiny_path,
        critics=objs,
        processing_class=tok,
        reward_funcs=shared_reward,
        args=make_args(IACConfig),
        train_dataset=items,
    )
    assert [c.model for c in distinct.team.critics] == objs
    # training moves the one shared critic, which both agents' value streams read
    before = obj.get_input_embeddings().weight.detach().clone()
    shared.train()
    assert shared.team.critics[0].model is obj and not torch.equal(before, obj.get_input_embeddings().weight)


def test_critic_learning_rate_has_its_own_group(make_args, items, tiny_path):
    args = make_args(MAACConfig, agent_learning_rate=1e-4, critic_learning_rate=5e-3)
    t = MAACTrainer(
        model=tiny_path, critic_model=tiny_path, reward_funcs=shared_reward, args=args, train_dataset=items
    )
    lrs = {g["name"]: g["lr"] for g in t.create_optimizer().param_groups}
    assert lrs == {"agent_1": 1e-4, "agent_2": 1e-4, "critic": 5e-3}
    critic_ids = {id(p) for g in t.optimizer.param_groups if g["name"] == "critic" for p in g["params"]}
    assert critic_ids == {id(p) for p in t.team.critics[0].parameters()}


def test_value_head_mode_updates_actor_and_head_together(make_args, items, tiny_path):
    args = make_args(
        IACConfig, use_separate_critic=False, value_clip_range=0.2, value_head_hidden_dim=8, learning_rate=1e-2
    )
    t = IACTrainer(model=tiny_path, reward_funcs=shared_reward, args=args, train_dataset=items)
    team = t.team
    assert len(team.critics) == 0 and len(team.value_heads) == 2
    lrs = {g["name"]: g["lr"] for g in t.create_optimizer().param_groups}
    assert lrs["value_head_1"] == lrs["agent_1"] == 1e-2
    # the critic loss reaches the actor's backbone (shared representation) and only agent 1's
    rollout, _ = rollout_data(t, items)
    batch = t.agent_batch(0, rollout.samples_of_agent(0))
    out = team([batch, None])
    out["values"][0].pow(2).sum().backward()
    assert team.agents[0].get_input_embeddings().weight.grad.abs().sum() > 0
    assert team.value_heads[0].out.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in team.agents[1].parameters())
    team.zero_grad(set_to_none=True)
    head0 = [p.detach().clone() for p in team.value_heads[0].parameters()]
    actor0 = team.agents[0].get_input_embeddings().weight.detach().clone()
    t.train()
    assert any(not torch.equal(a, p) for a, p in zip(head0, team.value_heads[0].parameters()))
    assert not torch.equal(actor0, team.agents[0].get_input_embeddings().weight)
    assert "agent_1/value_loss" in t.state.log_history[0]


# ---------------------------------------------------------------------------------------------- saving
def test_save_model_writes_loadable_critics(make_args, items, tiny_path, tmp_path):
    maac = MAACTrainer(
        model=tiny_path,
        critic_model=tiny_path,
        reward_funcs=shared_reward,
        args=make_args(MAACConfig),
        train_dataset=items,
    )
    maac.train()
    out = tmp_path / "maac"
    maac.save_model(str(out))
    loaded = CausalLMWithValueHead.from_pretrained(out / "critic")
    AutoTokenizer.from_pretrained(out / "critic")
    x = [torch.tensor([5, 6, 7])]
    assert critic_values(loaded, x).item() == pytest.approx(critic_values(maac.team.critics[0], x).item(), abs=1e-5)
    team = json.loads((out / "team.json").read_text())
    assert team["algorithm"] == "MAAC" and team["critics"][0]["folder"] == "critic"
    # a saved critic folder is a critic source again, value head included
    again = MAACTrainer(
        model=tiny_path,
        critic_model=str(out / "critic"),
        reward_funcs=shared_reward,
        args=make_args(MAACConfig),
        train_dataset=items,
    )
    torch.testing.assert_close(again.team.critics[0].value_head.out.weight, maac.team.critics[0].value_head.out.weight)

    iac = IACTrainer(
        model=tiny_path,
        reward_funcs=shared_reward,
        args=make_args(IACConfig, use_separate_critic=False),
        train_dataset=items,
    )
    iac.save_model(str(tmp_path / "iac"))
    head = load_value_head(str(tmp_path / "iac" / "agent_2"))
    torch.testing.assert_close(head.out.weight, iac.team.value_heads[1].out.weight)
    AutoModelForCausalLM.from_pretrained(tmp_path / "iac" / "agent_2")  # still a plain agent folder

    sep = IACTrainer(model=tiny_path, reward_funcs=shared_reward, args=make_args(IACConfig), train_dataset=items)
    sep.save_model(str(tmp_path / "sep"))
    assert (tmp_path / "sep" / "critic_1" / "value_head.safetensors").exists()
    assert (tmp_path / "sep" / "critic_2" / "model.safetensors").exists()


def test_checkpoint_resume_restores_critics_and_value_normalizer(make_args, items, tiny_path, tmp_path):
    args = make_args(
        MAPPOConfig, ppo_epochs=1, max_steps=2, save_strategy="steps", save_steps=2, output_dir=str(tmp_path / "ck")
    )
    a = MAPPOTrainer(
        model=tiny_path, critic_model=tiny_path, reward_funcs=shared_reward, args=args, train_dataset=items
    )
    a.train()
    ckpt = tmp_path / "ck" / "checkpoint-2"
    assert (ckpt / "critic" / "value_normalizer.json").exists()
    args_b = make_args(MAPPOConfig, ppo_epochs=1, max_steps=3, save_strategy="no", output_dir=str(tmp_path / "ck"))
    b = MAPPOTrainer(
        model=tiny_path, critic_model=tiny_path, reward_funcs=shared_reward, args=args_b, train_dataset=items
    )
    b._load_from_checkpoint(str(ckpt))
    for pa, pb in zip(a.team.critics.parameters(), b.team.critics.parameters()):
        torch.testing.assert_close(pa, pb)
    assert b.rl_step.normalizers[0].state_dict() == pytest.approx(a.rl_step.normalizers[0].state_dict())
    b.train(resume_from_checkpoint=str(ckpt))
    assert b.state.global_step == 3


# ---------------------------------------------------------------------------------------------- bad input
def build(trainer, make_args, items, cfg, args=None, **kw):
    args = args or make_args(cfg)
    return trainer(**{"model": MISSING, "reward_funcs": shared_reward, "args": args, "train_dataset": items, **kw})


@pytest.mark.parametrize("trainer, cfg", [(MAACTrainer, MAACConfig), (MAPPOTrainer, MAPPOConfig)])
def test_centralized_trainers_need_a_critic(make_args, items, trainer, cfg):
    with pytest.raises(ValueError, match=f"{trainer.__name__} needs a critic: pass critic_model"):
        build(trainer, make_args, items, cfg)


def test_critics_list_of_the_wrong_length(make_args, items):
    with pytest.raises(ValueError, match="critics has 2 entries but MAACTrainer has ONE shared centralized critic"):
        build(MAACTrainer, make_args, items, MAACConfig, critics=[MISSING, MISSING])
    with pytest.raises(ValueError, match="critics has 3 entries but num_agents is 2: IAC has one critic per agent"):
        build(IACTrainer, make_args, items, IACConfig, critics=[MISSING] * 3)
    args = make_args(MAPPOConfig, shared_critic=False)
    with pytest.raises(ValueError, match="critics has 1 entries but MAPPOTrainer with shared_critic=False has one"):
        build(MAPPOTrainer, make_args, items, MAPPOConfig, args=args, critics=[MISSING])
    with pytest.raises(ValueError, match="pass either critic_model .* or critics"):
        build(MAACTrainer, make_args, items, MAACConfig, critics=[MISSING], critic_model=MISSING)


@pytest.mark.parametrize("kw", [{"critic_model": MISSING}, {"critics": [MISSING, MISSING]}])
def test_iac_shared_model_mode_takes_no_critic(make_args, items, kw):
    args = make_args(IACConfig, use_separate_critic=False)
    with pytest.raises(ValueError, match="use_separate_critic=False puts a value head on each actor"):
        build(IACTrainer, make_args, items, IACConfig, args=args, **kw)


def test_value_clip_range_only_where_it_is_used(make_args):
    with pytest.raises(ValueError, match="value_clip_range applies only in shared-model mode"):
        make_args(IACConfig, value_clip_range=0.2)
    with pytest.raises(TypeError, match="value_clip_range"):
        make_args(MAACConfig, value_clip_range=0.2)
    assert make_args(IACConfig, use_separate_critic=False, value_clip_range=0.2).value_clip_range == 0.2


@pytest.mark.parametrize("cfg", [MAACConfig, IACConfig, MAPPOConfig])
def test_multi_turn_needs_one_generation_and_a_transition(make_args, items, cfg):
    with pytest.raises(ValueError, match="num_turns=2 needs num_generations=1: actor-critic trainers follow one"):
        make_args(cfg, num_turns=2, num_generations=2)
    trainer = {MAACConfig: MAACTrainer, IACConfig: IACTrainer, MAPPOConfig: MAPPOTrainer}[cfg]
    with pytest.raises(ValueError, match="num_turns=2 needs an external_transition"):
        build(
            trainer, make_args, items, cfg, args=make_args(cfg, num_turns=2, num_generations=1), critic_model=MISSING
        )


def test_mp_needs_agent_and_critic_devices(make_args):
    with pytest.raises(ValueError, match="parallel_training='mp' needs agent_devices"):
        make_args(MAACConfig, parallel_training="mp")
    for cfg in (MAACConfig, MAPPOConfig, IACConfig):
        with pytest.raises(ValueError, match="parallel_training='mp' needs critic_devices"):
            make_args(cfg, parallel_training="mp", agent_devices=["cpu"])
    # value heads live on the actors: no critic devices needed
    make_args(IACConfig, parallel_training="mp", agent_devices=["cpu"], use_separate_critic=False)


def test_mp_places_critics(make_args, items, tiny_path):
    args = make_args(MAACConfig, parallel_training="mp", agent_devices=["cpu"], critic_devices=["cpu"])
    t = MAACTrainer(
        model=tiny_path, critic_model=tiny_path, reward_funcs=shared_reward, args=args, train_dataset=items
    )
    assert t.team.hf_device_map == {"agents.0": "cpu", "agents.1": "cpu", "critics.0": "cpu"}
    t.train()


def test_unknown_critic_type_and_cross_joint_mode(make_args):
    with pytest.raises(ValueError, match="critic_type must be 'v' \\(V\\(h\\)\\) or 'q' \\(Q\\(h, a\\)\\), got 'w'"):
        make_args(IACConfig, critic_type="w")
    with pytest.raises(ValueError, match="actor-critic trainers need joint_mode='aligned'"):
        make_args(MAACConfig, joint_mode="cross")


@pytest.fixture(scope="module")
def other_vocab_path():
    from trl_marl.testing import tiny_model_path

    return tiny_model_path(vocab_size=300)


def test_critic_with_another_tokenizer(make_args, items, tiny_path, other_vocab_path):
    with pytest.raises(ValueError, match="the centralized critic .* is not tokenizer-compatible with agent 1"):
        MAACTrainer(
            model=tiny_path,
            critic_model=other_vocab_path,
            reward_funcs=shared_reward,
            args=make_args(MAACConfig),
            train_dataset=items,
        )
    with pytest.raises(ValueError, match="critic 2 .* is not tokenizer-compatible with agent 2"):
        IACTrainer(
            model=tiny_path,
            critics=[tiny_path, other_vocab_path],
            reward_funcs=shared_reward,
            args=make_args(IACConfig),
            train_dataset=items,
        )
    obj = AutoModelForCausalLM.from_pretrained(other_vocab_path)  # an object: its embedding table is checked
    with pytest.raises(ValueError, match="critic 1 .* has 300 token embeddings but agent 1's tokenizer"):
        IACTrainer(
            model=tiny_path,
            critics=[obj, tiny_path],
            processing_class=AutoTokenizer.from_pretrained(tiny_path),
            reward_funcs=shared_reward,
            args=make_args(IACConfig),
            train_dataset=items,
        )


# ---------------------------------------------------------------------------------------------- learning
@pytest.mark.parametrize(
    "trainer_cls, cfg, kw, critic",
    [
        (MAACTrainer, MAACConfig, {"max_steps": 25}, True),
        (IACTrainer, IACConfig, {"max_steps": 30}, False),
        (MAPPOTrainer, MAPPOConfig, {"max_steps": 30, "ppo_epochs": 2, "learning_rate": 7e-3}, True),
    ],
    ids=["maac", "iac", "mappo"],
)
def test_learns_the_coordination_task(task_trainer, tiny_path, trainer_cls, cfg, kw, critic):
    trainer, before = task_trainer(
        trainer_cls,
        cfg,
        "coordination",
        trainer_kwargs={"critic_model": tiny_path} if critic else None,
        **{"learning_rate": 5e-3, **kw},
    )
    trainer.train()
    after = trainer.evaluate_reward()["eval_reward"]
    assert after > before + 0.1, (before, after)


# ---------------------------------------------------------------------------------------------- recipes
@pytest.mark.parametrize("name", ["maac", "iac", "mappo"])
def test_recipe_runs_with_tiny_defaults(tmp_path, tiny_path, name):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / name
    trainer = module.main(
        ["--output_dir", str(out), "--max_steps", "1", "--eval_num_samples", "2", "--disable_tqdm", "true"]
    )
    assert trainer.before_reward is not None and trainer.after_reward is not None
    assert trainer.args.learning_rate == 3e-3  # the tiny defaults apply
    folder = "critic" if name != "iac" else "critic_1"
    assert (out / folder / "value_head.safetensors").exists()


@pytest.mark.parametrize(
    "trainer, cfg, critic",
    [(MAACTrainer, MAACConfig, True), (IACTrainer, IACConfig, False), (MAPPOTrainer, MAPPOConfig, True)],
    ids=["maac-critic", "iac-value-heads", "mappo-critic"],
)
def test_fresh_heads_are_seeded_by_args_seed_not_the_global_rng(tiny_path, make_args, items, trainer, cfg, critic):
    """Critics' and value heads' new heads are drawn from the "critic_init" stream of `args.seed`. They are built
    before the Trainer seeds anything, so they used to follow whatever the global RNG held: two trainers built from
    the same args after different `torch.manual_seed` calls now have identical heads; another `seed`, other heads."""

    def heads(global_seed: int, **overrides):
        torch.manual_seed(global_seed)
        kw = {"critic_model": tiny_path} if critic else {}
        args = make_args(cfg, **overrides) if critic else make_args(cfg, use_separate_critic=False, **overrides)
        t = trainer(model=tiny_path, reward_funcs=shared_reward, args=args, train_dataset=items, **kw)
        modules = [c.value_head for c in t.team.critics] if critic else list(t.team.value_heads)
        return [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]

    a, b = heads(1), heads(2)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    other = heads(1, seed=make_args(cfg).seed + 1)
    assert not torch.equal(other[0]["out.weight"], a[0]["out.weight"])
