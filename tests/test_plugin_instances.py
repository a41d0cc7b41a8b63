"""Plugins in code: `comparator=` / `replay_mode=` take instances or names, `comparator_kwargs` / `replay_kwargs`
reach a plugin's constructor. The third-party plugins are defined in this file (and one is registered through a
dist-info entry point, as an installed package would)."""

import sys

import numpy as np
import pytest
from datasets import Dataset

from trl_marl import MADPOIterConfig, MADPOIterTrainer


class EchoComparator:
    """A third-party comparator: every candidate of the comparator side is the same fixed joint response."""

    def __init__(self, args=None, text="zzz"):
        self.text, self.calls = text, 0

    def generate(self, items, prompts_per_agent, num_candidates, trainer):
        self.calls += 1
        return [[[self.text] * trainer.num_agents for _ in range(num_candidates)] for _ in items]


class LastRoundTwice:
    """A third-party replay mode with an option of its own (`repeat`)."""

    name = "last_round_twice"

    def __init__(self, *, k=None, lam=None, sample_size=None, repeat=2):
        if k is not None or lam is not None or sample_size is not None:
            raise ValueError("last_round_twice takes no preference_replay_k / _lambda / _sample_size")
        self.repeat, self.calls = repeat, 0

    def select(self, rounds, rng: np.random.Generator):
        self.calls += 1
        return [rounds[-1][j] for j in range(len(rounds[-1]))] * self.repeat


def vowels(c1, c2):
    return [float(sum(ch in "aeiou" for ch in a + b)) for a, b in zip(c1, c2)]


ITEMS = Dataset.from_list([{"prompt": f"Say {w}:"} for w in ["a", "e", "i", "o"]])


def args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        max_completion_length=4,
        rollout_buffer_size=4,
        preference_num_candidates=2,
        train_batch_size=4,
        num_rounds=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        temperature=2.0,
    )
    return MADPOIterConfig(**{**base, **kw})


@pytest.fixture
def registered_plugins(tmp_path, monkeypatch):
    """Register `EchoComparator` / `LastRoundTwice` from a fake installed distribution (entry points)."""
    pkg = tmp_path / "site"
    pkg.mkdir()
    # the "package" module is this test module: its classes are the plugins
    monkeypatch.setitem(sys.modules, "acme_team_plugins", sys.modules[__name__])
    dist = pkg / "acme_team_plugins-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-team-plugins\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[trl_marl.comparators]\necho = acme_team_plugins:EchoComparator\n"
        "[trl_marl.replay_modes]\nlast_round_twice = acme_team_plugins:LastRoundTwice\n"
    )
    monkeypatch.syspath_prepend(str(pkg))
    yield


def test_instances_are_used_as_given(tmp_path, tiny_path):
    comparator, replay = EchoComparator(text="qqq"), LastRoundTwice(repeat=3)
    t = MADPOIterTrainer(
        model=tiny_path,
        reward_funcs=vowels,
        args=args(tmp_path),
        train_dataset=ITEMS,
        comparator=comparator,
        replay_mode=replay,
    )
    assert t.rounds.comparator is comparator and t.rounds.replay_mode is replay
    t.train()
    assert comparator.calls >= 1 and replay.calls == 1


def test_names_with_plugin_options(tmp_path, tiny_path, registered_plugins):
    cfg = args(
        tmp_path,
        comparator_policy="echo",
        comparator_kwargs='{"text": "xyz"}',  # a JSON object, as from the command line
        preference_replay_mode="last_round_twice",
        replay_kwargs={"repeat": 4},
    )
    t = MADPOIterTrainer(model=tiny_path, reward_funcs=vowels, args=cfg, train_dataset=ITEMS)
    assert isinstance(t.rounds.comparator, EchoComparator) and t.rounds.comparator.text == "xyz"
    assert isinstance(t.rounds.replay_mode, LastRoundTwice) and t.rounds.replay_mode.repeat == 4
    # the trainer's `comparator=` name wins over the config's
    t2 = MADPOIterTrainer(model=tiny_path, reward_funcs=vowels, args=args(tmp_path), train_dataset=ITEMS,
                          comparator="echo", replay_mode="last_round_twice")  # fmt: skip
    assert isinstance(t2.rounds.comparator, EchoComparator) and t2.rounds.comparator.text == "zzz"


def test_bad_plugin_objects_and_options_fail_early(tmp_path, tiny_path, registered_plugins):
    with pytest.raises(TypeError, match="has no generate"):
        MADPOIterTrainer(model=tiny_path, reward_funcs=vowels, args=args(tmp_path), train_dataset=ITEMS,
                         comparator=object())  # fmt: skip
    with pytest.raises(TypeError, match="has no select"):
        MADPOIterTrainer(model=tiny_path, reward_funcs=vowels, args=args(tmp_path), train_dataset=ITEMS,
                         replay_mode=object())  # fmt: skip
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        args(tmp_path, preference_replay_mode="last_round_twice", replay_kwargs={"colour": 1})
    echo_options = args(tmp_path, comparator_policy="echo", comparator_kwargs={"text": "a"})
    with pytest.raises(ValueError, match="comparator_kwargs configures a comparator built by name"):
        MADPOIterTrainer(model=tiny_path, reward_funcs=vowels, args=echo_options, train_dataset=ITEMS,
                         comparator=EchoComparator())  # fmt: skip


def test_iterative_trainer_takes_trls_positional_order(tmp_path, tiny_path):
    t = MADPOIterTrainer(tiny_path, vowels, args(tmp_path, num_rounds=2), ITEMS)
    assert t.args.num_rounds == 2 and t.reward.func is vowels and t.train_dataset is ITEMS
