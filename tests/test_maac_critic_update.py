"""MAAC's shared critic is updated sequentially with each agent's batch; actors and critics are clipped by their own
norms (issue 13)."""

import copy

import torch

from trl_marl import MAACConfig, MAACTrainer, MAGRPOTrainer


def shared_reward(c1, c2):
    return [float(len(a) - len(b)) / 10 for a, b in zip(c1, c2)]


def test_maac_critic_takes_one_sgd_step_per_agent_on_the_updated_critic(make_args, items, tiny_path):
    lr, coef = 0.05, 0.5
    args = make_args(
        MAACConfig,
        optim="sgd",
        learning_rate=lr,
        critic_learning_rate=lr,
        value_loss_coef=coef,
        max_grad_norm=1e9,
        lr_scheduler_type="constant",
        advantage_normalization=False,
    )
    t = MAACTrainer(
        model=tiny_path, critic_model=tiny_path, reward_funcs=shared_reward, args=args, train_dataset=items
    )
    critic0 = copy.deepcopy(t.team.critics[0])
    seen = []
    original = t._rollout_step

    def spy(batch):
        seen.append(original(batch))
        return seen[-1]

    t._rollout_step = spy
    t.train()
    inputs = seen[0][0]
    data = inputs["critic"]
    rows = [s for s, it in enumerate(data.items) if it in set(inputs["items"])]
    batch, _ = t.rl_step.critic_batches(data.critic_inputs, rows)
    targets = data.targets[0][torch.tensor(rows)]

    # the spec by hand: agent 1's batch, an SGD step; agent 2's batch on the UPDATED critic, another step
    expected = copy.deepcopy(critic0)
    for _ in range(2):
        expected.zero_grad()
        v = expected(batch[0].input_ids, batch[0].attention_mask)
        (coef * ((v - targets) ** 2).mean()).backward()
        with torch.no_grad():
            for p in expected.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
    got = dict(t.team.critics[0].named_parameters())
    moved = 0
    for name, p in expected.named_parameters():
        torch.testing.assert_close(got[name].detach(), p.detach(), rtol=1e-4, atol=1e-6)
        moved += int(not torch.equal(p.detach(), dict(critic0.named_parameters())[name].detach()))
    assert moved > 0


def test_actors_and_critic_are_clipped_by_their_own_norms(make_args, items, tiny_path):
    args = make_args(MAACConfig, max_grad_norm=1.0)
    t = MAACTrainer(
        model=tiny_path, critic_model=tiny_path, reward_funcs=shared_reward, args=args, train_dataset=items
    )
    team = t.team
    modules = [team.agents[0], team.agents[1], team.critics[0]]
    scales = [3.0, 0.5, 12.0]  # norms before clipping
    for m, scale in zip(modules, scales):
        params = [p for p in m.parameters() if p.requires_grad]
        grads = [torch.randn_like(p) for p in params]
        total = torch.stack([g.norm() for g in grads]).norm()
        for p, g in zip(params, grads):
            p.grad = g * (scale / total)
    t.create_optimizer()
    pre = t._clip_grad_norm(t.model)
    assert abs(float(pre) - (3.0**2 + 0.5**2 + 12.0**2) ** 0.5) < 1e-3
    for m, scale in zip(modules, scales):
        norm = torch.stack([p.grad.norm() for p in m.parameters() if p.grad is not None]).norm().item()
        assert abs(norm - min(scale, 1.0)) < 1e-4, (scale, norm)  # agent 2 (0.5) untouched by the others


def test_magrpo_agents_are_clipped_separately(make_args, items, tiny_path):
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=shared_reward, args=make_args(), train_dataset=items)
    for agent, scale in zip(t.team.agents, (10.0, 0.25)):
        params = list(agent.parameters())
        for p in params:
            p.grad = torch.ones_like(p)
        total = torch.stack([p.grad.norm() for p in params]).norm()
        for p in params:
            p.grad *= scale / total
    t._clip_grad_norm(t.model)
    norms = [torch.stack([p.grad.norm() for p in a.parameters()]).norm().item() for a in t.team.agents]
    assert abs(norms[0] - 1.0) < 1e-4 and abs(norms[1] - 0.25) < 1e-5
