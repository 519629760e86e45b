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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.estimate import check_positive

# sharding imports only `workbench.runtime` (no torch_xla at import time) and nothing imports
# memory back, so the mesh sizes, the batch rule and the byte formatter come from one place

# ---- out-of-memory retry ----------------------------------------------------------------

_OOM_MARKERS = (
    "resource_exhausted",
    "resource exhausted",
    "out of memory",
    "oom when allocating",
    "attempting to reserve",
    "attempting to allocate",
    "ran out of memory",
)


def is_oom_error(exc: BaseException) -> bool:
    """True for a device out-of-memory error: XLA's RESOURCE_EXHAUSTED, CUDA out of memory,
    `torch.OutOfMemoryError` (also when it is the cause of another exception)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ in ("OutOfMemoryError", "ResourceExhaustedError"):
            return True
        text = str(current).lower()
        if any(marker in text for marker in _OOM_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass
class RetryResult:
    """The value `fn` returned and the micro-batch / accumulation it finally ran with."""

    value: Any
    micro_batch: int
    grad_accum: int
    attempts: list[dict[str, Any]] = field(default_factory=list)
    """One entry per try: micro_batch, grad_accum, error (None for the one that worked)."""

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.grad_accum


def run_with_oom_retry(
    fn: Callable[[int, int], Any],
    *,
    micro_batch: int,
    grad_accum: int,
    min_micro_batch: int = 1,
    multiple_of: int = 1,
    on_retry: Callable[[int, int, BaseException], None] | None = None,
) -> RetryResult:
    """Call ``fn(micro_batch, grad_accum)``; on an out-of-memory error halve the micro-batch and
    double the accumulation (same effective batch) and call again, down to `min_micro_batch`.

    The micro-batch stays a multiple of `multiple_of` (the data-parallel size). Errors that are
    not out-of-memory, and an OOM at the smallest micro-batch, propagate unchanged.
    """
    check_positive("micro_batch", micro_batch)
    check_positive("grad_accum", grad_accum)
    check_positive("min_micro_batch", min_micro_batch)
    check_positive("multiple_of", multiple_of)
    if micro_batch % multiple_of:
        raise ValueError(f"micro_batch={micro_batch} is not allowed: a multiple of multiple_of={multiple_of}")
    attempts: list[dict[str, Any]] = []
    while True:
        try:
            value = fn(micro_batch, grad_accum)
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            attempts.append(
                {
                    "micro_batch": micro_batch,
                    "grad_accum": grad_accum,
                    "error": f"{type(exc).__name__}: {exc}"[:300],
                }
            )
            half = micro_batch // 2
            if micro_batch % 2 or half < min_micro_batch or half % multiple_of:
                raise
            if on_retry is not None:
                on_retry(half, grad_accum * 2, exc)
            micro_batch, grad_accum = half, grad_accum * 2
            continue
        attempts.append({"micro_batch": micro_batch, "grad_accum": grad_accum, "error": None})
        return RetryResult(value=value, micro_batch=micro_batch, grad_accum=grad_accum, attempts=attempts)
