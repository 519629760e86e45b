"""[from memory] Will it fit? Per-device memory of one training step, estimated before anything compiles.

`estimate` adds up, per device, what a training step holds at its peak: parameters,
gradients, optimizer state, the activations saved for the backward pass (a per-layer
formula for the family's attention and MLP, with and without materialised attention
scores, with and without activation checkpointing), the logits and loss temporaries, and
the batch itself. A mesh (`MeshSpec` sizes; nothing is built) divides parameters, gradients
and optimizer state over ``fsdp x model`` and the batch over ``data x fsdp``.

The activation formula counts the tensors autograd saves in the `transformers`
implementations, per token of one layer (H hidden, h heads of size d, I MLP width, T length):

    H                 the layer input (all that checkpointing keeps)
    2H + 2H           each norm's input and normalised output (kept in fp32 by HF norms)
    4hd               q, k and v after repeat_kv (GQA materialises k and v for every head),
                      and the attention output that feeds o_proj
    hT                the softmax probabilities, when attention is materialised ("eager");
                      a flash/fused kernel keeps only a per-head log-sum-exp
    4I (gated MLP)    gate, up, act(gate), act(gate)*up; 2I for a plain MLP (GPT-2)

and the loss keeps 4 vocab-sized fp32 tensors per token (logits, log-softmax and the two
gradients: HF upcasts logits to fp32 for the loss). With checkpointing a layer keeps only
its input, and one layer at a time is recomputed in the backward pass.

The estimate was checked against the XLA compiler's own memory analysis of the real
training step on XLA:CPU (``bench/memory.py``, `compiled_step_memory`); the table and the
rows that miss are in the issue note. Two things the compiler does that a formula cannot see:
under FSDP it keeps the all-gathered weights alive between forward and backward (counted here
as one full copy, ``gathered_params``), and on XLA:CPU checkpointing saves almost nothing:
its optimizer pipeline removes the optimization barriers torch_xla's checkpoint inserts, and
the compiled step keeps about as much as an unchecked one (also with CSE switched off). The
estimate models checkpointing as it is meant to work, so checkpointed rows on XLA:CPU miss.

Also here: the largest batch that fits (`max_batch_size`, `find_batch_size`, which can
confirm with the compiled program's own figure), and a retry on out-of-memory that halves
the micro-batch and doubles gradient accumulation (`run_with_oom_retry`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.estimate import MemoryEstimate, check_positive, estimate, mesh_sizes

# sharding imports only `workbench.runtime` (no torch_xla at import time) and nothing imports
# memory back, so the mesh sizes, the batch rule and the byte formatter come from one place
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
    """
    check_positive("multiple_of", multiple_of)
    check_positive("memory_bytes", memory_bytes)
    step = math.lcm(multiple_of, _mesh_dp(estimate_kwargs))

    def fits(k: int) -> bool:
        est = estimate(model_config, batch_size=k * step, seq_len=seq_len, **estimate_kwargs)
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
        est = estimate(model_config, batch_size=c, seq_len=seq_len, **estimate_kwargs)
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
