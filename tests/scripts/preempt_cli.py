"""`trl-marl` with a SIGTERM sent during its evaluation after training (tests/test_preemption.py).

`preempt_cli.py COMMAND [FLAGS...]` runs `trl-marl COMMAND FLAGS...` in this process, the second evaluation (the
one after training: the CLI's own, or the final evaluation inside a preference trainer's `train()`) sending this
process SIGTERM before it runs.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

os.environ.setdefault("CI", "1")
torch.set_num_threads(1)


def main() -> int:
    from trl_marl.cli.main import main as trl_marl
    from trl_marl.trainers.evaluation import TaskEvaluator

    evaluate, calls = TaskEvaluator.evaluate, []

    def signalled(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(self, *args, **kwargs)

    TaskEvaluator.evaluate = signalled
    return trl_marl(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
