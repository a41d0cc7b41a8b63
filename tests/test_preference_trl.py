"""The preference half on TRL's machinery: TRL's preference format, TRL's DPO loss family on the joint margin,
reference models, the joint reward model fitted by TRL's RewardTrainer, and round trips with TRL's trainers."""

import math

import pytest
import torch
from transformers import AutoTokenizer

from trl_marl import MADPOConfig, MADPOTrainer
from trl_marl.trainers.preference import JointRewardModel, PreferencePair
from trl_marl.trainers.preference.pairs import joint_prompt_text, joint_response_text, to_dataset
from trl_marl.trainers.preference.reward_model import joint_text


def length_reward(c1, c2):
    return [float(len(a) - len(b)) for a, b in zip(c1, c2)]


def _pairs(chat: bool = False, n: int = 2, count: int = 3) -> list[PreferencePair]:
    out = []
    for j in range(count):
        prompts = [f"agent {i} task {j}" for i in range(n)]
        msgs = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": p}] for p in prompts]
        out.append(
            PreferencePair(
                prompts=prompts,
                winner_completions=[f"good {i} {j}" for i in range(n)],
                loser_completions=[f"bad {i} {j}" for i in range(n)],
                winner_reward=1.0 + j,
                loser_reward=0.5 * j,
                candidate_reward_mean=0.25,
                prompt_messages=msgs if chat else None,
            )
        )
    return out


def _texts(p: PreferencePair):
    return (
        p.prompts,
        p.winner_completions,
        p.loser_completions,
        p.winner_reward,
        p.loser_reward,
        p.candidate_reward_mean,
    )


# ---------------------------------------------------------------- TRL's preference format
def test_joint_dataset_is_trl_preference_format_and_round_trips():
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    pairs = _pairs()
    ds = to_dataset(pairs)
    assert ds.column_names[:3] == ["prompt", "chosen", "rejected"]
    row = ds[0]
    assert not is_conversational(row)
    # prompt + chosen is exactly the transcript the joint reward model scores
    assert row["prompt"] + row["chosen"] == joint_text(pairs[0].prompts, pairs[0].winner_completions)
    assert row["prompt"] == joint_prompt_text(pairs[0].prompts)
    assert row["rejected"] == joint_response_text(pairs[0].loser_completions)
    assert maybe_apply_chat_template(row, None) == row  # plain text passes through unchanged
    back = PreferencePair.from_dataset(ds)
    assert [_texts(p) for p in back] == [_texts(p) for p in pairs]


def test_per_agent_datasets_round_trip_and_conversational_form(tiny_path):
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    tok = AutoTokenizer.from_pretrained(tiny_path)
    for chat in (False, True):
        pairs = _pairs(chat=chat, n=3)
        per_agent = [to_dataset(pairs, agent=i) for i in range(3)]
        row = per_agent[1][2]
        assert is_conversational(row) is chat
        if chat:
            assert row["prompt"] == pairs[2].prompt_messages[1]
            assert row["chosen"] == [{"role": "assistant", "content": "good 1 2"}]
            rendered = maybe_apply_chat_template(row, tok)  # TRL's own helper accepts it
            assert rendered["prompt"].endswith("<|im_start|>assistant\n")
            assert rendered["chosen"].startswith("good 1 2")
            joint = to_dataset(pairs)[0]
            assert is_conversational(joint) and joint["prompt"][0]["role"] == "user"
            assert "agent 2 task 0" in maybe_apply_chat_template(joint, tok)["prompt"]
        else:
            assert row == {
                "prompt": "agent 1 task 2",
                "chosen": "good 1 2",
                "rejected": "bad 1 2",
                "winner_reward": 3.0,
                "loser_reward": 1.0,
                "candidate_reward_mean": 0.25,
            }
        back = PreferencePair.from_dataset(per_agent)
        assert [p.winner_completions for p in back] == [p.winner_completions for p in pairs]
        assert [p.loser_completions for p in back] == [p.loser_completions for p in pairs]
        assert [p.winner_reward for p in back] == [p.winner_reward for p in pairs]
        if chat:
            assert [p.prompt_messages for p in back] == [p.prompt_messages for p in pairs]
        else:
            assert [p.prompts for p in back] == [p.prompts for p in pairs]
    with pytest.raises(ValueError, match="agent"):
        to_dataset(pairs, agent=3)
    with pytest.raises(ValueError, match="agent_prompts"):
        PreferencePair.from_dataset(per_agent[0])


def test_collected_pairs_export_and_retokenize_to_the_sampled_ids(make_args, items, tiny_path):
    args = make_args(MADPOConfig, preference_num_candidates=3, preference_pairs_per_sample=2)
    t = MADPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items)
    pairs = t.collect_preference_pairs()
    back = PreferencePair.from_dataset(to_dataset(pairs), trainer=t)
    assert len(back) == len(pairs)
    for a, b in zip(pairs, back):
        assert _texts(a) == _texts(b)
        for i in range(2):
            assert torch.equal(a.prompt_ids[i], b.prompt_ids[i])
    # chat-template formatters: collected pairs keep the messages and export conversationally
    chat = MADPOTrainer(
        model=tiny_path,
        reward_funcs=length_reward,
        args=args,
        train_dataset=items,
        formatters=lambda item: [{"role": "user", "content": item["prompt"]}],
    )
    pairs = chat.collect_preference_pairs()
    from trl.data_utils import is_conversational

    assert pairs and all(p.prompt_messages for p in pairs)
    assert is_conversational(to_dataset(pairs, agent=0)[0])
    back = PreferencePair.from_dataset([to_dataset(pairs, agent=i) for i in range(2)], trainer=chat)
    assert [str(p) for p in back[0].prompts] == [str(p) for p in pairs[0].prompts]  # re-rendered by the template
    assert torch.equal(back[0].prompt_ids[1], pairs[0].prompt_ids[1])


# ---------------------------------------------------------------- TRL's DPO loss family on the joint margin
def _ls(x):  # log sigmoid
    return -math.log1p(math.exp(-x))


def _s(x):
    return 1 / (1 + math.exp(-x))


# the formulas of TRL 1.16's DPOTrainer._compute_loss, written out on scalars: C, R = joint chosen / rejected
# log-ratios, Lw, Ll = joint completion lengths, b = beta, e = label_smoothing, tau = discopop_tau
HAND = {
    "sigmoid": lambda C, R, Lw, Ll, b, e: -_ls(b * (C - R)),
    "hinge": lambda C, R, Lw, Ll, b, e: max(0.0, 1 - b * (C - R)),
    "ipo": lambda C, R, Lw, Ll, b, e: (C / Lw - R / Ll - 1 / (2 * b)) ** 2,
    "exo_pair": lambda C, R, Lw, Ll, b, e: (
        _s(b * (C - R)) * (_ls(b * (C - R)) - math.log(1 - e)) + _s(-b * (C - R)) * (_ls(-b * (C - R)) - math.log(e))
    ),
    "nca_pair": lambda C, R, Lw, Ll, b, e: -_ls(b * C) - 0.5 * _ls(-b * C) - 0.5 * _ls(-b * R),
    "robust": lambda C, R, Lw, Ll, b, e: (-(1 - e) * _ls(b * (C - R)) + e * _ls(-b * (C - R))) / (1 - 2 * e),
    "bco_pair": lambda C, R, Lw, Ll, b, e: -_ls(b * C) - _ls(-b * R),
    "sppo_hard": lambda C, R, Lw, Ll, b, e: (C - 0.5 / b) ** 2 + (R + 0.5 / b) ** 2,
    "apo_zero": lambda C, R, Lw, Ll, b, e: 1 - _s(b * C) + _s(b * R),
    "apo_down": lambda C, R, Lw, Ll, b, e: _s(b * C) + 1 - _s(b * (C - R)),
    "discopop": lambda C, R, Lw, Ll, b, e: (
        -_ls(b * (C - R)) * (1 - _s(b * (C - R) / 0.05)) + math.exp(-b * (C - R)) * _s(b * (C - R) / 0.05)
    ),
    "sigmoid_norm": lambda C, R, Lw, Ll, b, e: -_ls(b * (C / Lw - R / Ll)),
}


def _aot_loss(delta, b, e):
    return sum(-(1 - e) * _ls(b * x) - e * _ls(-b * x) for x in delta) / len(delta)


# the loss types that couple a batch's pairs, by hand on lists over pairs: C, R = joint chosen / rejected log-ratios,
# RC, RR = joint reference log-probs, Lw = joint chosen lengths (TRL 1.16's `_compute_loss` with the policy log-probs
# C + RC, R + RR)
BATCH_HAND = {
    "aot": lambda C, R, RC, RR, Lw, b, e: _aot_loss(
        [
            x - y
            for x, y in zip(
                sorted((c + rc) - (r + rr) for c, r, rc, rr in zip(C, R, RC, RR)),
                sorted(rc - rr for rc, rr in zip(RC, RR)),
            )
        ],
        b,
        e,
    ),
    "aot_unpaired": lambda C, R, RC, RR, Lw, b, e: _aot_loss([x - y for x, y in zip(sorted(C), sorted(R))], b, e),
    "sft": lambda C, R, RC, RR, Lw, b, e: -sum(c + rc for c, rc in zip(C, RC)) / sum(Lw),
}


def test_hand_formulas_cover_every_trl_loss_type():
    """Every loss type of the installed TRL's DPOTrainer is supported, and each has a hand formula here."""
    import re

    from trl_marl.algorithms.losses import DPO_LOSS_TYPES
    from trl_marl.trainers.preference.trl_pieces import trl_dpo_loss_types

    assert set(HAND) | set(BATCH_HAND) == set(DPO_LOSS_TYPES)
    assert set(re.findall(r"`'([a-z_]+)'`", trl_dpo_loss_types())) == set(DPO_LOSS_TYPES)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("loss_type", sorted(BATCH_HAND))
def test_joint_batch_dpo_losses_and_per_agent_gradients_match_hand_computation(loss_type, n):
    """aot / aot_unpaired / sft: the joint loss is TRL's formula on the JOINT values (one sort of the pairs by the
    joint log-ratios; the joint chosen NLL), and each agent's gradient is that formula's derivative through its own
    values once."""
    from trl_marl.algorithms.losses import joint_dpo_loss

    beta, eps, P = 0.4, 0.1, 3
    c_vals = [[-1.0, -2.5, 0.3], [-0.5, -1.5, 0.9], [-2.0, -0.25, 0.4]][:n]  # log-ratios, agents x pairs
    r_vals = [[-1.5, -1.0, 0.7], [-2.0, -0.5, -0.6], [-1.5, -3.0, 0.2]][:n]
    rc_vals = [[-4.0, -6.0, -3.0], [-5.0, -2.0, -7.0], [-3.5, -9.0, -2.5]][:n]  # reference log-probs
    rr_vals = [[-3.0, -7.5, -5.0], [-6.0, -2.5, -4.0], [-2.0, -6.0, -3.0]][:n]
    lw = torch.tensor([[3, 5, 2], [2, 4, 6], [6, 1, 3]][:n])
    ll = torch.tensor([[4, 2, 1], [3, 3, 2], [2, 5, 4]][:n])
    leaves_c = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in c_vals]
    leaves_r = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in r_vals]
    ref_c = torch.tensor(rc_vals, dtype=torch.float64)
    ref_r = torch.tensor(rr_vals, dtype=torch.float64)
    backward_loss, joint = joint_dpo_loss(
        torch.stack(leaves_c), torch.stack(leaves_r), beta, loss_type, None, eps, lw, ll, 0.05, ref_c, ref_r
    )

    def col_sums(rows):
        return [sum(row[p] for row in rows) for p in range(P)]

    def hand(c, r):
        C, R, RC, RR = col_sums(c), col_sums(r), col_sums(rc_vals), col_sums(rr_vals)
        return BATCH_HAND[loss_type](C, R, RC, RR, [float(x) for x in lw.sum(0)], beta, eps)

    value = hand(c_vals, r_vals)
    assert joint.item() == pytest.approx(value, rel=1e-9, abs=1e-12)
    assert backward_loss.item() == pytest.approx(n * value, rel=1e-9, abs=1e-12)
    if loss_type != "sft":  # the sort matters on these numbers: the pairs' own (unsorted) alignment differs
        C, R, RC, RR = col_sums(c_vals), col_sums(r_vals), col_sums(rc_vals), col_sums(rr_vals)
        if loss_type == "aot":
            unsorted = [(c + rc) - (r + rr) - (rc - rr) for c, r, rc, rr in zip(C, R, RC, RR)]
        else:
            unsorted = [c - r for c, r in zip(C, R)]
        assert abs(_aot_loss(unsorted, beta, eps) - value) > 1e-3
    backward_loss.backward()
    h = 1e-6
    for i in range(n):
        for p in range(P):
            for vals, leaves in ((c_vals, leaves_c), (r_vals, leaves_r)):
                up = [list(row) for row in vals]
                dn = [list(row) for row in vals]
                up[i][p] += h
                dn[i][p] -= h
                args_up = (up, r_vals) if vals is c_vals else (c_vals, up)
                args_dn = (dn, r_vals) if vals is c_vals else (c_vals, dn)
                expected = (hand(*args_up) - hand(*args_dn)) / (2 * h)
                got = 0.0 if leaves[i].grad is None else leaves[i].grad[p].item()  # None: no path at all
                assert got == pytest.approx(expected, rel=1e-5, abs=1e-8)
    if loss_type == "sft":  # agent i's gradient: its own chosen log-probs over the joint chosen token count only
        for i in range(n):
            assert torch.allclose(leaves_c[i].grad, torch.full((P,), -1.0 / float(lw.sum()), dtype=torch.float64))
            assert leaves_r[i].grad is None


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("loss_type", sorted(HAND))
def test_joint_dpo_loss_and_per_agent_gradients_match_hand_computation(loss_type, n):
    from trl_marl.algorithms.losses import joint_dpo_loss

    beta, eps = 0.4, 0.1  # no pair at the hinge kink
    # agents x pairs (P = 2): log-ratios (a reference model's or none) and completion token counts
    c_vals = [[-1.0, -2.5], [-0.5, -1.5], [-2.0, -0.25]][:n]
    r_vals = [[-1.5, -1.0], [-2.0, -0.5], [-1.0, -3.0]][:n]
    lw = torch.tensor([[3, 5], [2, 4], [6, 1]][:n])
    ll = torch.tensor([[4, 2], [3, 3], [2, 5]][:n])
    leaves_c = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in c_vals]
    leaves_r = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in r_vals]
    backward_loss, joint = joint_dpo_loss(
        torch.stack(leaves_c), torch.stack(leaves_r), beta, loss_type, None, eps, lw, ll, 0.05
    )

    def hand(c, r):  # the joint loss by hand: sums over agents, mean over pairs
        per = []
        for p in range(2):
            C, R = sum(row[p] for row in c), sum(row[p] for row in r)
            Lw, Ll = float(lw[:, p].sum()), float(ll[:, p].sum())
            per.append(HAND[loss_type](C, R, Lw, Ll, beta, eps))
        return sum(per) / 2

    assert joint.item() == pytest.approx(hand(c_vals, r_vals), rel=1e-9, abs=1e-12)
    # every agent's term has the value of the joint loss
    assert backward_loss.item() == pytest.approx(n * hand(c_vals, r_vals), rel=1e-9, abs=1e-12)
    backward_loss.backward()
    h = 1e-6
    for i in range(n):
        for p in range(2):
            for vals, leaves in ((c_vals, leaves_c), (r_vals, leaves_r)):
                up = [list(row) for row in vals]
                dn = [list(row) for row in vals]
                up[i][p] += h
                dn[i][p] -= h
                other_c, other_r = (up, r_vals) if vals is c_vals else (c_vals, up)
                other_c2, other_r2 = (dn, r_vals) if vals is c_vals else (c_vals, dn)
                expected = (hand(other_c, other_r) - hand(other_c2, other_r2)) / (2 * h)
                # dL/d(agent i's value): the JOINT loss's derivative once, not n times (no flow via other agents)
                assert leaves[i].grad[p].item() == pytest.approx(expected, rel=1e-5, abs=1e-8)


def test_joint_dpo_loss_weighted_list_mixes_batch_and_pair_losses():
    """A list of loss types with `loss_weights` (TRL's way, e.g. DPO + an SFT term): the weighted sum of each type's
    joint loss."""
    from trl_marl.algorithms.losses import joint_dpo_loss

    c = torch.tensor([[-1.0, -2.5, 0.3], [-0.5, -1.5, 0.9]], dtype=torch.float64)
    r = torch.tensor([[-1.5, -1.0, 0.7], [-2.0, -0.5, -0.6]], dtype=torch.float64)
    rc = torch.tensor([[-4.0, -6.0, -3.0], [-5.0, -2.0, -7.0]], dtype=torch.float64)
    lw = torch.tensor([[3, 5, 2], [2, 4, 6]])
    _, mixed = joint_dpo_loss(c, r, 0.4, ["sigmoid", "sft"], [0.5, 2.0], 0.0, lw, lw, ref_chosen=rc, ref_rejected=rc)
    C, R, RC = c.sum(0).tolist(), r.sum(0).tolist(), rc.sum(0).tolist()
    sigmoid = sum(HAND["sigmoid"](x, y, 1, 1, 0.4, 0.0) for x, y in zip(C, R)) / 3
    sft = BATCH_HAND["sft"](C, R, RC, RC, lw.sum(0).tolist(), 0.4, 0.0)
    assert mixed.item() == pytest.approx(0.5 * sigmoid + 2.0 * sft, rel=1e-12)


def test_joint_dpo_loss_sigmoid_without_reference_is_madpo_loss():
    from trl_marl.algorithms.losses import joint_dpo_loss, madpo_loss

    c = torch.tensor([[-1.0, -2.0], [-3.0, -0.5]], requires_grad=True)
    r = torch.tensor([[-2.0, -1.0], [-1.0, -1.5]])
    b1, j1 = joint_dpo_loss(c, r, 0.1)
    b2, j2 = madpo_loss(c - r, 0.1)
    torch.testing.assert_close(j1, j2)
    torch.testing.assert_close(b1, b2)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        joint_dpo_loss(c, r, 0.1, "kto")
    with pytest.raises(ValueError, match="loss_weights"):
        joint_dpo_loss(c, r, 0.1, ["sigmoid", "hinge"], [1.0])


# ---------------------------------------------------------------- MADPO on TRL's DPO machinery
def test_trl_pieces_exist_in_the_installed_trl():
    """The TRL pieces the preference trainers reuse (one module, pinned to TRL 1.16) exist, and every MADPO
    loss_type is one of TRL's DPO loss type names."""
    from trl_marl.algorithms.losses import DPO_LOSS_TYPES
    from trl_marl.trainers.preference import trl_pieces

    for name in trl_pieces.__all__:
        assert getattr(trl_pieces, name) is not None
    help_text = trl_pieces.trl_dpo_loss_types()
    for name in DPO_LOSS_TYPES:
        assert f"'{name}'" in help_text, name
    assert trl_pieces.RewardConfig(output_dir="x", use_cpu=True, bf16=False).center_rewards_coefficient is None


def test_madpo_beta_default_and_loss_type(make_args):
    """TRL's default `beta`; a single `loss_type` becomes a list, as in TRL's DPOConfig (the `dpo_beta` alias is
    tested in tests/test_trl_names.py)."""
    assert make_args(MADPOConfig).beta == 0.1
    assert make_args(MADPOConfig, beta=0.3).beta == 0.3
    assert make_args(MADPOConfig, loss_type="hinge").loss_type == ["hinge"]


def _madpo(make_args, items, tiny_path, **kw):
    args = make_args(MADPOConfig, preference_num_candidates=3, train_batch_size=4, **kw.pop("cfg", {}))
    return MADPOTrainer(model=tiny_path, reward_funcs=length_reward, args=args, train_dataset=items, **kw)


@pytest.mark.parametrize("loss_type", ["hinge", "ipo", "bco_pair", "aot", "sft"])
def test_madpo_loss_type_gradient_is_the_joint_formulas(make_args, items, tiny_path, loss_type):
    """Through the trainer: the loss is TRL's formula on the joint response and each agent's gradient is the joint
    loss's derivative through its OWN log-probs only."""
    from trl_marl.algorithms.losses import dpo_pair_loss

    t = _madpo(make_args, items, tiny_path, cfg={"loss_type": loss_type, "beta": 0.5})
    pairs = t.collect_preference_pairs()[:4]
    team = t.team
    loss = t.compute_loss(team, {"pairs": pairs})
    loss.backward()
    got = [[p.grad.clone() for p in a.parameters()] for a in team.agents]
    team.zero_grad()
    c, r, lw, ll = t.preference_logps(team, pairs)
    joint = dpo_pair_loss(loss_type, c.sum(0), r.sum(0), 0.5, 0.0, lw.sum(0).float(), ll.sum(0).float()).mean()
    assert loss.item() == pytest.approx(joint.item(), rel=1e-5)
    joint.backward()  # with disjoint agents, the joint loss's gradient w.r.t. agent i is agent i's term's
    for i, agent in enumerate(team.agents):
        for g, p in zip(got[i], agent.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def _plain_logp(model, prompt, completion, temperature=1.0):
    """log p(completion | prompt) by one plain forward of `model` on the unpadded sequence (no trl_marl code)."""
    ids = torch.cat([prompt, completion])[None]
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, completion[:, None]).sum().item()


def test_madpo_forward_is_trls_collator_and_one_concatenated_forward_per_agent(make_args, items, tiny_path):
    """MADPO's per-agent batch is TRL's `DataCollatorForPreference` output, ONE forward per agent scores winners
    and losers together, and the sequence log-probs equal a plain per-sample forward (at the sampling temperature)."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    t = _madpo(make_args, items, tiny_path, cfg={"temperature": 0.7})
    pairs = t.collect_preference_pairs()[:4]
    batches = t._agent_pair_batches(pairs)
    for i, b in enumerate(batches):
        trl_out = DataCollatorForPreference(pad_token_id=t.tokenizers[i].pad_token_id)(
            [
                {"prompt_ids": p.prompt_ids[i].tolist(), "chosen_ids": p.winner_ids[i].tolist(),
                 "rejected_ids": p.loser_ids[i].tolist()}
                for p in pairs
            ]
        )  # fmt: skip
        for key in ("input_ids", "attention_mask", "completion_mask"):
            assert torch.equal(getattr(b, key), trl_out[key]), key
    calls = [0] * t.num_agents
    hooks = [
        a.model.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, a in enumerate(t.team.agents)
    ]
    with torch.no_grad():
        c, r, lw, ll = t.preference_logps(t.team, pairs)
    for h in hooks:
        h.remove()
    assert calls == [1] * t.num_agents  # chosen and rejected in ONE forward per agent
    assert "forward" not in vars(t.team.agents[0])  # the fused head was added for that call only
    with torch.no_grad():
        for j, p in enumerate(pairs):
            for i, agent in enumerate(t.team.agents):
                w = _plain_logp(agent, p.prompt_ids[i], p.winner_ids[i], 0.7)
                lo = _plain_logp(agent, p.prompt_ids[i], p.loser_ids[i], 0.7)
                assert c[i, j].item() == pytest.approx(w, abs=1e-4)
                assert r[i, j].item() == pytest.approx(lo, abs=1e-4)
                assert lw[i, j].item() == len(p.winner_ids[i]) and ll[i, j].item() == len(p.loser_ids[i])
    # the same numbers as the forward MADPO had before (our left-padded AgentBatch, still what TeamModel takes)
    from trl_marl.algorithms.logprobs import sequence_logprobs
    from trl_marl.data_types.batches import collate_agent_batch

    old = [
        collate_agent_batch([p.prompt_ids[i] for p in pairs] * 2,
                            [p.winner_ids[i] for p in pairs] + [p.loser_ids[i] for p in pairs],
                            t.tokenizers[i].pad_token_id)
        for i in range(t.num_agents)
    ]  # fmt: skip
    with torch.no_grad():
        old_logps = torch.stack(
            [sequence_logprobs(lp, b.completion_mask) for lp, b in zip(t.team(old)["logprobs"], old)]
        )
    torch.testing.assert_close(old_logps, torch.cat([c, r], dim=1), rtol=1e-5, atol=1e-4)
    # the gradient path: the margins through the trainer's wrapped team equal the no-grad ones
    t._metrics.clear("train")
    c2, r2, _, _ = t.preference_logps(t.model_wrapped, pairs)
    torch.testing.assert_close(c2.detach(), c, rtol=1e-5, atol=1e-5)
    entropy = [t._metrics["train"][f"agent_{i}/entropy"] for i in (1, 2)]
    assert c2.requires_grad and all(len(e) == 1 and e[0] > 0 for e in entropy)


def test_madpo_reference_model_is_scored_at_the_policy_temperature(make_args, items, tiny_path):
    """A reference equal to the initial agents gives log-ratios of 0 at the start also when temperature != 1
    (the reference used to be scored at temperature 1 and the policy at the sampling temperature)."""
    t = _madpo(make_args, items, tiny_path, ref_model=tiny_path, cfg={"temperature": 0.7})
    pairs = t.collect_preference_pairs()[:3]
    with torch.no_grad():
        c, r, _, _ = t.preference_logps(t.team, pairs)
        ref_c, ref_r = t.reference_logps(pairs, c.device)
    torch.testing.assert_close(ref_c, c, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref_r, r, rtol=1e-5, atol=1e-5)


def test_madpo_reference_model_margins_equal_the_direct_computation(make_args, items, tiny_path):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(tiny_path)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a reference that differs from the agents
    t = _madpo(make_args, items, tiny_path, ref_model=ref)
    pairs = t.collect_preference_pairs()[:3]
    with torch.no_grad():
        c, r, _, _ = t.preference_logps(t.team, pairs)
        ref_c, ref_r = t.reference_logps(pairs, c.device)

    def direct(model, prompt, completion):
        ids = torch.cat([prompt, completion])[None]
        pos = torch.arange(ids.shape[1])[None]
        logits = model(ids, position_ids=pos).logits[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(1, completion[:, None]).sum().item()

    with torch.no_grad():
        for j, p in enumerate(pairs[:2]):
            for i in range(2):
                agent = t.team.agents[i]
                m_direct = (
                    direct(agent, p.prompt_ids[i], p.winner_ids[i]) - direct(ref, p.prompt_ids[i], p.winner_ids[i])
                ) - (direct(agent, p.prompt_ids[i], p.loser_ids[i]) - direct(ref, p.prompt_ids[i], p.loser_ids[i]))
                got = (c[i, j] - ref_c[i, j]) - (r[i, j] - ref_r[i, j])
                assert got.item() == pytest.approx(m_direct, abs=1e-4)
    # at the start the agents differ from the reference, so the log-ratios are not zero
    assert (c - ref_c).abs().max() > 1e-3
    # the DPO metrics are logged for the joint response
    t.compute_loss(t.team, {"pairs": pairs})
    m = t._metrics["train"]
    for key in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen"):
        assert key in m
    beta = t.args.beta
    assert m["rewards/chosen"][-1] == pytest.approx(beta * (c - ref_c).sum(0).mean().item(), rel=1e-4)
    assert m["rewards/margins"][-1] == pytest.approx(beta * ((c - ref_c) - (r - ref_r)).sum(0).mean().item(), rel=1e-4)


def test_madpo_precomputed_reference_is_the_initial_policy(make_args, items, tiny_path):
    t = _madpo(
        make_args, items, tiny_path, cfg={"precompute_ref_log_probs": True, "max_steps": 2, "learning_rate": 1e-2}
    )
    pairs = t.collect_preference_pairs()
    t.pairs = pairs
    with torch.no_grad():
        c0, r0, _, _ = t.preference_logps(t.team, pairs)
    t.train()
    ref_c = torch.tensor([p.ref_chosen_logps for p in pairs]).T
    torch.testing.assert_close(ref_c, c0, rtol=1e-4, atol=1e-4)  # computed once, before any update
    log = next(h for h in t.state.log_history if "rewards/chosen" in h)
    assert log["rewards/chosen"] == pytest.approx(0.0, abs=1e-4)  # first step: policy == reference


# ---------------------------------------------------------------- the joint reward model through TRL
def _synthetic_pairs(count=8):
    return [
        PreferencePair([f"topic {i}", "x"], [f"good answer {i}", "yes good"], [f"bad answer {i}", "no"], 1.0, 0.0, 0.5)
        for i in range(count)
    ]


def test_reward_model_fit_is_trls_reward_trainer_on_the_exported_dataset(tiny_path, tmp_path):
    """`JointRewardModel.fit` gives the same weights as TRL's RewardTrainer run by hand on `to_dataset(pairs)` (the
    text form TRL tokenizes itself): the fit IS TRL's, and fit and scoring read the tokens TRL reads."""
    from trl import RewardConfig, RewardTrainer

    pairs = _synthetic_pairs()
    ours = JointRewardModel.from_pretrained(tiny_path, seed=3)
    before = torch.get_rng_state()
    result = ours.fit(pairs, learning_rate=1e-3, num_epochs=2, batch_size=4, seed=5, output_dir=str(tmp_path / "a"))
    assert torch.equal(torch.get_rng_state(), before)  # the outer run's random stream did not move
    assert set(result) >= {"accuracy", "margin", "loss", "train_loss", "losses"} and len(result["losses"]) == 4

    theirs = JointRewardModel.from_pretrained(tiny_path, seed=3)
    cfg = RewardConfig(
        output_dir=str(tmp_path / "b"),
        learning_rate=1e-3,
        num_train_epochs=2,
        per_device_train_batch_size=4,
        lr_scheduler_type="constant",
        seed=5,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        max_length=None,
    )
    RewardTrainer(
        model=theirs.model, args=cfg, train_dataset=to_dataset(pairs), processing_class=theirs.tokenizer
    ).train()
    for (name, a), b in zip(ours.model.named_parameters(), theirs.model.parameters()):
        torch.testing.assert_close(a, b, msg=name, rtol=1e-5, atol=1e-6)
    # TRL's accuracy is the share of pairs whose winner scores higher, in eval mode
    w = ours.score([p.prompts for p in pairs], [p.winner_completions for p in pairs])
    lo = ours.score([p.prompts for p in pairs], [p.loser_completions for p in pairs])
    assert result["accuracy"] == pytest.approx(sum(x > y for x, y in zip(w, lo)) / len(w))
    assert result["margin"] == pytest.approx(sum(x - y for x, y in zip(w, lo)) / len(w), rel=1e-4)


def test_reward_model_path_must_be_a_sequence_classification_model(make_args, tiny_path, tmp_path):
    from trl_marl import MARLHFConfig, MARLHFIterConfig, MARLHFTrainer

    with pytest.raises(ValueError, match="must be a sequence-classification model with num_labels=1"):
        MARLHFTrainer(
            model=tiny_path,
            reward_funcs=length_reward,
            args=make_args(MARLHFConfig, reward_model_path=tiny_path),
            train_dataset=[{"prompt": "a"}],
        )
    with pytest.raises(ValueError, match="iterative trainers fit a NEW reward model"):
        make_args(MARLHFIterConfig, reward_model_path=tiny_path)


# ---------------------------------------------------------------- train elsewhere, come back
def test_train_elsewhere_round_trip_with_trl_trainers(make_args, items, tiny_path, tmp_path):
    """Collect pairs with MADPOTrainer, export them, train a reward model with TRL's RewardTrainer, save it, train
    MARLHF on it (`reward_model_path`); and run TRL's DPOTrainer on one agent's exported columns."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer

    from trl_marl import MARLHFConfig, MARLHFTrainer

    collector = MADPOTrainer(
        model=tiny_path,
        reward_funcs=length_reward,
        args=make_args(MADPOConfig, preference_num_candidates=3),
        train_dataset=items,
    )
    pairs = collector.collect_preference_pairs()
    joint, agent0 = to_dataset(pairs), to_dataset(pairs, agent=0)
    common = dict(report_to="none", save_strategy="no", use_cpu=True, bf16=False, max_steps=3, logging_steps=1)

    tok = AutoTokenizer.from_pretrained(tiny_path)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_path, num_labels=1)
    rm.config.pad_token_id = tok.pad_token_id
    reward_trainer = RewardTrainer(
        model=rm,
        args=RewardConfig(output_dir=str(tmp_path / "rm"), per_device_train_batch_size=4, **common),
        train_dataset=joint,
        processing_class=tok,
    )
    reward_trainer.train()
    reward_trainer.save_model(str(tmp_path / "rm"))

    task_calls = []

    def task_reward(c1, c2):
        task_calls.append(len(c1))
        return length_reward(c1, c2)

    args = make_args(MARLHFConfig, reward_model_path=str(tmp_path / "rm"), max_steps=1)
    t = MARLHFTrainer(model=tiny_path, reward_funcs=task_reward, args=args, train_dataset=items)
    t.train()
    assert t.state.global_step == 1 and not task_calls  # no collection, no fit: the RL rewards are the model's
    with torch.no_grad():
        text = joint[0]["prompt"] + joint[0]["chosen"]
        direct = rm.eval()(**tok(text + tok.eos_token, return_tensors="pt")).logits.item()
    assert t.reward_model.score([pairs[0].prompts], [pairs[0].winner_completions])[0] == pytest.approx(
        direct, abs=1e-4
    )

    dpo = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_path),
        ref_model=AutoModelForCausalLM.from_pretrained(tiny_path),
        args=DPOConfig(output_dir=str(tmp_path / "dpo"), per_device_train_batch_size=4, **common),
        train_dataset=agent0,
        processing_class=tok,
    )
    dpo.train()
    assert dpo.state.global_step == 3 and "rewards/margins" in dpo.state.log_history[0]


def _run_script(script: str, *args: str, config: str | None = None):
    """tests/scripts/SCRIPT under `accelerate launch --config_file accelerate_configs/CONFIG.yaml`, or in ONE plain
    process (no launcher) when `config` is None."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conftest import launch_failure

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable]
    if config is None:
        for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
    else:
        cmd += [
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(root / "accelerate_configs" / f"{config}.yaml"),
        ]
    cmd += [str(root / "tests" / "scripts" / script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=root)
    assert proc.returncode == 0, launch_failure(proc)


@pytest.fixture(scope="module")
def one_process_reward_fit(tmp_path_factory):
    """The baseline: ONE process fitting the same 16 pairs with batches of 8 (the global batch of 2 processes x 4)."""
    out = tmp_path_factory.mktemp("one_process_fit")
    _run_script("dist_reward_model.py", str(out), "16", "1", "8")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("config", ["multi_cpu", "zero2_cpu", "zero3_cpu", "fsdp2_cpu"])
def test_reward_model_fit_is_sharded_over_processes(tmp_path, tiny_path, config, one_process_reward_fit):
    """2 processes (DDP / ZeRO-2 / ZeRO-3 / FSDP2): the RewardTrainer stage shards the pairs (each process takes half of
    every batch: half the steps of a 1-process fit with the same per-process batch), the fitted weights are equal on
    both ranks and equal a 1-process fit on the same global batches; under ZeRO-3 and FSDP2 the PARAMETERS are sharded
    too: each rank holds only its half of the reward model between the fit's steps and while it scores (RL)."""
    import json

    _run_script("dist_reward_model.py", str(tmp_path), "16", "1", "4", config=config)
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(i["num_processes"] == 2 for i in infos)
    # 16 pairs, 4 per process per step, 2 processes: 2 steps (a single process takes 4)
    assert [i["steps"] for i in infos] == [2, 2]
    assert infos[0]["metrics"] == infos[1]["metrics"]
    w0, w1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert w0.keys() == w1.keys()
    for k in w0:
        torch.testing.assert_close(w0[k], w1[k], msg=k)
    one = torch.load(one_process_reward_fit / "rank0.pt")
    assert one.keys() == w0.keys()
    for k in w0:  # the same global batches, gradients averaged over the processes: the same update
        torch.testing.assert_close(w0[k], one[k], atol=2e-5, rtol=0, msg=k)
    for info in infos:
        fit, scoring = info["held_during_fit"], info["held_while_scoring"]
        assert len(fit) == 2
        full = scoring["full"]
        if config == "zero3_cpu":
            # each rank's partition is half the model (plus alignment padding); between forwards a rank holds
            # only the parameters under TRL's persistence threshold (10 x hidden: the norms and the score head)
            for held in [*fit, scoring]:
                assert held["full"] == full and held["shard"] <= full // 2 + 64, held
                assert held["held"] < full // 100, held
        elif config == "fsdp2_cpu":  # per-layer FSDP2 units: each rank keeps its (padded) half
            for held in [*fit, scoring]:
                assert held["full"] == full and held["held"] == held["shard"] <= full // 2 + 64, held
        else:  # data parallel: a full copy on every rank
            assert all(held["shard"] == held["held"] == full for held in [*fit, scoring])
    rm = JointRewardModel.from_pretrained(tiny_path, seed=0)
    fresh = rm.model.state_dict()
    assert any(not torch.allclose(fresh[k], w0[k]) for k in w0)  # it was trained
    rm.model.load_state_dict(w0)
    pairs = _synthetic_pairs(16)
    w = rm.score([p.prompts for p in pairs], [p.winner_completions for p in pairs])
    lo = rm.score([p.prompts for p in pairs], [p.loser_completions for p in pairs])
    margin = sum(a - b for a, b in zip(w, lo)) / len(w)
    assert margin == pytest.approx(infos[0]["metrics"]["reward_model/margin"], rel=1e-4, abs=1e-5)
