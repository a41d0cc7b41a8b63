"""The preference half on TRL's machinery: TRL's preference format, TRL's DPO loss family on the joint margin,
reference models, the joint reward model fitted by TRL's RewardTrainer, and round trips with TRL's trainers."""

import math

import pytest
import torch
from transformers import AutoTokenizer

from trl_marl import MADPOConfig, MADPOTrainer
from trl_marl.trainers.preference import PreferencePair
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
    t = MADPOTrainer(agent_model=tiny_path, reward_func=length_reward, args=args, train_dataset=items)
    pairs = t.collect_preference_pairs()
    back = PreferencePair.from_dataset(to_dataset(pairs), trainer=t)
    assert len(back) == len(pairs)
    for a, b in zip(pairs, back):
        assert _texts(a) == _texts(b)
        for i in range(2):
            assert torch.equal(a.prompt_ids[i], b.prompt_ids[i])
    # chat-template formatters: collected pairs keep the messages and export conversationally
    chat = MADPOTrainer(
        agent_model=tiny_path,
        reward_func=length_reward,
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


def test_hand_formulas_cover_every_supported_trl_loss_type():
    from trl_marl.algorithms.losses import DPO_LOSS_TYPES

    assert set(HAND) == set(DPO_LOSS_TYPES)


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


def test_joint_dpo_loss_sigmoid_without_reference_is_madpo_loss():
    from trl_marl.algorithms.losses import joint_dpo_loss, madpo_loss

    c = torch.tensor([[-1.0, -2.0], [-3.0, -0.5]], requires_grad=True)
    r = torch.tensor([[-2.0, -1.0], [-1.0, -1.5]])
    b1, j1 = joint_dpo_loss(c, r, 0.1)
    b2, j2 = madpo_loss(c - r, 0.1)
    torch.testing.assert_close(j1, j2)
    torch.testing.assert_close(b1, b2)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        joint_dpo_loss(c, r, 0.1, "aot")
    with pytest.raises(ValueError, match="loss_weights"):
        joint_dpo_loss(c, r, 0.1, ["sigmoid", "hinge"], [1.0])
