"""The one place that registers a training algorithm: its trainer, its config and, in the REINFORCE family, its group
baseline.

Everything that picks an algorithm by name reads this registry: the command line (`trl-marl <name>` and
`trl-marl magrpo --baseline`) and MARLHF's RL backend (`MARLHFConfig.rl_algorithm`: `MARLHFTrainer` holds the
`GroupBaselineStep` of a REINFORCE-family algorithm's baseline, or the RL step of the `maac` / `iac` trainer, its
`step_class`; see `trl_marl.trainers.rl_step`). What a checkpoint of the
algorithm may hold is its trainer's `resume_types` (collected over the class hierarchy by
`MultiAgentTrainer.all_resume_types`), shown as `Algorithm.resume_types`.

Adding an algorithm is one call next to its trainer:

    from trl_marl.trainers.registry import register_algorithm

    register_algorithm("mafoo", trainer=MAFooTrainer, config=MAFooConfig)

A class may also be given as `"module:attribute"` (entry-point notation), imported on first use: the built-ins below
are registered that way, through their public names in `trl_marl`, so that this module and `trl-marl --help` load
without torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["Algorithm", "algorithms", "get_algorithm", "register_algorithm"]


def _load(ref: type | str) -> type:
    if isinstance(ref, type):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Algorithm:
    """A registered training algorithm.

    Attributes:
        name: the algorithm's name: its `trl-marl` command, and its `rl_algorithm` value when it is a MARLHF backend.
        trainer: the trainer class, or `"module:attribute"` naming it (see `trainer_class`).
        config: the config class, or `"module:attribute"` naming it (see `config_class`).
        baseline: REINFORCE family only: the group baseline of its advantages (`mean`, `raw`, `loo` or `max`, see
            `trl_marl.algorithms.advantages.group_advantages`), which picks it in `trl-marl magrpo --baseline` and
            makes it a backend of MARLHF's `rl_algorithm`. None for every other algorithm.
    """

    name: str
    trainer: type | str
    config: type | str
    baseline: str | None = None

    @property
    def trainer_class(self) -> type:
        """The trainer class (imported on first use).

        Raises:
            TypeError: the registered `baseline` is not the trainer's own `baseline` attribute.
        """
        trainer = _load(self.trainer)
        if self.baseline is not None and getattr(trainer, "baseline", None) != self.baseline:
            raise TypeError(
                f"algorithm {self.name!r} is registered with baseline={self.baseline!r} but its trainer "
                f"{trainer.__name__} computes baseline={getattr(trainer, 'baseline', None)!r}"
            )
        return trainer

    @property
    def config_class(self) -> type:
        """The config class (imported on first use)."""
        return _load(self.config)

    @property
    def resume_types(self) -> tuple[type, ...]:
        """The types a checkpoint of this algorithm may hold besides plain data: its trainer's `resume_types`,
        collected over the class hierarchy (what the checkpoint loader allows for this trainer)."""
        return self.trainer_class.all_resume_types()


_ALGORITHMS: dict[str, Algorithm] = {}


def _check_ref(field: str, ref: object) -> None:
    if isinstance(ref, type) or (isinstance(ref, str) and ref.count(":") == 1 and all(ref.split(":"))):
        return
    raise TypeError(f"{field} must be a class or a 'module:attribute' string, got {ref!r}")


def register_algorithm(
    name: str, trainer: type | str, config: type | str, *, baseline: str | None = None
) -> Algorithm:
    """Register an algorithm under `name` and return its `Algorithm` (see its attributes for the arguments).

    Raises:
        ValueError: `name` is empty or already registered, or `baseline` is already another algorithm's.
        TypeError: `trainer` or `config` is neither a class nor a `"module:attribute"` string.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if name in _ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is already registered (trainer {_ALGORITHMS[name].trainer!r})")
    _check_ref("trainer", trainer)
    _check_ref("config", config)
    if baseline is not None:
        taken = [a.name for a in _ALGORITHMS.values() if a.baseline == baseline]
        if taken:
            raise ValueError(
                f"baseline {baseline!r} is already computed by the algorithm {taken[0]!r}; one algorithm per baseline"
            )
    algorithm = Algorithm(name, trainer, config, baseline)
    _ALGORITHMS[name] = algorithm
    return algorithm


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as `name`.

    Raises:
        ValueError: `name` is not registered (the message lists the registered names).
    """
    if name not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; registered algorithms: {', '.join(_ALGORITHMS)}")
    return _ALGORITHMS[name]


def algorithms() -> tuple[Algorithm, ...]:
    """Every registered algorithm, in the order of registration (the built-ins first)."""
    return tuple(_ALGORITHMS.values())


# The built-ins. The REINFORCE family (group baselines), then the actor-critic and the preference trainers.
register_algorithm("magrpo", "trl_marl:MAGRPOTrainer", "trl_marl:MAGRPOConfig", baseline="mean")
register_algorithm("mareinforce", "trl_marl:MAREINFORCETrainer", "trl_marl:MAREINFORCEConfig", baseline="raw")
register_algorithm("marloo", "trl_marl:MARLOOTrainer", "trl_marl:MARLOOConfig", baseline="loo")
register_algorithm("maremax", "trl_marl:MAReMaxTrainer", "trl_marl:MAReMaxConfig", baseline="max")
register_algorithm("maac", "trl_marl:MAACTrainer", "trl_marl:MAACConfig")
register_algorithm("iac", "trl_marl:IACTrainer", "trl_marl:IACConfig")
register_algorithm("mappo", "trl_marl:MAPPOTrainer", "trl_marl:MAPPOConfig")
register_algorithm("madpo", "trl_marl:MADPOTrainer", "trl_marl:MADPOConfig")
register_algorithm("marlhf", "trl_marl:MARLHFTrainer", "trl_marl:MARLHFConfig")
register_algorithm("madpo-iter", "trl_marl:MADPOIterTrainer", "trl_marl:MADPOIterConfig")
register_algorithm("marlhf-iter", "trl_marl:MARLHFIterTrainer", "trl_marl:MARLHFIterConfig")
