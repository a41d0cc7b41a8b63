"""A folder's entries replaced all or nothing: what a final team save uses (`output_dir/agent_1/ ...`, `team.json`,
beside the user's own files and the checkpoints), as checkpoints use their staging folder.

The new entries are written into a staging folder inside the target (same disk: every move is a rename, which needs
no space and cannot fail half-way for lack of it); only once it is complete are the old entries moved aside, the new
ones renamed into place (`team.json`, the marker of a complete team, out first and in last) and the old removed. A
write that fails leaves the previous entries untouched and removes the staging folder.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable

from trl_marl.checkpointing.durable import fsync_dir

__all__ = ["STAGING_NAME", "write_entries_atomically"]

STAGING_NAME = ".tmp-save"
_ASIDE_NAME = ".old-save"


def write_entries_atomically(
    folder: str, write: Callable[[str], None], stale: Iterable[str] = (), marker: str | None = None
) -> None:
    """Call `write(staging)` to write the new entries into a staging folder inside `folder`, then replace the entries
    of the same names, and the `stale` names (left by an earlier save, no longer written), by them. `marker` (a file
    among the new entries) is moved out first and in last, so that a folder holding it holds a complete save. If
    `write` raises, `folder` is left as it was (the staging folder is removed) and the error propagates."""
    os.makedirs(folder, exist_ok=True)
    staging, aside = os.path.join(folder, STAGING_NAME), os.path.join(folder, _ASIDE_NAME)
    for leftover in (staging, aside):  # from a process killed during an earlier save
        shutil.rmtree(leftover, ignore_errors=True)
    os.makedirs(staging)
    try:
        write(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    new = sorted(os.listdir(staging), key=lambda n: n == marker)  # the marker last
    old = [n for n in dict.fromkeys([*new, *stale]) if os.path.lexists(os.path.join(folder, n))]
    old.sort(key=lambda n: n != marker)  # the marker first
    os.makedirs(aside)
    for name in old:
        os.replace(os.path.join(folder, name), os.path.join(aside, name))
    for name in new:
        os.replace(os.path.join(staging, name), os.path.join(folder, name))
    fsync_dir(folder)
    shutil.rmtree(aside, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)
