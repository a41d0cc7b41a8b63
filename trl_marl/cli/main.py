"""`trl-marl`: the command-line entry point, shaped like TRL's `trl`.

    trl-marl madpo                                        # the tiny local model on the built-in task, in-process
    trl-marl magrpo --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name data.jsonl \
        --reward_funcs trl.rewards:think_format_reward --use_peft --accelerate_config multi_gpu
    trl-marl maac --config run.yaml
    trl-marl env                                          # versions, for bug reports
    trl-marl estimate MODEL --num_agents 2 --world_size 8 # per-rank memory per engine (trl_marl.distributed.memory)
    trl-marl vllm-serve --model MODEL --num_agents 2      # a team's vLLM server (trl_marl.generation.vllm_server)

A training command runs in this process unless `--accelerate_config NAME|PATH` or `accelerate launch` flags
(`--num_processes 2`, ...) are given: then it re-launches itself through `accelerate launch` (as `trl <algo>` does),
with the named config shipped in the package (`trl_marl/accelerate_configs/`, then TRL's).
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentParser, RawDescriptionHelpFormatter

from trl_marl.cli.recipes import RECIPES

__all__ = ["main", "print_env"]

TOOLS = ("env", "estimate", "vllm-serve")  # the commands that do not train


def _split_accelerate_config(argv: list[str]) -> tuple[list[str], str | None]:
    out, value, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--accelerate_config":
            if i + 1 >= len(argv):
                raise SystemExit("trl-marl: --accelerate_config needs a value (a config name or a file path)")
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--accelerate_config="):
            value = arg.split("=", 1)[1]
        else:
            out.append(arg)
        i += 1
    return out, value


def _subtract_subsequence(items: list[str], sub: list[str]) -> list[str]:
    """`items` without the ordered subsequence `sub` (TRL's CLI splits its arguments the same way)."""
    it = iter(sub)
    current = next(it, None)
    kept = []
    for item in items:
        if current is not None and item == current:
            current = next(it, None)
        else:
            kept.append(item)
    return kept


def _epilog() -> str:
    from trl_marl.cli.launch import available_configs
    from trl_marl.tasks import TASKS

    return (
        f"tasks (--task): {', '.join(TASKS)}\n"
        f"accelerate configs (--accelerate_config): {', '.join(available_configs())}, or a file path\n"
        "every config field is a flag and a --config YAML key; `trl-marl <command> --help` lists them"
    )


def _build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="trl-marl",
        description="Train teams of LLM agents with multi-agent RL and preference learning (on TRL).",
        epilog=_epilog(),
        formatter_class=RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join([*RECIPES, *TOOLS]) + "}")
    for recipe in RECIPES.values():
        sub.add_parser(recipe.name, help=f"train with {recipe.help}", add_help=False)
    sub.add_parser("env", help="print the versions of trl_marl and its stack (for bug reports)")
    sub.add_parser("estimate", help="per-rank memory of a team for DDP / ZeRO-2 / ZeRO-3 / FSDP2", add_help=False)
    sub.add_parser("vllm-serve", help="serve a team's generation with vLLM for vllm_mode='server'", add_help=False)
    return parser


def print_env() -> None:
    """Print what a bug report needs: trl_marl, Python, the platform, the stack's versions, devices, accelerate."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def v(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    from trl_marl import __version__

    devices = "cpu only"
    if torch.cuda.is_available():
        devices = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    lines = {
        "trl_marl": __version__,
        "Platform": platform.platform(),
        "Python": platform.python_version(),
        **{
            name: v(name)
            for name in ("trl", "transformers", "torch", "accelerate", "peft", "deepspeed", "datasets", "vllm")
        },
        "Devices": devices,
    }
    try:
        from accelerate.commands.config import default_config_file

        lines["accelerate default config"] = (
            default_config_file if os.path.isfile(default_config_file) else "not found"
        )
    except ImportError:  # pragma: no cover
        pass
    print("Copy-paste the following information when reporting an issue:\n")
    for key, value in lines.items():
        print(f"- {key}: {value}")


def main(argv: list[str] | None = None) -> int:
    """Run `trl-marl`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if command == "env":
        print_env()
        return 0
    if command == "estimate":  # `trl-marl estimate MODEL --num_agents 2 --engine zero3 ...`
        from trl_marl.distributed.memory import main as estimate_main

        return estimate_main(rest)
    if command == "vllm-serve":
        from trl_marl.generation.vllm_server import main as serve_main

        return serve_main(rest)
    if command not in RECIPES:
        parser.error(f"unknown command {command!r}; choose from {', '.join([*RECIPES, *TOOLS])}")
    rest, accelerate_config = _split_accelerate_config(rest)

    from trl_marl.cli.launch import available_configs
    from trl_marl.cli.recipes import make_parser

    # Handles --help (exits). What the recipe's parser does not know goes to `accelerate launch`, if accelerate
    # knows it: anything else is a one-line error here, not accelerate's whole usage.
    accelerate_help = (
        "--accelerate_config NAME|PATH: run under `accelerate launch` with a config shipped in the package ("
        + ", ".join(available_configs())
        + ") or a config file; other `accelerate launch` flags are passed on."
    )
    recipe_parser = make_parser(command, more_help=accelerate_help)
    *_, config_remaining, cli_remaining = recipe_parser.parse_args_and_config(
        rest, return_remaining_strings=True, separate_remaining_strings=True
    )
    from accelerate.commands.launch import launch_command_parser

    from trl_marl.cli.recipe_args import check_unknown_flags, option_flags

    accelerate_flags = option_flags(launch_command_parser())
    check_unknown_flags(f"trl-marl {command}", recipe_parser, config_remaining, cli_remaining, rest, accelerate_flags)
    launch_args = config_remaining + cli_remaining
    if accelerate_config is None and not launch_args:
        from trl_marl.cli.recipes import run_command

        run_command(command, rest)
        return 0

    from trl_marl.cli.launch import launch, resolve_accelerate_config

    if accelerate_config is not None:
        launch_args = ["--config_file", resolve_accelerate_config(accelerate_config), *launch_args]
    launch(command, launch_args, _subtract_subsequence(rest, cli_remaining))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
