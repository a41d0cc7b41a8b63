"""The checkpoint / resume part of a trainer: the team folders it saves, each process's resume state, preemption.

A saved team (`trainer.save_model()`, and the model part of every checkpoint) is one folder per agent, `agent_1/ ...
agent_n/`, each a `save_pretrained` folder with the agent's tokenizer (an adapter folder for a PEFT agent), plus
`team.json` (what `AgentTeam.from_pretrained` reads), the cards and `training_args.bin`. A checkpoint adds, per
process, the state an exact resume needs (`trl_marl_state_rank{r}.pt`: the step inside the rollout, the buffered
rollout, `env_step`, the metrics since the last log, the random streams and the trainer's extra state), written and
read by `trl_marl.checkpointing.checkpoint` (crash-safe folders, the `weights_only` allowlist).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

from trl_marl.checkpointing.atomic import write_entries_atomically
from trl_marl.checkpointing.checkpoint import (
    PREEMPTED_EXIT_CODE,
    CheckpointError,
    PreemptionHandler,
    checkpoint_status,
    is_staging_folder,
    latest_complete_checkpoint,
    load_resume_state,
    save_checkpoint_atomically,
)
from trl_marl.checkpointing.checksums import CHECKSUM_FILE, write_folder_checksums
from trl_marl.checkpointing.space import SaveError, check_output_dir, failed_save, is_write_failure, save_sizes
from trl_marl.checkpointing.state_files import CorruptedStateError
from trl_marl.distributed.collective import destroy_process_group_at_exit
from trl_marl.generation.engine import GenerationUnavailable
from trl_marl.hub import (
    CARD_FILE,
    TEAM_FILE,
    agent_role,
    saved_team_entries,
    team_metadata,
    write_trainer_cards,
)
from trl_marl.rewards import RewardFunctionError
from trl_marl.rollout.prompts import PromptError
from trl_marl.trainers.finite import check_weights
from trl_marl.utils.secrets import redacted_args

__all__ = [
    "checkpoint_identity",
    "save_team",
    "check_output_space",
    "resume_state",
    "restore",
    "team_description",
    "save_agents",
    "write_team_files",
    "load_agents_from",
    "load_weights",
    "load_process_state",
    "save_rng_streams",
    "load_rng_streams",
    "damaged_rng_state_named",
    "PreemptionCallback",
    "run_training",
    "stop_if_preempted",
    "preemption_covered",
    "exit_preempted",
    "save_after_failure",
]

logger = logging.getLogger(__name__)

# what `train()` checkpoints before raising: a dead generation server, a reward function that raised, a bad prompt
_SAVED_FAILURES = (GenerationUnavailable, RewardFunctionError, PromptError)


def save_team(trainer: Any, output_dir: str, state_dict: dict | None = None) -> None:
    """Write `trainer`'s team to `output_dir`: `agent_1/ ... agent_n/` (`save_agents`), what the trainer saves beside
    them (`trainer._save_extra`: critics, a reward model), `team.json` and `training_args.bin` (`write_team_files`),
    the cards and `checksums.json`. `state_dict` is the team's (as the engine gathered it); None: the team's own.

    All or nothing: a non-finite weight is refused before anything is written (`trl_marl.trainers.finite`); the team
    is written beside the previous one and renamed into place (`trl_marl.checkpointing.atomic`), so a save that fails
    (a full disk: `SaveError`, naming the path and the bytes needed) leaves the previous team as it was; what an
    earlier run saved that this one does not write (a third agent, a critic) is removed. Inside a checkpoint's
    staging folder the checkpoint's own commit makes it atomic."""
    team = trainer.team
    if state_dict is None:
        state_dict = team.state_dict()
    check_weights(trainer, state_dict, output_dir)
    if is_staging_folder(output_dir):  # a checkpoint's marker holds the digest of every file already
        os.makedirs(output_dir, exist_ok=True)
        _write_team(trainer, output_dir, state_dict)
        return

    def write(folder: str) -> None:
        _write_team(trainer, folder, state_dict)
        write_folder_checksums(folder, saved_team_entries(folder), exclude_names=[CARD_FILE])

    stale = [*saved_team_entries(output_dir), CHECKSUM_FILE] if os.path.isdir(output_dir) else []
    try:
        write_entries_atomically(output_dir, write, stale, marker=TEAM_FILE)
    except Exception as exc:
        if not is_write_failure(exc) or isinstance(exc, SaveError):
            raise
        previous = os.path.isfile(os.path.join(output_dir, TEAM_FILE))
        intact = "The team saved there before is intact." if previous else "Nothing was left there."
        sizes = save_sizes(team, trainer.is_deepspeed_enabled)
        raise failed_save(output_dir, exc, sizes, False, intact) from exc


def _write_team(trainer: Any, folder: str, state_dict: dict) -> None:
    save_agents(folder, trainer.team, trainer.tokenizers, state_dict)
    trainer._save_extra(folder, state_dict)
    write_team_files(folder, trainer._team_description(), trainer.args)
    write_trainer_cards(trainer, folder)


def check_output_space(trainer: Any) -> None:
    """At construction, on the processes that save: `output_dir` must be writable and its disk must hold the largest
    save this run makes (a checkpoint when `save_strategy` checkpoints, else the team), so that a read-only or full
    disk is found before training, not at the end (`trl_marl.checkpointing.space`)."""
    args = trainer.args
    if not args.should_save:
        return
    sizes = save_sizes(trainer.team, trainer.is_deepspeed_enabled)
    checkpoints = args.save_strategy != "no"
    needed = sizes.checkpoint if checkpoints else sizes.weights
    what = sizes.describe(checkpoints) + (" for one checkpoint" if checkpoints else " for the team")
    check_output_dir(args.output_dir, needed, what)


def checkpoint_identity(trainer: Any) -> dict:
    """What a checkpoint records about the run that wrote it, checked when one is resumed: the trainer, the algorithm
    and the team (a checkpoint of another trainer or team is refused as such, not called damaged)."""
    return {
        "trainer": type(trainer).__name__,
        "algorithm": trainer._name,
        "num_agents": trainer.num_agents,
        "agents": list(trainer.agent_names),
    }


def resume_state(trainer: Any) -> dict:
    """What one process of `trainer` needs to continue exactly (saved in every checkpoint as
    `trl_marl_state_rank{r}.pt`; the global torch / numpy / python random states are transformers' `rng_state*.pth`):
    the step inside the rollout, `env_step`, the buffered rollout, the last evaluation reward, the metrics recorded
    since the last log, the random streams and the trainer's `_extra_resume_state()`."""
    return {
        "num_processes": trainer.accelerator.num_processes,
        "step": trainer._step,
        "env_step": trainer.env_step,
        "buffered": trainer._buffered,
        "last_eval_reward": trainer._last_eval_reward,
        "metrics": trainer._metrics.state_dict(),
        "rng_streams": trainer.rng_streams.state_dict(),
        "extra": trainer._extra_resume_state(),
    }


def restore(trainer: Any, checkpoint: str) -> None:
    """Restore what `resume_state` saved in `checkpoint` for this process (`load_process_state`), the trainer's extra
    state through `trainer._restore_extra_state`."""
    state = load_process_state(checkpoint, trainer.accelerator, trainer.all_resume_types())
    trainer._step = int(state["step"])
    trainer.env_step = int(state["env_step"])
    trainer._buffered = state["buffered"]
    trainer._last_eval_reward = state.get("last_eval_reward")
    trainer._metrics.load_state_dict(state.get("metrics", {}))
    if state.get("rng_streams") is not None:
        trainer.rng_streams.load_state_dict(state["rng_streams"])
    trainer._restore_extra_state(checkpoint, state.get("extra", {}))


def team_description(trainer: Any) -> dict:
    """`team.json`'s content: the algorithm, each agent's folder, source, formatter and role, the reward, the joint
    mode and number of turns, and `trl_marl.hub.team_metadata` (the safe training config, the paper, the tags)."""
    formatters = trainer.formatters
    return {
        "algorithm": trainer._name,
        "num_agents": trainer.num_agents,
        "agents": [
            {
                "folder": f"agent_{i + 1}",
                "source": trainer.agent_names[i],
                "formatter": getattr(formatters[i], "__qualname__", type(formatters[i]).__name__),
                "role": agent_role(formatters[i], i),
            }
            for i in range(trainer.num_agents)
        ],
        "reward_func": trainer.reward.name,
        "joint_mode": trainer.args.joint_mode,
        "num_turns": trainer.args.num_turns,
        **team_metadata(trainer),
    }


def save_agents(output_dir: str, team: nn.Module, tokenizers: Sequence[Any], state_dict: dict) -> None:
    """Write `agent_1/ ... agent_n/`: each agent's `save_pretrained` folder (its weights taken from `state_dict`, the
    team's, so a sharded team saves what the engine gathered) with its tokenizer."""
    for i, agent in enumerate(team.agents):
        prefix = "shared." if team.shared_base else f"agents.{i}."  # a LoRA team's agents share `shared`
        sub = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        folder = os.path.join(output_dir, f"agent_{i + 1}")
        agent.save_pretrained(folder, state_dict=sub or None)
        tokenizers[i].save_pretrained(folder)


def write_team_files(output_dir: str, description: dict, args: Any) -> None:
    """`team.json` (the team's description) and `training_args.bin` (the config as `TrainingArguments` pickles it,
    minus anything secret: `trl_marl.utils.secrets`)."""
    with open(os.path.join(output_dir, TEAM_FILE), "w", encoding="utf-8") as f:
        json.dump(description, f, indent=2)
    torch.save(redacted_args(args), os.path.join(output_dir, "training_args.bin"))


def load_agents_from(checkpoint: str, team: nn.Module) -> None:
    """Load every agent of `team` from `agent_i/` of a folder written by `save_agents`."""
    for i, agent in enumerate(team.agents):
        load_weights(agent, os.path.join(checkpoint, f"agent_{i + 1}"))


def load_weights(module: nn.Module, folder: str) -> None:
    """Load a saved agent (or critic backbone) folder of a checkpoint into `module`: an adapter on a shared base, a
    PEFT adapter, or full (possibly sharded) `safetensors` weights. A missing or damaged file is a
    `CorruptedStateError` naming it; weights that do not match the module are a RuntimeError."""
    from safetensors.torch import load_file as _load_file

    fix = f"delete {os.path.dirname(os.path.abspath(folder))} and resume from the checkpoint before it"

    def load_file(path: str) -> dict:
        try:
            return _load_file(path)
        except Exception as exc:  # noqa: BLE001 -- safetensors / OS errors of a damaged file
            raise CorruptedStateError(path, f"unreadable weights ({type(exc).__name__}: {exc})", fix) from exc

    if not os.path.isdir(folder):
        raise CorruptedStateError(folder, "the folder is missing", fix)
    if hasattr(module, "load_saved"):  # an adapter on a shared base
        module.load_saved(folder)
        return
    adapter_file = os.path.join(folder, "adapter_model.safetensors")
    if os.path.isfile(adapter_file):  # a PEFT agent: its adapter
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(module, load_file(adapter_file))
        return
    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(single):
        state = load_file(single)
    elif os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        state = {}
        for fn in files:
            state.update(load_file(os.path.join(folder, fn)))
    else:
        raise CorruptedStateError(folder, "no model weights (model.safetensors or model.safetensors.index.json)", fix)
    missing, unexpected = module.load_state_dict(state, strict=False)
    tied = set(getattr(module, "_tied_weights_keys", None) or [])
    tied |= {
        k for k in missing if k.endswith("lm_head.weight") and getattr(module.config, "tie_word_embeddings", False)
    }
    bad = [k for k in missing if k not in tied]
    if bad or unexpected:
        raise RuntimeError(f"checkpoint {folder} does not match the agent: missing {bad}, unexpected {unexpected}")


def load_process_state(checkpoint: str, accelerator: Any, resume_types: Sequence[type]) -> dict:
    """This process's resume state of `checkpoint` (only `resume_types` besides tensors and containers are
    unpickled); a `CheckpointError` when it was written by another number of processes (each process resumes its own
    rollout buffer and random streams)."""
    state = load_resume_state(checkpoint, accelerator.process_index, resume_types)
    saved_world = state.get("num_processes", accelerator.num_processes)
    if saved_world != accelerator.num_processes:
        raise CheckpointError(
            f"{checkpoint} was written by {saved_world} process(es) and this run has "
            f"{accelerator.num_processes}: each process resumes its own rollout buffer and random streams; "
            f"resume with {saved_world} process(es)"
        )
    return state


def save_rng_streams(streams: Any, output_dir: str, rank: int) -> None:
    """This process's random streams (`trl_marl.data_types.rng.RNGStreams`) as `rng_streams_{rank}.pt`."""
    torch.save(streams.state_dict(), os.path.join(output_dir, f"rng_streams_{rank}.pt"))


def load_rng_streams(streams: Any, checkpoint: str, rank: int) -> None:
    """Restore what `save_rng_streams` wrote (nothing when the checkpoint has no such file)."""
    path = os.path.join(checkpoint, f"rng_streams_{rank}.pt")
    if os.path.isfile(path):
        with damaged_rng_state_named(checkpoint, rank, path):
            streams.load_state_dict(torch.load(path, weights_only=True))


@contextlib.contextmanager
def damaged_rng_state_named(checkpoint: str | None, rank: int, path: str | None = None) -> Iterator[None]:
    """A random-state file of `checkpoint` that cannot be read (transformers' `rng_state*.pth`, or `path`) is a
    `CorruptedStateError` naming the file and what to do, instead of torch's `weights_only` advice."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 -- an unpickling / zip error of a damaged file
        if checkpoint is None:
            raise
        if path is None:
            single = os.path.join(checkpoint, "rng_state.pth")
            path = single if os.path.isfile(single) else os.path.join(checkpoint, f"rng_state_{rank}.pth")
        raise CorruptedStateError(
            path,
            f"the random states cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
            f"the file is damaged: resume from an earlier checkpoint of {os.path.dirname(os.path.normpath(checkpoint))} "
            "(resume_from_checkpoint=<its folder>)",
        ) from exc


def _any_process_requested(handler: PreemptionHandler, accelerator: Any) -> bool:
    """Whether any process received a preemption signal (a collective when there are several processes: every
    process must ask at the same point)."""
    requested = handler.requested
    if accelerator.num_processes > 1:  # a signal to any process stops all of them at the same point
        flag = torch.tensor([1.0 if requested else 0.0], device=accelerator.device)
        requested = accelerator.reduce(flag, reduction="sum").item() > 0
    return requested


class PreemptionCallback(TrainerCallback):
    """After a preemption signal (to any process): save a checkpoint at the end of the current optimizer step on
    every process, then stop."""

    def __init__(self, handler: PreemptionHandler, accelerator: Any):
        self.handler = handler
        self.accelerator = accelerator

    def on_step_end(self, args, state, control, **kwargs):
        if _any_process_requested(self.handler, self.accelerator):
            self.handler.stop_now = True
            control.should_save = True
            control.should_training_stop = True
        return control


def run_training(trainer: Any, training_loop: Callable[..., Any], resume_from_checkpoint: Any, *args, **kwargs):
    """`trainer.train()`'s phases, with SIGTERM / SIGUSR1 handled from the first to the last: restore the checkpoint
    (`trainer._restore_for_resume`); then, inside `trainer._training_context(checkpoint)`, what comes before the
    loop (`trainer._prepare_training`: pair collection, reward-model fitting), the training loop (`training_loop`,
    `Trainer.train`) and what follows it (`trainer._after_training`: the final evaluation).

    A signal is honoured at the next safe point, with a complete checkpoint and exit status 75: the end of the
    current optimizer step (`PreemptionCallback`); the end of a phase before the loop (`stop_if_preempted`: the
    checkpoint holds what the phases produced, so nothing is redone); the end of `train()`, unless an outer block
    (`preemption_covered`: the CLI's final evaluation and save) handles it. A generation engine that stops answering
    in the loop (`GenerationUnavailable`: a dead vLLM server), a reward function that raises (`RewardFunctionError`)
    and a task item without a usable prompt (`trl_marl.rollout.prompts.PromptError`) get a checkpoint at the step
    boundary before their error is raised (`save_after_failure`); in the middle of a preference pair collection
    (before the loop, or an iterative round's) the checkpoint holds its finished chunks too; in the final evaluation
    after the loop, the checkpoint of the last step (the training is complete: resuming only evaluates again)."""
    handler = trainer._preemption
    with handler.covering():
        checkpoint = trainer._restore_for_resume(resume_from_checkpoint)
        with trainer._training_context(checkpoint):
            try:
                out = trainer._prepare_training(checkpoint)
                trains = out is None
                if trains:
                    loop_checkpoint = _loop_checkpoint(trainer, checkpoint)
                    # a run resumed from a checkpoint of the loop has done nothing since: that checkpoint is the state
                    stop_if_preempted(trainer, "before the first optimizer step", keep=loop_checkpoint)
                    out = training_loop(loop_checkpoint, *args, **kwargs)
            except _SAVED_FAILURES as exc:  # checkpoint, then raise
                save_after_failure(trainer, exc)
                raise
            if trains:
                if handler.stop_now:
                    exit_preempted(trainer)
                try:
                    out = trainer._after_training(out)
                except _SAVED_FAILURES as exc:  # the training is complete: its last step is checkpointed
                    save_after_failure(trainer, exc, trained=True)
                    raise
        if not handler.nested:
            stop_if_preempted(trainer, "after training")
    destroy_process_group_at_exit()
    return out


def _loop_checkpoint(trainer: Any, checkpoint: str | None) -> str | None:
    """The checkpoint `Trainer.train` resumes from: `checkpoint`, except one written before the first optimizer step
    (a preemption during pair collection or reward-model fitting, a failure in the middle of the collection). That
    one holds no optimizer state and the agents are the initial ones: the loop starts afresh from the restored state
    and the checkpoint's global random states. The random streams stay as restored and advanced since (the rest of a
    collection stopped in its middle drew from them)."""
    if checkpoint is None:
        return None
    with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
        if json.load(f).get("global_step", 0) > 0:
            return checkpoint
    streams = trainer.rng_streams.state_dict()
    trainer._load_rng_state(checkpoint)
    trainer.rng_streams.load_state_dict(streams)
    return None


def stop_if_preempted(trainer: Any, when: str, keep: str | None = None) -> None:
    """When any process received SIGTERM / SIGUSR1: write a complete checkpoint of the trainer's state now, then exit
    with status 75. Before the first optimizer step the checkpoint holds the agents, the random states and the resume
    state (collected pairs, the fitted reward model), without optimizer state. `keep`: a complete checkpoint that
    holds the current state already (none is written). Every process must call it at the same point."""
    if not _any_process_requested(trainer._preemption, trainer.accelerator):
        return
    trainer._preemption.stop_now = True
    exit_preempted(trainer, keep or _checkpoint_now(trainer), when)


def _checkpoint_now(trainer: Any) -> str:
    """Write a complete checkpoint of the trainer's state now (replacing one of the same step); before the first
    optimizer step without optimizer state. Returns its folder."""
    step = trainer.state.global_step
    return save_checkpoint_atomically(
        trainer,
        identity=checkpoint_identity(trainer),
        with_optimizer=step > 0,
        save_model=None if step > 0 else _initial_team_saver(trainer),
    )


def _initial_team_saver(trainer: Any) -> Callable[[str], None] | None:
    """How to save the team before the training loop: `save_model`, except under DeepSpeed, whose engine (which
    `save_model` reads) is built by the loop: the team's own weights then, gathered under ZeRO-3."""
    if not (trainer.is_deepspeed_enabled and trainer.deepspeed is None):
        return None

    def save(folder: str) -> None:
        from trl_marl.distributed.zero3 import gathered

        with gathered(trainer.team):
            trainer._save(folder)

    return save


@contextlib.contextmanager
def preemption_covered(trainer: Any, what: str) -> Iterator[None]:
    """SIGTERM / SIGUSR1 handled around `trainer.train()` and what its caller does after it (the CLI's final
    evaluation and save): a signal that arrives after `train()` returned lets the block finish, then exits with status
    75 (`what` says what the block left, e.g. where the team is saved). Inside `train()` the trainer's own handling
    applies (a checkpoint at the next optimizer step)."""
    with trainer._preemption.covering():
        yield
        if _any_process_requested(trainer._preemption, trainer.accelerator):
            signal = trainer._preemption.signal_name or "another process"
            logger.warning(f"{type(trainer).__name__}: stopped by {signal} after training; {what}")
            raise SystemExit(PREEMPTED_EXIT_CODE)


def exit_preempted(trainer: Any, checkpoint: str | None = None, when: str | None = None) -> None:
    """End a preempted run: say where its checkpoint is and exit with `PREEMPTED_EXIT_CODE` (75)."""
    signal = trainer._preemption.signal_name or "another process"
    where = checkpoint or os.path.join(trainer.args.output_dir, f"checkpoint-{trainer.state.global_step}")
    moment = f" ({when})" if when else ""
    logger.warning(
        f"{type(trainer).__name__}: stopped by {signal} at step {trainer.state.global_step}{moment}; checkpoint saved "
        f"in {where}; resume with resume_from_checkpoint=True"
    )
    raise SystemExit(PREEMPTED_EXIT_CODE)


def _remedy(error: BaseException) -> str:
    if isinstance(error, RewardFunctionError):
        return "fix the reward function"
    if isinstance(error, PromptError):
        return "fix or drop the item"
    return "restart the server"


def save_after_failure(trainer: Any, error: BaseException, trained: bool = False) -> None:
    """The generation engine stopped answering (`GenerationUnavailable`: a dead vLLM server), a reward function
    raised (`RewardFunctionError`) or a task item's prompt could not be generated from (`PromptError`) during
    `train()`: as on preemption, write the checkpoint of the last optimizer step (unless it exists) and add to `error`
    where it is and what to do before resuming, for the caller to raise.

    All three fail before the step changes anything a checkpoint holds (the weights are pushed before the rollout
    draws anything; the prompts are formatted and the rewards computed inside the rollout's random stream, which an
    exception leaves at its state before the block: `RNGStreams.scoped`), so the resumed run draws what an
    uninterrupted one would. Only at an optimizer-step boundary
    (not between micro-steps of gradient accumulation) and in a one-process run (the other processes may be inside a
    collective of the step and could not join the save); there the error names the latest complete checkpoint
    instead, which a resumed run continues from (the steps after it run again).

    In the middle of a preference pair collection with chunks finished (`trainer._unsaved_collection()`: MADPO's and
    MARLHF's before the loop, an iterative round's), the checkpoint of the current step is written (`checkpoint-0`
    before the first step; a round-end checkpoint of the same step is replaced by one that holds more) with the
    collection's progress (`trl_marl.trainers.preference.collection`): the resumed run continues at the failed chunk.

    `trained`: the failure came after the training loop (`trainer._after_training`: the final evaluation), so the
    training is complete; one that came in the loop after its last optimizer step (the evaluation at the end of an
    `eval_strategy="steps"` run) is too. The note then says so: the checkpoint holds the trained agents, and a run
    resumed from it trains no further step (it runs `_after_training` again: the final evaluation).
    """
    args, step = trainer.args, trainer.state.global_step
    folder = os.path.join(args.output_dir, f"checkpoint-{step}")
    savable = trainer.accelerator.num_processes == 1 and (
        trained or trainer._step % args.gradient_accumulation_steps == 0
    )
    collection = None if trained else trainer._unsaved_collection()
    complete = trained or (collection is None and 0 < trainer.state.max_steps <= step)
    failed = "its final evaluation" if trained else "the evaluation after its last step"
    stopped = f"the run's training is complete (step {step}) but {failed} failed" if complete else None
    then = "resume with train(resume_from_checkpoint=True)"
    if collection is not None and savable:
        note = f"the run stopped at step {step} in {collection}: {_checkpoint_now(trainer)} holds their pairs"
    elif complete and savable:
        if checkpoint_status(folder) is not None:
            folder = _checkpoint_now(trainer)
        note = f"{stopped}: {folder} holds the trained agents (AgentTeam.from_pretrained({folder!r}) loads them)"
        then = (
            "resume with train(resume_from_checkpoint=True): it trains no further step and only runs the final "
            "evaluation again"
            if trained
            else "evaluate them with trainer.evaluate() (train(resume_from_checkpoint=True) trains no further step)"
        )
    elif step > 0 and savable:
        if checkpoint_status(folder) is not None:
            trainer._save_checkpoint(trainer.model_wrapped, trial=None)
        note = f"the run stopped after step {step}: {folder} holds it"
    else:
        stopped = stopped or f"the run stopped at step {step}"
        latest = latest_complete_checkpoint(args.output_dir, warn=False)
        note = f"{stopped}; the latest checkpoint is {latest}"
        if latest is None:
            note, then = f"{stopped} with no checkpoint to resume from", "start it again"
    note = f"trl_marl: {note}; {_remedy(error)}, then {then}"
    logger.warning(note)
    error.add_note(note)
