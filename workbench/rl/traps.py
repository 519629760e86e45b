"""The traps a GRPO run falls into, named while it runs: read from each log interval's figures.

Users' most frequent GRPO reports are runs that trained on nothing and said nothing: completions
cut at the budget whose rewards judged unfinished answers (trl#5697: every reward 0), groups whose
completions all scored alike (no advantage, no gradient), reward functions that scored nothing.
`interval_traps` reads an interval's rollout figures (`workbench.rl.metrics.rollout_metrics`, no
device read) and words a notice for each trap it finds:

- more than half of the interval's completions cut at ``grpo.max_completion_length``
  (``clipped_ratio`` > 0.5): the key to raise;
- most groups without signal (``zero_std_groups`` > 0.5): what makes groups differ;
- a reward function that scored none of the interval's completions (its figure is n/a).

`nothing_scored` words the one that stops the run: no completion scored by any function for a whole
interval (every advantage 0: the run would learn nothing and report a mean of nothing as 0). The run
raises `NothingScoredError` with that line once the interval's metrics reached the callbacks, so the
dashboard and ``--metrics-out`` hold the interval that stopped it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CLIPPED_SHARE = 0.5
"""Above this share of an interval's completions cut at the budget, the run says which key to raise."""
ZERO_STD_SHARE = 0.5
"""Above this share of an interval's groups without signal ("most groups"), the run says so."""


class NothingScoredError(RuntimeError):
    """No completion of a whole log interval was scored by any reward function: the run stops."""


@dataclass(frozen=True)
class Trap:
    """A trap found in an interval: its `kind` (one notice of each kind joins the run's summary) and the notice."""

    kind: str
    message: str


def interval_traps(figures: Mapping[str, Any], grpo: Any, step: int) -> list[Trap]:
    """The traps in an interval's rollout figures (`ROLLOUT_KEYS` filled), at log step `step` of a run
    with the ``grpo`` section `grpo`; none for an interval without a rollout."""
    if figures.get("completion_length") is None:  # no rollout in the interval (num_iterations > 1)
        return []
    traps = []
    clipped = figures.get("clipped_ratio")
    if clipped is not None and clipped > CLIPPED_SHARE:
        traps.append(
            Trap(
                "clipped",
                f"step {step}: {clipped:.0%} of the interval's completions were cut at "
                f"grpo.max_completion_length={grpo.max_completion_length} tokens (clipped_ratio {clipped:.2f}): "
                "their rewards judge unfinished answers; raise grpo.max_completion_length"
                + (
                    ""
                    if grpo.mask_truncated_completions
                    else " (or leave cut ones out of the loss with grpo.mask_truncated_completions=true)"
                ),
            )
        )
    zero = figures.get("zero_std_groups")
    if zero is not None and zero > ZERO_STD_SHARE:
        traps.append(
            Trap(
                "zero_std",
                f"step {step}: {zero:.0%} of the interval's groups scored every completion alike "
                f"(zero_std_groups {zero:.2f}): their advantages are 0 and they teach nothing; prompts "
                "all right or all wrong are too easy or too hard for the model: raise grpo.num_generations, "
                "add a reward with partial credit (e.g. format), or train on prompts nearer its level",
            )
        )
    for name, value in (figures.get("rewards") or {}).items():
        if value is None:
            hint = " (it compares with the data's 'answer' column)" if name == "math_answer" else ""
            traps.append(
                Trap(
                    f"unscored:{name}",
                    f"step {step}: reward function {name!r} scored none of the interval's completions "
                    f"(it returned None or NaN for each){hint}: reward/{name} is n/a",
                )
            )
    return traps


def nothing_scored(figures: Mapping[str, Any], names: Sequence[str], step: int) -> str | None:
    """The line that stops a run whose interval ending at `step` had completions and scored none of
    them (the reward functions `names`); None when something was scored or nothing was sampled."""
    if figures.get("completion_length") is None or figures.get("reward_mean") is not None:
        return None
    answer = (
        "; math_answer compares with the data's 'answer' column (name yours with data.columns={answer: COLUMN})"
        if "math_answer" in names
        else ""
    )
    return (
        f"step {step}: no completion of the interval was scored: every reward function "
        f"({', '.join(names)}) returned None or NaN for each, so every advantage is 0 and the run learns "
        f"nothing; make the functions return numbers (None skips a completion){answer}"
    )


class TrapNotices:
    """Says each trap found at a log step: the first of each kind through the run's notice (it joins
    the run's summary), later ones as a notice line only."""

    def __init__(self, notice: Any, repeat: Any) -> None:
        self.notice, self.repeat = notice, repeat
        self.kinds: set[str] = set()

    def say(self, traps: Sequence[Trap]) -> None:
        for trap in traps:
            if trap.kind in self.kinds:
                self.repeat(trap.message)
            else:
                self.kinds.add(trap.kind)
                self.notice(trap.message)
