"""TRL's GRPO fields on a TEAM: per agent, on each agent's tokens; the seed stays the default; bad input is named.

`tests/test_grpo_trainer_vs_trl.py` holds one agent against `trl.GRPOTrainer` itself; here a two-agent team must
train each agent exactly as a one-agent run on that agent's own tokens with the joint reward, with different settings
per agent (loss type, temperature, length, clip range, reference KL, reward scaling, learning rate).
"""

from __future__ import annotations

import math

import pytest
import torch

from trl_marl import MADPOConfig, MAGRPOConfig, MAGRPOTrainer, MAREINFORCETrainer, MARLOOTrainer
from trl_marl.algorithms.advantages import group_advantages
from trl_marl.algorithms.grpo_advantages import scale_advantages
from trl_marl.data_types.rollout import GenerationOutput
from trl_marl.models.adapters import AdapterDisabled
from trl_marl.models.team import agent_token_logprobs
from trl_marl.utils.deprecation import TrlMarlFutureWarning

PROMPTS = ["the writer sun", "the writer moon"]
G = 4
EOS, PAD = 1, 0


def _ids(key: str, k: int, call: int, length: int, vocab: int = 512) -> list[int]:
    seed = sum(map(ord, key)) * 31 + k * 7 + call * 101
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, length + 1, (1,), generator=g))
    ids = torch.randint(4, vocab, (n,), generator=g).tolist()
    if seed % 3:
        ids[-1] = EOS
    return ids


def fixed_engine(trainer, lengths, agents=None):
    """Replace the trainer's sampling by fixed completions of each (agent, prompt, k, generation); `agents` maps the
    trainer's agent j to the team's agent index (a one-agent run of team agent i uses agent i's completions)."""
    agents = agents or list(range(len(lengths)))
    tok = trainer.tokenizers[0]
    calls = [0]

    def generate(prompts_per_agent, num_generations, greedy=False):
        call = calls[0]
        calls[0] += 1
        outs = []
        for j, prompts in enumerate(prompts_per_agent):
            a = agents[j]
            pids = [torch.tensor(tok(str(p))["input_ids"]) for p in prompts for _ in range(num_generations)]
            comp = [
                torch.tensor(_ids(f"{a}|{p}", k, call, lengths[a])) for p in prompts for k in range(num_generations)
            ]
            outs.append(
                GenerationOutput(tok.batch_decode([c.tolist() for c in comp], skip_special_tokens=True), pids, comp)
            )
        return outs

    trainer.generation.generate = generate
    return calls


def _score(text: str) -> float:
    return float(sum(map(ord, text)) % 7) / 3 - 1.0


# ---------------------------------------------------------------------------------------------------- per agent
TEAM = dict(
    loss_type=["grpo", "dapo"],
    temperature=[0.7, 1.3],
    max_completion_length=[5, 8],
    epsilon=[0.2, 0.1],
    beta=[0.0, 0.04],
    scale_rewards=["group", "batch"],
    agent_learning_rate=[0.5, 0.3],
    mask_truncated_completions=[False, True],
)


def _config(tmp_path, name, num_agents, **settings):
    settings = {"max_steps": 2, **settings}
    return MAGRPOConfig(
        output_dir=str(tmp_path / name),
        num_agents=num_agents,
        num_generations=G,
        rollout_buffer_size=len(PROMPTS),
        num_iterations=2,
        optim="sgd",
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        **settings,
    )


def test_each_agent_trains_as_a_one_agent_run_on_its_tokens_with_the_joint_reward(tiny_path, tmp_path):
    """Two agents with different loss types, temperatures, lengths, clip ranges, betas, reward scalings and learning
    rates, two optimizer steps on one generation (clipping acting): each agent's weights equal those of a one-agent
    run with that agent's settings, its own completions and the joint reward of the joint actions they were in."""
    joint: list[dict[str, float]] = [{}, {}]  # agent -> its completion's text -> the joint reward

    def team_reward(c1, c2):
        rewards = [_score(a) - 0.5 * _score(b) + 0.1 * len(b) for a, b in zip(c1, c2)]
        for texts, table in zip((c1, c2), joint):
            table.update(zip(texts, rewards))
        return rewards

    items = [{"prompt": p} for p in PROMPTS]
    team = MAGRPOTrainer(
        model=tiny_path, reward_funcs=team_reward, args=_config(tmp_path, "team", 2, **TEAM), train_dataset=items
    )
    calls = fixed_engine(team, TEAM["max_completion_length"])
    team.train()
    assert calls[0] == 1
    log = team.state.log_history[1]
    assert log["agent_1/clip_ratio/region_mean"] > 0 and log["agent_2/clip_ratio/region_mean"] > 0
    assert "agent_2/kl" in log and "agent_1/kl" not in log
    for i in range(2):
        settings = {k: v[i] for k, v in TEAM.items()}
        solo = MAGRPOTrainer(
            model=tiny_path,
            reward_funcs=lambda c1, i=i: [joint[i][c] for c in c1],
            args=_config(tmp_path, f"solo{i}", 1, **settings),
            train_dataset=items,
        )
        fixed_engine(solo, TEAM["max_completion_length"], agents=[i])
        solo.train()
        for (name, mine), theirs in zip(team.team.agents[i].named_parameters(), solo.team.agents[0].parameters()):
            torch.testing.assert_close(
                mine, theirs, atol=1e-6, rtol=1e-5, msg=lambda m, n=name, a=i + 1: f"agent {a} {n}: {m}"
            )
        solo_log = solo.state.log_history[1]
        assert math.isclose(solo_log["agent_1/loss"], log[f"agent_{i + 1}/loss"], rel_tol=1e-5, abs_tol=1e-7)


def test_a_heterogeneous_team_samples_and_is_scored_with_each_agents_settings(tiny_path, tmp_path):
    """Different temperatures, lengths, min_p, repetition penalty and generation_kwargs: each agent's
    `GenerationConfig` carries its own, its completions respect its own length, and its log-probs (the old ones of
    `num_iterations=2`, the reference ones of `beta`) are taken at its own temperature."""
    args = _config(
        tmp_path,
        "hetero",
        2,
        loss_type="dapo",
        beta=0.04,
        temperature=[0.6, 1.4],
        top_p=[1.0, 0.9],
        top_k=[None, 50],
        min_p=[None, 0.05],
        repetition_penalty=[1.0, 1.3],
        generation_kwargs=[None, {"no_repeat_ngram_size": 2}],
        max_completion_length=[3, 7],
        max_steps=1,
    )
    t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=lambda c1, c2: [float(len(a)) for a in c1],
        args=args,
        train_dataset=[{"prompt": p} for p in PROMPTS],
    )
    tok, eos = t.tokenizers[0], t.eos_ids[0]
    first, second = (t.generation.generation_config(tok, eos, 1, False, i) for i in range(2))
    assert (first.temperature, first.max_new_tokens, first.top_k, first.min_p) == (0.6, 3, 0, None)
    assert (second.temperature, second.max_new_tokens, second.top_p, second.top_k) == (1.4, 7, 0.9, 50)
    assert (second.min_p, second.repetition_penalty, second.no_repeat_ngram_size) == (0.05, 1.3, 2)
    assert t.generation.generation_config(tok, eos, 1, True, 1).max_new_tokens == 7  # greedy keeps the length
    captured = {}
    original = t.rl_step.grpo_step.prepare

    def prepare(rollout):
        captured["rollout"], captured["generations"] = rollout, original(rollout)
        return captured["generations"]

    t.rl_step.grpo_step.prepare = prepare
    t.train()
    rollout = captured["rollout"]
    for i, limit in enumerate((3, 7)):
        samples = rollout.samples_of_agent(i)
        assert all(s.completion_ids.numel() <= limit for s in samples)
        batch = t.agent_batch(i, samples)
        gen = captured["generations"][i]
        C = batch.completion_ids.shape[1]
        with torch.no_grad():
            ref_expected = agent_token_logprobs(t.reference_models[i], batch, args.temperature[i])
            other = agent_token_logprobs(t.reference_models[i], batch, args.temperature[1 - i])
        mask = batch.completion_mask.bool()
        torch.testing.assert_close(gen.ref_logps[:, :C][mask], ref_expected[mask], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(gen.ref_logps[:, :C][mask], other[mask], atol=1e-3)
    assert t.team.agent_temperature(0) == 0.6 and t.team.agent_temperature(1) == 1.4


# ---------------------------------------------------------------------------------------------------- the seed
def test_the_seed_loss_stays_the_default_and_scale_rewards_is_trls(make_args, items, tiny_path):
    """Nothing set: the seed's loss and its population-std z-score (no loss-family step). `scale_rewards="group"`:
    TRL's advantages (Bessel std + 1e-4), sqrt(G/(G-1)) smaller than the seed's for spread-out groups."""
    r = torch.tensor([[1.0, 0.0, 3.0, -2.0], [0.5, 0.25, 2.0, 1.5]])
    seed_t = MAGRPOTrainer(
        model=tiny_path, reward_funcs=lambda c1, c2: [0.0] * len(c1), args=make_args(), train_dataset=items
    )
    assert seed_t.rl_step.grpo_step is None and seed_t.reference_models is None and seed_t.args.seed_zscore
    seed_adv = seed_t.rl_step.agent_advantages(None, 0, r)
    torch.testing.assert_close(seed_adv, group_advantages(r, "mean", normalize=True))
    trl_t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=lambda c1, c2: [0.0] * len(c1),
        args=make_args(scale_rewards="group"),
        train_dataset=items,
    )
    trl_adv = trl_t.rl_step.agent_advantages(None, 0, r)
    torch.testing.assert_close(trl_adv.flatten(), scale_advantages(r.flatten(), 4, "group"))
    ratio = seed_adv / trl_adv
    torch.testing.assert_close(ratio, torch.full_like(ratio, math.sqrt(4 / 3)), atol=1e-3, rtol=1e-3)


def test_advantage_normalization_is_a_deprecated_alias_of_scale_rewards(make_args):
    with pytest.warns(TrlMarlFutureWarning, match="use `scale_rewards`"):
        off = make_args(advantage_normalization=False)
    assert off.scale_rewards == "none" and not off.seed_zscore
    with pytest.warns(TrlMarlFutureWarning, match="use `scale_rewards`"):
        on = make_args(MAGRPOConfig, advantage_normalization=True)
    assert on.scale_rewards is None and on.seed_zscore  # the seed's z-score, unchanged
    with pytest.warns(TrlMarlFutureWarning), pytest.raises(ValueError, match="disagree"):
        make_args(advantage_normalization=False, scale_rewards="group")
    assert make_args(scale_rewards=True).scale_rewards == "group"  # TRL also takes booleans


def test_siblings_keep_their_baseline_under_trl_scaling(make_args, items, tiny_path):
    """`scale_rewards` divides by the std: MARLOO's leave-one-out advantage stays G/(G-1) x MAGRPO's (the seed's
    z-score would make them equal)."""
    r = torch.tensor([[1.0, 0.0, 3.0, -2.0]])
    kw = dict(reward_funcs=lambda c1, c2: [0.0] * len(c1), train_dataset=items, model=tiny_path)
    loo = MARLOOTrainer(args=make_args(scale_rewards="group"), **kw).rl_step.agent_advantages(None, 0, r)
    mean = MAGRPOTrainer(args=make_args(scale_rewards="group"), **kw).rl_step.agent_advantages(None, 0, r)
    torch.testing.assert_close(loo, mean * 4 / 3)


# ---------------------------------------------------------------------------------------------------- batches
def test_steps_per_generation_and_generation_batch_size_split_the_rollout(make_args):
    a = make_args(rollout_buffer_size=8, steps_per_generation=4)
    assert (a.train_batch_size, a.steps_per_rollout, a.steps_per_generation) == (2, 4, 4)
    assert a.generation_batch_size == 8 * 2  # items x num_generations x processes
    b = make_args(generation_batch_size=12, num_generations=3, steps_per_generation=2)
    assert (b.rollout_buffer_size, b.train_batch_size) == (4, 2)
    assert make_args().steps_per_generation == 1


# ---------------------------------------------------------------------------------------------------- references
def test_beta_with_peft_uses_the_adapter_disabled_base_and_sync_ref_model_moves_the_reference(
    make_args, items, tiny_path
):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    kw = dict(model=tiny_path, reward_funcs=lambda c1, c2: [float(len(a)) for a in c1], train_dataset=items)
    t = MAGRPOTrainer(args=make_args(loss_type="dapo", beta=0.1), peft_config=lora, **kw)
    assert all(isinstance(r, AdapterDisabled) for r in t.reference_models)  # no second copy of any agent
    with pytest.raises(ValueError, match="sync_ref_model=True with a peft_config"):
        MAGRPOTrainer(args=make_args(loss_type="dapo", beta=0.1, sync_ref_model=True), peft_config=lora, **kw)
    args = make_args(
        loss_type="dapo", beta=0.1, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.25
    )
    t = MAGRPOTrainer(args=args, **kw)
    ref0 = [p.detach().clone() for p in t.reference_models[0].parameters()]
    t.train()
    agent = list(t.team.agents[0].parameters())
    for r, r0, p in zip(t.reference_models[0].parameters(), ref0, agent):
        torch.testing.assert_close(r, 0.25 * p + 0.75 * r0)


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(loss_type="ppo"), r"loss_type must be one of \['grpo', 'dapo', 'dr_grpo'"),
        (
            dict(loss_type="dapo", importance_sampling_level="tokens"),
            r"importance_sampling_level must be one of \['token', 'sequence'\]",
        ),
        (dict(loss_type="dapo", epsilon=-0.1), "epsilon must be a finite number >= 0"),
        (dict(loss_type="dapo", num_iterations=0), "num_iterations must be >= 1"),
        (
            dict(rollout_buffer_size=4, steps_per_generation=3),
            r"steps_per_generation \(3\) must be >= 1 and divide the generation batch",
        ),
        (dict(generation_batch_size=5), r"generation_batch_size \(5\) must be a positive multiple of num_generations"),
        (
            dict(loss_type="dapo", temperature=[0.7, 1.0, 1.2]),
            "temperature has 3 entries; give one value, or a list of 1 or num_agents=2",
        ),
        (dict(loss_type=["dapo", "grpo", "bnpo"]), "loss_type has 3 entries"),
        (dict(loss_type=["dapo", "grpo"], epsilon=[0.2, -1.0]), "agent 2: epsilon must be a finite number >= 0"),
        (dict(scale_rewards="std"), r"scale_rewards must be one of \['group', 'batch', 'none'\]"),
        (dict(beta=0.04), "beta=0.04 is a setting of TRL's GRPO loss family; set loss_type too"),
        (dict(num_iterations=2), "num_iterations=2 is a setting of TRL's GRPO loss family"),
        (dict(loss_type="dapo", beta=0.04, reference_kl_enabled=True), "two KL estimators"),
        (dict(loss_type="dapo", sync_ref_model=True), "nothing to sync"),
        (dict(loss_type="dapo", min_p=1.5), r"min_p must be None or in \[0, 1\]"),
        (dict(multi_objective_aggregation="mean"), r"multi_objective_aggregation must be one of"),
        (
            dict(loss_type="dapo", use_vllm=True, vllm_importance_sampling_mode="token"),
            r"vllm_importance_sampling_mode must be one of",
        ),
    ],
)
def test_bad_settings_are_named_at_construction(make_args, settings, message):
    with pytest.raises(ValueError, match=message):
        make_args(**settings)


@pytest.mark.parametrize(
    "generation_kwargs, message",
    [
        ({"num_return_sequences": 3}, r"generation_kwargs sets num_return_sequences=3: .* set num_generations=3"),
        ([None, {"num_return_sequences": 3}], r"generation_kwargs\[1\] sets num_return_sequences=3"),
        ({"do_sample": False}, r"generation_kwargs sets do_sample=False with num_generations=2: greedy decoding"),
        ({"bogus_key": 3}, r"generation_kwargs sets \['bogus_key'\], which transformers' GenerationConfig"),
        ({"max_tokens": 4}, r"'max_tokens' \(did you mean 'max_new_tokens'\?\)"),
        ('{"top_k": 5', r"generation_kwargs='\{\"top_k\": 5' is not valid JSON \(.*\); write a JSON object"),
    ],
)
def test_generation_kwargs_are_checked_at_construction(make_args, generation_kwargs, message):
    """On the old code: num_return_sequences gave a bare IndexError when the trainer was built, do_sample=False
    failed in train() (transformers: greedy methods do not support num_return_sequences != 1), an unknown key was
    ignored, and a JSON string that does not parse raised a bare JSONDecodeError naming no field."""
    with pytest.raises(ValueError, match=message):
        make_args(generation_kwargs=generation_kwargs)


def test_generation_kwargs_the_backend_takes_are_accepted(make_args, monkeypatch):
    from trl_marl.generation import vllm_backend

    kw = {"no_repeat_ngram_size": 2, "max_new_tokens": 4}
    assert make_args(generation_kwargs=kw).generation_kwargs == kw
    assert make_args(generation_kwargs='[{"top_k": 5}]').generation_kwargs == [{"top_k": 5}]  # the command line's
    assert make_args(num_generations=1, generation_kwargs={"do_sample": False}).num_generations == 1  # greedy
    # use_vllm: the keys go to vLLM's SamplingParams, whose fields the installed vLLM names
    monkeypatch.setattr(vllm_backend, "vllm_sampling_fields", lambda: frozenset({"presence_penalty", "top_k"}))
    assert make_args(use_vllm=True, generation_kwargs={"presence_penalty": 0.5}).use_vllm is True
    with pytest.raises(ValueError, match=r"sets \['no_repeat_ngram_size'\], which vLLM's SamplingParams"):
        make_args(use_vllm=True, generation_kwargs={"no_repeat_ngram_size": 2})
    with pytest.raises(ValueError, match=r"generation_kwargs sets n=3: .* set num_generations=3"):
        make_args(use_vllm=True, generation_kwargs={"n": 3})
    # "auto" picks one backend when the trainer is built: a key of one of them only is a warning
    with pytest.warns(UserWarning, match=r"'presence_penalty' is a setting of vLLM's SamplingParams only"):
        make_args(use_vllm="auto", generation_kwargs={"presence_penalty": 0.5})
    # no vLLM: nothing to check the keys against with use_vllm=True (the trainer refuses to build without vLLM);
    # "auto" samples with transformers, whose keys it takes
    monkeypatch.setattr(vllm_backend, "vllm_sampling_fields", lambda: None)
    assert make_args(use_vllm=True, generation_kwargs={"presence_penalty": 0.5}).use_vllm is True
    with pytest.raises(ValueError, match=r"use_vllm='auto' samples with transformers here \(vLLM is not installed"):
        make_args(use_vllm="auto", generation_kwargs={"presence_penalty": 0.5})


def test_per_agent_lists_only_where_a_config_takes_them(make_args):
    with pytest.raises(ValueError, match="temperature takes one value on MADPOConfig"):
        make_args(MADPOConfig, temperature=[0.7, 1.0])
    assert make_args(temperature=[0.9]).temperature == [0.9]  # a list of one: every agent


def test_bad_combinations_are_named_at_trainer_construction(make_args, items, tiny_path):
    kw = dict(model=tiny_path, reward_funcs=lambda c1, c2: [0.0] * len(c1), train_dataset=items)
    with pytest.raises(ValueError, match="GDPO's group-mean form; MARLOOTrainer"):
        MARLOOTrainer(args=make_args(multi_objective_aggregation="normalize_then_sum"), **kw)
    with pytest.raises(ValueError, match="reward_processor change the reward"):
        MAGRPOTrainer(args=make_args(multi_objective_aggregation="normalize_then_sum"), reward_processor=abs, **kw)
    with pytest.raises(ValueError, match="scale_rewards='group' needs num_generations >= 2"):
        MAREINFORCETrainer(args=make_args(scale_rewards="group", num_generations=1), **kw)
