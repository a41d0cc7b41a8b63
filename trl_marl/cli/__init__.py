"""The `trl-marl` command (installed by the wheel), shaped like TRL's `trl` command: see `trl_marl.cli.main`."""

from trl_marl.cli.main import main

__all__ = ["main"]
