"""Papercuts a new user meets (issue 19): error wording, recipe messages and exit codes, a re-used output_dir,
`--help` and docstrings that say what really happens."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRL_PARSER_RECIPES = ("magrpo", "maac", "iac", "mappo", "madpo", "marlhf")


def load_recipe(name):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def length_gap(c1, c2):
    return [float(len(a) - len(b)) / 10 for a, b in zip(c1, c2)]


def constant(c1, c2):
    return [1.0] * len(c1)


# ---------------------------------------------------------------------------------------- 3. error wording
def test_joint_critic_tokenizer_error_says_each_thing_once(make_args, items, tiny_path):
    from trl_marl import MAACConfig, MAACTrainer
    from trl_marl.testing import tiny_model_path

    with pytest.raises(ValueError) as err:
        MAACTrainer(
            model=tiny_path,
            critic_model=tiny_model_path(vocab_size=300),
            reward_funcs=length_gap,
            args=make_args(MAACConfig),
            train_dataset=items,
        )
    msg = str(err.value)
    assert "is not tokenizer-compatible with agent 1: its tokenizer has" in msg
    assert "agent 1's has" in msg and ")'s" not in msg
    assert msg.count("tokenized with") == 1, msg


# ------------------------------------------------------------------------------- 4. MADPO without pairs
def test_madpo_without_pairs_warns_once_with_what_to_change(make_args, items, tiny_path, caplog, capsys):
    from trl_marl import MADPOConfig, MADPOTrainer

    trainer = MADPOTrainer(
        model=tiny_path,
        reward_funcs=constant,  # every candidate ties: no pair
        args=make_args(MADPOConfig, preference_num_candidates=2, rollout_buffer_size=8, max_completion_length=2),
        train_dataset=items,
    )
    with caplog.at_level(logging.WARNING):
        out = trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "no preference pair" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "raise preference_num_candidates (now 2)" in warnings[0] and "temperature" in warnings[0]
    assert "no preference pair" not in capsys.readouterr().out  # not printed a second time
    assert out.metrics["num_pairs"] == 0 and trainer.state.global_step == 0


def test_recipe_exits_nonzero_when_no_training_step_was_taken(tmp_path, tiny_path, monkeypatch, capsys):
    from trl_marl import MADPOTrainer

    monkeypatch.setattr(MADPOTrainer, "collect_preference_pairs", lambda self, dataset=None: [])
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        load_recipe("madpo").main(
            ["--output_dir", str(out), "--eval_num_samples", "2", "--max_completion_length", "2"]
        )
    assert exit_.value.code == 1
    assert "took no training step" in capsys.readouterr().err
    assert not (out / "team.json").exists()  # nothing saved


def test_centralized_recipe_says_what_it_saved(tmp_path, tiny_path, monkeypatch, capsys):
    from trl_marl import MADPOTrainer

    def one_step(self, *args, **kwargs):  # stands in for training: the message under test comes after it
        self.state.global_step = 1

    monkeypatch.setattr(MADPOTrainer, "train", one_step)
    out = tmp_path / "run"
    argv = ["--output_dir", str(out), "--collaboration_mode", "centralized", "--eval_num_samples", "2"]
    load_recipe("madpo").main(argv + ["--max_completion_length", "2"])
    printed = capsys.readouterr().out
    assert "saved 1 centralized model (agent_1/) that writes all 2 roles" in printed
    assert "saved 2" not in printed
    assert json.loads((out / "team.json").read_text())["num_agents"] == 1


# --------------------------------------------------------------------------------- 5. --num_agents check
def test_num_agents_flag_that_does_not_fit_the_task_is_refused(tmp_path, tiny_path):
    with pytest.raises(ValueError, match=r"--num_agents 3 .* 'coordination', which is played by 2 agents"):
        load_recipe("magrpo").main(["--num_agents", "3", "--output_dir", str(tmp_path / "run")])


# ------------------------------------------------------------------------------- 6. re-used output_dir
def test_save_into_a_reused_output_dir_leaves_no_stale_team_files(make_args, items, tiny_path, tmp_path):
    from trl_marl import AgentTeam, MAGRPOConfig, MAGRPOTrainer

    out = tmp_path / "reused"
    # what earlier runs left: a third agent, critics, a reward model, a value head and a LoRA adapter config
    for folder in ("agent_1", "agent_3", "critic", "critic_2", "reward_model"):
        (out / folder).mkdir(parents=True)
        (out / folder / "config.json").write_text("{}")
    (out / "agent_1" / "value_head.safetensors").write_bytes(b"stale")
    (out / "agent_1" / "adapter_config.json").write_text('{"base_model_name_or_path": "elsewhere"}')
    (out / "notes.txt").write_text("mine")  # not ours: kept
    (out / "agent_notes").mkdir()  # not a saved-team entry: kept
    trainer = MAGRPOTrainer(
        model=tiny_path, reward_funcs=length_gap, args=make_args(MAGRPOConfig), train_dataset=items
    )
    trainer.save_model(str(out))
    names = sorted(p.name for p in out.iterdir())
    assert {"agent_3", "critic", "critic_2", "reward_model"}.isdisjoint(names), names
    assert {"agent_1", "agent_2", "team.json", "notes.txt", "agent_notes"} <= set(names)
    assert not (out / "agent_1" / "value_head.safetensors").exists()
    assert not (out / "agent_1" / "adapter_config.json").exists()
    assert AgentTeam.from_pretrained(str(out)).num_agents == 2


# ------------------------------------------------------------------------- 9. --help and docstrings
@pytest.mark.parametrize("name", TRL_PARSER_RECIPES)
def test_recipe_help_mentions_config(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_recipe(name).main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--config FILE.yaml" in text and "override the file" in text
    assert f"recipes/{name}.py" in text  # the recipe's own description comes first


def test_testing_docstring_gives_the_real_cache_folder_name(tiny_path):
    import trl_marl.testing

    assert Path(tiny_path).name in trl_marl.testing.__doc__


# ------------------------------------------------------------------ 7. classic-marl traces match the command
@pytest.mark.slow
def test_classic_marl_docs_show_the_default_commands_traces(tmp_path, capsys):
    """docs/classic-marl.md shows the seed-0 greedy traces of `python recipes/gridworld.py` (seeds are trained
    independently, so one seed reproduces them)."""
    load_recipe("gridworld").main(["--seeds", "1", "--no-competitive", "--output_dir", str(tmp_path)])
    traces = [ln.strip() for ln in capsys.readouterr().out.splitlines() if " A: (" in ln or " B: (" in ln]
    assert len(traces) == 8
    doc = (ROOT / "docs" / "classic-marl.md").read_text()
    shown = {" ".join(ln.split()) for ln in doc.splitlines()}
    for line in traces:
        assert " ".join(line.split()) in shown, line
    assert "as the default command above (`python recipes/gridworld.py`) prints them" in doc
