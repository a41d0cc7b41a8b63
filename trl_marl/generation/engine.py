"""The generation-engine interface: how a trainer samples completions for its team.

A trainer picks ONE engine when it is built (`trl_marl.generation.hf.HFGeneration`: transformers' `generate`; or
`trl_marl.generation.vllm_backend.VLLMTeamGeneration`: colocated vLLM engines; or
`trl_marl.generation.vllm_server_engine.VLLMServerGeneration`: `trl-marl vllm-serve` servers) and then calls it without
knowing which: training rollouts, evaluation, pair collection and the comparators all go through `generate` /
`generate_with`. An engine gets what it needs when it is built (the accelerator, the team, the tokenizers and EOS ids,
the sampling settings); it never imports a trainer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from torch import nn

from trl_marl.data_types.rollout import GenerationOutput
from trl_marl.data_types.text import PromptText, valid_text

__all__ = [
    "GenerationEngine",
    "GenerationUnavailable",
    "SamplingSettings",
    "prompt_token_ids",
]


# the completions per prompt, under each backend's name: the trainer passes num_generations (TRL's name) itself
class GenerationUnavailable(RuntimeError):
    """The engine cannot sample: the process it samples through (a vLLM server) did not answer after its retries.
    A trainer saves a checkpoint at the step boundary before passing it on, as on preemption."""


@dataclass(frozen=True)
class SamplingSettings:
    """The sampling settings of one agent (TRL's names, as the trainer configs hold them).

    Attributes:
        max_completion_length: the most tokens a completion may have.
        max_prompt_length: prompts are cut to their last `max_prompt_length` tokens; None keeps them whole.
        temperature, top_p, top_k: nucleus / top-k sampling (`top_k=None` disables it); greedy decoding ignores
            them.
        min_p: minimum token probability relative to the most likely token (None: off).
        repetition_penalty: transformers' / vLLM's repetition penalty (1.0: off).
        generation_kwargs: more keyword arguments of the backend's sampling settings (transformers'
            `GenerationConfig` or vLLM's `SamplingParams`); they override the fields above, as in TRL.
    """

    max_completion_length: int
    max_prompt_length: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    generation_kwargs: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, args: Any, agent: int = 0) -> SamplingSettings:
        """Agent `agent`'s settings in a trainer config: its fields, each one value or one per agent (`min_p`,
        `repetition_penalty` and `generation_kwargs` where the config has them)."""

        def value(name: str, default: Any = None) -> Any:
            v = getattr(args, name, default)
            return (v[0] if len(v) == 1 else v[agent]) if isinstance(v, (list, tuple)) else v

        return cls(
            value("max_completion_length"),
            args.max_prompt_length,
            value("temperature"),
            value("top_p"),
            value("top_k"),
            value("min_p"),
            value("repetition_penalty", 1.0),
            value("generation_kwargs"),
        )

    @classmethod
    def per_agent(cls, args: Any) -> list[SamplingSettings]:
        """Every agent's settings (`from_config` for agent 0 .. `args.num_agents - 1`)."""
        return [cls.from_config(args, i) for i in range(args.num_agents)]


def prompt_token_ids(tokenizer: Any, prompts: Sequence[PromptText], max_prompt_length: int | None) -> list[list[int]]:
    """The token ids an engine generates from: a prompt's own `token_ids` when it carries them
    (`PromptText.of_ids`), else the tokenized text (no special tokens after a chat template, row by row), left-cut to
    `max_prompt_length`. Invalid unicode in a text (a lone surrogate from an environment's or a tool's text, which
    the tokenizer refuses) is tokenized as U+FFFD (`valid_text`)."""
    if not prompts:
        return []
    given = [getattr(p, "token_ids", None) for p in prompts]  # plain strings are prompts too
    text_rows = [i for i, ids in enumerate(given) if ids is None]
    rows: list[list[int]] = [list(ids) if ids is not None else [] for ids in given]
    for chat in (False, True):  # each row as its kind: a batch may mix chat-template text and plain strings
        kind = [i for i in text_rows if bool(getattr(prompts[i], "chat", False)) == chat]
        if kind:
            encoded = tokenizer([valid_text(str(prompts[i])) for i in kind], add_special_tokens=not chat)["input_ids"]
            for i, ids in zip(kind, encoded):
                rows[i] = list(ids)
    return [r[-max_prompt_length:] if max_prompt_length is not None else r for r in rows]


class GenerationEngine(ABC):
    """Samples completions for a team of agents.

    Rows are prompt-major: for agent i, the `G` samples of prompt p are rows `p*G .. p*G+G-1` of its
    `GenerationOutput`. An agent with no prompts gets an empty output; an agent whose entry is None takes no part in
    the call on ANY process (an agentic turn generates for one agent position at a time). When generating is a
    collective (`collective`: ZeRO-3 or FSDP2 with several processes) every process must call the engine the same
    number of times, in the same order, even with no prompts (`trl_marl.distributed.collective`), and give None for
    the same agents.
    """

    @property
    @abstractmethod
    def collective(self) -> bool:
        """Whether generating (and scoring with a sharded model) is a collective every process must join."""

    @abstractmethod
    def generate(
        self, prompts_per_agent: Sequence[Sequence[PromptText] | None], num_generations: int, greedy: bool = False
    ) -> list[GenerationOutput]:
        """`num_generations` samples per prompt from each of the team's agents (with `greedy`, greedy decodes)."""

    @abstractmethod
    def generate_with(
        self,
        models: Sequence[nn.Module],
        tokenizers: Sequence[Any],
        prompts_per_agent: Sequence[Sequence[PromptText]],
        num_generations: int,
        eos_ids: Sequence[list[int]] | None = None,
        greedy: bool = False,
    ) -> list[GenerationOutput]:
        """The same with other models (one per agent, e.g. a comparator's), at the team's sampling settings."""

    def before_rollout(self) -> None:
        """Called by the trainer on every process at the start of each training rollout, where the processes are in
        step: a place for work they agree on (the vLLM server engine's one push per step under DDP); nothing
        here."""
        return None

    @abstractmethod
    def unwrapped_team(self) -> AbstractContextManager[nn.Module]:
        """The team, unwrapped from its engine and ready for `generate_with` on its own agents (under ZeRO-3 each
        agent is gathered by that call, one at a time, not the whole team here)."""
