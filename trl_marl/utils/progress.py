"""Progress bars for the long phases outside `Trainer`'s own bar: preference-pair collection, reward-model fitting,
evaluation. They follow the trainer's `disable_tqdm` and show on the main process only, as `transformers` does."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["progress_bar", "trainer_shows_progress"]


def trainer_shows_progress(trainer: Any) -> bool:
    """Whether `trainer` shows progress bars: `args.disable_tqdm` is off and this is the main process."""
    accelerator = getattr(trainer, "accelerator", None)
    main = accelerator is None or accelerator.is_main_process
    return main and not getattr(trainer.args, "disable_tqdm", False)


def progress_bar(iterable: Iterable, desc: str, enabled: bool = True, total: int | None = None, unit: str = "batch"):
    """`tqdm(iterable)` when `enabled` (and tqdm is importable), else `iterable` unchanged."""
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, dynamic_ncols=True)
