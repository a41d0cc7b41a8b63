"""The actor-critic math against hand-computed numbers: transitions of a rollout, TD targets, grouped advantages,
GAE over linked steps, value clipping, the PPO surrogate and PopArt."""

import math

import pytest
import torch

from trl_marl.algorithms import (
    RunningMeanStd,
    gae,
    linked_gae,
    normalize_in_groups,
    popart_rescale,
    ppo_clip_loss,
    td_targets,
    value_loss,
)
from trl_marl.data_types.critic import build_transitions
from trl_marl.data_types.rollout import Node, Rollout, Sample
from trl_marl.trainers.actor_critic import joint_critic_text


def _sample(agent, node, penalty=0.0):
    return Sample(agent, node, 0, "p", "c", torch.tensor([5]), torch.tensor([6, 1]), penalty=penalty)


@pytest.fixture
def rollout():
    """Item 0 runs two turns (node 0 -> node 2); item 1 ended early after its first turn (node 1).

    Per-agent processed rewards; agent 1's sample at node 0 carries a reference-KL penalty of 0.2.
    """
    samples = [_sample(0, 0, 0.2), _sample(1, 0), _sample(0, 1), _sample(1, 1), _sample(0, 2), _sample(1, 2)]

    def node(nid, item, turn, parent, sids, rewards, children=None, terminated=False):
        return Node(
            nid,
            item,
            turn,
            parent,
            ["p1", "p2"],
            [[], []],
            [[], []],
            samples=[[sids[0]], [sids[1]]],
            joint=[(0, 0)],
            rewards=torch.tensor(rewards),
            raw_rewards=torch.tensor(rewards),
            children=children or {},
            terminated=terminated,
        )

    nodes = [
        node(0, 0, 0, None, (0, 1), [[1.0, 3.0]], children={0: 2}),
        node(1, 1, 0, None, (2, 3), [[0.5, 0.5]], terminated=True),
        node(2, 0, 1, (0, 0), (4, 5), [[2.0, 0.0]]),
    ]
    return Rollout([{}, {}], nodes, samples, num_agents=2, num_generations=1, joint_mode="aligned")


def test_transitions_rewards_penalties_and_successors(rollout):
    team = build_transitions(rollout)
    # team reward = mean over agents of (r_i - penalty_i): (1 - 0.2 + 3) / 2
    torch.testing.assert_close(team.rewards, torch.tensor([1.9, 0.5, 1.0]))
    assert team.next_index.tolist() == [2, -1, -1]  # item 1 ended early: no bootstrap
    assert team.turn == [0, 0, 1] and team.item == [0, 1, 0]
    torch.testing.assert_close(build_transitions(rollout, agent=0).rewards, torch.tensor([0.8, 0.5, 2.0]))
    torch.testing.assert_close(build_transitions(rollout, agent=1).rewards, torch.tensor([3.0, 0.5, 0.0]))


def test_td_targets_and_errors_on_the_rollout(rollout):
    team = build_transitions(rollout)
    values = torch.tensor([0.4, 0.3, 1.5])
    targets = td_targets(team.rewards, values[team.next_index.clamp(min=0)], team.has_next, discount=0.9)
    # 1.9 + 0.9 * V(h_1 of item 0) ; early end and last turn: the reward alone
    torch.testing.assert_close(targets, torch.tensor([1.9 + 0.9 * 1.5, 0.5, 1.0]))
    torch.testing.assert_close(targets - values, torch.tensor([2.85, 0.2, -0.5]))


def test_advantages_normalized_inside_each_turn_group():
    deltas = torch.tensor([2.85, 0.2, -0.5])
    turns = torch.tensor([0, 0, 1])
    # turn 0: z-score of (2.85, 0.2) = (+1, -1); a group of one sample gets zero
    torch.testing.assert_close(normalize_in_groups(deltas, turns), torch.tensor([1.0, -1.0, 0.0]))


def test_linked_gae_hand_computed(rollout):
    team = build_transitions(rollout)
    values = torch.tensor([0.4, 0.3, 1.5])
    adv, targets = linked_gae(team.rewards, values, team.next_index, discount=0.9, lam=0.5)
    # A_2 = 1.0 - 1.5 ; A_0 = (1.9 + 0.9 * 1.5 - 0.4) + 0.9 * 0.5 * A_2 ; A_1 = 0.5 - 0.3
    a2 = -0.5
    torch.testing.assert_close(adv, torch.tensor([2.85 + 0.45 * a2, 0.2, a2]))
    torch.testing.assert_close(targets, adv + values)


def test_linked_gae_lambda_zero_is_td_and_matches_gae_on_a_chain():
    rewards, values = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.5, 0.2, 0.7])
    nxt = torch.tensor([1, 2, -1])
    adv0, tgt0 = linked_gae(rewards, values, nxt, discount=0.8, lam=0.0)
    torch.testing.assert_close(tgt0, td_targets(rewards, values[nxt.clamp(min=0)], nxt >= 0, 0.8))
    adv, tgt = linked_gae(rewards, values, nxt, discount=0.8, lam=0.7)
    ref_adv, ref_tgt = gae(rewards, values, torch.tensor([0.2, 0.7, 0.0]), torch.tensor([1, 1, 0]), 0.8, 0.7)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(tgt, ref_tgt)
    with pytest.raises(ValueError, match="next_index must point to a later step"):
        linked_gae(rewards, values, torch.tensor([-1, 0, -1]))


def test_value_loss_clipping_per_row():
    values, old, targets = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.5]), torch.tensor([1.0, 0.2])
    # row 0: max(0, (0 + 0.2 - 1)^2 = 0.64); row 1: max(0.04, (0.5 - 0.2 - 0.2)^2 = 0.01)
    assert value_loss(values, targets, old, clip_range=0.2).item() == pytest.approx((0.64 + 0.04) / 2)
    assert value_loss(values, targets).item() == pytest.approx((0.0 + 0.04) / 2)


def test_ppo_clip_token_level_negative_advantage():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    loss, clipfrac = ppo_clip_loss(logp, torch.zeros(1, 3), torch.tensor([-1.0]), 0.2, mask=torch.tensor([[1, 1, 0]]))
    # rho=1.5: min(-1.5, -1.2) = -1.5 ; rho=0.5: min(-0.5, -0.8) = -0.8 ; third token masked
    assert loss.item() == pytest.approx((1.5 + 0.8) / 2)
    assert clipfrac.item() == pytest.approx(1.0)


def test_ppo_clip_sequence_level_ratio_inside_the_range_is_plain_pg():
    seq, old = torch.tensor([math.log(1.1), math.log(0.9)]), torch.zeros(2)
    loss, clipfrac = ppo_clip_loss(seq, old, torch.tensor([2.0, 1.0]), 0.2)
    assert loss.item() == pytest.approx(-(1.1 * 2.0 + 0.9 * 1.0) / 2)
    assert clipfrac.item() == 0.0


def test_popart_rescale_preserves_outputs():
    w, b, x = torch.tensor([[1.0, 2.0]]), torch.tensor([0.5]), torch.tensor([1.0, -1.0])
    # y = 1 - 2 + 0.5 = -0.5 ; V = 2 * y + 1 = 0
    w2, b2 = popart_rescale(w, b, old_mean=1.0, old_std=2.0, new_mean=3.0, new_std=4.0)
    torch.testing.assert_close(w2, torch.tensor([[0.5, 1.0]]))
    torch.testing.assert_close(b2, torch.tensor([-0.25]))  # (2 * 0.5 + 1 - 3) / 4
    assert (4.0 * (w2 @ x + b2) + 3.0).item() == pytest.approx((2.0 * (w @ x + b) + 1.0).item())
    with pytest.raises(ValueError, match="standard deviations must be > 0"):
        popart_rescale(w, b, 0.0, 0.0, 0.0, 1.0)


def test_running_mean_std_scale():
    rms = RunningMeanStd(eps=0.0)
    rms.update(torch.tensor([1.0, 3.0]))
    assert rms.std == pytest.approx(1.0)
    torch.testing.assert_close(rms.normalize(torch.tensor([3.0])), torch.tensor([1.0]))


def test_joint_critic_text():
    assert joint_critic_text(["a", "b"]) == "[Agent 1] a\n[Agent 2] b"
    assert (
        joint_critic_text(["a", "b"], ["x", "y"])
        == "[Agent 1] a\n[Agent 2] b\n[Joint Action]\n[Agent 1] x\n[Agent 2] y"
    )
