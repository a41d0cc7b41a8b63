"""Scale and ecosystem options: per-agent devices with overlapping generation, and the Trainer options that pass
through (gradient accumulation, clipping, schedulers, gradient checkpointing, bf16, report_to)."""

import threading

import pytest
import torch

from trl_marl import MAGRPOTrainer
from trl_marl.trainers.arguments import apply_wandb_config


def reward(c1, c2):
    return [float(len(a) - len(b)) for a, b in zip(c1, c2)]


def test_mp_places_agents_and_generates_in_threads(make_args, items, tiny_path, monkeypatch):
    args = make_args(
        parallel_training="mp", agent_devices=["cpu", "cpu"], reference_kl_enabled=True, reference_devices=["cpu"]
    )
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items)
    assert [str(t.agent_device(i)) for i in range(2)] == ["cpu", "cpu"]
    threads = set()
    for agent in t.team.agents:
        original = agent.generate

        def spy(*a, _orig=original, **kw):
            threads.add(threading.get_ident())
            return _orig(*a, **kw)

        monkeypatch.setattr(agent, "generate", spy)
    t.train()
    assert len(threads) == 2 and threading.get_ident() not in threads  # one worker thread per agent
    assert t.state.global_step == 1


def test_mp_agent_devices_length_is_checked(make_args):
    with pytest.raises(ValueError, match="agent_devices has 3 entries; give 1 or num_agents=2"):
        make_args(parallel_training="mp", agent_devices=["cpu"] * 3)


def test_gradient_accumulation_and_lr_schedule(make_args, items, tiny_path):
    calls = []

    def counting(c1, c2):
        calls.append(len(c1))
        return reward(c1, c2)

    args = make_args(
        rollout_buffer_size=2,
        train_batch_size=1,
        gradient_accumulation_steps=2,
        max_steps=2,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        learning_rate=1e-3,
    )
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=counting, args=args, train_dataset=items)
    t.train()
    # 2 optimizer steps x 2 accumulated micro-steps, each rollout (2 items) feeding 2 micro-steps
    assert t.state.global_step == 2 and calls == [4, 4]
    lrs = [h["agent_1/learning_rate"] for h in t.state.log_history if "agent_1/learning_rate" in h and "loss" in h]
    assert lrs[0] == pytest.approx(1e-3)  # end of warm-up
    assert lrs[1] < lrs[0]  # cosine decay


def test_max_grad_norm_clips(make_args, items, tiny_path):
    def delta(max_grad_norm):
        args = make_args(optim="sgd", learning_rate=1.0, max_grad_norm=max_grad_norm, weight_decay=0.0)
        t = MAGRPOTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items)
        before = [p.detach().clone() for p in t.team.parameters()]
        t.train()
        return max((p.detach() - b).abs().max().item() for p, b in zip(t.team.parameters(), before))

    assert delta(1e-6) <= 1e-6 * 1.01
    assert delta(0.0) > 1e-3


def test_gradient_checkpointing_gives_the_same_loss(make_args, items, tiny_path):
    losses = []
    for gc in (False, True):
        args = make_args(gradient_checkpointing=gc, seed=3)
        t = MAGRPOTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items)
        t.train()
        assert t.team.is_gradient_checkpointing == gc
        losses.append(t.state.log_history[0]["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


def test_bf16_on_cpu(make_args, items, tiny_path):
    t = MAGRPOTrainer(
        model=tiny_path, reward_funcs=reward, train_dataset=items, args=make_args(bf16=True, use_cpu=True)
    )
    t.train()
    assert t.args.bf16 and torch.isfinite(torch.tensor(t.state.log_history[0]["loss"]))


def test_report_to_tensorboard_writes_events(make_args, items, tiny_path, tmp_path):
    pytest.importorskip("tensorboard")
    args = make_args(report_to="tensorboard")
    MAGRPOTrainer(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items).train()
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_wandb_config_maps_to_the_environment(make_args, monkeypatch):
    for var in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_TAGS"):
        monkeypatch.delenv(var, raising=False)
    args = make_args()
    apply_wandb_config(args, {"project": "team", "entity": "lab", "name": "run-1", "tags": ["a", "b"]})
    import os

    assert os.environ["WANDB_PROJECT"] == "team" and os.environ["WANDB_TAGS"] == "a,b"
    assert args.run_name == "run-1" and "wandb" in args.report_to


@pytest.mark.slow
def test_torch_compile(make_args, items, tiny_path):
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=reward, train_dataset=items, args=make_args(torch_compile=True))
    t.train()
    assert t.state.global_step == 1


def test_activation_checkpointing_on_older_transformers(tiny_path):
    """On transformers < 5.24 (what vLLM's CPU build pins) the backbones only have `gradient_checkpointing_enable`:
    plain per-layer checkpointing goes through it, and the options only the newer API has fail with a clear error."""
    from transformers import AutoModelForCausalLM

    from trl_marl.models.team import TeamModel

    calls = []

    class OldApiModel(type(AutoModelForCausalLM.from_pretrained(tiny_path))):
        activation_checkpointing_enable = None  # not there before 5.24
        activation_checkpointing_disable = None

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            calls.append(("enable", gradient_checkpointing_kwargs))

        def gradient_checkpointing_disable(self):
            calls.append(("disable", None))

    team = TeamModel([OldApiModel.from_pretrained(tiny_path)], ["a"])
    team.activation_checkpointing_enable({"use_reentrant": False})
    team.activation_checkpointing_disable()
    assert calls == [("enable", {"use_reentrant": False}), ("disable", None)]
    with pytest.raises(ValueError, match="every_n_layers != 1 or offload=True needs transformers >= 5.24"):
        team.activation_checkpointing_enable(every_n_layers=2)
