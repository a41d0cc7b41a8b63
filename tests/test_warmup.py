"""`trl_marl.trainers.warmup`: warming a trainer at construction changes nothing a run depends on."""

import torch

import trl_marl.trainers.warmup as warmup
from trl_marl import MAGRPOTrainer


def test_warm_up_leaves_the_random_streams_the_modes_and_the_gradients_as_they_were(
    make_args, tiny_path, items, monkeypatch
):
    calls = []
    real = warmup.warm_up
    monkeypatch.setattr(warmup, "warm_up", lambda trainer: (calls.append(trainer), real(trainer)))

    def build():
        torch.manual_seed(7)
        trainer = MAGRPOTrainer(
            model=tiny_path, reward_funcs=lambda c1, c2: [0.0] * len(c1), args=make_args(), train_dataset=items
        )
        return trainer, torch.get_rng_state()

    warm, warm_state = build()
    assert calls == [warm]
    monkeypatch.setattr(warmup, "warm_up", lambda trainer: None)
    cold, cold_state = build()
    assert torch.equal(warm_state, cold_state)
    assert warm.team.training == cold.team.training
    assert all(p.grad is None for p in warm.team.parameters())
