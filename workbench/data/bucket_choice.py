"""How many shapes to compile: the bucket plan that minimises predicted training time, compiles included.

Every extra bucket boundary is one more XLA program to compile, and it saves padding. Over a run
of ``epochs`` passes, a plan with ``K`` boundaries costs about

    predicted(K) = epochs * padded_tokens(K) * seconds_per_padded_token + K * compile_seconds

`choose_buckets` returns the plan with the exact minimum over every K. It solves all K at once:
a penalised dynamic programme in which each boundary costs
``compile_seconds / (epochs * seconds_per_padded_token)`` padded tokens, over the histogram of
distinct rounded lengths, with the same monotone convex-hull trick as the "optimal" planner
(`workbench.data.buckets`) but a single layer, so one pass costs O(distinct lengths) whatever
the best K is. The plan carries a `BucketChoice` (`workbench.data.buckets`, beside the plan it
describes): the inputs and the predicted time for each K (from the per-K planner's layers) so a
panel or a bench can draw the trade-off.

Off XLA nothing compiles: with ``compile_seconds=0`` the choice is the plan with the fewest
padded tokens, one boundary per distinct rounded length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from workbench.data.buckets import (
    BucketChoice,
    BucketPlan,
    LengthHistogram,
    _optimal_boundaries,
    _useless,
    fewest_padded_tokens,
)

CURVE_SHAPES = 32
"""The trade-off curve covers K = 1 .. this many shapes (and the chosen K when it is beyond)."""

_TIE = 1e-12  # relative: predictions this close count as equal, and the fewer shapes win


def _check_number(name: str, value: Any, *, positive: bool) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    ok = ok and math.isfinite(float(value)) and (float(value) > 0 if positive else float(value) >= 0)
    if not ok:
        allowed = "a finite number > 0" if positive else "a finite number >= 0"
        raise ValueError(f"{name}={value!r} is not allowed: must be {allowed}")
    return float(value)


def choose_buckets(
    lengths: Sequence[int] | np.ndarray,
    *,
    compile_seconds: float,
    seconds_per_padded_token: float,
    epochs: float = 1.0,
    multiple_of: int = 8,
    max_length: int | None = None,
    source: str = "given",
    extra: dict[str, Any] | None = None,
) -> BucketPlan:
    """The bucket plan with the least predicted time: ``epochs * padded tokens * seconds_per_padded_token
    + shapes * compile_seconds``, exactly minimised over every number of shapes.

    Lengths, ``multiple_of`` and ``max_length`` mean what they mean for
    `workbench.data.buckets.plan_buckets`. The plan's ``strategy`` is "auto" and its ``choice``
    (`BucketChoice`) holds the predicted time for each K; among equal predictions the fewest
    shapes win. ``source`` and ``extra`` are recorded in the choice (where the costs came from).
    """
    compile_s = _check_number("compile_seconds", compile_seconds, positive=False)
    token_s = _check_number("seconds_per_padded_token", seconds_per_padded_token, positive=True)
    passes = _check_number("epochs", epochs, positive=True)
    hist = LengthHistogram.of(lengths, multiple_of=multiple_of, max_length=max_length)
    values, counts = hist.values, hist.counts
    penalty = compile_s / (passes * token_s)  # padded tokens per pass one more shape must save
    boundaries = _penalised_boundaries(values, counts, penalty)
    curve = fewest_padded_tokens(values, counts, min(len(values), CURVE_SHAPES))
    chosen_padded = int(hist.plan(boundaries, "auto").padded_tokens)

    def predicted(k: int, padded: int) -> float:
        return passes * padded * token_s + k * compile_s

    best = predicted(len(boundaries), chosen_padded)
    fewer = [
        k
        for k in range(1, min(len(curve), len(boundaries) - 1) + 1)
        if predicted(k, curve[k - 1]) <= best * (1 + _TIE)
    ]
    if fewer:  # a tie with fewer shapes (the penalised pass may take either): the fewest win
        boundaries = _optimal_boundaries(values, counts, fewer[0])
        chosen_padded = curve[fewer[0] - 1]
    choice = BucketChoice(
        compile_seconds=compile_s,
        seconds_per_padded_token=token_s,
        epochs=passes,
        padded_tokens=curve,
        chosen=len(boundaries),
        chosen_padded_tokens=chosen_padded,
        source=source,
        extra=dict(extra or {}),
    )
    return hist.plan(boundaries, "auto", choice)


def _penalised_boundaries(values: np.ndarray, counts: np.ndarray, penalty: float) -> list[int]:
    """Boundaries minimising ``sum(count_i * boundary(value_i)) + penalty * boundaries`` over every K.

    ``g(i) = min_j g(j) + v_i * (C_i - C_j) + penalty`` with ``g(-1) = 0``: the cheapest plan of
    the lengths up to ``v_i`` whose last boundary is ``v_i``, each boundary charged ``penalty``.
    As in `workbench.data.buckets._optimal_boundaries`, each j is a line ``y = g(j) - C_j * x``
    queried at ``x = v_i``; slopes fall and queries rise, so a monotone hull answers the whole
    programme in one O(n) pass. The top value (always last) is always a boundary.
    """
    v = [int(x) for x in values]
    prefix = [0, *(int(x) for x in np.cumsum(counts))]  # prefix[j + 1] = sequences up to v_j
    n = len(v)
    # line index t stands for "previous boundary at v_{t-1}" (t = 0: no previous boundary)
    g: list[float] = [0.0] + [math.inf] * n
    parent = [-1] * (n + 1)
    hull: list[int] = []
    head = 0
    for i in range(n):
        t = i  # the line for a previous boundary at v_{i-1} (or none, for i = 0)
        while len(hull) - head >= 2 and _useless(hull[-2], hull[-1], t, g, prefix):
            hull.pop()
        hull.append(t)
        head = min(head, len(hull) - 1)
        x = v[i]
        while head + 1 < len(hull) and (
            g[hull[head + 1]] - prefix[hull[head + 1]] * x <= g[hull[head]] - prefix[hull[head]] * x
        ):
            head += 1
        best = hull[head]
        g[i + 1] = g[best] + x * (prefix[i + 1] - prefix[best]) + penalty
        parent[i + 1] = best
    chosen, t = [], n
    while t > 0:
        chosen.append(v[t - 1])
        t = parent[t]
    return chosen[::-1]
