"""MARLHFIter / MADPOIter rounds: aligned on rollouts and optimizer steps, max_steps per round (issue 13)."""

import pytest
from conftest import iterative_args, letters_reward
from datasets import Dataset

from trl_marl import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig, MARLHFIterTrainer


def _args(tmp_path, cls, **kw):
    base = dict(max_completion_length=4, preference_num_candidates=2)
    if cls is not MADPOIterConfig:  # MADPO samples preference_num_candidates and refuses num_generations
        base["num_generations"] = 2
    return iterative_args(tmp_path, cls, **{**base, **kw})


@pytest.mark.parametrize("ga, buffer", [(3, 2), (2, 3)])
def test_marlhf_iter_rounds_start_on_a_rollout_boundary(tmp_path, tiny_path, ga, buffer):
    """One rollout of `buffer` items per round, `buffer` steps on it (train_batch_size 1), accumulation `ga` that
    does not divide it: every step trains on a rollout of ITS OWN round, rolled out at the round's first step."""
    items = Dataset.from_list([{"prompt": f"Say something about {w}."} for w in ["rain", "snow", "wind"][:buffer]])
    args = _args(
        tmp_path, MARLHFIterConfig, rollout_buffer_size=buffer, train_batch_size=1, gradient_accumulation_steps=ga
    )
    t = MARLHFIterTrainer(model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=items)
    made, used = {}, []
    rollout_step, compute_loss = t._rollout_step, t.compute_loss

    def spy_rollout(batch):
        out = rollout_step(batch)
        made[id(out[0]["rollout"])] = t.rounds.completed
        return out

    def spy_loss(model, inputs, *a, **k):
        used.append((t.rounds.completed, made[id(inputs["rollout"])]))
        return compute_loss(model, inputs, *a, **k)

    t._rollout_step, t.compute_loss = spy_rollout, spy_loss
    t.train()
    assert t.rounds.completed == 2
    assert {r for r, _ in used} == {1, 2}
    assert all(now == made_in for now, made_in in used), used
    per_round = [sum(1 for r, _ in used if r == k) for k in (1, 2)]
    assert all(c % ga == 0 and c % buffer == 0 for c in per_round), per_round


def test_max_steps_counts_per_round(tmp_path, tiny_path):
    items = Dataset.from_list([{"prompt": f"Say something about {w}."} for w in ["rain", "snow", "wind", "fire"]])
    args = _args(tmp_path, MADPOIterConfig, rollout_buffer_size=2, train_batch_size=2, max_steps=1)
    t = MADPOIterTrainer(model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=items)
    t.train()
    assert t.rounds.completed == 2 and t.state.global_step == 2
    assert t.args.max_steps == 1  # the user's value is left as it was
