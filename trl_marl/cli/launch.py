"""`--accelerate_config NAME|PATH`: the accelerate configs shipped in the package, the re-launch, and the script each
rank runs (`python -m trl_marl.cli.launch <command> [flags]`).

The configs live in `trl_marl/accelerate_configs/` (package data, so the wheel has them; the repository's top-level
`accelerate_configs/` holds the same files, kept identical by `tests/test_cli.py`). A name that trl_marl does not
ship is looked up in TRL's own configs (`fsdp1`, `zero1`, ...), as `trl --accelerate_config` would.
"""

from __future__ import annotations

import importlib.resources as resources
import sys
from pathlib import Path

__all__ = ["available_configs", "resolve_accelerate_config", "launch", "main"]


def available_configs() -> list[str]:
    """Names `--accelerate_config` accepts: trl_marl's configs, then TRL's that trl_marl does not override."""
    ours = sorted(
        p.name[:-5] for p in resources.files("trl_marl.accelerate_configs").iterdir() if p.name.endswith(".yaml")
    )
    try:
        trls = sorted(
            p.name[:-5] for p in resources.files("trl.accelerate_configs").iterdir() if p.name.endswith(".yaml")
        )
    except ModuleNotFoundError:  # pragma: no cover - TRL is a dependency
        trls = []
    return ours + [n for n in trls if n not in ours]


def resolve_accelerate_config(value: str) -> str:
    """A config file path from `--accelerate_config`'s value: an existing file, or a shipped config's name."""
    if Path(value).is_file():
        return value
    for package in ("trl_marl.accelerate_configs", "trl.accelerate_configs"):
        candidate = resources.files(package).joinpath(f"{value}.yaml")
        if candidate.is_file():
            return str(candidate)
    raise ValueError(
        f"--accelerate_config {value!r} is neither a file nor a shipped config; names: {', '.join(available_configs())}"
    )


def launch(command: str, launch_args: list[str], script_args: list[str]) -> None:
    """Run `accelerate launch <launch_args> -m trl_marl.cli.launch <command> <script_args>` (accelerate's own parser
    and launcher, as TRL's CLI does). Each rank runs the launcher as a module (`-m`): as a script, its folder would
    come first on `sys.path`."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    args = launch_command_parser().parse_args([*launch_args, "--module", "trl_marl.cli.launch", command, *script_args])
    launch_command(args)


def main(argv: list[str] | None = None) -> None:
    """What each rank of `trl-marl <command> --accelerate_config ...` executes: the command's recipe."""
    from trl_marl.cli.recipes import run_command

    argv = list(sys.argv[1:] if argv is None else argv)
    run_command(argv[0], argv[1:])


if __name__ == "__main__":
    main()
