"""One random stream per purpose (trl_marl.data_types.rng.RNGStreams) and its use by the trainers (issue 13)."""

import torch
from conftest import iterative_args, letters_reward
from datasets import Dataset

from trl_marl import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig, MARLHFIterTrainer
from trl_marl.data_types.rng import RNGStreams

ITEMS = Dataset.from_list([{"prompt": f"Say something about {w}."} for w in ["rain", "snow", "wind", "fire"]])


def _args(tmp_path, cls, **kw):
    base = dict(max_completion_length=5, rollout_buffer_size=2, preference_num_candidates=2)
    if cls is not MADPOIterConfig:  # MADPO samples preference_num_candidates and refuses num_generations
        base["num_generations"] = 2
    return iterative_args(tmp_path, cls, **{**base, **kw})


def test_streams_are_independent_reproducible_and_restorable():
    s = RNGStreams(3)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with s.scoped("rollout"):
        a = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is as the block found it
    with s.scoped("comparator"):
        torch.rand(100)  # draws of another purpose do not shift this one
    with s.scoped("rollout"):
        b = torch.rand(4)
    t = RNGStreams(3)
    with t.scoped("rollout"):
        a2 = torch.rand(4)
    saved = t.state_dict()
    with t.scoped("rollout"):
        b2 = torch.rand(4)
    assert torch.equal(a, a2) and torch.equal(b, b2) and not torch.equal(a, b)
    u = RNGStreams(3)
    u.load_state_dict(saved)
    with u.scoped("rollout"):
        assert torch.equal(torch.rand(4), b2)
    with s.scoped("rollout", round=2):
        other_round = torch.rand(4)
    assert not torch.equal(other_round, a)
    assert RNGStreams(3, rank=1).seed_for("rollout") != s.seed_for("rollout")


def _rl_rollout_texts(t):
    """The RL rollouts' completions, per round, recorded as training draws them."""
    seen = {}
    original = t._rollout_step

    def spy(items):
        out = original(items)
        seen.setdefault(t.rounds.completed, []).append([s.completion for s in out[0]["rollout"].samples])
        return out

    t._rollout_step = spy
    return seen


def test_marlhf_iter_rounds_draw_different_rollouts_and_runs_repeat(tmp_path):
    from trl_marl.testing import tiny_model_path

    runs = []
    for run in range(2):
        args = _args(tmp_path / str(run), MARLHFIterConfig, learning_rate=1e-9, reward_learning_rate=1e-3)
        t = MARLHFIterTrainer(model=tiny_model_path(), reward_funcs=letters_reward, args=args, train_dataset=ITEMS)
        seen = _rl_rollout_texts(t)
        torch.manual_seed(999 + run)  # the global RNG does not matter: every draw comes from the streams
        t.train()
        runs.append(seen)
    assert runs[0] == runs[1]
    # the agents barely move (lr 1e-9), so equal rounds would mean the same random draws: they must differ
    assert runs[0][1][0] != runs[0][2][0]


def test_comparator_samples_do_not_shift_training_rollouts(tmp_path):
    from trl_marl.testing import tiny_model_path

    texts = []
    for kc in (1, 3):
        args = _args(
            tmp_path / str(kc),
            MADPOIterConfig,
            comparator_policy="model",
            comparator_kwargs={"model_name": tiny_model_path()},
            comparator_num_candidates=kc,
        )
        t = MADPOIterTrainer(model=tiny_model_path(), reward_funcs=letters_reward, args=args, train_dataset=ITEMS)
        t.rounds.stream_round = 1
        t.rounds.comparator.prepare(t, 1) if hasattr(t.rounds.comparator, "prepare") else None
        t.rounds.collect(1)  # the agents' candidates, then the comparator's kc samples
        with t.rng_streams.scoped("rollout", 1):  # the next training draws
            rollout = t.rollout_engine.run([ITEMS[0], ITEMS[1]], t.generate)
        texts.append([s.completion for s in rollout.samples])
    assert texts[0] == texts[1]


def test_reward_model_init_leaves_the_global_rng_alone(tiny_path):
    from trl_marl.trainers.preference import JointRewardModel

    torch.manual_seed(7)
    state = torch.get_rng_state()
    a = JointRewardModel.from_pretrained(tiny_path, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    b = JointRewardModel.from_pretrained(tiny_path, seed=5)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
