"""The bucket planner: at most K padded lengths ("boundaries") for a distribution of sequence lengths.

XLA compiles one program per input shape. Raw variable-length batches recompile at every new
length; padding everything to the maximum compiles once but spends most FLOPs on padding. A
bucket plan (`BucketPlan`) makes the set of shapes a planned, measured quantity: its
boundaries, the real and padded token counts, and so its efficiency.

`plan_buckets` offers several strategies (`STRATEGIES`). Strategy "optimal" is an exact
dynamic programme: it returns the boundaries (multiples of ``multiple_of``) with the fewest
padded tokens possible, over the histogram of distinct rounded-up lengths (so 1,000,000
lengths cost what their few thousand distinct values cost), with a monotone convex-hull trick
making each of the K layers linear in the distinct values.

**Boundaries are fitted to sequence lengths, not to per-batch maxima.** The sampler
(`workbench.data.sampler`) forms batches *inside* a bucket and the collator
(`workbench.data.collate`) pads every batch of bucket ``j`` to boundary ``b_j``, whatever its
members are, so each sequence costs exactly its bucket boundary: the padded-token count of an
epoch is ``sum(boundary(length_i))`` over the sequences (plus the remainders dropped to keep
shapes fixed), which is what the planner minimises (`padded_tokens_for`). Per-batch maxima
would be the right target only for batches formed first and padded to their longest member
(strategy "none"); their maxima depend on the shuffle, change every epoch and give one shape
per distinct maximum — the recompilation bucketing exists to avoid.

A plan that `workbench.data.bucket_choice.choose_buckets` made carries its `BucketChoice`: why it has the
number of shapes it has (the inputs and the predicted time per K).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

STRATEGIES = ("optimal", "pow2", "multiple", "quantile", "max")
Strategy = Literal["optimal", "pow2", "multiple", "quantile", "max"]


# ---- planning --------------------------------------------------------------------------------


def round_up(values: Any, multiple: int) -> Any:
    return -(-np.asarray(values, dtype=np.int64) // multiple) * multiple


@dataclass(frozen=True)
class BucketPlan:
    """Boundaries for a length distribution and what they cost."""

    boundaries: list[int]
    """Sorted padded lengths; the last one fits every (clipped) length."""
    real_tokens: int
    """Tokens of the sequences themselves (lengths clipped to `max_length`)."""
    padded_tokens: int
    """Tokens after padding each sequence to its bucket boundary."""
    strategy: str
    num_sequences: int
    counts: list[int] = field(default_factory=list)
    """Sequences per bucket, aligned with `boundaries`."""
    truncated: int = 0
    """Sequences longer than `max_length` (planned as truncated to it)."""
    choice: BucketChoice | None = None
    """How `choose_buckets` picked the number of shapes (its predicted time per K); None otherwise."""

    @property
    def efficiency(self) -> float:
        """Real tokens / padded tokens (1.0 means no padding)."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    @property
    def num_shapes(self) -> int:
        """Distinct padded lengths, i.e. compiled shapes per batch size."""
        return len(self.boundaries)

    def bucket_index(self, length: int) -> int:
        """Index of the smallest boundary that fits `length`."""
        index = bisect.bisect_left(self.boundaries, int(length))
        if index == len(self.boundaries):
            raise ValueError(
                f"length={length} is longer than the last boundary {self.boundaries[-1]}; "
                "truncate it or plan with a larger max_length"
            )
        return index

    def bucket_for(self, length: int) -> int:
        """The padded length a sequence of `length` tokens gets."""
        return self.boundaries[self.bucket_index(length)]

    def summary(self) -> dict[str, Any]:
        out = {
            "strategy": self.strategy,
            "boundaries": list(self.boundaries),
            "num_shapes": self.num_shapes,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "efficiency": self.efficiency,
            "truncated": self.truncated,
        }
        if self.choice is not None:
            out["choice"] = self.choice.summary()
        return out


@dataclass(frozen=True)
class BucketChoice:
    """Why a plan has the number of shapes it has: the inputs and the predicted time per K."""

    compile_seconds: float
    """Seconds one more shape costs to compile."""
    seconds_per_padded_token: float
    """Training seconds per padded token."""
    epochs: float
    """Passes over the lengths the run makes."""
    padded_tokens: list[int]
    """Fewest padded tokens of one pass with at most K shapes, for K = 1, 2, ... (entry K-1)."""
    chosen: int
    """The number of shapes chosen."""
    chosen_padded_tokens: int
    """Padded tokens of one pass under the chosen plan."""
    source: str = "given"
    """Where the two costs came from ("given", "measured", or "no compiles" off XLA)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Facts of the measurement, if any (e.g. the shape it ran on)."""

    def padded_for(self, shapes: int) -> int:
        if shapes == self.chosen:
            return self.chosen_padded_tokens
        if not 1 <= shapes <= len(self.padded_tokens):
            raise ValueError(f"shapes={shapes} is not on the curve: expected 1..{len(self.padded_tokens)}")
        return self.padded_tokens[shapes - 1]

    def steps_seconds(self, shapes: int) -> float:
        """Predicted seconds of the training steps with `shapes` shapes (the padding part)."""
        return self.epochs * self.padded_for(shapes) * self.seconds_per_padded_token

    def compile_part(self, shapes: int) -> float:
        """Predicted seconds compiling `shapes` shapes."""
        return shapes * self.compile_seconds

    def predicted_seconds(self, shapes: int) -> float:
        """Predicted total: steps plus compiles."""
        return self.steps_seconds(shapes) + self.compile_part(shapes)

    @property
    def predicted_total_s(self) -> float:
        """The chosen plan's predicted total seconds."""
        return self.predicted_seconds(self.chosen)

    def curve(self) -> list[dict[str, float]]:
        """One row per K on the curve (and the chosen K): shapes, compile_s, steps_s, total_s."""
        ks = sorted({*range(1, len(self.padded_tokens) + 1), self.chosen})
        return [
            {
                "shapes": k,
                "compile_s": self.compile_part(k),
                "steps_s": self.steps_seconds(k),
                "total_s": self.predicted_seconds(k),
            }
            for k in ks
        ]

    def describe(self) -> str:
        """One line: the choice, its predicted total and its inputs."""
        if self.compile_seconds == 0:  # nothing to weigh: the per-token figure is only a placeholder
            return (
                f"bucketing auto: {self.chosen} shapes, the fewest padded tokens ({self.chosen_padded_tokens:,} "
                f"per epoch; {self.source}: every distinct rounded length its own shape)"
            )
        return (
            f"bucketing auto: {self.chosen} shapes, predicted {self.predicted_total_s:.1f} s "
            f"({self.compile_part(self.chosen):.1f} s compiling + {self.steps_seconds(self.chosen):.1f} s of steps) "
            f"from compile {self.compile_seconds:.3g} s/shape and {self.seconds_per_padded_token:.3g} s/padded token "
            f"({self.source}) over {self.epochs:.3g} epochs"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "chosen_shapes": self.chosen,
            "predicted_total_s": self.predicted_total_s,
            "compile_seconds": self.compile_seconds,
            "seconds_per_padded_token": self.seconds_per_padded_token,
            "epochs": self.epochs,
            "source": self.source,
            "curve": self.curve(),
            **({"measurement": dict(self.extra)} if self.extra else {}),
        }


def padded_tokens_for(lengths: Sequence[int] | np.ndarray, boundaries: Sequence[int]) -> int:
    """Tokens after padding every length to the smallest boundary that fits it (lengths must fit)."""
    arr = np.asarray(lengths, dtype=np.int64)
    bounds = np.asarray(sorted(boundaries), dtype=np.int64)
    if arr.size and arr.max() > bounds[-1]:
        raise ValueError(f"a length of {int(arr.max())} does not fit the last boundary {int(bounds[-1])}")
    return int(bounds[np.searchsorted(bounds, arr, side="left")].sum())


def plan_buckets(
    lengths: Sequence[int] | np.ndarray,
    max_buckets: int | None,
    *,
    multiple_of: int = 1,
    max_length: int | None = None,
    strategy: Strategy = "optimal",
) -> BucketPlan:
    """Choose padded lengths for `lengths`.

    ``max_buckets`` caps the number of boundaries (None: no cap). Lengths above ``max_length``
    are planned as truncated to it (and counted in ``truncated``); without ``max_length`` the
    longest length decides. Every boundary is a multiple of ``multiple_of`` and the last one
    is ``max_length`` (or the longest length) rounded up to it.

    Strategies: "optimal" (fewest padded tokens with at most ``max_buckets`` boundaries, exact),
    "pow2" (powers of two), "multiple" (every ``multiple_of``), "quantile" (length quantiles
    ``i / max_buckets``), "max" (one boundary: pad to the maximum). When "pow2" or "multiple"
    need more boundaries than ``max_buckets``, the shortest buckets merge into the next one up.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not allowed: expected one of {', '.join(STRATEGIES)}")
    if max_buckets is not None and (not isinstance(max_buckets, (int, np.integer)) or max_buckets < 1):
        raise ValueError(f"max_buckets={max_buckets!r} is not allowed: must be an int >= 1 or None")
    hist = LengthHistogram.of(lengths, multiple_of=multiple_of, max_length=max_length)
    values, counts, top = hist.values, hist.counts, hist.top

    if strategy == "optimal":
        # no cap: one boundary per candidate value, the appended top one included
        k = len(values) if max_buckets is None else int(max_buckets)
        boundaries = _optimal_boundaries(values, counts, k)
    elif strategy == "max":
        boundaries = [top]
    elif strategy == "pow2":
        lo, bounds, p = int(values[0]), [], 1
        while True:
            b = int(round_up(p, multiple_of))
            if b >= lo:
                bounds.append(min(b, top))
            if b >= top:
                break
            p *= 2
        boundaries = _cap(sorted(set(bounds)), max_buckets)
    elif strategy == "multiple":
        boundaries = _cap(list(range(int(values[0]), top + 1, multiple_of)), max_buckets)
    else:  # quantile
        k = int(max_buckets) if max_buckets is not None else 4
        qs = np.quantile(hist.clipped, np.arange(1, k + 1) / k, method="higher")
        boundaries = sorted({int(b) for b in round_up(qs, multiple_of)} | {top})
        boundaries = _cap([b for b in boundaries if b <= top], max_buckets)

    return hist.plan(boundaries, strategy)


@dataclass(frozen=True)
class LengthHistogram:
    """Lengths as the planners see them: clipped to ``max_length``, rounded up to ``multiple_of``,
    counted per distinct value; the top value (``max_length`` or the longest, rounded) is always
    present (with a count of 0 when no length reaches it), since the last boundary must fit it."""

    values: np.ndarray
    """Distinct rounded lengths, ascending, the top one last."""
    counts: np.ndarray
    """Sequences per value."""
    clipped: np.ndarray
    """Every length, clipped to ``max_length`` (not rounded)."""
    top: int
    truncated: int

    @classmethod
    def of(
        cls, lengths: Sequence[int] | np.ndarray, *, multiple_of: int = 1, max_length: int | None = None
    ) -> LengthHistogram:
        if not isinstance(multiple_of, (int, np.integer)) or multiple_of < 1:
            raise ValueError(f"multiple_of={multiple_of!r} is not allowed: must be an int >= 1")
        arr = np.asarray(lengths, dtype=np.int64).ravel()
        if arr.size == 0:
            raise ValueError("lengths is empty: nothing to plan buckets for")
        if arr.min() < 1:
            raise ValueError(f"lengths must be >= 1, got a length of {int(arr.min())}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length={max_length!r} is not allowed: must be >= 1 or None")
        limit = int(max_length) if max_length is not None else int(arr.max())
        clipped = np.minimum(arr, limit)
        top = int(round_up(limit, multiple_of))
        values, counts = np.unique(round_up(clipped, multiple_of), return_counts=True)
        if values[-1] != top:
            values, counts = np.append(values, top), np.append(counts, 0)
        return cls(values, counts, clipped, top, int((arr > limit).sum()))

    def plan(
        self, boundaries: Sequence[int], strategy: str, choice: BucketChoice | None = None
    ) -> BucketPlan:
        """The `BucketPlan` of these lengths under `boundaries` (the last one must be >= `top`)."""
        bounds = np.asarray(boundaries, dtype=np.int64)
        which = np.searchsorted(bounds, self.values, side="left")
        per_bucket = np.bincount(which, weights=self.counts, minlength=len(bounds)).astype(np.int64)
        return BucketPlan(
            boundaries=[int(b) for b in bounds],
            real_tokens=int(self.clipped.sum()),
            padded_tokens=int((bounds[which] * self.counts).sum()),
            strategy=strategy,
            num_sequences=int(self.clipped.size),
            counts=[int(c) for c in per_bucket],
            truncated=self.truncated,
            choice=choice,
        )


def _cap(boundaries: list[int], max_buckets: int | None) -> list[int]:
    """Keep the longest `max_buckets` boundaries (the shortest buckets merge upwards)."""
    return boundaries if max_buckets is None else boundaries[-int(max_buckets) :]


def _optimal_boundaries(values: np.ndarray, counts: np.ndarray, max_buckets: int) -> list[int]:
    """Exact minimum of sum(count_i * boundary(value_i)) with at most `max_buckets` boundaries.

    Some optimal plan uses only values that occur (lowering a boundary to the largest value in
    its bucket never costs more), and the largest value is always a boundary. With ``C`` the
    prefix counts, ``f_k(i) = min_j f_{k-1}(j) + v_i * (C_i - C_j)``: for each j a line
    ``y = f_{k-1}(j) - C_j * x`` queried at ``x = v_i``. Slopes fall and queries rise as i
    grows, so a monotone convex-hull trick answers each layer in O(n). Python ints keep the
    arithmetic exact.
    """
    v = [int(x) for x in values]
    prefix = [int(x) for x in np.cumsum(counts)]
    n = len(v)
    if max_buckets >= n:
        # Every value its own bucket; drop values nobody uses except the last (zero-count top).
        return [v[i] for i in range(n) if counts[i] > 0 or i == n - 1]
    prev: list[float] = [v[i] * prefix[i] for i in range(n)]  # one bucket ending at v_i
    parents: list[list[int]] = []
    for k in range(2, max_buckets + 1):
        prev, parent = _next_layer(prev, v, prefix, k)
        parents.append(parent)
    # Walk back from the last value through the layer that used all max_buckets boundaries.
    chosen = [n - 1]
    i = n - 1
    for parent in reversed(parents):
        i = parent[i]
        chosen.append(i)
    return [v[i] for i in reversed(chosen)]


def _next_layer(prev: list[float], v: list[int], prefix: list[int], k: int) -> tuple[list[float], list[int]]:
    """Layer k of the DP from layer k-1 (`prev`): the cheapest cost with k boundaries ending at each
    value, and the previous boundary it came from (-1 where k boundaries do not fit)."""
    n = len(v)
    cur: list[float] = [float("inf")] * n
    parent = [-1] * n
    hull: list[int] = []  # line indices j, slopes -prefix[j] strictly decreasing
    head = 0
    for i in range(k - 1, n):
        j = i - 1  # the line for a previous boundary at v_{i-1} becomes available
        if prev[j] != float("inf"):
            while len(hull) - head >= 2 and _useless(hull[-2], hull[-1], j, prev, prefix):
                hull.pop()
            hull.append(j)
            head = min(head, len(hull) - 1)
        x = v[i]
        while head + 1 < len(hull) and (
            prev[hull[head + 1]] - prefix[hull[head + 1]] * x <= prev[hull[head]] - prefix[hull[head]] * x
        ):
            head += 1
        if head < len(hull):
            best = hull[head]
            cur[i] = prev[best] + x * (prefix[i] - prefix[best])
            parent[i] = best
    return cur, parent


def fewest_padded_tokens(values: Sequence[int], counts: Sequence[int], max_k: int) -> list[int]:
    """Fewest padded tokens with at most 1, 2, ..., `max_k` boundaries (entry k-1 for k), for the
    histogram (`values` ascending, the top one last; `counts` per value): the "optimal" planner's
    minimum for every K, from one pass of its K layers."""
    v = [int(x) for x in values]
    prefix = [int(x) for x in np.cumsum(counts)]
    layer: list[float] = [v[i] * prefix[i] for i in range(len(v))]
    best = [int(layer[-1])]
    for k in range(2, min(max_k, len(v)) + 1):
        layer, _ = _next_layer(layer, v, prefix, k)
        best.append(min(best[-1], int(layer[-1])))  # "at most k": never worse than k - 1
    return best + [best[-1]] * (max_k - len(best))


def _useless(a: int, b: int, c: int, f: list[float], slope: list[int]) -> bool:
    """True when line b is never strictly below both a and c (lines y = f[j] - slope[j] * x)."""
    # Intersection of a and c lies left of (or at) the intersection of a and b.
    return (f[c] - f[a]) * (slope[b] - slope[a]) <= (f[b] - f[a]) * (slope[c] - slope[a])
