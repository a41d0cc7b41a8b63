"""Every function of trl_marl.algorithms against hand-computed numbers."""

import math

import pytest
import torch

from trl_marl.algorithms import (
    RunningMeanStd,
    baseline_advantages,
    bradley_terry_loss,
    completion_mask,
    cross_sample_returns,
    gae,
    group_advantages,
    k3_kl,
    madpo_loss,
    normalize_in_groups,
    policy_gradient_loss,
    ppo_clip_loss,
    sequence_logprobs,
    td_targets,
    tree_returns,
    value_loss,
)

R = torch.tensor([1.0, 2.0, 3.0, 6.0])


@pytest.mark.parametrize(
    "baseline, expected",
    [
        ("mean", [-2.0, -1.0, 0.0, 3.0]),
        ("raw", [1.0, 2.0, 3.0, 6.0]),
        ("loo", [-8 / 3, -4 / 3, 0.0, 4.0]),  # (4 R - 12) / 3
        ("max", [-5.0, -4.0, -3.0, 0.0]),
    ],
)
def test_group_baselines(baseline, expected):
    torch.testing.assert_close(group_advantages(R, baseline), torch.tensor(expected))


@pytest.mark.parametrize("baseline", ["mean", "raw", "loo", "max"])
def test_normalization_makes_every_baseline_identical(baseline):
    std = math.sqrt((4 + 1 + 0 + 9) / 4)  # population std of R - mean(R)
    expected = torch.tensor([-2.0, -1.0, 0.0, 3.0]) / std
    torch.testing.assert_close(group_advantages(R, baseline, normalize=True), expected)


def test_all_equal_group_gets_zero_advantage_not_noise():
    flat = torch.tensor([[0.7, 0.7, 0.7], [1.0, 1.0 + 1e-9, 1.0]])
    for baseline in ("mean", "loo", "max"):
        out = group_advantages(flat, baseline, normalize=True)
        assert torch.equal(out, torch.zeros_like(out)), baseline


def test_group_advantages_rejects_unknown_baseline_and_small_loo():
    with pytest.raises(ValueError, match="baseline must be one of"):
        group_advantages(R, "median")
    with pytest.raises(ValueError, match="at least 2 samples"):
        group_advantages(torch.tensor([1.0]), "loo")


def test_cross_sample_returns_is_mean_over_joint_actions_containing_the_sample():
    joint = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # joint[k1, k2]
    torch.testing.assert_close(cross_sample_returns(joint, agent=0), torch.tensor([1.5, 3.5]))
    torch.testing.assert_close(cross_sample_returns(joint, agent=1), torch.tensor([2.0, 3.0]))


def test_tree_returns_discounted_mean_of_child():
    out = tree_returns(torch.tensor([1.0, 0.0]), [torch.tensor([2.0, 4.0]), None], discount=0.5)
    torch.testing.assert_close(out, torch.tensor([2.5, 0.0]))  # 1 + 0.5 * mean(2, 4); leaf keeps its reward
    per_agent = tree_returns(torch.tensor([[1.0, 2.0]]), [torch.tensor([[2.0, 0.0], [4.0, 2.0]])], discount=1.0)
    torch.testing.assert_close(per_agent, torch.tensor([[4.0, 3.0]]))


def test_td_targets_bootstrap_only_where_a_next_turn_exists():
    out = td_targets(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 20.0, 30.0]), torch.tensor([1, 1, 0]), 0.9)
    torch.testing.assert_close(out, torch.tensor([10.0, 20.0, 3.0]))


def test_gae_hand_computed():
    adv, targets = gae(
        torch.tensor([1.0, 0.0, 2.0]),
        torch.tensor([0.5, 0.5, 0.5]),
        torch.tensor([0.5, 0.5, 0.0]),
        torch.tensor([1, 1, 0]),
        discount=0.9,
        lam=0.8,
    )
    # deltas: 0.95, -0.05, 1.5; A2 = 1.5, A1 = -0.05 + 0.72 * 1.5, A0 = 0.95 + 0.72 * A1
    a1 = -0.05 + 0.72 * 1.5
    torch.testing.assert_close(adv, torch.tensor([0.95 + 0.72 * a1, a1, 1.5]))
    torch.testing.assert_close(targets, adv + 0.5)


def test_gae_lambda_zero_is_td_error():
    adv, _ = gae(
        torch.tensor([1.0, 2.0]),
        torch.tensor([0.3, 0.4]),
        torch.tensor([0.4, 9.0]),
        torch.tensor([1, 0]),
        discount=1.0,
        lam=0.0,
    )
    torch.testing.assert_close(adv, torch.tensor([1.0 + 0.4 - 0.3, 2.0 - 0.4]))


def test_normalize_in_groups():
    out = normalize_in_groups(torch.tensor([1.0, 3.0, 10.0, 10.0, 5.0]), torch.tensor([0, 0, 1, 1, 2]))
    torch.testing.assert_close(out, torch.tensor([-1.0, 1.0, 0.0, 0.0, 0.0]))


def test_normalize_in_groups_over_processes_equals_the_whole_batch():
    """Two "processes" (threads meeting in a simulated all-reduce) holding uneven halves of a batch, one of them
    missing a group, normalize with the summed moments exactly as one process normalizing the whole batch; each
    normalizing alone does not."""
    import threading

    values = torch.tensor([1.0, 3.0, 10.0, 2.0, 7.0, 4.0, 4.0, 8.0, -1.0])
    groups = torch.tensor([0, 0, 1, 2, 0, 1, 1, 0, 2])
    parts = [(values[:3], groups[:3]), (values[3:], groups[3:])]  # process 0 has no group 2
    slots, barrier = [None, None], threading.Barrier(2)

    def all_reduce_sum(rank):
        def reduce(t):
            slots[rank] = t
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total

        return reduce

    out = [None, None]

    def process(rank):
        out[rank] = normalize_in_groups(*parts[rank], all_reduce_sum(rank))

    threads = [threading.Thread(target=process, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    whole = normalize_in_groups(values, groups)
    torch.testing.assert_close(torch.cat(out), whole)
    alone = torch.cat([normalize_in_groups(v, g) for v, g in parts])
    assert not torch.allclose(alone, whole)


def test_policy_gradient_loss_value_and_gradient():
    logp = torch.tensor([-2.0, -3.0], requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    loss = policy_gradient_loss(logp, adv)
    assert loss.item() == pytest.approx(-0.5)  # -mean(-2 * 1, -3 * -1)
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv / 2)


def test_ppo_clip_loss():
    logp = torch.log(torch.tensor([1.5, 1.5]))
    old = torch.zeros(2)
    loss, clipfrac = ppo_clip_loss(logp, old, torch.tensor([1.0, -1.0]), clip_range=0.2)
    # A=+1: min(1.5, 1.2) = 1.2 -> -1.2 ; A=-1: min(-1.5, -1.2) = -1.5 -> +1.5
    assert loss.item() == pytest.approx((-1.2 + 1.5) / 2)
    assert clipfrac.item() == pytest.approx(1.0)
    # token level with a mask: masked tokens do not count
    tok = torch.log(torch.tensor([[1.0, 5.0]]))
    loss_t, _ = ppo_clip_loss(tok, torch.zeros(1, 2), torch.tensor([2.0]), 0.2, mask=torch.tensor([[1, 0]]))
    assert loss_t.item() == pytest.approx(-2.0)


def test_value_loss_clipped_and_unclipped():
    assert value_loss(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx((1 + 4) / 2)
    # clipped term larger: V=1, V_old=0, target=1 -> V_clip = 0.2 -> (0.2 - 1)^2 = 0.64 > 0
    clipped = value_loss(torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([0.0]), clip_range=0.2)
    assert clipped.item() == pytest.approx(0.64)
    # unclipped term larger
    both = value_loss(torch.tensor([0.0]), torch.tensor([0.2]), torch.tensor([0.5]), clip_range=0.2)
    assert both.item() == pytest.approx(0.04)
    with pytest.raises(ValueError, match="old_values"):
        value_loss(torch.tensor([0.0]), torch.tensor([0.0]), clip_range=0.2)


def test_bradley_terry_loss():
    assert bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0])).item() == pytest.approx(
        math.log(1 + math.exp(-2))
    )
    with_margin = bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([1.0]))
    assert with_margin.item() == pytest.approx(math.log(1 + math.exp(-1)))


def test_madpo_loss_value_and_per_agent_gradient():
    beta = 0.1
    margins = torch.tensor([[1.0, -0.5], [2.0, 0.25]], requires_grad=True)  # agents x pairs
    backward_loss, joint = madpo_loss(margins, beta)
    delta = torch.tensor([3.0, -0.25])
    assert joint.item() == pytest.approx(float(-torch.nn.functional.logsigmoid(beta * delta).mean()))
    backward_loss.backward()
    # d L / d m_i = - beta * sigmoid(-beta * Delta) / P, identical for each agent (through its own margin only)
    expected = -beta * torch.sigmoid(-beta * delta) / 2
    torch.testing.assert_close(margins.grad, torch.stack([expected, expected]))


def test_madpo_other_agents_margins_are_detached():
    m0 = torch.tensor([1.0], requires_grad=True)
    m1 = torch.tensor([2.0], requires_grad=True)
    # the term of agent 0 alone must not reach agent 1
    margins = torch.stack([m0, m1.detach()])
    loss, _ = madpo_loss(margins, 0.1)
    loss.backward()
    assert m1.grad is None
    assert m0.grad.item() == pytest.approx(-0.1 * torch.sigmoid(torch.tensor(-0.3)).item())


def test_k3_kl():
    logp = torch.tensor([[0.0, 0.0]])
    ref = torch.tensor([[math.log(0.5), 0.0]])
    assert k3_kl(logp, ref).item() == pytest.approx(0.5 - 1 + math.log(2))
    assert k3_kl(logp, ref, torch.tensor([[0, 1]])).item() == pytest.approx(0.0)
    assert (k3_kl(torch.randn(4, 3), torch.randn(4, 3)) >= 0).all()


def test_completion_mask_scores_through_first_eos_only():
    ids = torch.tensor([[5, 1, 0, 0], [5, 6, 7, 8], [1, 1, 1, 1], [4, 2, 1, 3]])
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    assert torch.equal(completion_mask(ids, 1), expected)
    # several EOS ids (e.g. <|im_end|> and <|endoftext|>)
    assert torch.equal(completion_mask(torch.tensor([[5, 2, 1]]), [1, 2]), torch.tensor([[1, 1, 0]]))


def test_sequence_logprobs_masks():
    logp = torch.tensor([[-1.0, -2.0, -4.0]])
    assert sequence_logprobs(logp, torch.tensor([[1, 1, 0]])).item() == pytest.approx(-3.0)


def test_running_mean_std():
    rms = RunningMeanStd()
    rms.update(torch.tensor([1.0, 2.0, 3.0]))
    rms.update(torch.tensor([4.0, 5.0]))
    assert rms.mean == pytest.approx(3.0)
    assert rms.var == pytest.approx(2.0)  # population variance of 1..5
    x = torch.tensor([3.0, 5.0])
    torch.testing.assert_close(rms.denormalize(rms.normalize(x)), x)
    other = RunningMeanStd()
    other.load_state_dict(rms.state_dict())
    assert other.mean == rms.mean and other.count == 5


def test_baseline_advantages_against_an_external_value():
    torch.testing.assert_close(baseline_advantages(R, 2.5), torch.tensor([-1.5, -0.5, 0.5, 3.5]))
    std = math.sqrt((4 + 1 + 0 + 9) / 4)
    torch.testing.assert_close(baseline_advantages(R, 2.5, normalize=True), torch.tensor([-2.0, -1.0, 0.0, 3.0]) / std)
