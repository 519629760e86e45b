"""The out-of-memory policy: recognise a device OOM, halve the micro-batch, double accumulation, retry.

One rule serves every caller: a micro-batch can be halved while it is even and the half stays
a multiple of the data-parallel size (so it still splits over the mesh) and at least the
smallest allowed. The effective batch (micro-batch x accumulation) and so the math stay the
same. `retry_on_oom` is the loop; the trainer uses it for warm-up and eager steps (restoring
its state before each retry), `run_with_oom_retry` for a plain function of
(micro_batch, grad_accum).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from workbench.analysis.estimate import check_positive

T = TypeVar("T")

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


def halved_micro_batch(micro_batch: int, *, multiple_of: int = 1, min_micro_batch: int = 1) -> int | None:
    """The micro-batch after one out-of-memory retry, or None when it cannot be halved."""
    half = micro_batch // 2
    if micro_batch % 2 or half < min_micro_batch or half % multiple_of:
        return None
    return half


def retry_on_oom(attempt: Callable[[], T], shrink: Callable[[BaseException], bool]) -> T:
    """Call `attempt` until it returns. On an out-of-memory error call ``shrink(error)``, which
    makes the next attempt smaller and returns False when nothing smaller is possible; then (and
    for any other error) the error propagates unchanged."""
    while True:
        try:
            return attempt()
        except Exception as err:
            if not is_oom_error(err) or not shrink(err):
                raise


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
    current = {"micro_batch": micro_batch, "grad_accum": grad_accum}

    def attempt() -> Any:
        return fn(current["micro_batch"], current["grad_accum"])

    def shrink(err: BaseException) -> bool:
        attempts.append({**current, "error": f"{type(err).__name__}: {err}"[:300]})
        half = halved_micro_batch(
            current["micro_batch"], multiple_of=multiple_of, min_micro_batch=min_micro_batch
        )
        if half is None:
            return False
        current.update(micro_batch=half, grad_accum=current["grad_accum"] * 2)
        if on_retry is not None:
            on_retry(current["micro_batch"], current["grad_accum"], err)
        return True

    value = retry_on_oom(attempt, shrink)
    attempts.append({**current, "error": None})
    return RetryResult(value=value, attempts=attempts, **current)
