"""The largest batch that fits: searched with the memory estimate, optionally confirmed by the compiler.

`max_batch_size` is the largest global batch whose `workbench.analysis.estimate.estimate` fits
in one device's memory (less a headroom), a multiple of the mesh's data-parallel size.
`find_batch_size` chooses the micro-batch to run with before anything runs: the largest
candidate the estimate lets through, checked, when a `compiled_bytes` probe is given
(`workbench.analysis.probe.compiled_step_probe`), against the compiled program's own figure,
and the next smaller one when the compiler says it does not fit. Its `BatchPlan` keeps every
candidate with the reason it was taken or not.

A step that still runs out of memory is `workbench.train.oom`'s to handle (half the
micro-batch, twice the gradient accumulation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.estimate import MemoryEstimate, check_positive, estimate, mesh_sizes
from workbench.parallel.mesh import data_parallel_size

# ---- the largest batch -----------------------------------------------------------------


def max_batch_size(
    model_config: Any,
    *,
    seq_len: int,
    memory_bytes: int,
    multiple_of: int = 1,
    headroom: float = 0.1,
    limit: int = 1 << 20,
    **estimate_kwargs: Any,
) -> int:
    """The largest global batch whose estimate fits in `memory_bytes` per device; 0 when not even
    the smallest allowed batch fits.

    The batch is a multiple of `multiple_of` and of the data-parallel size (data x fsdp) of a
    ``mesh=`` in `estimate_kwargs` (their least common multiple): `estimate` refuses a batch
    that does not split over the mesh, so the default ``multiple_of=1`` works with a mesh too.
    `estimate_kwargs` go to `estimate` as they are (optimizer, precision, mesh, ``lora_rank`` and
    ``lora_targets`` for a LoRA run, ``quantize`` for a quantized base, ``loss_chunk_tokens``,
    ...); `memory_bytes` goes too, so a ``loss_chunk_tokens='auto'`` estimate chunks the loss as
    the trainer would on that device.

    The estimate grows with the batch except where 'auto' starts chunking the loss (the logits
    term then drops to one chunk's); the search doubles, then bisects, so right there it may
    return a fitting batch below the largest one.
    """
    check_positive("multiple_of", multiple_of)
    check_positive("memory_bytes", memory_bytes)
    step = math.lcm(multiple_of, _mesh_dp(estimate_kwargs))

    def fits(k: int) -> bool:
        est = estimate(
            model_config, batch_size=k * step, seq_len=seq_len, memory_bytes=memory_bytes, **estimate_kwargs
        )
        return est.fits(memory_bytes, headroom)

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi * step <= limit and fits(hi):  # the estimate grows with the batch: double, then bisect
        lo, hi = hi, hi * 2
    hi = min(hi, limit // step + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * step


def _mesh_dp(estimate_kwargs: Mapping[str, Any]) -> int:
    """The data-parallel size (data x fsdp) of the ``mesh=`` among `estimate` keyword arguments; 1 without one."""
    return data_parallel_size(mesh_sizes(estimate_kwargs.get("mesh")))


@dataclass
class BatchPlan:
    """What `find_batch_size` chose and why."""

    batch_size: int
    """Global micro-batch to run with (0: nothing fits)."""
    estimate: MemoryEstimate | None
    compiled_bytes: int | None
    """The compiled program's per-device peak for `batch_size`, where the backend reported one."""
    memory_bytes: int
    candidates: list[dict[str, Any]] = field(default_factory=list)
    """Every size considered: batch_size, estimate_bytes, compiled_bytes, fits, reason."""


def find_batch_size(
    model_config: Any,
    *,
    seq_len: int,
    memory_bytes: int,
    dp_size: int | None = None,
    candidates: Sequence[int] | None = None,
    headroom: float = 0.1,
    compiled_bytes: Callable[[int], int | None] | None = None,
    **estimate_kwargs: Any,
) -> BatchPlan:
    """Choose the global micro-batch before running anything.

    Candidates are multiples of `step`, the least common multiple of `dp_size` and the data-parallel
    size (data x fsdp) of a ``mesh=`` in `estimate_kwargs`; `dp_size` defaults to the mesh's (1
    without a mesh). Default candidates: step x 1, 2, 4, ... up to the estimate's largest fit and
    one beyond. The largest candidate whose estimate fits is checked with
    `compiled_bytes(batch)` when given (e.g. compile the step without running it and read the
    compiler's memory analysis); if the compiler says it does not fit, the next smaller candidate
    is tried. A `None` from the probe (backend reports nothing) keeps the estimate's verdict.
    `estimate_kwargs` and `memory_bytes` reach `estimate` as in `max_batch_size`.
    """
    mesh_dp = _mesh_dp(estimate_kwargs)
    if dp_size is None:
        dp_size = mesh_dp
    check_positive("dp_size", dp_size)
    step = math.lcm(dp_size, mesh_dp)
    if candidates is None:
        best = max_batch_size(
            model_config,
            seq_len=seq_len,
            memory_bytes=memory_bytes,
            multiple_of=step,
            headroom=headroom,
            **estimate_kwargs,
        )
        top = max(best, step) * 2
        candidates = []
        k = step
        while k <= top:
            candidates.append(k)
            k *= 2
        if best and best not in candidates:
            candidates.append(best)
    for c in candidates:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1 or c % step:
            allowed = (
                f"dp_size={dp_size}"
                if step == dp_size
                else f"{step} (the least common multiple of dp_size={dp_size} and the mesh's data x fsdp = {mesh_dp})"
            )
            raise ValueError(f"candidate batch size {c!r} is not allowed: a positive multiple of {allowed}")
    budget = memory_bytes * (1 - headroom)
    rows: list[dict[str, Any]] = []
    ordered = sorted(set(candidates), reverse=True)
    chosen, chosen_est, chosen_compiled = 0, None, None
    for c in ordered:
        est = estimate(
            model_config, batch_size=c, seq_len=seq_len, memory_bytes=memory_bytes, **estimate_kwargs
        )
        row: dict[str, Any] = {"batch_size": c, "estimate_bytes": est.total_bytes, "compiled_bytes": None}
        if chosen:
            row.update(fits=est.fits(memory_bytes, headroom), reason="smaller than the chosen size")
        elif not est.fits(memory_bytes, headroom):
            row.update(fits=False, reason="estimate over budget")
        else:
            measured = compiled_bytes(c) if compiled_bytes is not None else None
            row["compiled_bytes"] = measured
            if measured is not None and measured > budget:
                row.update(fits=False, reason="compiled program over budget")
            else:
                row.update(
                    fits=True,
                    reason="chosen" + (" (compiler agrees)" if measured is not None else " (estimate)"),
                )
                chosen, chosen_est, chosen_compiled = c, est, measured
        rows.append(row)
    rows.sort(key=lambda r: r["batch_size"])
    return BatchPlan(
        batch_size=chosen,
        estimate=chosen_est,
        compiled_bytes=chosen_compiled,
        memory_bytes=memory_bytes,
        candidates=rows,
    )
