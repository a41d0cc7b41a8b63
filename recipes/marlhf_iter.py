"""Train a team with iterative MARLHF: rounds of collect -> store -> select (replay mode) -> train, with a comparator.

    accelerate launch recipes/marlhf_iter.py                             # tiny local model, coordination task, CPU
    accelerate launch recipes/marlhf_iter.py --num_rounds 4 --preference_replay_mode nearest_k --preference_replay_k 2
    accelerate launch recipes/marlhf_iter.py --comparator_policy history --comparator_kwargs '{"k": 2}'
    trl-marl marlhf-iter --config my_run.yaml                          # the same, as the installed command

Every field of `MARLHFIterConfig` is a flag (see docs/iterative.md).
"""

from trl_marl.cli.recipes import run_command


def main(argv=None):
    return run_command("marlhf-iter", argv, description=__doc__)


if __name__ == "__main__":
    main()
