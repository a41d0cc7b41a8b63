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


def test_warm_up_runs_the_fused_heads_kernels_once_per_head_and_leaves_no_gradient(
    make_args, tiny_path, items, monkeypatch
):
    """Where the fused head applies (CUDA; forced here), TRL's kernel runs forward and backward once per distinct head
    at construction (Triton compiles it then, not in the first step), and no gradient is left behind."""
    import trl_marl.models.fused_head as fused_head_module

    monkeypatch.setattr(fused_head_module, "_triton_runs_on", lambda device: True)
    calls = []
    from trl.kernels import ChunkedLogProbFunction  # fused_head imports it at call time, from trl.kernels

    class Counted(ChunkedLogProbFunction):
        @staticmethod
        def forward(ctx, *args):
            calls.append("forward")
            return ChunkedLogProbFunction.forward(ctx, *args)

        @staticmethod
        def backward(ctx, *grads):
            calls.append("backward")
            return ChunkedLogProbFunction.backward(ctx, *grads)

    monkeypatch.setattr("trl.kernels.ChunkedLogProbFunction", Counted)
    monkeypatch.setattr(warmup, "_warm_scoring", lambda *a: None)  # count the head's own warm-up only
    trainer = MAGRPOTrainer(
        model=tiny_path, reward_funcs=lambda c1, c2: [0.0] * len(c1), args=make_args(), train_dataset=items
    )
    assert trainer.team.num_agents == 2 and calls == ["forward", "backward"] * 2
    assert all(p.grad is None for p in trainer.team.parameters())


def test_warm_up_runs_a_backward_through_every_agents_layers_and_samples_its_decode(
    make_args, tiny_path, items, monkeypatch
):
    """The first backward through a model loads its gradient kernels (on CUDA, at their first launch): the warm-up
    runs one per agent, through every decoder layer, and writes no `.grad`; its decode samples as training does (the
    random streams are restored: the test above)."""
    backward: list[int] = []
    sampled: list[bool] = []
    real = warmup.warm_up

    def traced(trainer):
        for i, agent in enumerate(trainer.team.agents):
            for layer in agent.model.layers:
                layer.register_full_backward_hook(lambda m, gi, go, i=i: backward.append(i))
        generate = trainer.generation.generate
        monkeypatch.setattr(
            trainer.generation,
            "generate",
            lambda prompts, n, greedy=False: (sampled.append(not greedy), generate(prompts, n, greedy))[1],
        )
        real(trainer)

    monkeypatch.setattr(warmup, "warm_up", traced)
    trainer = MAGRPOTrainer(
        model=tiny_path, reward_funcs=lambda c1, c2: [0.0] * len(c1), args=make_args(), train_dataset=items
    )
    layers = len(trainer.team.agents[0].model.layers)
    assert backward == [0] * layers + [1] * layers
    assert sampled == [True]
    assert all(p.grad is None for p in trainer.team.parameters())
