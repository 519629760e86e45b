"""DPO's term in the memory estimate: a preference pair is two rows, and a 'copy' reference holds the weights again.

`PairRows` (`workbench.objectives.preference.Preference.memory` makes a config's) tells
`workbench.analysis.estimate.estimate` that an example of ``batch_size`` is a pair, a chosen and a
rejected row through the forward and backward passes, and adds the ``reference`` part: a 'copy'
reference's frozen weights in the parameter precision. The reference's own forward runs without
gradients before the policy's and keeps nothing for the backward pass, so it adds nothing at the
step's peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.analysis.objective_memory import StepContext, StepRows

PREFERENCE_REFERENCES = ("adapters_off", "copy", "precompute")
"""How a DPO run gets its reference log-probs (``train.dpo_reference`` resolved: `PairRows.reference`)."""

REFERENCE_MEANINGS: dict[str, str] = {
    "reference": "DPO's frozen reference copy of the starting weights, in the parameter precision",
}
"""The breakdown part `PairRows` adds (`workbench.analysis.estimate.BREAKDOWN_MEANINGS`)."""


@dataclass(frozen=True)
class PairRows(StepRows):
    """A preference pair: its chosen and rejected rows; a 'copy' reference's weights beside the model's."""

    reference: str = "adapters_off"
    """The run's reference (`PREFERENCE_REFERENCES`; `workbench.objectives.preference.reference_mode`)."""
    rows_per_example: ClassVar[int] = 2

    @property
    def weight_copies(self) -> int:  # type: ignore[override]
        return 1 if self.reference == "copy" else 0

    def __post_init__(self) -> None:
        if self.reference not in PREFERENCE_REFERENCES:
            raise ValueError(
                f"reference={self.reference!r} is not allowed: one of {', '.join(map(repr, PREFERENCE_REFERENCES))}"
            )

    def extra_parts(self, step: StepContext) -> tuple[dict[str, int], Any]:
        return {"reference": step.weight_bytes * self.weight_copies}, None
