"""Preemption covers the whole run (docs/checkpoints.md, docs/failures.md): SIGTERM / SIGUSR1 are handled from the
first line of `train()` (pair collection, reward-model fitting) to the end of the CLI's final evaluation and save,
and every such run exits with status 75 leaving a complete checkpoint or the saved team.

The end-of-step path (a signal inside the training loop) is tested in tests/test_resume.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_resume import _assert_same_run, _run_script, resume_run

from trl_marl.checkpointing.checkpoint import PREEMPTED_EXIT_CODE, PreemptionHandler, latest_complete_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_nested_covering_keeps_the_handlers_and_the_signal_of_the_outer_block():
    """The CLI's block around `train()` and its final save holds the handlers; `train()`'s own block inside it must
    neither drop them nor forget a signal received inside it."""
    before = signal.getsignal(signal.SIGTERM)
    handler = PreemptionHandler()
    with handler.covering():
        with handler.covering():
            assert handler.nested
            os.kill(os.getpid(), signal.SIGTERM)
        assert not handler.nested and handler.requested and handler.signal_name == "SIGTERM"
        assert signal.getsignal(signal.SIGTERM) == handler._handle
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigterm_during_the_final_evaluation_inside_train_checkpoints_the_last_step(tmp_path, tiny_path):
    """MADPO evaluates at the end of `train()`: a signal there (no outer block) writes a complete checkpoint of the
    last step and exits with 75, also with save_strategy="no". On the old code the handler was gone by then: -15."""
    trainer = resume_run.build("madpo", str(tmp_path / "run"), tiny_path, save=False)
    trainer.eval_dataset = resume_run.items()
    trainer.args.max_steps, trainer.args.eval_num_samples = 2, 2
    evaluate = trainer.evaluate

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(*args, **kwargs)

    trainer.evaluate = signalled
    with pytest.raises(SystemExit) as stopped:
        trainer.train()
    assert stopped.value.code == PREEMPTED_EXIT_CODE
    assert latest_complete_checkpoint(str(tmp_path / "run")) == str(tmp_path / "run" / "checkpoint-2")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are put back


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, phase", [("madpo", "collection"), ("marlhf", "collection"), ("marlhf", "reward_fit")]
)
def test_sigterm_before_the_first_step_checkpoints_what_the_phase_produced(family, phase, tmp_path, tiny_path):
    """SIGTERM during MADPO's / MARLHF's pair collection or MARLHF's reward-model fitting: the phase ends, a complete
    `checkpoint-0` holds its result, the run exits with 75, and resuming neither collects nor fits again and gives
    the uninterrupted run. On the old code the handler was installed after these phases: exit -15, nothing saved."""
    full = resume_run.build(family, str(tmp_path / "full"), tiny_path, save=False)
    full.train()
    out = tmp_path / "preempted"
    proc = _run_script(family, out, tiny_path, "--signal-in", phase, "--no-save")
    assert proc.returncode == PREEMPTED_EXIT_CODE, proc.stderr[-3000:]
    assert "stopped by SIGTERM at step 0" in proc.stderr and str(out / "checkpoint-0") in proc.stderr
    assert latest_complete_checkpoint(str(out)) == str(out / "checkpoint-0")

    resumed = resume_run.build(family, str(out), tiny_path, save=False)

    def never(*args, **kwargs):
        raise AssertionError("a phase the checkpoint holds ran again")

    resumed.collect_preference_pairs = never
    if phase == "reward_fit":
        resumed.fit_reward_model = never
    resumed.train(resume_from_checkpoint=True)
    _assert_same_run(full, resumed)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["magrpo", "madpo"])
def test_sigterm_during_the_cli_final_evaluation_saves_the_team_and_exits_75(command, tmp_path, tiny_path):
    """SIGTERM during the evaluation after training (the CLI's own for MAGRPO, the one inside MADPO's `train()`):
    the evaluation finishes, the trained team is saved, the run exits with 75. On the old code: exit -15 and the
    trained team never saved."""
    out = tmp_path / "run"
    flags = ["--output_dir", str(out), "--max_steps", "2", "--eval_num_samples", "2", "--disable_tqdm", "true"]
    if command == "madpo":
        flags += ["--preference_num_candidates", "2"]
    else:
        flags += ["--num_generations", "2", "--max_completion_length", "4"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    script = ROOT / "tests" / "scripts" / "preempt_cli.py"
    proc = subprocess.run(
        [sys.executable, str(script), command, *flags], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == PREEMPTED_EXIT_CODE, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "eval reward after training" in proc.stdout and "saved 2 agent models" in proc.stdout
    assert f"stopped by SIGTERM after training; the trained team is saved in {out}" in proc.stderr
    from trl_marl import AgentTeam

    assert len(AgentTeam.from_pretrained(str(out)).agents) == 2  # complete, checksums verified
