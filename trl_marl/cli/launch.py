"""The script `accelerate launch` runs for `trl-marl <command> --accelerate_config ...` (one process per rank).

python -m trl_marl.cli.launch <command> [flags]     # what each rank executes
"""

import sys


def main(argv: list[str] | None = None) -> None:
    from trl_marl.cli.recipes import run_command

    argv = list(sys.argv[1:] if argv is None else argv)
    run_command(argv[0], argv[1:])


if __name__ == "__main__":
    main()
