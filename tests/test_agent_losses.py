"""The REINFORCE family's loss backpropagated one agent at a time (`trl_marl.trainers.agent_losses`): the same
gradients as one backward of the summed loss, each agent's graph freed before the next agent's forward, and only
where the engine allows several backward passes per step."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType
from conftest import cpu_args, letters_reward

import trl_marl.trainers.agent_losses as agent_losses


def _trainer(tiny_path, tmp_path, **overrides):
    from trl_marl import MAGRPOConfig, MAGRPOTrainer

    args = cpu_args(MAGRPOConfig, tmp_path, num_generations=3, rollout_buffer_size=3, **overrides)
    prompts = [{"prompt": p} for p in ("the cat", "a long way home", "sing", "a dog", "the sea", "rain")]
    return MAGRPOTrainer(model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=prompts)


def _step(trainer, inputs, accumulation: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[bool]]:
    """One micro-step's loss and gradients, and for each forward of the second agent whether the first agent's
    gradient was already there."""
    model = trainer.model
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = accumulation
    first = list(trainer.team.agents[0].parameters())
    seen: list[bool] = []
    hook = trainer.team.agents[1].register_forward_pre_hook(lambda *_: seen.append(first[0].grad is not None))
    try:
        loss = trainer.training_step(model, inputs)
    finally:
        hook.remove()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss, grads, seen


@pytest.mark.parametrize("loss_type", [None, "grpo"])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_each_agents_backward_gives_the_gradient_of_the_summed_loss(
    tiny_path, tmp_path, monkeypatch, loss_type, accumulation
):
    kwargs = {} if loss_type is None else {"loss_type": loss_type, "beta": 0.0}
    trainer = _trainer(tiny_path, tmp_path, **kwargs)
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))

    loss, grads, seen = _step(trainer, inputs, accumulation)
    assert seen and all(seen)  # the first agent was backpropagated before the second agent's forward(s)
    monkeypatch.setattr(agent_losses, "backward_each_part", lambda *a: False)  # one backward of the sum
    loss_once, grads_once, seen_once = _step(trainer, inputs, accumulation)
    assert seen_once and not any(seen_once)

    torch.testing.assert_close(loss, loss_once, rtol=1e-6, atol=1e-7)
    assert grads.keys() == grads_once.keys()
    assert any(name.startswith("agents.0.") for name in grads) and any(name.startswith("agents.1.") for name in grads)
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_once[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"loss_type": "grpo", "beta": 0.04, "entropy_coef": 0.01, "mask_truncated_completions": True},
        {"loss_type": "dapo", "num_iterations": 2},
        {"loss_type": "bnpo"},
    ],
    ids=["seed", "grpo-kl-entropy", "dapo-old-logps", "bnpo"],
)
def test_an_agents_rows_in_parts_give_the_whole_batchs_loss_gradient_and_metrics(
    tiny_path, tmp_path, monkeypatch, overrides
):
    """`logprob_batch_size=3` cuts each agent's 9 rows into 3 parts, each backpropagated right after its forward
    (the first part's gradient is there when the second part runs); the loss, every gradient and every logged metric
    equal those of one forward per agent (the old code). The metrics are computed once per agent, from the merged
    parts (the parts' own were computed and discarded before)."""
    import trl_marl.algorithms.grpo as grpo

    trainer = _trainer(tiny_path, tmp_path, logprob_batch_size=3, **overrides)
    inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    first = list(trainer.team.agents[0].parameters())
    computed = []
    metrics_of = grpo.grpo_metrics
    monkeypatch.setattr(grpo, "grpo_metrics", lambda *a, **k: computed.append(1) or metrics_of(*a, **k))

    def step():
        trainer._metrics["train"].clear()
        seen: list[bool] = []
        hook = trainer.team.agents[0].register_forward_pre_hook(lambda *_: seen.append(first[0].grad is not None))
        try:
            loss, grads, _ = _step(trainer, inputs, 1)
        finally:
            hook.remove()
        return loss, grads, {k: list(v) for k, v in trainer._metrics["train"].items()}, seen

    loss, grads, metrics, seen = step()
    assert False in seen and True in seen  # part 1 backpropagated before part 2's forward
    if overrides:  # the TRL loss family (the seed loss has no GRPO metrics)
        assert len(computed) == trainer.num_agents  # not once per part as well
    monkeypatch.setattr(agent_losses, "backward_parts", lambda model, batch, rows: [(0, len(batch.input_ids))])
    loss_whole, grads_whole, metrics_whole, seen_whole = step()
    assert not any(seen_whole)

    torch.testing.assert_close(loss, loss_whole, rtol=1e-5, atol=1e-7)
    assert grads.keys() == grads_whole.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_whole[name], rtol=1e-4, atol=1e-7, msg=name)
    assert metrics.keys() == metrics_whole.keys()
    assert {"agent_1/loss", "agent_2/entropy", "entropy"} <= metrics.keys()
    for key, values in metrics.items():
        assert values == pytest.approx(metrics_whole[key], rel=1e-5, abs=1e-7, nan_ok=True), key


def _fake(distributed_type=DistributedType.NO, n_gpu=1, optim="adamw_torch"):
    return SimpleNamespace(
        args=SimpleNamespace(n_gpu=n_gpu, optim=optim), accelerator=SimpleNamespace(distributed_type=distributed_type)
    )


@pytest.mark.parametrize(
    "case, allowed",
    [
        ({}, True),
        ({"distributed_type": DistributedType.MULTI_CPU}, False),
        ({"distributed_type": DistributedType.MULTI_GPU}, False),
        ({"distributed_type": DistributedType.DEEPSPEED}, False),
        ({"distributed_type": DistributedType.FSDP}, False),
        ({"n_gpu": 2}, False),  # DataParallel
        ({"optim": "lomo"}, False),
        ({"optim": "adalomo"}, False),
    ],
)
def test_each_agent_is_backpropagated_alone_only_where_the_engine_allows_it(case, allowed):
    assert agent_losses.backward_each_part(_fake(**case), ["a", "b"]) is allowed
    assert agent_losses.backward_each_part(_fake(**case), ["a", None]) is allowed  # one agent: its rows in parts
    assert agent_losses.backward_each_part(_fake(**case), [None, None]) is False
    with torch.no_grad():
        assert agent_losses.backward_each_part(_fake(**case), ["a", "b"]) is False


def test_a_skipped_agent_is_left_out_of_the_sum(tiny_path, tmp_path):
    """An agent whose batch is None contributes nothing; the others are backpropagated as usual."""
    trainer = _trainer(tiny_path, tmp_path)
    calls = []

    def model(batches, **_):
        calls.append([b is not None for b in batches])
        return {"logprobs": [None if b is None else b * 1.0 for b in batches]}

    x = torch.tensor([1.0, 2.0], requires_grad=True)
    trainer.current_gradient_accumulation_steps = 2
    loss, out, losses = agent_losses.sum_of_agent_losses(
        trainer, model, [x, None, 3 * x], lambda i, o, rows: o["logprobs"][i][rows].sum()
    )
    assert calls == [[True, False, False], [False, False, True]]
    assert out["logprobs"][1] is None and torch.equal(out["logprobs"][2].detach(), 3 * x.detach())
    assert loss.item() == pytest.approx(12.0)
    assert losses[1] is None and [losses[0].item(), losses[2].item()] == pytest.approx([3.0, 9.0])
    torch.testing.assert_close(x.grad, torch.full((2,), 0.5))  # the first term, divided by the 2 micro-steps
    loss.backward()
    torch.testing.assert_close(x.grad, torch.full((2,), 3.5))


# ------------------------------------------------------------------------------------------ each agent's step
def _trained(tiny_path, tmp_path, early: bool, monkeypatch, **overrides):
    """A 3-step run; `early=False` makes the transformers loop step every agent (the engines' way)."""
    with monkeypatch.context() as patch:
        if not early:
            patch.setattr(agent_losses, "step_each_agent", lambda *a: False, raising=False)  # old code: no such step
        trainer = _trainer(tiny_path, tmp_path / ("early" if early else "loop"), max_steps=3, **overrides)
        first = list(trainer.team.agents[0].parameters())
        seen: dict[int, set[bool]] = {}  # micro-step -> at agent 2's forwards, whether agent 1's gradient was there

        def look(*_):
            if torch.is_grad_enabled():
                seen.setdefault(trainer._step, set()).add(first[0].grad is not None)

        hook = trainer.team.agents[1].register_forward_pre_hook(look)
        trainer.train()
        hook.remove()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return trainer, logs, [seen[k] for k in sorted(seen)]


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_grad_norm": 0.05},  # clipping bites: each agent by its own norm
        {"max_grad_norm": 0.0},  # no clipping
        {"max_grad_norm": 0.05, "gradient_accumulation_steps": 2},
        {"max_grad_norm": 0.05, "loss_type": "grpo", "beta": 0.0},
    ],
    ids=["clipped", "unclipped", "accumulated", "grpo"],
)
def test_each_agents_early_step_is_the_loops_step(tiny_path, tmp_path, monkeypatch, overrides):
    """On one process each agent but the last takes its optimizer step right after its backward and its gradients
    are freed before the next agent's forward; the weights, losses and logged gradient norms after 3 steps are those
    of the transformers loop stepping the whole team (the old code: the first agent's gradients held through the
    second agent's forward and backward)."""
    early, early_logs, early_seen = _trained(tiny_path, tmp_path, True, monkeypatch, **overrides)
    loop, loop_logs, loop_seen = _trained(tiny_path, tmp_path, False, monkeypatch, **overrides)

    accumulation = overrides.get("gradient_accumulation_steps", 1)
    # at the micro-step that ends with the optimizer step the first agent's gradients are gone when agent 2 starts;
    # on the others (accumulation) they must stay, to be accumulated
    expected = [{k % accumulation != accumulation - 1} for k in range(3 * accumulation)]
    assert early_seen == expected
    assert loop_seen == [{True}] * (3 * accumulation)

    for (name, p), q in zip(early.team.named_parameters(), loop.team.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)
    assert len(early_logs) == len(loop_logs) == 3
    for a, b in zip(early_logs, loop_logs):
        for key in ("loss", "grad_norm", "agent_1/grad_norm", "agent_2/grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
    assert early_logs[0]["agent_1/grad_norm"] > 0.05  # the clipping was active


def test_each_agents_early_step_only_where_the_loop_would_step_alike(tiny_path, tmp_path):
    """Not on a micro-step that only accumulates, not with a gradient scaler (fp16), not for agents sharing one base
    (clipped together), not with an optimizer outside `torch.optim` (its update might read other gradients)."""
    trainer = _trainer(tiny_path, tmp_path)
    trainer.create_optimizer()
    assert agent_losses.step_each_agent(trainer)
    trainer.accelerator.gradient_state._set_sync_gradients(False)
    assert not agent_losses.step_each_agent(trainer)
    trainer.accelerator.gradient_state._set_sync_gradients(True)
    trainer.accelerator.scaler = object()
    assert not agent_losses.step_each_agent(trainer)
    trainer.accelerator.scaler = None

    class Outside(torch.optim.SGD):
        pass

    Outside.__module__ = "my_optimizers"
    trainer.optimizer = Outside(trainer.team.parameters(), lr=0.1)
    assert not agent_losses.step_each_agent(trainer)


def test_each_agents_early_step_leaves_other_gradients_alone(tiny_path, tmp_path):
    """The optimizer steps agent i only: another parameter's gradient (a later agent's, accumulated over earlier
    micro-steps) is neither applied nor lost, and agent i's gradients are freed."""
    trainer = _trainer(tiny_path, tmp_path, max_grad_norm=0.0)
    trainer.create_optimizer()
    mine = [p for _, p in trainer.team.agent_named_parameters(0)]
    other = [p for _, p in trainer.team.agent_named_parameters(1)]
    for p in mine + other:
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in mine + other]
    kept = [p.grad for p in other]
    agent_losses.optimizer_step_of_agent(trainer, 0, torch.tensor(1.0))
    assert all(p.grad is None for p in mine)
    assert all(p.grad is g for p, g in zip(other, kept))
    assert all(not torch.equal(p, b) for p, b in zip(mine, before[: len(mine)]) if p.requires_grad)
    assert all(torch.equal(p, b) for p, b in zip(other, before[len(mine) :]))
    assert trainer._early_steps == {"agent_1": pytest.approx(math.sqrt(sum(p.numel() for p in mine)))}
