"""The round driver of iterative (online) preference training (`MADPOIterTrainer`, `MARLHFIterTrainer`).

`num_rounds` rounds; in round nu:

1. **collect** — the current agents sample `preference_num_candidates` joint responses per item and the COMPARATOR
   (`comparator_policy`, an entry-point plugin) samples `comparator_num_candidates`; candidate c of one side is
   compared with candidate c of the other (indices present on both sides), the oracle scores both, the higher wins
   (either side may), ties are dropped, and `pair_selection` keeps `preference_pairs_per_sample` per item;
2. **store** the round's pairs D(nu) as `preference_replay_dir/iteration_{nu:04d}.json` (`round_files`);
3. **select** the training set B(nu) with the replay mode (`preference_replay_mode`, an entry-point plugin) over
   this run's stored rounds — replayed pairs are re-read from their round files;
4. **train** on B(nu): the trainer's own step (`round_batches`).

The whole run is ONE `Trainer.train()` (one accelerate / DeepSpeed engine): the training data loader (`loader()`)
drives the rounds, running each round's collection when the previous round's last step is done. With
`save_strategy != "no"` a checkpoint is written at the end of every round (and only then); it holds the agents,
optimizer, scheduler, every RNG stream (the comparator's separate stream included), the round counter, the replay
index with copies of its round files, and the policy-history index (`save_state`), so that a run resumed from round
nu's checkpoint produces the same round nu+1 pairs and weights as an uninterrupted run.

A trainer holds one `RoundDriver` (`trainer.rounds`) and calls it from its `Trainer` hooks (`get_train_dataloader`,
`train`, the checkpoint hooks). The driver calls back these members of the trainer:

| trainer member | what for |
|---|---|
| `round_micro_batches() -> int` | training batches of one round (before the `max_steps` cap): the run's step count |
| `round_batches(nu, pairs) -> list` | this process's training batches for round nu's training pairs |
| `preference_oracle() -> Callable | None` | the scorer of new comparisons when it is not the task reward |
| `pair_from_record`, `candidate_reward_keys`, `save_model` | re-read pairs, candidate metrics, policy snapshots |
| `rollout_engine`, `generate`, `reward`, `rng_streams`, `tokenize_completion`, `completion_eos_token` | collection |
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
from collections.abc import Iterator
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback

from trl_marl.checkpointing.state_files import CorruptedStateError, read_json_state, require
from trl_marl.data_types.rng import keyed_rng
from trl_marl.data_types.text import valid_text, valid_texts
from trl_marl.plugins.comparators_protocol import check_comparator_output
from trl_marl.plugins.registry import COMPARATOR_GROUP, load_plugin
from trl_marl.plugins.replay import make_replay_mode
from trl_marl.trainers.preference.collection import collecting
from trl_marl.trainers.preference.data_parallel import collection_chunks, merge_item_shares
from trl_marl.trainers.preference.pair_checks import usable_pairs
from trl_marl.trainers.preference.pairs import PreferencePair, select_aligned_pairs
from trl_marl.trainers.preference.round_files import StoredRound, read_round_file, round_file_name, write_round_file
from trl_marl.utils.progress import progress_bar, trainer_shows_progress

__all__ = ["RoundDriver", "build_round_plugins", "STATE_FILE"]

logger = logging.getLogger(__name__)

STATE_FILE = "iterative_state.json"


def build_round_plugins(args: Any, comparator: Any = None, replay_mode: Any = None) -> tuple[Any, str, Any]:
    """The comparator, its name and the replay mode of an iterative run, before any model loads.

    `comparator=` / `replay_mode=` (the trainer's arguments): a registered plugin name (instead of the config's
    `comparator_policy` / `preference_replay_mode`) or a ready instance (see docs/plugins.md). A comparator built by
    name is `ComparatorClass(args, **args.comparator_kwargs)`."""
    if comparator is None or isinstance(comparator, str):
        name = args.comparator_policy if comparator is None else comparator
        comparator = load_plugin(COMPARATOR_GROUP, name)(args, **(args.comparator_kwargs or {}))
    else:
        if not callable(getattr(comparator, "generate", None)):
            raise TypeError(
                f"comparator={type(comparator).__name__} has no generate(items, prompts_per_agent, "
                "num_candidates, trainer) method; see trl_marl.plugins.comparators_protocol"
            )
        if args.comparator_kwargs:
            raise ValueError("comparator_kwargs configures a comparator built by name; this one is an instance")
        name = type(comparator).__name__
    if replay_mode is None or isinstance(replay_mode, str):
        replay_mode = make_replay_mode(
            args.preference_replay_mode if replay_mode is None else replay_mode,
            k=args.preference_replay_k,
            lam=args.preference_replay_lambda,
            sample_size=args.preference_replay_sample_size,
            **(args.replay_kwargs or {}),
        )
    else:
        if not callable(getattr(replay_mode, "select", None)):
            raise TypeError(
                f"replay_mode={type(replay_mode).__name__} has no select(rounds, rng) method; see "
                "trl_marl.plugins.replay.ReplayMode"
            )
        if args.replay_kwargs:
            raise ValueError("replay_kwargs configures a replay mode built by name; this one is an instance")
    return comparator, name, replay_mode


class RoundDriver:
    """Rounds, the comparator, the replay buffer, round files, policy history and round checkpoints of one
    iterative trainer (see the module docstring).

    Attributes:
        comparator, comparator_name, replay_mode: the plugins (`build_round_plugins`).
        completed: rounds started so far (a round counts from its collection on).
        stored: this run's replay index, `{"iteration", "path", "num_pairs"}` per stored round.
        policy_snapshots: rounds completed -> policy snapshot folder (0 = the initial policy), for `history`.
        stream_round: the round whose random streams are drawn from now (0 before the first round).
    """

    def __init__(self, trainer: Any, comparator: Any, comparator_name: str, replay_mode: Any):
        a = trainer.args
        self.trainer = trainer
        self.comparator, self.comparator_name, self.replay_mode = comparator, comparator_name, replay_mode
        self.replay_dir = a.preference_replay_dir or os.path.join(a.output_dir, "preference_replay")
        self.policy_dir = a.policy_checkpoint_dir or os.path.join(a.output_dir, "policy_history")
        self.completed = 0
        self.stored: list[dict] = []
        self.policy_snapshots: dict[int, str] = {}
        self.stream_round = 0
        self.last_batch_of_round = False
        self.done = False
        self._current_pairs: dict[int, PreferencePair] = {}  # id(record) -> the exact pair, for the current round
        self._batches_now: list | None = None  # the batches of the round in progress, and the next index
        self._next = 0
        self._resume_round: dict | None = None
        self._user_max_steps: int | None = None  # the user's max_steps while the run's is in `args` (`running`)
        self._warned_comparator_state = False  # a comparator state with invalid unicode is warned of once
        trainer.add_callback(_RoundCallback(self))

    # ---- sizes and the max_steps cap ----
    @property
    def comparator_candidates(self) -> int:
        a = self.trainer.args
        return a.comparator_num_candidates or a.preference_num_candidates

    def max_pairs_per_round(self) -> int:
        """The most training pairs one round can select."""
        t, a = self.trainer, self.trainer.args
        if a.preference_replay_sample_size is not None:
            return a.preference_replay_sample_size
        per_item = min(a.preference_num_candidates, self.comparator_candidates)
        if a.preference_pairs_per_sample is not None:
            per_item = min(per_item, a.preference_pairs_per_sample)
        return len(t.train_dataset) * per_item

    def _round_limit(self) -> int | None:
        """`max_steps` counts optimizer steps PER ROUND: a round trains at most
        `max_steps * gradient_accumulation_steps` batches (every round runs; `max_steps <= 0`: no cap)."""
        a = self.trainer.args
        user = a.max_steps if self._user_max_steps is None else self._user_max_steps
        return user * a.gradient_accumulation_steps if user is not None and user > 0 else None

    def cap_count(self, count: int) -> int:
        """A round's batch count under the per-round `max_steps` cap."""
        limit = self._round_limit()
        return count if limit is None else min(count, limit)

    def cap_batches(self, batches: list) -> list:
        """A round's batches under the per-round `max_steps` cap."""
        limit = self._round_limit()
        return batches if limit is None else batches[:limit]

    @staticmethod
    def align(batches: list, multiple: int) -> list:
        """Pad a round's batches to a multiple of `multiple` (gradient accumulation) by wrapping around."""
        if not batches or len(batches) % multiple == 0:
            return batches
        extra = multiple - len(batches) % multiple
        return batches + [batches[k % len(batches)] for k in range(extra)]

    def steps_upper_bound(self) -> int:
        """Optimizer steps of the whole run at most (the Trainer's `max_steps` while the rounds run)."""
        a = self.trainer.args
        ga = a.gradient_accumulation_steps
        return max(1, a.num_rounds * math.ceil(self.cap_count(self.trainer.round_micro_batches()) / ga))

    # ---- the run ----
    def loader(self) -> _RoundLoader:
        """The training "data loader": each round's collection, then the round's batches, round after round."""
        return _RoundLoader(self, self.steps_upper_bound() * self.trainer.args.gradient_accumulation_steps)

    @contextlib.contextmanager
    def running(self, checkpoint: str | None) -> Iterator[None]:
        """Around the Trainer loop: restore the rounds from `checkpoint` (already resolved and restored by the
        trainer), make the Trainer's `max_steps` the whole run's (the user's value is per round and is put back),
        and close the comparator at the end."""
        a = self.trainer.args
        if checkpoint:
            self.load_state(checkpoint)
            a.ignore_data_skip = True  # the round loader resumes at the next round by itself
        self._user_max_steps = a.max_steps
        a.max_steps = self.steps_upper_bound()
        try:
            yield
        finally:
            a.max_steps = self._user_max_steps
            self._user_max_steps = None
            close = getattr(self.comparator, "close", None)
            if close is not None:
                close()

    def start_round(self, nu: int) -> list:
        """Collect, store and select round `nu`; return this process's training batches for it."""
        t = self.trainer
        self.stream_round = nu  # round nu's random streams, from its collection through its training
        if getattr(self.comparator, "needs_policy_history", False):
            self._snapshot_policy(nu - 1)
        prepare = getattr(self.comparator, "prepare", None)
        if prepare is not None:
            prepare(t, nu)
        pairs = self.collect(nu)
        records = [p.to_record() for p in pairs]
        path = os.path.join(self.replay_dir, round_file_name(nu))
        if t.accelerator.is_main_process:
            write_round_file(path, nu, records)
        t.accelerator.wait_for_everyone()
        self.stored.append({"iteration": nu, "path": path, "num_pairs": len(records)})
        self._current_pairs = {id(r): p for r, p in zip(records, pairs)}
        rounds = [StoredRound(r["path"], r["num_pairs"], r["iteration"], t.num_agents) for r in self.stored[:-1]]
        selected = self.replay_mode.select(rounds + [records], t.rng_streams.numpy("replay", nu))
        # what would train on nothing (chosen == rejected, an empty completion) is dropped and counted (pair_checks)
        train_pairs = usable_pairs(
            [self._pair_from_record(r) for r in selected], f"{t._name} round {nu}", t.accelerator.is_main_process
        )
        m = t._metrics["train"]
        m["iter/current_iteration"].append(float(nu))
        m["iter/current_preference_pairs"].append(float(len(records)))
        m["iter/total_preference_pairs"].append(float(sum(r["num_pairs"] for r in self.stored)))
        m["iter/train_preference_pairs"].append(float(len(train_pairs)))
        if not train_pairs:
            msg = (
                f"{t._name} round {nu}: no preference pair to train on (all comparisons tied), so this round makes "
                "no update; raise preference_num_candidates or temperature, or check the reward"
            )
            if t.accelerator.is_main_process:
                logger.warning(msg)  # once: a printed copy would repeat it
            return []
        return t.round_batches(nu, train_pairs)

    def _snapshot_policy(self, rounds_done: int) -> None:
        if rounds_done in self.policy_snapshots:
            return
        path = os.path.join(self.policy_dir, f"iteration_{rounds_done:04d}")
        self.trainer.save_model(path, _internal_call=True)
        self.trainer.accelerator.wait_for_everyone()
        self.policy_snapshots[rounds_done] = path

    def _pair_from_record(self, record: dict) -> PreferencePair:
        """The training pair of a selected record: the in-memory pair for the current round (exact sampled token
        ids), else re-tokenized from the stored text."""
        exact = self._current_pairs.get(id(record))
        if exact is not None:
            return exact
        return self.trainer.pair_from_record(record)

    # ---- collection ----
    @torch.no_grad()
    def collect(self, nu: int) -> list[PreferencePair]:
        """Round nu's pairs: the current agents' candidates against the comparator's, scored, selected per item;
        every process's items gathered, in item order (the same list on every process)."""
        t = self.trainer
        a = t.args
        rank, world = t.accelerator.process_index, t.accelerator.num_processes
        chunks = collection_chunks(len(t.train_dataset), a.rollout_buffer_size, rank, world)
        # a failure keeps the finished chunks for its checkpoint (collection.py)
        with collecting(t, f"round {nu}'s pair collection", nu, chunks) as progress:
            todo = progress_bar(
                progress.remaining(t, chunks),
                f"Round {nu}: collecting pairs",
                trainer_shows_progress(t),
                total=len(chunks) - progress.finished,
            )
            for indices, filler in todo:
                progress.results += self._collect_chunk(nu, indices, filler)
        local = progress.results
        # every process's pairs in item order: what one process collecting every item builds
        merged = merge_item_shares(gather_object([local]) if world > 1 else [local])
        pairs = [p for item_pairs, _, _ in merged for p in item_pairs]
        target_rewards = [r for _, rewards, _ in merged for r in rewards]
        comp_rewards = [r for _, _, rewards in merged for r in rewards]
        m = t._metrics["train"]
        if target_rewards:
            for key in t.candidate_reward_keys:
                m[key].append(sum(target_rewards) / len(target_rewards))
        if comp_rewards:
            m["iter/comparator_reward_mean"].append(sum(comp_rewards) / len(comp_rewards))
        failures = getattr(self.comparator, "parse_failures", None)
        if failures is not None:
            m["iter/comparator_parse_failures"].append(float(failures))
        return pairs

    def _collect_chunk(self, nu: int, indices: list[int], filler: bool) -> list[tuple[int, tuple]]:
        """Round nu's comparisons for the items `indices` of one chunk: this process's
        `(item index, (pairs, target rewards, comparator rewards))` per item; none for a filler chunk, which runs
        every step (generation and scoring may be collectives) and keeps nothing."""
        t = self.trainer
        a, n = t.args, t.num_agents
        K, Kc = a.preference_num_candidates, self.comparator_candidates
        items = [t.train_dataset[j] for j in indices]
        with t.rng_streams.scoped("rollout", nu):
            rollout = t.rollout_engine.run(items, t.generate, num_generations=K)
        env_steps = rollout.env_steps
        prompts_per_agent = [[node.prompts[i] for node in rollout.nodes] for i in range(n)]
        task_prompts = [t.rollout_engine.task_prompt(item, node.prompts) for item, node in zip(items, rollout.nodes)]
        # target side scores (rescored when the oracle is not the task reward)
        t_proc, t_raw = self._target_scores(rollout, items)
        with t.rng_streams.scoped("comparator", nu):  # its draws never shift the training stream's
            joint = self.comparator.generate(items, prompts_per_agent, Kc, t)
        joint = check_comparator_output(
            joint, num_items=len(items), num_candidates=Kc, num_agents=n, name=self.comparator_name
        )
        flat = [(b, c) for b in range(len(items)) for c in range(Kc) if joint[b][c] is not None]
        c_proc: list[list[float | None]] = [[None] * Kc for _ in items]
        c_raw: list[list[float | None]] = [[None] * Kc for _ in items]
        # a sharded reward-model oracle is a collective: called (with no rows) even where no candidate is left
        if flat or t.collective_generation:
            comps = [[joint[b][c][i] for b, c in flat] for i in range(n)]
            proc, raw = self._comparator_scores(comps, [task_prompts[b] for b, _ in flat], [items[b] for b, _ in flat])
            env_steps += len(flat)
            for (b, c), p, r in zip(flat, _shared_list(proc), _shared_list(raw)):
                c_proc[b][c], c_raw[b][c] = p, r
        if filler:
            return []
        t.env_step += env_steps
        results = []
        for b, node in enumerate(rollout.nodes):
            # the random selection is keyed by (round, item): the same whichever process collects the item
            rng = keyed_rng(a.seed, "pair_selection", nu, indices[b])
            kept = select_aligned_pairs(t_proc[b], c_proc[b], a.pair_selection, a.preference_pairs_per_sample, rng)
            present = [t_proc[b][c] for c in range(min(K, Kc))] + [v for v in c_proc[b][: min(K, Kc)] if v is not None]
            mean = sum(present) / len(present)
            pairs = [
                self._aligned_pair(
                    rollout,
                    node,
                    joint[b][c],
                    c,
                    target_wins,
                    (t_proc[b][c], c_proc[b][c]),
                    (t_raw[b][c], c_raw[b][c]),
                    mean,
                )
                for c, target_wins in kept
            ]
            comp = [v for v in c_proc[b] if v is not None]
            results.append((indices[b], (pairs, list(t_proc[b]), comp)))
        return results

    def _target_scores(self, rollout, items) -> tuple[list[list[float]], list[list[float]]]:
        """(processed, raw) scores of the current agents' joint responses, per item: the rollout's task rewards, or
        the trainer's `preference_oracle` in ONE call for every joint response of every item, split per item."""
        oracle = self.trainer.preference_oracle()
        if oracle is None:
            proc = [_mean_per_joint(node.rewards) for node in rollout.nodes]
            raw = [_mean_per_joint(node.raw_rewards) for node in rollout.nodes]
            return proc, raw
        sizes = [len(node.joint) for node in rollout.nodes]
        comps = [
            [rollout.samples[node.samples[i][k]].completion for node in rollout.nodes for k in range(len(node.joint))]
            for i in range(self.trainer.num_agents)
        ]
        scores = oracle(*comps, batch_items=[item for item, size in zip(items, sizes) for _ in range(size)])
        starts = [sum(sizes[:j]) for j in range(len(sizes) + 1)]
        proc = [scores[s:e] for s, e in zip(starts, starts[1:])]
        return proc, proc

    def _comparator_scores(self, completions_per_agent, task_prompts, items) -> tuple[torch.Tensor, torch.Tensor]:
        """(processed, raw) scores of the comparator's joint responses: the task reward, or the oracle's."""
        oracle = self.trainer.preference_oracle()
        if oracle is not None:
            scores = torch.tensor(oracle(*completions_per_agent, batch_items=items))
            return scores, scores
        if not task_prompts:
            return torch.zeros(0), torch.zeros(0)
        return self.trainer.reward(completions_per_agent, task_prompts, items)

    def _aligned_pair(self, rollout, node, comp_texts, c, target_wins, scores, raw, mean) -> PreferencePair:
        """The pair of candidate c: the current agents' joint response against the comparator's. `scores` and `raw`
        are (target side, comparator side)."""
        t, n = self.trainer, self.trainer.num_agents
        samples = [rollout.samples[node.samples[i][c]] for i in range(n)]
        target_ids = [s.completion_ids for s in samples]
        comp_ids = [t.tokenize_completion(i, comp_texts[i]) for i in range(n)]
        # how each side ended (the EOS token's text, None when cut at max_completion_length), kept in the round file
        target = (
            [s.completion for s in samples],
            target_ids,
            [t.completion_eos_token(i, ids) for i, ids in enumerate(target_ids)],
        )
        comparator = (
            [str(x) for x in comp_texts],  # plain strings: pairs are pickled across processes
            comp_ids,
            [t.completion_eos_token(i, ids) for i, ids in enumerate(comp_ids)],
        )
        (w_texts, w_ids, w_eos), (l_texts, l_ids, l_eos) = (
            (target, comparator) if target_wins else (comparator, target)
        )
        (w_score, l_score), (w_raw, l_raw) = (scores, raw) if target_wins else (scores[::-1], raw[::-1])
        return PreferencePair(
            prompts=[str(s.prompt) for s in samples],
            winner_completions=w_texts,
            loser_completions=l_texts,
            winner_reward=w_score,
            loser_reward=l_score,
            candidate_reward_mean=mean,
            prompt_ids=[s.prompt_ids for s in samples],
            winner_ids=w_ids,
            loser_ids=l_ids,
            raw_rewards=[w_raw, l_raw],
            target_raw_reward=raw[0],
            comparator_raw_reward=raw[1],
            winner_eos=w_eos,
            loser_eos=l_eos,
        )

    # ---- checkpoints ----
    def resume_state(self) -> dict:
        """This process's round in progress, for a checkpoint written inside a round (preemption)."""
        if self._batches_now is not None and self._next < len(self._batches_now):
            return {"round_in_progress": {"batches": self._batches_now, "next": self._next}}
        return {}

    def restore_resume_state(self, extra: dict) -> None:
        self._resume_round = extra.get("round_in_progress")

    def save_state(self, folder: str) -> None:
        """Round counter, replay index (with copies of its round files), policy history and comparator state.

        The file is strictly valid JSON where resuming allows it: a round's `path` is a record only (a resume reads
        the checkpoint's copy into its own `preference_replay_dir`), so a lone surrogate in it (a folder name that
        is not UTF-8) is written as U+FFFD (`valid_text`), which strict parsers take where they refuse a `\\ud800`
        escape. The policy snapshots' folders and the comparator's state are what a resume uses, so they are
        written exactly: a lone surrogate in a comparator's state is warned of (`_check_comparator_state`)."""
        os.makedirs(os.path.join(folder, "preference_replay"), exist_ok=True)
        rounds = []
        for r in self.stored:
            copy_path = os.path.join(folder, "preference_replay", os.path.basename(r["path"]))
            shutil.copyfile(r["path"], copy_path)
            rounds.append({**r, "path": valid_text(r["path"]), "checkpoint_copy": os.path.basename(r["path"])})
        comparator = self.comparator.state_dict() if hasattr(self.comparator, "state_dict") else None
        self._check_comparator_state(comparator)
        state = {
            "completed_rounds": self.completed,
            "rounds": rounds,
            "policy_snapshots": {str(k): v for k, v in self.policy_snapshots.items()},
            "comparator": comparator,
            "env_step": self.trainer.env_step,
        }
        tmp = os.path.join(folder, STATE_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(folder, STATE_FILE))

    def _check_comparator_state(self, state: Any) -> None:
        """Warn (once) of a comparator state holding invalid unicode (a lone surrogate, e.g. an API's text kept in a
        cache): it is written as JSON's `\\ud800` escape, which `load_state` restores exactly but strict JSON
        parsers refuse; replacing it would change what the comparator resumes with."""
        if state is None or self._warned_comparator_state or valid_texts(state) == state:
            return
        self._warned_comparator_state = True
        logger.warning(
            "the state_dict() of comparator %r holds invalid unicode (a lone surrogate): %s is written with it as a "
            "JSON \\udXXX escape, which a resume restores exactly but strict JSON parsers refuse; return valid text "
            "from state_dict() (trl_marl.data_types.text.valid_texts) to keep the checkpoint strictly valid JSON",
            self.comparator_name,
            STATE_FILE,
        )

    def load_state(self, folder: str) -> None:
        """Restore what `save_state` wrote; every file is validated (`CorruptedStateError` naming it)."""
        t = self.trainer
        path = os.path.join(folder, STATE_FILE)
        if not os.path.isfile(path):
            raise CorruptedStateError(
                path,
                "the file is missing, so this is not a complete checkpoint of an iterative trainer",
                f"resume from another checkpoint of {os.path.dirname(os.path.abspath(folder))} "
                "(resume_from_checkpoint=True picks the latest complete one)",
            )
        fix = f"delete {folder} and resume from the checkpoint before it"
        state = read_json_state(path, fix)
        completed = require(state, "completed_rounds", int, path, fix)
        rounds = require(state, "rounds", list, path, fix)
        snapshots = require(state, "policy_snapshots", dict, path, fix)
        if len(rounds) != completed:
            raise CorruptedStateError(path, f"it records {len(rounds)} rounds but completed_rounds={completed}", fix)
        self.completed = completed
        self.stored = []
        for k, r in enumerate(rounds):
            if not isinstance(r, dict) or not all(key in r for key in ("iteration", "num_pairs", "checkpoint_copy")):
                raise CorruptedStateError(path, f"round entry {k} lacks iteration / num_pairs / checkpoint_copy", fix)
            copy_path = os.path.join(folder, "preference_replay", r["checkpoint_copy"])
            data = read_round_file(copy_path, r["iteration"], t.num_agents, fix)
            if data["num_pairs"] != r["num_pairs"]:
                raise CorruptedStateError(
                    copy_path, f"it holds {data['num_pairs']} pairs but {STATE_FILE} recorded {r['num_pairs']}", fix
                )
            target = os.path.join(self.replay_dir, os.path.basename(copy_path))
            if t.accelerator.is_main_process:
                write_round_file(target, r["iteration"], data["pairs"])
            self.stored.append({"iteration": r["iteration"], "path": target, "num_pairs": r["num_pairs"]})
        t.accelerator.wait_for_everyone()
        self.policy_snapshots = {int(k): v for k, v in snapshots.items()}
        if state.get("comparator") is not None and hasattr(self.comparator, "load_state_dict"):
            self.comparator.load_state_dict(state["comparator"])
        t.env_step = int(state.get("env_step", 0))


def _mean_per_joint(rewards: torch.Tensor) -> list[float]:
    """Per joint response: the team reward, or the mean of the per-agent rewards."""
    return rewards.tolist() if rewards.ndim == 1 else rewards.mean(1).tolist()


def _shared_list(t: torch.Tensor) -> list[float]:
    return (t if t.ndim == 1 else t.mean(dim=1)).tolist()


class _RoundLoader:
    """The training "data loader" of an iterative trainer: it runs each round's collection and yields the round's
    training batches (this process's share), round after round."""

    def __init__(self, driver: RoundDriver, length: int):
        self.driver, self.length = driver, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        d = self.driver
        resumed = d._resume_round  # a round interrupted by preemption: its remaining batches first
        d._resume_round = None
        while resumed is not None or d.completed < d.trainer.args.num_rounds:
            if resumed is not None:
                batches, start = resumed["batches"], resumed["next"]
                resumed = None
            else:
                nu = d.completed + 1
                batches, start = d.start_round(nu), 0
                d.completed = nu
            d._batches_now = batches
            for j in range(start, len(batches)):
                d._next = j + 1
                d.last_batch_of_round = j == len(batches) - 1
                yield batches[j]
            d.last_batch_of_round = False
            d._batches_now, d._next = None, 0
        d.done = True


class _RoundCallback(TrainerCallback):
    """Checkpoints at round ends only; stops when every round is done."""

    def __init__(self, driver: RoundDriver):
        self.driver = driver

    def on_step_end(self, args, state, control, **kwargs):
        d = self.driver
        at_end = d.last_batch_of_round
        preempted = d.trainer._preemption.stop_now  # a preemption checkpoint may fall inside a round
        control.should_save = bool(at_end and args.save_strategy != "no") or preempted
        if (at_end and d.completed >= d.trainer.args.num_rounds) or preempted:
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.driver.done:
            control.should_training_stop = True
        return control
