"""An objective's term in the memory estimate: what one example is in the step's rows, and what else it holds.

`workbench.analysis.estimate.estimate` prices one training step the same way for every objective and
asks its term (``objective=``; a run's from `workbench.objective_registry.Objective.memory`, through
`workbench.analysis.config_estimate.config_settings`) only what differs:

- how many rows one example of ``batch_size`` is (`StepRows.rows_per_example`) and how many positions a
  row has (`StepRows.positions`);
- where the LM head runs and what its logits hold (`StepRows.head_positions`, `StepRows.logits_bytes`);
- the batch's own tensors (`StepRows.input_bytes`);
- the parts it adds beyond the step's own, and figures of its own to show beside them
  (`StepRows.extra_parts`: DPO's frozen reference copy; GRPO's rollout cache,
  `workbench.analysis.rollout_memory.RolloutPlan`).

`StepRows` itself is the next-token loss's term: a row of text an example, the head at every position.
The others are their objectives' own: `workbench.analysis.preference_memory.PairRows` (a preference pair's
two rows, and a 'copy' reference's weights), `workbench.analysis.rollout_memory.RolloutPlan` (GRPO's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.models.lm_head import logits_bytes


@dataclass(frozen=True)
class StepContext:
    """What an objective's term may read of the step being priced (per device)."""

    model_config: Any
    """The model's config, as `estimate` was given it."""
    shape: Any
    """Its `workbench.analysis.shape.ModelShape`."""
    rows: int
    """Rows a micro-step trains per device."""
    prompt_length: int
    """The length `estimate` was given (a GRPO prompt's; a row's otherwise)."""
    param_bytes: int
    """Bytes of a weight as stored."""
    compute_bytes: int
    """Bytes of an activation (and of a weight as the matmuls see it)."""
    model_parallel: int
    """The mesh's model axis."""
    weight_bytes: int
    """The model's own weights per device as held (a quantized base at its integers and scales)."""
    training_transient_bytes: int
    """The step's activations and logits: what it frees before the next step."""


class StepRows:
    """The next-token loss's term (the estimate's default): one row of the given length an example, the
    LM head and its loss at every position. Other objectives subclass it where they differ."""

    rows_per_example: int = 1
    """Rows one example of ``batch_size`` puts through the forward and backward passes."""
    weight_copies: int = 0
    """Frozen copies of the starting weights the objective holds beside the model's (a DPO 'copy'
    reference: one), on the device and, while loading, on the host."""

    def positions(self, length: int) -> int:
        """Positions of a training row, for examples of `length` tokens."""
        return length

    def head_positions(self, positions: int) -> int:
        """Positions of a row the LM head runs on (the chunking rule's length)."""
        return positions

    def logits_bytes(
        self,
        *,
        rows: int,
        positions: int,
        chunk: int | None,
        vocab: int,
        model_parallel: int,
        frozen_head: bool,
    ) -> int:
        """The LM head's fp32 logits, log-softmax and their gradients over `positions` (one `chunk` of
        positions when chunked), vocabulary-parallel under the model axis."""
        return logits_bytes(
            rows=rows, positions=chunk or positions, vocab=vocab, model_parallel=model_parallel
        )

    def input_bytes(self, *, rows: int, positions: int, prompt_length: int) -> int:
        """The batch on the device: input ids and labels, int64."""
        return rows * positions * 2 * 8

    def extra_parts(self, step: StepContext) -> tuple[dict[str, int], Any]:
        """Breakdown parts beyond the step's own, and figures of the objective's own to show beside the
        breakdown (`MemoryEstimate.objective_report`): none."""
        return {}, None


NEXT_TOKEN = StepRows()
"""The default term: supervised next-token training."""
