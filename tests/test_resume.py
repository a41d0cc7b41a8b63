"""Exact resume after a SIGKILL, crash-safe checkpoints (a kill at every write point), preemption by a real signal,
and `resume_from_checkpoint=True`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trl_marl.checkpoint import (
    COMPLETE_MARKER,
    PREEMPTED_EXIT_CODE,
    CheckpointError,
    latest_complete_checkpoint,
    resolve_resume_checkpoint,
    set_write_hook,
    staging_folder,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "resume_run.py"
sys.path.insert(0, str(SCRIPT.parent))
import resume_run  # noqa: E402

LOGGED = ("loss", "learning_rate", "env_step", "grad_norm")


def _run_script(*argv, timeout=600):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, argv)], env=env, capture_output=True, text=True, timeout=timeout
    )


def _logged(trainer):
    """Per step: the logged rewards, loss, learning rate, env_step (timings left out)."""
    out = {}
    for entry in trainer.state.log_history:
        if "train_runtime" in entry or "step" not in entry:
            continue
        keep = {
            k: v
            for k, v in entry.items()
            if not k.startswith("time/") and ("reward" in k or k in LOGGED or k.endswith("/learning_rate"))
        }
        out.setdefault(entry["step"], {}).update(keep)
    return out


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.team.state_dict().items()}


def _assert_same_run(full, resumed):
    a, b = _weights(full), _weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"weights differ at {k}"
    assert resumed.state.global_step == full.state.global_step
    assert _logged(resumed) == _logged(full)
    assert resumed.env_step == full.env_step


def kill_and_resume(family, kill_at, tmp_path, tiny_path):
    full = resume_run.build(family, str(tmp_path / "full"), tiny_path)
    full.train()
    out = tmp_path / "killed"
    proc = _run_script(family, out, tiny_path, "--kill-at", kill_at)
    assert proc.returncode == -9, proc.stderr[-3000:]
    resumed = resume_run.build(family, str(out), tiny_path)
    resumed.train(resume_from_checkpoint=True)
    _assert_same_run(full, resumed)
    return full, resumed


def test_magrpo_killed_mid_rollout_resumes_exactly(tmp_path, tiny_path):
    # 2 steps per rollout, 4 steps per epoch: killed at the end of step 4 (no checkpoint of it), the run resumes
    # from checkpoint-3, inside the second rollout (its buffer restored), and crosses an epoch boundary
    _, resumed = kill_and_resume("magrpo", 4, tmp_path, tiny_path)
    assert resumed._restored_from.endswith("checkpoint-3")


@pytest.mark.slow
@pytest.mark.parametrize(
    "family,kill_at",
    [("maac", 3), ("iac", 4), ("mappo", 3), ("madpo", 4), ("marlhf", 3), ("madpoiter", 5), ("marlhfiter", 5)],
)
def test_every_family_killed_and_resumed_exactly(family, kill_at, tmp_path, tiny_path):
    kill_and_resume(family, kill_at, tmp_path, tiny_path)
