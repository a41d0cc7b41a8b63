"""Faults found before they cost a run, and saves that never leave a half-written state (docs/failures.md): a
diverged step stops the run before anything non-finite is applied or saved; a read-only or full output folder is
refused at construction; a save that fails (a full disk) leaves the previous checkpoint / team intact and no staging
files; a damaged random-state file is named."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest
import torch
from conftest import cpu_args, letters_reward

ITEMS = [{"prompt": f"Write about topic {i}."} for i in range(4)]


def _magrpo(tmp_path, **overrides):
    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.testing import tiny_model_path

    return MAGRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=letters_reward,
        args=cpu_args(MAGRPOConfig, tmp_path, **overrides),
        train_dataset=ITEMS,
    )


def _all_finite(folder) -> bool:
    from safetensors.torch import load_file

    files = list(folder.rglob("*.safetensors"))
    assert files
    return all(torch.isfinite(t).all() for f in files for t in load_file(f).values())


# ------------------------------------------------------------------------------------------ non-finite steps
def test_a_diverging_learning_rate_stops_the_run_before_anything_non_finite_is_saved(tmp_path):
    """learning_rate=1e30 (finite, so the config takes it): the first update throws the weights to ~1e30, the next
    forward overflows. The run stops with the step, the agents and the likely causes, and every checkpoint it wrote
    holds finite weights. On the old code it trained on and `save_model()` wrote NaN weights."""
    from trl_marl.trainers.finite import NonFiniteError

    trainer = _magrpo(tmp_path, learning_rate=1e30, max_steps=4, save_strategy="steps", save_steps=1)
    with pytest.raises(NonFiniteError) as err:
        trainer.train()
    message = str(err.value)
    assert re.search(r"MAGRPOTrainer: optimizer step 2: the (loss|gradient norm) is nan", message), message
    # agent_1's gradient is checked when it takes its step, right after its backward (`agent_losses.step_each_agent`)
    assert "non-finite gradient in agent_1" in message and "had already taken it" not in message
    assert "learning rate too high (learning_rate=1e+30)" in message and "rewards too large" in message
    assert f"resume from {tmp_path / 'out' / 'checkpoint-1'}" in message
    checkpoints = sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-1"] and _all_finite(tmp_path / "out" / "checkpoint-1")


@pytest.mark.parametrize("agent", [0, 1])
def test_a_non_finite_gradient_names_its_agent_and_is_never_applied(tmp_path, agent):
    """One agent's gradient becomes inf while the loss stays finite: the optimizer step is refused, naming that
    agent, and no weight of it moved. On one process each agent but the last takes its step right after its
    backward (`trl_marl.trainers.agent_losses`): an inf in the first agent stops the run before anything moved; an
    inf in the second stops it after the first agent's (finite) update, which the error names."""
    from trl_marl.trainers.finite import NonFiniteError

    trainer = _magrpo(tmp_path)
    before = {k: v.clone() for k, v in trainer.team.state_dict().items()}
    param = next(p for _, p in trainer.team.agent_named_parameters(agent))
    param.register_hook(lambda g: torch.full_like(g, float("inf")))
    stopped = "training stopped before the step was applied"
    if agent == 1:
        stopped += r" to the other agents \(agent_1 had already taken it in memory"
    with pytest.raises(
        NonFiniteError,
        match=rf"optimizer step 1: the gradient norm is inf \(non-finite gradient in agent_{agent + 1}\); {stopped}",
    ):
        trainer.train()
    moved = {k.split(".")[1] for k, v in trainer.team.state_dict().items() if not torch.equal(before[k], v)}
    assert moved == ({"0"} if agent == 1 else set())


def test_non_finite_weights_are_never_saved(tmp_path):
    from trl_marl.trainers.finite import NonFiniteError

    trainer = _magrpo(tmp_path)
    trainer.save_model(str(tmp_path / "team"))
    team_json = (tmp_path / "team" / "team.json").read_text()
    with torch.no_grad():
        next(trainer.team.agents[1].parameters()).view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"not saving to .*team at step 0: non-finite weights in agent_2 \("):
        trainer.save_model(str(tmp_path / "team"))
    assert (tmp_path / "team" / "team.json").read_text() == team_json and _all_finite(tmp_path / "team")


# ------------------------------------------------------------------------------------------ the output folder
def test_a_read_only_output_dir_is_refused_at_construction(tmp_path):
    """An existing folder that cannot be written: on the old code found only when the trained team was saved."""
    from trl_marl.checkpointing.space import SaveError

    if os.geteuid() == 0:  # root writes through permissions: a folder of sysfs, where nobody creates files
        out = "/sys/kernel"
        if not os.path.isdir(out) or os.access(out, os.W_OK) and _root_can_create_in(out):
            pytest.skip("no folder that root cannot write")
    else:
        folder = tmp_path / "read_only"
        folder.mkdir()
        folder.chmod(0o555)
        out = str(folder)
    with pytest.raises(SaveError, match=rf"output_dir {out} cannot be written .*Choose a writable output_dir"):
        _magrpo(tmp_path, output_dir=out)


def _root_can_create_in(folder: str) -> bool:
    try:
        os.close(os.open(os.path.join(folder, ".trl_marl_probe"), os.O_CREAT | os.O_WRONLY))
    except OSError:
        return False
    os.remove(os.path.join(folder, ".trl_marl_probe"))
    return True


def test_a_disk_too_small_for_one_checkpoint_is_refused_at_construction(tmp_path, monkeypatch):
    import shutil

    from trl_marl.checkpointing import space

    real = shutil.disk_usage
    monkeypatch.setattr(space.shutil, "disk_usage", lambda p: real(p)._replace(free=1_000_000))
    with pytest.raises(
        space.SaveError,
        match=r"output_dir .*out is on a disk with 1.0 MB free, and a save of this "
        r"team needs about .* MB \(weights .* \+ optimizer state .*\) for one checkpoint",
    ):
        _magrpo(tmp_path, save_strategy="steps", save_steps=1)
    assert not [p for p in (tmp_path / "out").iterdir()]  # the check leaves nothing behind


def test_save_sizes_count_what_a_save_writes(tmp_path):
    from trl_marl.checkpointing.space import save_sizes

    trainer = _magrpo(tmp_path)
    sizes = save_sizes(trainer.team)
    trainer.save_model(str(tmp_path / "team"))
    written = sum(f.stat().st_size for f in (tmp_path / "team").rglob("*.safetensors"))
    assert 0.9 < written / sizes.weights < 1.1
    trainable = sum(p.numel() for p in trainer.team.parameters() if p.requires_grad)
    assert sizes.optimizer == 8 * trainable  # Adam's two fp32 moments


# ------------------------------------------------------------------------------------------ failed saves
def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_disk_full_during_a_checkpoint_keeps_the_previous_one_and_no_staging(tmp_path, monkeypatch):
    """On the old code: `[enforce fail at inline_container.cc]` (or a bare OSError) and the staging folder left."""
    from trl_marl.checkpointing.checkpoint import latest_complete_checkpoint
    from trl_marl.checkpointing.space import SaveError

    trainer = _magrpo(tmp_path, max_steps=2, save_strategy="steps", save_steps=1)
    real = trainer._save_optimizer_and_scheduler

    def fill_the_disk_at_step_2(folder):
        if trainer.state.global_step == 2:
            _disk_full()
        real(folder)

    monkeypatch.setattr(trainer, "_save_optimizer_and_scheduler", fill_the_disk_at_step_2)
    with pytest.raises(SaveError) as err:
        trainer.train()
    out = tmp_path / "out"
    message = str(err.value)
    assert f"could not save to {out / 'checkpoint-2'}: OSError: [Errno 28] No space left on device" in message
    assert "It needs about" in message and "(weights" in message and "are free on that disk" in message
    assert f"{out / 'checkpoint-1'}, the latest complete checkpoint, is intact" in message
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1"]  # no .tmp-checkpoint-2 left
    assert latest_complete_checkpoint(str(out)) == str(out / "checkpoint-1")


def test_a_disk_full_while_the_optimizer_is_written_and_hashed_is_a_save_error(tmp_path, monkeypatch):
    """The optimizer state goes through `HashingWriter` (hashed as written): a full disk there is the same
    `SaveError`, and no staging folder is left."""
    from trl_marl.checkpointing import durable
    from trl_marl.checkpointing.checkpoint import latest_complete_checkpoint
    from trl_marl.checkpointing.space import SaveError

    trainer = _magrpo(tmp_path, max_steps=2, save_strategy="steps", save_steps=1)
    real = durable.HashingWriter._write

    def full_at_step_2(self, data):
        if trainer.state.global_step == 2 and self.path.endswith("optimizer.pt"):
            _disk_full()
        return real(self, data)

    monkeypatch.setattr(durable.HashingWriter, "_write", full_at_step_2)
    with pytest.raises(SaveError, match=r"checkpoint-2: OSError: \[Errno 28\] No space left on device"):
        trainer.train()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1"]
    assert latest_complete_checkpoint(str(out)) == str(out / "checkpoint-1")


def test_a_disk_full_at_the_final_save_leaves_the_previous_team_loadable(tmp_path, monkeypatch):
    """On the old code the earlier team was cleared first, then agent_1 was written, agent_2 half-written, and no
    team.json: nothing loadable was left."""
    from trl_marl import AgentTeam
    from trl_marl.checkpointing.space import SaveError

    trainer = _magrpo(tmp_path)
    team_dir = tmp_path / "team"
    trainer.save_model(str(team_dir))
    before = (team_dir / "team.json").read_text()
    trainer.train()  # the weights move: a new save would differ
    agent_class, calls = type(trainer.team.agents[1]), []
    save_pretrained = agent_class.save_pretrained

    def full_on_the_second_agent(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            _disk_full()
        return save_pretrained(self, *args, **kwargs)

    monkeypatch.setattr(agent_class, "save_pretrained", full_on_the_second_agent)
    with pytest.raises(
        SaveError,
        match=r"could not save to .*team: OSError: \[Errno 28\] No space left on device\. "
        r"It needs about .* \(the weights\); .* are free on that disk\. The team saved there before "
        r"is intact",
    ):
        trainer.save_model(str(team_dir))
    assert (team_dir / "team.json").read_text() == before
    assert sorted(p.name for p in team_dir.iterdir() if p.name.startswith(".")) == []  # no staging left
    monkeypatch.undo()
    AgentTeam.from_pretrained(str(team_dir))  # checksums and all: the earlier team, whole


def test_a_final_save_replaces_the_team_whole(tmp_path):
    trainer = _magrpo(tmp_path)
    team_dir = tmp_path / "team"
    (team_dir / "agent_3").mkdir(parents=True)  # what an earlier, larger team left
    (team_dir / "notes.txt").write_text("mine")
    trainer.save_model(str(team_dir))
    names = sorted(p.name for p in team_dir.iterdir())
    assert names == [
        "README.md",
        "agent_1",
        "agent_2",
        "checksums.json",
        "notes.txt",
        "team.json",
        "training_args.bin",
    ]
    assert json.loads((team_dir / "team.json").read_text())["num_agents"] == 2


# ------------------------------------------------------------------------------------------ damaged random states
@pytest.mark.parametrize("name", ["rng_state.pth", "rng_streams_0.pt"])
def test_a_damaged_random_state_file_is_named_with_what_to_do(tmp_path, name):
    """On the old code: torch's `weights_only` advice (or a zip error), not naming the file."""
    from trl_marl.checkpointing.state_files import CorruptedStateError

    trainer = _magrpo(tmp_path, save_strategy="steps", save_steps=1)
    trainer.train()
    checkpoint = tmp_path / "out" / "checkpoint-1"
    (checkpoint / name).write_bytes(b"\x00" * (checkpoint / name).stat().st_size)
    with pytest.raises(
        CorruptedStateError,
        match=rf"{checkpoint / name}: the random states cannot be read .*resume "
        rf"from an earlier checkpoint of {tmp_path / 'out'}",
    ):
        trainer._load_rng_state(str(checkpoint))
