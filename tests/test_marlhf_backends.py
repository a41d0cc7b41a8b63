"""MARLHF by composition: the RL backend is a part of the trainer (`trainers/rl_step.py`), so `MARLHFTrainer` is a
`MARLHFTrainer` whatever `rl_algorithm` is, and the removed backend classes forward for one release."""

import pytest

from trl_marl import MAACTrainer, MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer, MARLHFTrainer
from trl_marl.trainers.actor_critic import IACStep, MAACStep
from trl_marl.trainers.group_baseline import GroupBaselineStep
from trl_marl.trainers.registry import get_algorithm
from trl_marl.utils.deprecation import TrlMarlDeprecationWarning

BACKENDS = ["magrpo", "mareinforce", "marloo", "maremax", "maac", "iac"]


def reward(a, b):
    return [float(len(x) + len(y)) for x, y in zip(a, b)]


def build(trainer_cls, make_args, items, tiny_path, algorithm, config_cls=MARLHFConfig, **kw):
    args = make_args(config_cls, rl_algorithm=algorithm)
    if algorithm == "maac":
        kw.setdefault("critic_model", tiny_path)
    return trainer_cls(model=tiny_path, reward_funcs=reward, args=args, train_dataset=items, **kw)


@pytest.mark.parametrize("algorithm", BACKENDS)
def test_marlhf_is_a_marlhf_trainer_with_every_backend(make_args, items, tiny_path, algorithm):
    # the old code returned a MARLHFMAACTrainer / MARLHFIACTrainer (not a MARLHFTrainer) for maac / iac
    t = build(MARLHFTrainer, make_args, items, tiny_path, algorithm)
    assert isinstance(t, MARLHFTrainer) and type(t) is MARLHFTrainer
    baseline = get_algorithm(algorithm).baseline
    if baseline is not None:  # the REINFORCE family: the group baseline the registry gives the algorithm
        assert isinstance(t.rl_step, GroupBaselineStep) and t.rl_step.baseline == baseline
        assert t.rl_step.normalize == (algorithm == "magrpo")  # advantage_normalization unset
    else:  # the actor-critic trainer's own step, critics inside the team
        assert type(t.rl_step) is {"maac": MAACStep, "iac": IACStep}[algorithm]
        assert type(t.rl_step) is get_algorithm(algorithm).trainer_class.step_class
        assert len(t.team.critics) == t.args.num_critics == (1 if algorithm == "maac" else t.args.num_agents)
        assert t.rl_step.normalize_advantages  # unset: on, as in the actor-critic configs
        assert t.supports_per_agent_rewards and not t.supports_shared_base


@pytest.mark.parametrize("algorithm", ["magrpo", "maac"])
def test_marlhf_iter_is_a_marlhf_iter_trainer(make_args, items, tiny_path, algorithm):
    t = build(MARLHFIterTrainer, make_args, items, tiny_path, algorithm, config_cls=MARLHFIterConfig)
    assert type(t) is MARLHFIterTrainer and isinstance(t, MARLHFTrainer) and t.rounds is not None


def test_maac_backend_saves_its_critic_as_maac_does(make_args, items, tiny_path, tmp_path):
    t = build(MARLHFTrainer, make_args, items, tiny_path, "maac")
    t.save_model(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "critic" / "config.json").exists()
    import json

    team = json.loads((tmp_path / "saved" / "team.json").read_text())
    assert team["critics"][0]["folder"] == "critic" and team["critic_type"] == "v"
    assert set(MARLHFTrainer.all_resume_types()) >= set(
        MAACTrainer.all_resume_types()
    )  # a MAAC backend's state resumes


@pytest.mark.parametrize("algorithm", ["magrpo", "marloo"])
def test_a_critic_with_a_reinforce_backend_is_refused(make_args, items, tiny_path, algorithm):
    with pytest.raises(ValueError, match=f"rl_algorithm={algorithm!r} trains without a critic"):
        build(MARLHFTrainer, make_args, items, tiny_path, algorithm, critic_model=tiny_path)


def test_maac_backend_without_a_critic_is_refused(make_args, items, tiny_path):
    with pytest.raises(ValueError, match="rl_algorithm='maac' trains a centralized critic: pass critic_model="):
        build(MARLHFTrainer, make_args, items, tiny_path, "maac", critic_model=None)


def test_actor_critic_backend_fields_are_checked_by_the_config(make_args):
    with pytest.raises(ValueError, match="value_clip_range applies only in shared-model mode"):
        make_args(MARLHFConfig, rl_algorithm="iac", value_clip_range=0.2)
    with pytest.raises(ValueError, match=r"critic_devices has 2 entries; give 1 or one per critic \(1\)"):
        make_args(
            MARLHFConfig,
            rl_algorithm="maac",
            parallel_training="mp",
            agent_devices=["cpu"],
            critic_devices=["cpu", "cpu"],
        )
    cfg = make_args(MARLHFConfig, rl_algorithm="iac", use_separate_critic=False, value_clip_range=0.2)
    assert cfg.num_critics == cfg.num_agents and not cfg.uses_separate_critics


@pytest.mark.parametrize(
    ("module", "name", "new", "backend"),
    [
        ("trl_marl.trainers.preference.marlhf", "MARLHFMAACTrainer", MARLHFTrainer, None),
        ("trl_marl.trainers.preference.marlhf", "MARLHFIACTrainer", MARLHFTrainer, None),
        ("trl_marl.trainers.preference.marlhf", "MARLHFMAACConfig", MARLHFConfig, "maac"),
        ("trl_marl.trainers.preference.marlhf", "MARLHFIACConfig", MARLHFConfig, "iac"),
        ("trl_marl.trainers.preference.iterative_trainers", "MARLHFIterMAACTrainer", MARLHFIterTrainer, None),
        ("trl_marl.trainers.preference.iterative_config", "MARLHFIterIACConfig", MARLHFIterConfig, "iac"),
        ("trl_marl.trainers.preference", "MARLHFIACTrainer", MARLHFTrainer, None),
        ("trl_marl.trainers.preference", "MARLHFIterMAACConfig", MARLHFIterConfig, "maac"),
    ],
)
def test_removed_backend_names_warn_and_work(tmp_path, module, name, new, backend):
    import importlib

    with pytest.warns(TrlMarlDeprecationWarning, match=f"{name} is removed in the next release"):
        old = getattr(importlib.import_module(module), name)
    if backend is None:
        assert old is new
    else:  # the config of that backend
        cfg = old(output_dir=str(tmp_path), report_to="none", rollout_buffer_size=2)
        assert type(cfg) is new and cfg.rl_algorithm == backend
    with pytest.raises(AttributeError):
        importlib.import_module(module).MARLHFNoSuchTrainer  # noqa: B018
