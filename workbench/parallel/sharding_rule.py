"""A sharding rule and a table of them: the one type every rule table is written in.

A `ShardingRule` maps parameter names (a regex) to a partition spec over the ``model`` axis, with where
it came from (`TP_PLAN`, `HAND_RULE`, `FSDP_FALLBACK`); a `RuleTable` is an ordered tuple of them with
notes for the sharding report; `FSDP_ONLY_RULES` is the family-agnostic table every other one ends in.
The hand tables and the choice of a model's table are `workbench.parallel.rules`'s, the tables derived
from transformers' plans `workbench.parallel.tp_plan`'s: both build on this module.

Plain Python: nothing here touches torch_xla.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

AxisEntry = str | tuple[str, ...] | None
"""One entry of a partition spec: a mesh axis, several axes (major first) or None (replicated)."""
PartitionSpec = tuple[AxisEntry, ...]


def axes_of(entry: AxisEntry) -> tuple[str, ...]:
    """The mesh axes one partition-spec entry names, major first (none for a replicated dimension)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


class ShardingError(ValueError):
    """A sharding that cannot be applied; the message names the parameter, dimension and axis."""


TP_PLAN = "tp plan"
"""`ShardingRule.source` of a rule derived from transformers' own tensor-parallel plan."""
HAND_RULE = "hand rule"
"""`ShardingRule.source` of a rule written here (or passed in by the caller)."""
FSDP_FALLBACK = "fsdp fallback"
"""`ShardingRule.source` of a rule that only spreads a parameter over ``fsdp`` (no plan, no hand rule)."""


@dataclass(frozen=True)
class ShardingRule:
    """Parameters whose name matches `pattern` (``re.search``) get `spec` over the `model` axis.

    `spec` has one entry per tensor dimension (a mesh axis, a tuple of axes, or None), or is
    None for "replicate everywhere". With `fsdp=True` the `fsdp` axis then goes on the largest
    dimension the spec leaves free (one that divides by the fsdp size). `source` says where the
    rule came from (`TP_PLAN`, `HAND_RULE`, `FSDP_FALLBACK`); with `ndim` set, the rule applies
    only to parameters with that many dimensions (one plan style gives a weight, its bias and a
    stacked-experts tensor different specs).
    """

    pattern: str
    spec: PartitionSpec | None
    note: str = ""
    fsdp: bool = True
    source: str = HAND_RULE
    ndim: int | None = None

    def applies(self, name: str, ndim: int) -> bool:
        return (self.ndim is None or self.ndim == ndim) and re.search(self.pattern, name) is not None


class RuleTable(tuple):
    """A rule table (a tuple of `ShardingRule`) with `notes` for the sharding report: why a
    family got FSDP only, which plan styles could not be mapped."""

    notes: tuple[str, ...] = ()

    def __new__(cls, rules: Iterable[ShardingRule], notes: Iterable[str] = ()) -> RuleTable:
        table = super().__new__(cls, rules)
        table.notes = tuple(notes)
        return table


def rule(
    pattern: str,
    spec: PartitionSpec | None,
    note: str = "",
    *,
    fsdp: bool = True,
    source: str = HAND_RULE,
    ndim: int | None = None,
) -> ShardingRule:
    return ShardingRule(pattern, spec, note, fsdp, source, ndim)


FSDP_ONLY_RULES: tuple[ShardingRule, ...] = (
    rule(r"(norm|ln_\w+)\.(weight|bias)$", None, "norm: tiny, replicated", source=FSDP_FALLBACK),
    rule(r"\.bias$", None, "bias: tiny, replicated", source=FSDP_FALLBACK),
    rule(r".", tuple(), "FSDP: largest dimension over fsdp", source=FSDP_FALLBACK),
)
"""Family-agnostic rules: FSDP on every weight, no tensor parallelism (a `model` axis holds replicas)."""


def as_rules(rules: Iterable[Any]) -> list[ShardingRule]:
    """`rules` as `ShardingRule`s: each one as it is, or a ``(pattern, spec[, note])`` tuple made into one."""
    out = []
    for item in rules:
        if isinstance(item, ShardingRule):
            out.append(item)
        elif isinstance(item, Sequence) and len(item) in (2, 3) and isinstance(item[0], str):
            out.append(ShardingRule(item[0], None if item[1] is None else tuple(item[1]), *item[2:]))
        else:
            raise ShardingError(f"rule {item!r} is not allowed: expected ShardingRule or (pattern, spec)")
    return out
