"""`current_copy` under DeepSpeed ZeRO-3 (2 CPU processes): the copy is built from the gathered weights (issue 13)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import launch_failure

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_current_copy_under_zero3_equals_the_gathered_weights(tmp_path, tiny_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "accelerate_configs" / "zero3_cpu.yaml"),
        str(ROOT / "tests" / "scripts" / "dist_current_copy.py"),
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, launch_failure(proc)
    for rank in (0, 1):
        info = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert info["deepspeed"] and info["partitioned"], info  # the live agents really are ZeRO-3 partitions
        assert info["copy_numel"] == info["live_numel"] and all(n > 0 for n in info["copy_numel"]), info
        assert info["equal"], info
        assert info["completed_rounds"] == 1 and info["global_step"] > 0, info
