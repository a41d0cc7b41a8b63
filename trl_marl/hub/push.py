"""Pushing a team to the Hub (`push_team_to_hub`) and the trainer's Hub hooks (`Trainer.push_to_hub`,
`init_hf_repo`, `_push_from_checkpoint` for a team).

The trainer calls these functions with itself; this module never imports the trainer module (it only uses the
trainer's documented attributes: `args`, `num_agents`, `save_model`, `is_world_process_zero`, `_team_description`,
`create_model_card`, `callback_handler`, `state`, `control`, `hub_model_id`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import huggingface_hub
import huggingface_hub.errors
from huggingface_hub import HfApi

from trl_marl.checkpointing.checksums import CHECKSUM_FILE
from trl_marl.hub.cards import write_model_cards
from trl_marl.hub.settings import (
    CARD_FILE,
    HUB_TEAM_LAYOUTS,
    TEAM_FILE,
    UPLOAD_IGNORE,
    _agent_entries,
    agent_repo_id,
    read_team_description,
)

if TYPE_CHECKING:  # pragma: no cover
    from huggingface_hub import CommitInfo

_APIS: dict[str, HfApi] = {}


def _api() -> HfApi:
    """One `HfApi` per endpoint (so `run_as_future` pushes are queued one after the other, as in transformers)."""
    from trl_marl import __version__

    endpoint = huggingface_hub.constants.ENDPOINT
    if endpoint not in _APIS:
        _APIS[endpoint] = HfApi(endpoint=endpoint, library_name="trl_marl", library_version=__version__)
    return _APIS[endpoint]


class HubError(RuntimeError):
    """A Hub request that failed: the message names the Hub endpoint, the repository and how to run offline."""


OFFLINE_ADVICE = (
    "To train without the Hub, set push_to_hub=False (a saved team can be pushed later with "
    "`trainer.push_to_hub()` or `trl_marl.push_team_to_hub(output_dir, repo_id)`); HF_HUB_OFFLINE=1 keeps every "
    "library off the network."
)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP clients' error bases: huggingface_hub moved from `httpx` to `httpx2` (1.x); catch whichever exists."""
    errors: list[type[BaseException]] = [OSError, ValueError, huggingface_hub.errors.HfHubHTTPError]
    for client in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(client).HTTPError)
    return tuple(errors)


@contextlib.contextmanager
def _on_the_hub(action: str, repo_ids: str | Sequence[str] | None) -> Iterator[None]:
    """Turn a failed Hub request (no network, offline mode, refused, unauthorized, ...) into a `HubError` that says
    what was being done to which repository on which endpoint, and how to run offline."""
    try:
        yield
    except HubError:
        raise
    except _transport_errors() as exc:
        repos = [repo_ids] if isinstance(repo_ids, str) else list(repo_ids or [])
        where = ", ".join(repos) or "(no repository)"
        raise HubError(
            f"the Hugging Face Hub ({huggingface_hub.constants.ENDPOINT}) could not {action} {where}: "
            f"{type(exc).__name__}: {exc}. {OFFLINE_ADVICE}"
        ) from exc


def _create_repos(
    layout: str,
    repo_id: str | Sequence[str],
    num_agents: int,
    token: str | None,
    private: bool | None,
) -> tuple[str | None, list[str] | None]:
    """Create (exist_ok) the repo(s) of a team; return (team repo id, per-agent repo ids) with namespaces resolved."""
    api = _api()
    if layout == "team":
        if not isinstance(repo_id, str):
            raise ValueError("hub_team_layout='team' pushes to ONE repo: pass repo_id as a string")
        with _on_the_hub("create the repository", repo_id):
            return api.create_repo(repo_id, token=token, private=private, exist_ok=True).repo_id, None
    if isinstance(repo_id, str):
        ids = [agent_repo_id(repo_id, i + 1) for i in range(num_agents)]
    else:
        ids = list(repo_id)
        if len(ids) != num_agents:
            raise ValueError(f"got {len(ids)} per-agent repo ids for a team of {num_agents} agents")
    with _on_the_hub("create the repositories", ids):
        resolved = [api.create_repo(r, token=token, private=private, exist_ok=True).repo_id for r in ids]
    base = None
    if isinstance(repo_id, str):
        suffix = "-agent-1"
        base = resolved[0][: -len(suffix)] if resolved[0].endswith(suffix) else repo_id
    return base, resolved


def _upload(
    folder: str | os.PathLike,
    description: dict,
    layout: str,
    team_repo_id: str | None,
    agent_repo_ids: Sequence[str] | None,
    *,
    token: str | None,
    revision: str | None,
    commit_message: str,
    run_as_future: bool,
) -> list[CommitInfo | Future]:
    """Upload a saved team (cards already written) in `layout`; one commit per repo."""
    api = _api()
    if layout == "team":
        with _on_the_hub("upload the team to", team_repo_id):
            upload = api.upload_folder(
                repo_id=team_repo_id,
                folder_path=str(folder),
                commit_message=commit_message,
                token=token,
                revision=revision,
                run_as_future=run_as_future,
                allow_patterns=["*/*", TEAM_FILE, CARD_FILE, CHECKSUM_FILE],
                ignore_patterns=list(UPLOAD_IGNORE),
            )
        return [upload]
    entries = _agent_entries(description)
    results = []
    for i, (entry, repo) in enumerate(zip(entries, agent_repo_ids)):
        sub = os.path.join(folder, entry["folder"])
        if not os.path.isdir(sub):
            raise FileNotFoundError(f"agent folder {sub} is missing")
        # the repo's own team.json: the team, this agent's index and every agent's repo
        own = {**description, "hub": {"layout": "per_agent", "agent_index": i, "repo_ids": list(agent_repo_ids)}}
        with open(os.path.join(sub, TEAM_FILE), "w", encoding="utf-8") as f:
            json.dump(own, f, indent=2)
        with _on_the_hub(f"upload agent {i + 1} to", repo):
            results.append(
                api.upload_folder(
                    repo_id=repo,
                    folder_path=sub,
                    commit_message=commit_message,
                    token=token,
                    revision=revision,
                    run_as_future=run_as_future,
                    ignore_patterns=list(UPLOAD_IGNORE),
                )
            )
    return results


def push_team_to_hub(
    trainer_or_folder: Any | str | os.PathLike,
    repo_id: str | Sequence[str] | None = None,
    *,
    layout: str | None = None,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "End of training",
    revision: str | None = None,
    blocking: bool = True,
) -> CommitInfo | Future | list[CommitInfo | Future] | None:
    """Push a team to the Hub with `HfApi.create_repo` + `HfApi.upload_folder`.

    Args:
        trainer_or_folder: a trainer (its team is saved to `args.output_dir` first, on every process) or a folder
            written by `save_model` (`agent_i/` folders and `team.json`).
        repo_id: `layout="team"`: the team repo. `layout="per_agent"`: the base id -- agent i goes to
            `{repo_id}-agent-{i}` (i = 1..n) -- or the list of n per-agent repo ids. For a trainer it defaults to its
            `hub_model_id` (else the output folder's name, as transformers does); required for a folder.
        layout: `"team"` (one repo, a folder per agent + `team.json` + README) or `"per_agent"` (one repo per agent);
            default: the trainer's `hub_team_layout`, `"team"` for a folder.
        token: Hub token for the requests (default: the trainer's `hub_token`, else the locally saved login). It is
            sent in the Authorization header only and never written to any uploaded file.
        private: create the repo(s) private (default: the trainer's `hub_private_repo`); no effect on existing repos.
        commit_message: the commit message of every repo's commit.
        revision: branch to commit to (default: the trainer's `hub_revision`, else the default branch).
        blocking: wait for the uploads; with False the upload(s) run in the background and Futures are returned.

    Before uploading, the cards (every agent's `README.md` and the team's) are rewritten with the final repo ids.
    Never uploaded: `training_args.bin` (it pickles `hub_token`), `checkpoint-*` folders, files starting with `_`.

    Returns:
        `"team"`: the `CommitInfo` (or a Future) of the commit. `"per_agent"`: a list of them, one per agent, in agent
        order. None on non-main processes of a distributed run.
    """
    if not isinstance(trainer_or_folder, (str, os.PathLike)):
        trainer = trainer_or_folder
        args = trainer.args
        trainer.save_model(args.output_dir, _internal_call=True)  # no push of the configured layout
        if not trainer.is_world_process_zero():
            return None
        folder = args.output_dir
        layout = layout or args.hub_team_layout
        if repo_id is None:
            repo_id = getattr(trainer, "hub_model_id", None) or args.hub_model_id or Path(folder).absolute().name
        token = token if token is not None else args.hub_token
        private = private if private is not None else args.hub_private_repo
        revision = revision if revision is not None else args.hub_revision
    else:
        folder = os.fspath(trainer_or_folder)
        layout = layout or "team"
        if repo_id is None:
            raise ValueError("push_team_to_hub(folder) needs repo_id (the team repo, or the per-agent base id / ids)")
    if layout not in HUB_TEAM_LAYOUTS:
        raise ValueError(f"layout must be one of {list(HUB_TEAM_LAYOUTS)}, got {layout!r}")
    description = read_team_description(folder)
    if description is None:
        raise FileNotFoundError(f"{folder} has no {TEAM_FILE}: save the team with trainer.save_model() first")
    n = len(_agent_entries(description))
    team_id, agent_ids = _create_repos(layout, repo_id, n, token, private)
    write_model_cards(folder, description, layout=layout, repo_id=team_id, agent_repo_ids=agent_ids)
    results = _upload(
        folder,
        description,
        layout,
        team_id,
        agent_ids,
        token=token,
        revision=revision,
        commit_message=commit_message,
        run_as_future=not blocking,
    )
    return results[0] if layout == "team" else results


# ------------------------------------------------------------------------------- trainer integration (base.py)
def trainer_repo_ids(trainer: Any) -> tuple[str | None, list[str] | None]:
    """The trainer's team repo id (or per-agent base id) and per-agent repo ids, as far as they are known."""
    team = getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id
    agents = getattr(trainer, "hub_agent_repo_ids", None)
    if agents is None and team and trainer.args.hub_team_layout == "per_agent":
        agents = [agent_repo_id(team, i + 1) for i in range(trainer.num_agents)]
    return team, agents


def write_trainer_cards(
    trainer: Any,
    output_dir: str | os.PathLike,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: Sequence[str] | str | None = None,
) -> None:
    """Cards of a trainer's saved team (called by `_save` and `create_model_card`), pointing at the repos of its
    `hub_model_id` / `hub_team_layout` when set."""
    team, agents = trainer_repo_ids(trainer)
    write_model_cards(
        output_dir,
        trainer._team_description(),
        layout=trainer.args.hub_team_layout,
        repo_id=team,
        agent_repo_ids=agents,
        model_name=model_name,
        dataset_name=dataset_name,
        tags=tags,
    )


def init_trainer_repos(trainer: Any, token: str | None = None, private: bool | None = None) -> None:
    """`Trainer.init_hf_repo` for a team: create the team repo or the per-agent repos (main process only) and set
    `trainer.hub_model_id` (team repo / per-agent base id) and `trainer.hub_agent_repo_ids`."""
    if not trainer.is_world_process_zero():
        return
    args = trainer.args
    repo = args.hub_model_id or Path(args.output_dir).absolute().name
    token = token if token is not None else args.hub_token
    private = private if private is not None else args.hub_private_repo
    team, agents = _create_repos(args.hub_team_layout, repo, trainer.num_agents, token, private)
    trainer.hub_model_id = team
    trainer.hub_agent_repo_ids = agents
    trainer.push_in_progress = None


def push_trainer(
    trainer: Any,
    commit_message: str | None = "End of training",
    blocking: bool = True,
    token: str | None = None,
    revision: str | None = None,
    private: bool | None = None,
    **card_kwargs: Any,
) -> CommitInfo | Future | list[CommitInfo | Future] | None:
    """`Trainer.push_to_hub` for a team: create the repo(s) if needed, save the team, write the cards with
    `card_kwargs` (`model_name`, `dataset_name`, `tags`), wait for a running checkpoint push, upload."""
    unknown = sorted(set(card_kwargs) - {"model_name", "dataset_name", "tags"})
    if unknown:
        raise TypeError(
            f"push_to_hub got unexpected keyword arguments {unknown} (model card: model_name, dataset_name, tags)"
        )
    args = trainer.args
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    token = token if token is not None else args.hub_token
    if trainer.hub_model_id is None:
        trainer.init_hf_repo(token=token, private=private)
    trainer.save_model(_internal_call=True)
    if not trainer.is_world_process_zero():
        return None
    model_name = card_kwargs.pop("model_name", None)
    if model_name is None:
        model_name = (args.hub_model_id or Path(args.output_dir).name).split("/")[-1]
    trainer.create_model_card(model_name=model_name, **card_kwargs)
    revision = revision if revision is not None else args.hub_revision
    trainer._finish_current_push()
    team, agents = trainer_repo_ids(trainer)
    results = _upload(
        args.output_dir,
        trainer._team_description(),
        args.hub_team_layout,
        team,
        agents,
        token=token,
        revision=revision,
        commit_message=commit_message or "End of training",
        run_as_future=not blocking,
    )
    return results[0] if args.hub_team_layout == "team" else results


def push_trainer_checkpoint(trainer: Any, checkpoint_folder: str) -> None:
    """`Trainer._push_from_checkpoint` for a team, by `hub_strategy`: `"end"` nothing; `"every_save"` the team of
    the checkpoint (agents, tokenizers, cards, team.json) to the repo(s); `"checkpoint"` / `"all_checkpoints"` (team
    layout) also the whole checkpoint folder to `last-checkpoint/` / `checkpoint-N/` of the team repo. Pushes run in
    the background; a push is skipped while the previous one runs unless `hub_always_push`."""
    from transformers.trainer_utils import HubStrategy, SaveStrategy
    from transformers.utils.hub import PushInProgress

    args = trainer.args
    strategy = HubStrategy(args.hub_strategy)
    if not trainer.is_world_process_zero() or strategy == HubStrategy.END:
        return
    running = getattr(trainer, "push_in_progress", None)
    if not args.hub_always_push and running is not None and not running.is_done():
        return
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    if args.save_strategy == SaveStrategy.STEPS:
        message = f"Training in progress, step {trainer.state.global_step}"
    else:
        message = f"Training in progress, epoch {int(trainer.state.epoch or 0)}"
    team, agents = trainer_repo_ids(trainer)
    jobs = _upload(
        checkpoint_folder,
        trainer._team_description(),
        args.hub_team_layout,
        team,
        agents,
        token=args.hub_token,
        revision=args.hub_revision,
        commit_message=message,
        run_as_future=True,
    )
    if strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
        path_in_repo = "last-checkpoint" if strategy == HubStrategy.CHECKPOINT else Path(checkpoint_folder).name
        jobs.append(
            _api().upload_folder(
                repo_id=team,
                folder_path=checkpoint_folder,
                path_in_repo=path_in_repo,
                commit_message=message + ", checkpoint",
                token=args.hub_token,
                revision=args.hub_revision,
                run_as_future=True,
                ignore_patterns=["*training_args.bin"],
            )
        )
    if running is None or running.is_done():
        trainer.push_in_progress = PushInProgress(jobs)
    else:
        running.jobs.extend(jobs)
