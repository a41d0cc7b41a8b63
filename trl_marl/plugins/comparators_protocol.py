"""The comparator protocol: what an iterative trainer asks of the other side of every comparison.

In iterative preference training (`MADPOIterTrainer`, `MARLHFIterTrainer`) every pair compares the current agents'
joint response with the COMPARATOR's joint response at the same candidate index. `comparator_policy` names a
comparator plugin (entry-point group `trl_marl.comparators`); the built-ins are `current`, `current_copy`, `model`,
`history` and `api`, and a third-party package registers its own class the same way (docs/plugins.md).

This module holds only the contract (no torch, no models), so a plugin package can import it cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

__all__ = ["Comparator", "JointCandidate", "check_comparator_output", "option_name"]

JointCandidate = list[str]
"""One joint response: one completion string per agent, in agent order."""


@runtime_checkable
class Comparator(Protocol):
    """A source of comparator joint responses.

    Construction. The trainer builds the comparator once, before training, as
    `ComparatorClass(args, **args.comparator_kwargs)`: `args` is the trainer's iterative config (`MADPOIterConfig` /
    `MARLHFIterConfig`), the keyword arguments are the comparator's own options. The constructor validates them
    (`ValueError` naming the option) and does no heavy work: models are loaded, copied or placed lazily, on the
    first `generate` call or in `prepare`. A class that declares its options as a dataclass (`options_class`, see
    `trl_marl.plugins.comparator_options`) has them checked when the config is built, before any model loads.

    Generation. In each round's collection phase the trainer calls

        joint = comparator.generate(items, prompts_per_agent, num_candidates, trainer)

    - `items`: the batch of task items (dataset rows), `B = len(items)`.
    - `prompts_per_agent[i][b]`: agent i's prompt for item b, as the trainer formatted it for the current agents
      (`len(prompts_per_agent) == num_agents`, each of length B). A centralized comparator
      (`generation_mode="centralized"`) builds its one joint prompt from these and the item itself.
    - `num_candidates`: how many joint responses to return per item (`comparator_num_candidates`, defaulting to
      `preference_num_candidates`).
    - `trainer`: the calling trainer, for what the comparator may need from it: `trainer.args` (generation
      settings such as `max_completion_length`, `temperature`, `top_p`, `top_k`), the agents and tokenizers,
      devices, the round driver `trainer.rounds` (`completed` rounds, `policy_snapshots`), the output directory.
      A comparator must not change the trainer's state (no optimizer steps, no change to the agents' weights or to
      the trainer's RNG streams).

    Returns `joint` with `joint[b][c][i]` = agent i's completion (a `str`, without the prompt) in joint candidate c
    for item b: `len(joint) == B`, `len(joint[b]) == num_candidates`, `len(joint[b][c]) == num_agents`. Candidate
    c of the comparator is compared with candidate c of the current agents; a centralized comparator parses its joint
    completion back into one string per agent before returning, and puts `None` in the slot of a candidate that
    failed to parse (that index is then not compared; count such failures in a `parse_failures` attribute).
    Completions are plain text: the trainer re-tokenizes them for the training pass. Failures raise (for example the
    API comparator's `APIComparatorError`); returning fewer candidates is not a way to signal an error.

    Optional hooks (called when present, via `getattr`):

    - `prepare(trainer, iteration: int) -> None`: at the start of each collection phase, before the round's first
      `generate` call (`iteration` counts rounds from 1). `current_copy` copies the actor weights here, `history`
      picks the checkpoint here.
    - `state_dict() -> dict` / `load_state_dict(state: dict) -> None`: JSON-able state saved in and restored from
      training checkpoints (for example `current`'s separate RNG stream), exactly; its texts should be valid unicode
      (`trl_marl.data_types.text.valid_texts`: a lone surrogate is restored but strict JSON parsers refuse the
      file, and the trainer warns). Never put credentials in it.
    - `close() -> None`: release resources (HTTP connections, comparator models) when training ends.

    Attributes:
        name: the entry-point name the comparator is registered under (logs, model cards, error messages).
        options_class: optional; the dataclass of the comparator's options, built from `comparator_kwargs` when the
            config is built (its `__post_init__` validates them; an optional `check_team(num_agents)` method checks
            what depends on the team's size).
        needs_policy_history: optional; True makes the trainer save a policy snapshot at the start of every round
            (`trainer.rounds.policy_snapshots`: rounds completed -> folder), as `history` needs.
    """

    name: ClassVar[str]

    def generate(
        self,
        items: Sequence[Mapping[str, Any]],
        prompts_per_agent: Sequence[Sequence[str]],
        num_candidates: int,
        trainer: Any,
    ) -> list[list[JointCandidate]]: ...


def check_comparator_output(
    joint: Any, *, num_items: int, num_candidates: int, num_agents: int, name: str = "comparator"
) -> list[list[JointCandidate]]:
    """Validate a `Comparator.generate` result's shape and types and return it as plain nested lists; raise
    `ValueError` saying which item / candidate is wrong and what was expected."""
    if not isinstance(joint, Sequence) or isinstance(joint, str) or len(joint) != num_items:
        got = len(joint) if isinstance(joint, Sequence) and not isinstance(joint, str) else type(joint).__name__
        raise ValueError(f"{name}.generate must return one list per item ({num_items}), got {got}")
    for b, per_item in enumerate(joint):
        if not isinstance(per_item, Sequence) or isinstance(per_item, str) or len(per_item) != num_candidates:
            raise ValueError(
                f"{name}.generate: item {b} must have {num_candidates} joint candidates, got "
                f"{len(per_item) if isinstance(per_item, Sequence) else type(per_item).__name__}"
            )
        for c, candidate in enumerate(per_item):
            if candidate is None:  # a dropped candidate (e.g. a centralized completion that did not parse)
                continue
            if (
                not isinstance(candidate, Sequence)
                or isinstance(candidate, str)
                or len(candidate) != num_agents
                or not all(isinstance(text, str) for text in candidate)
            ):
                raise ValueError(
                    f"{name}.generate: item {b}, candidate {c} must be a list of {num_agents} completion strings "
                    f"(one per agent), got {candidate!r:.200}"
                )
    return [[None if candidate is None else list(candidate) for candidate in per_item] for per_item in joint]


def option_name(key: str) -> str:
    """Where the comparator option `key` is set in an iterative config (for error messages):
    `comparator_kwargs['key']`."""
    return f"comparator_kwargs[{key!r}]"
