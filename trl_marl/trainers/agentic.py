"""Agentic teams in the trainers: `tools=`, `environment_factory=`, `turn_order` and `max_tool_calling_iterations`
(TRL 1.16's names), checked at construction and turned into the trainer's rollout (`trl_marl.rollout.agentic`).

A generation-based trainer (the MAGRPO family, MAAC / IAC / MAPPO) rolls out agentically when it is given tools, an
environment factory, or `turn_order="sequential"`; otherwise its rollout is the `JointRollout` of before, unchanged.
Every choice that has no meaning for an agentic rollout is refused here, before any model loads, with the field:
`joint_mode="cross"` (a cross joint action would combine samples played in different environments),
`external_transition` (the environment and the conversation make the next turn), `early_termination_threshold`
(the environment ends episodes), ReMax's greedy baseline, and trainers that do not roll out (preference trainers,
the centralized baseline).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl_marl.environments import (
    EnvironmentRegistry,
    EpisodeConfig,
    ToolExecutor,
    per_agent_tools,
    prepare_tool_tokenizer,
)
from trl_marl.rewards import RewardFunction
from trl_marl.rewards.sources import RewardSources
from trl_marl.rollout.agentic import AgenticRollout
from trl_marl.rollout.agentic_turns import TurnPlayer
from trl_marl.rollout.engine import JointRollout

__all__ = ["AgenticSetup", "PLACEHOLDER_ITEM", "build_rollout"]

# the item of the dataset made when an environment makes its own tasks (TRL's placeholder rows: an empty prompt)
PLACEHOLDER_ITEM = {"prompt": ""}


class AgenticSetup:
    """The agentic arguments of a trainer, validated (see the module docstring); `None` from `build` when the trainer
    rolls out as before.

    Attributes:
        tools: per agent, its standalone tools.
        registry: the environments, or None.
        train_dataset: the training items: the one given, or (an environment that makes its own tasks) placeholder
            items, `rollout_buffer_size` per process.
    """

    def __init__(
        self,
        trainer: str,
        args: Any,
        tools: Sequence[Any] | None,
        environment_factory: Callable[[], Any] | Mapping[str, Callable[[], Any]] | None,
        reward_func: Callable | None,
        train_dataset: Any,
        external_transition: Callable | None,
    ):
        n = args.num_agents
        refuse = [
            (args.joint_mode != "aligned", f"joint_mode={args.joint_mode!r}: a joint action of 'cross' mode would "
             "combine samples played in different branches of the environment; use joint_mode='aligned'"),
            (external_transition is not None, "external_transition: the environment and the agents' conversation "
             "make each next turn; pass external_transition or tools / environment_factory / "
             "turn_order='sequential', not both"),
            (args.early_termination_threshold is not None, "early_termination_threshold: the environment ends "
             "episodes (is_done() or a done attribute); leave early_termination_threshold=None"),
            (getattr(args, "remax_baseline", "max") == "greedy", "remax_baseline='greedy': the greedy joint action is "
             "a one-shot baseline that an episode with tools does not have; use remax_baseline='max'"),
        ]  # fmt: skip
        for bad, why in refuse:
            if bad:
                raise ValueError(
                    f"{trainer} with tools, environment_factory or turn_order='sequential' does not take {why}"
                )
        self.tools = per_agent_tools(tools, n)
        self.registry = EnvironmentRegistry(environment_factory) if environment_factory is not None else None
        if reward_func is None and not (self.registry is not None and self.registry.has_reward):
            raise ValueError(
                "no reward source: pass reward_funcs, or an environment_factory whose environment defines get_reward()"
            )
        self.train_dataset = train_dataset if train_dataset is not None else self._placeholder_dataset(args)

    def _placeholder_dataset(self, args: Any) -> Any:
        """TRL's rule: without a dataset the environment makes its own tasks (`reset()` returns them), so one
        environment (not a dict: the `environment` column routes) and `max_steps > 0` (the run's length)."""
        if self.registry is None:
            raise ValueError("train_dataset is required unless an environment_factory makes the tasks")
        if self.registry.multi:
            raise ValueError(
                "a dict environment_factory needs a train_dataset with an 'environment' column to route each item; "
                "pass a dataset, or a single environment factory"
            )
        if args.max_steps is None or args.max_steps <= 0:
            raise ValueError(
                "without a train_dataset (the environment makes its own tasks), max_steps must be > 0: it sets the "
                f"run's length; got max_steps={args.max_steps}"
            )
        from datasets import Dataset

        return Dataset.from_list([dict(PLACEHOLDER_ITEM)] * (args.rollout_buffer_size * max(args.world_size, 1)))

    @classmethod
    def build(
        cls,
        trainer_cls: type,
        args: Any,
        tools: Sequence[Any] | None,
        environment_factory: Any,
        reward_func: Callable | None,
        train_dataset: Any,
        external_transition: Callable | None,
    ) -> AgenticSetup | None:
        """The setup of a trainer class's arguments, or None when it rolls out as before. A trainer class that does
        not roll out (`supports_agentic = False`) refuses tools, an environment and a sequential turn order."""
        if not tools and environment_factory is None and args.turn_order == "simultaneous":
            return None
        if not trainer_cls.supports_agentic:
            raise ValueError(
                f"{trainer_cls.__name__} does not support tools, environment_factory or turn_order='sequential' (it "
                "learns from pairs or from one centralized model, not from a team's episodes); use a generation-based "
                "trainer: the MAGRPO family, MAAC, IAC or MAPPO"
            )
        return cls(
            trainer_cls.__name__, args, tools, environment_factory, reward_func, train_dataset, external_transition
        )

    def reward_sources(
        self, funcs: RewardFunction | None, processor: Callable[[float], float] | None
    ) -> RewardSources:
        """The reward functions plus every environment class that defines `get_reward` (TRL's extra reward source)."""
        envs = [] if self.registry is None else [s.cls.__name__ for s in self.registry.specs.values() if s.has_reward]
        return RewardSources(funcs, len(self.tools), processor, list(dict.fromkeys(envs)))

    def rollout(self, trainer: Any, reward: RewardSources) -> AgenticRollout:
        """The trainer's agentic rollout: each agent's tokenizer made ready for tool calling (TRL's
        `prepare_tool_tokenizer` steps), one tool executor, the episode settings of `trainer.args`."""
        args = trainer.args
        n = args.num_agents
        templates: list[str | None] = [None] * n
        ready = [False] * n
        env_tools = self.registry is not None and any(s.tools for s in self.registry.specs.values())
        for i, tok in enumerate(trainer.tokenizers):
            if not (self.tools[i] or env_tools):
                continue
            try:
                templates[i], ready[i] = prepare_tool_tokenizer(tok), True
            except Exception as e:
                if self.tools[i]:  # standalone tools need it now; environment tools only when offered (TurnPlayer)
                    raise ValueError(f"agent {i + 1} has tools, but its tokenizer: {e}") from e
        player = TurnPlayer(
            trainer.tokenizers,
            templates,
            ready,
            trainer.eos_ids,
            ToolExecutor(),
            args.max_completion_length,
            synced=trainer.generation.collective,
        )
        episode = EpisodeConfig(
            num_agents=n,
            turn_order=args.turn_order,
            max_turns=args.num_turns,
            max_tool_calling_iterations=args.max_tool_calling_iterations,
        )
        return AgenticRollout(
            trainer.formatters,
            player,
            reward,
            episode,
            args.num_generations,
            self.tools,
            self.registry,
            synced=trainer.generation.collective,
        )


def build_rollout(
    trainer: Any, agentic: AgenticSetup | None, reward: Any, external_transition: Callable | None
) -> AgenticRollout | JointRollout:
    """The trainer's rollout: the agentic one (`AgenticSetup.rollout`), else the `JointRollout` of its config.
    Both keep the processes in step when generating is a collective (ZeRO-3 / FSDP2)."""
    if agentic is not None:
        return agentic.rollout(trainer, reward)
    synced = trainer.generation.collective
    return JointRollout.from_config(
        trainer.args, trainer.formatters, trainer._render, reward, external_transition, synced=synced
    )
