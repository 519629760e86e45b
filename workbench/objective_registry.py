"""The objectives a run can train, one protocol and a registry by name: ``train.objective`` picks one.

An `Objective` is everything one training objective owns, in one place: the settings it reads (its
config section or keys) and their checks against the rest of a config, the records its examples are
made of, its term in the memory estimate, and, for a run, the trainer's side (`Objective.start`: the
step's loss, its warm-up batches, its eval and its metrics; `workbench.train.objective_run`). The
implementations (next-token SFT, distillation when a teacher is given, DPO and its relatives, GRPO)
live in `workbench.objectives`, the layer above the training loop, and register themselves here with
`register_objective` when that package is imported (``import workbench`` does it); an objective of
your own registers the same way (docs/how-to/objectives.md).

The layers below the objectives reach one through `objective_for` and call what the protocol names:
the config's validation (`Objective.check_config`), the data layer (`Objective.examples`), the memory
estimate (`Objective.memory`) and the `Trainer` (`Objective.start`). None of them names an objective;
this module imports nothing of the workbench but the config's error type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar, Literal

from workbench.config_parse import ConfigError

ExampleKind = Literal["text", "pairs", "prompts"]
"""What an objective's examples are: tokenised text or chat ('text'), preference pairs ('pairs', two
rows each: `workbench.data.preference`) or prompts with their answers ('prompts': `workbench.data.prompts`)."""


class Objective:
    """One training objective (see the module docstring). Subclasses set the class attributes and
    implement `examples` and `start`; the rest has a default that reads and checks nothing more."""

    name: ClassVar[str]
    """The ``train.objective`` value that picks it."""
    summary: ClassVar[str]
    """What it trains, in a few words (``config --explain train.objective``, model cards)."""
    example_kind: ClassVar[ExampleKind] = "text"
    """What its examples are (`ExampleKind`)."""
    settings: ClassVar[tuple[str, ...]] = ()
    """The config keys only this objective reads: ``section.key``, or ``section.`` for a whole section.
    A run of another objective that sets one gets a notice naming it (`idle_settings`)."""

    @property
    def reader(self) -> str:
        """Who reads its `settings`, for a notice: ``train.objective=NAME``."""
        return f"train.objective={self.name}"

    def check_config(self, cfg: Any) -> None:
        """Refuse (`workbench.config_parse.require`) what this objective cannot run in `cfg`, a
        `workbench.config.WorkbenchConfig` whose sections each passed their own checks."""
        return None  # an objective with no requirement of the rest of the config

    def examples(self, cfg: Any, tokenizer: Any, cache_dir: Any) -> Any:
        """``data.source``'s records as this objective's tokenised examples (a ``datasets.Dataset``)."""
        raise NotImplementedError(f"objective {self.name!r} makes no examples")

    def memory(self, cfg: Any) -> Any:
        """Its term in the memory estimate (a `workbench.analysis.objective_memory.StepRows`: the rows
        an example is, where the head runs, what else the step holds); None: one row of text an example,
        the next-token loss at every position."""
        return None

    def start(self, trainer: Any, *, teacher: Any = None) -> Any:
        """The trainer's side of a run (a `workbench.train.objective_run.ObjectiveRun`), before the model
        is placed; `teacher`: the model a run distils from, refused by an objective that takes none."""
        raise NotImplementedError(f"objective {self.name!r} cannot train")

    def idle_settings(self, cfg: Any, *, teacher: Any = None) -> list[str]:
        """Its own settings `cfg` sets that this run does not read (a setting that only matters with a
        teacher, say), each as a notice; the settings of other objectives are `idle_settings`' too."""
        return []


_REGISTRY: dict[str, Objective] = {}


def register_objective(objective: Objective) -> Objective:
    """Make `objective` one ``train.objective`` can name (replacing one of the same name); returns it."""
    if not getattr(objective, "name", ""):
        raise ValueError(f"{type(objective).__name__} has no name: set its class attribute `name`")
    _REGISTRY[objective.name] = objective
    return objective


def objective_names() -> tuple[str, ...]:
    """Every registered objective's name, in the order they registered."""
    return tuple(_REGISTRY)


def registered_objectives() -> tuple[Objective, ...]:
    """Every registered objective, in the order they registered."""
    return tuple(_REGISTRY.values())


def objective_named(name: str) -> Objective:
    """The objective ``train.objective=name`` picks; `ConfigError` naming the ones there are."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY) or "none registered (import workbench.objectives)"
        raise ConfigError(
            f"train.objective={name!r} is not allowed: one of {known} (an objective of your own "
            "registers with workbench.objective_registry.register_objective)"
        ) from None


def objective_for(cfg: Any) -> Objective:
    """The objective a `workbench.config.WorkbenchConfig` trains (its ``train.objective``)."""
    return objective_named(cfg.train.objective)


def idle_settings(cfg: Any, *, teacher: Any = None) -> list[str]:
    """A notice for each setting `cfg` gives a value other than its default that its run will not read:
    another objective's (``grpo.beta=0.1 is read by train.objective=grpo; this run trains 'sft': it is
    ignored``), and the run's own objective's idle ones (`Objective.idle_settings`)."""
    ours = objective_for(cfg)
    notices = []
    for other in _REGISTRY.values():
        if other is ours:
            continue
        for key in set_keys(cfg, other.settings, exclude=ours.settings):
            notices.append(
                f"{key}={_value(cfg, key)!r} is read by {other.reader}; this run trains "
                f"train.objective={ours.name} ({ours.summary}): it is ignored"
            )
    return notices + ours.idle_settings(cfg, teacher=teacher)


def set_keys(cfg: Any, settings: Iterable[str], *, exclude: Iterable[str] = ()) -> list[str]:
    """The dotted keys among `settings` (``section.key`` or a whole ``section.``) that `cfg` sets to other
    than their defaults, leaving out those `exclude` names (the same key read by another objective too)."""
    default = type(cfg)()
    skipped = set(exclude)
    found = []
    for setting in settings:
        section, _, key = setting.partition(".")
        keys = [key] if key else [f.name for f in dataclasses.fields(getattr(cfg, section))]
        for name in keys:
            dotted = f"{section}.{name}"
            if dotted in skipped or f"{section}." in skipped:
                continue
            if getattr(getattr(cfg, section), name) != getattr(getattr(default, section), name):
                found.append(dotted)
    return found


def _value(cfg: Any, dotted: str) -> Any:
    section, key = dotted.split(".", 1)
    return getattr(getattr(cfg, section), key)
