"""Planned sequence shapes: bucket boundaries, bucketed batches, packing and compile prewarm.

XLA compiles one program per input shape. Raw variable-length batches recompile at every new
length; padding everything to the maximum compiles once but spends most FLOPs on padding. This
module turns the set of shapes into a planned, measured quantity:

- `plan_buckets` chooses at most K padded lengths ("boundaries") for a length distribution.
  Strategy "optimal" is an exact dynamic programme: it returns the boundaries (multiples of
  ``multiple_of``) with the fewest padded tokens possible, over the histogram of distinct
  rounded-up lengths (so 1,000,000 lengths cost what their few thousand distinct values cost),
  with a monotone convex-hull trick making each of the K layers linear in the distinct values.
- `BucketBatchSampler` groups indices by bucket, batches inside a bucket, and knows every
  (batch, length) shape it can emit (`batch_shapes`), so `prewarm` compiles them all up front.
- `BucketCollator` pads ``input_ids``/``attention_mask``/``labels`` to the bucket boundary.
- `pack_sequences` / `PackedCollator` put several sequences in one fixed-length row instead.
- `make_loader` builds the loader the training loop uses from ``cfg.bucketing``.

**Boundaries are fitted to sequence lengths, not to per-batch maxima.** The sampler forms
batches *inside* a bucket and the collator pads every batch of bucket ``j`` to boundary
``b_j``, whatever its members are, so each sequence costs exactly its bucket boundary: the
padded-token count of an epoch is ``sum(boundary(length_i))`` over the sequences (plus the
remainders dropped to keep shapes fixed), which is what the planner minimises. Per-batch maxima
would be the right target only for batches formed first and padded to their longest member
(strategy "none"); their maxima depend on the shuffle, change every epoch and give one shape
per distinct maximum — the recompilation this module exists to avoid.

Packing keeps sequences apart under eager attention (what `workbench.models.build_model` uses
on XLA) in one of two ways, both checked against per-sequence losses in the tests:

- ``attention="position_ids"`` (default with transformers >= 4.53 and torch >= 2.6): the batch carries no
  ``attention_mask`` and ``position_ids`` that restart at 0 for each sequence; transformers'
  ``masking_utils`` then detects the packed format (``find_packed_sequence_indices``) and builds
  the block-diagonal causal mask on the device. Only ``batch x length`` integers cross to the
  device. transformers does this only without a KV cache: call the model with
  ``use_cache=False`` (the trainer does; with a cache the rows' sequences would see each other).
  Under torch < 2.6 transformers detects the packing but does not apply it (its mask functions
  need torch >= 2.6), so the default there is "mask4d".
- ``attention="mask4d"``: a ready ``(batch, 1, length, length)`` additive float mask
  (0 inside a sequence's causal block, the dtype's minimum elsewhere), which transformers passes
  to eager attention unchanged. Works with older transformers and torch; costs ``length**2``
  floats per row on the host-to-device link.

In both, the label of each sequence's first token is set to -100: under the causal shift it
would otherwise be predicted from the previous sequence's last token.
"""

from __future__ import annotations

import bisect
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

# One definition, in the module that is cheap to import (data.py imports nothing heavy at the
# top, and nothing from here, so there is no cycle); re-exported below for existing importers.
from workbench.data import IGNORE_INDEX

STRATEGIES = ("optimal", "pow2", "multiple", "quantile", "max")
Strategy = Literal["optimal", "pow2", "multiple", "quantile", "max"]


# ---- planning --------------------------------------------------------------------------------


def _round_up(values: Any, multiple: int) -> Any:
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
        return {
            "strategy": self.strategy,
            "boundaries": list(self.boundaries),
            "num_shapes": self.num_shapes,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "efficiency": self.efficiency,
            "truncated": self.truncated,
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
    truncated = int((arr > limit).sum())
    clipped = np.minimum(arr, limit)
    top = int(_round_up(limit, multiple_of))
    rounded = _round_up(clipped, multiple_of)
    values, counts = np.unique(rounded, return_counts=True)

    if strategy == "optimal":
        if values[-1] != top:  # the last boundary must fit max_length even if no length reaches it
            values, counts = np.append(values, top), np.append(counts, 0)
        # no cap: one boundary per candidate value, the appended top one included
        k = len(values) if max_buckets is None else int(max_buckets)
        boundaries = _optimal_boundaries(values, counts, k)
    elif strategy == "max":
        boundaries = [top]
    elif strategy == "pow2":
        lo, bounds, p = int(values[0]), [], 1
        while True:
            b = int(_round_up(p, multiple_of))
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
        qs = np.quantile(clipped, np.arange(1, k + 1) / k, method="higher")
        boundaries = sorted({int(b) for b in _round_up(qs, multiple_of)} | {top})
        boundaries = _cap([b for b in boundaries if b <= top], max_buckets)

    bounds = np.asarray(boundaries, dtype=np.int64)
    which = np.searchsorted(bounds, values, side="left")
    per_bucket = np.bincount(which, weights=counts, minlength=len(bounds)).astype(np.int64)
    return BucketPlan(
        boundaries=[int(b) for b in bounds],
        real_tokens=int(clipped.sum()),
        padded_tokens=int((bounds[which] * counts).sum()),
        strategy=strategy,
        num_sequences=int(arr.size),
        counts=[int(c) for c in per_bucket],
        truncated=truncated,
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
    inf = float("inf")
    prev: list[float] = [v[i] * prefix[i] for i in range(n)]  # one bucket ending at v_i
    parents: list[list[int]] = []
    for k in range(2, max_buckets + 1):
        cur: list[float] = [inf] * n
        parent = [-1] * n
        hull: list[int] = []  # line indices j, slopes -prefix[j] strictly decreasing
        head = 0
        for i in range(k - 1, n):
            j = i - 1  # the line for a previous boundary at v_{i-1} becomes available
            if prev[j] != inf:
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
        parents.append(parent)
        prev = cur
    # Walk back from the last value through the layer that used all max_buckets boundaries.
    chosen = [n - 1]
    i = n - 1
    for parent in reversed(parents):
        i = parent[i]
        chosen.append(i)
    return [v[i] for i in reversed(chosen)]


def _useless(a: int, b: int, c: int, f: list[float], slope: list[int]) -> bool:
    """True when line b is never strictly below both a and c (lines y = f[j] - slope[j] * x)."""
    # Intersection of a and c lies left of (or at) the intersection of a and b.
    return (f[c] - f[a]) * (slope[b] - slope[a]) <= (f[b] - f[a]) * (slope[c] - slope[a])


# ---- batching by bucket ----------------------------------------------------------------------


class BucketBatchSampler:
    """Lists of dataset indices, each list from one bucket, so each batch has one planned shape.

    Per-bucket batch sizes come from ``tokens_per_batch`` (``tokens // boundary``) or one fixed
    ``batch_size``, rounded down to a multiple of ``dp_size`` (at least ``dp_size``). Shuffling
    is deterministic in (seed, epoch). Sequences longer than the last boundary (or than
    ``max_length`` when given) are truncated (kept in the last bucket; the collator cuts them)
    or dropped, per ``overflow``; they are counted in `report()` and announced with a warning.
    With ``drop_last`` each bucket's incomplete remainder is left out of the epoch (counted too),
    so only full shapes occur; ``drop_last=False`` needs ``dp_size=1`` (a remainder need not
    split evenly over the replicas). ``boundaries=None`` puts everything in one group: batches
    are padded by the collator to their longest member rounded up to ``multiple_of`` (no planned
    shapes); give the collator's ``multiple_of`` here too so `batch_shapes` lists those lengths.
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        boundaries: Sequence[int] | None,
        *,
        batch_size: int | None = None,
        tokens_per_batch: int | None = None,
        dp_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        overflow: Literal["truncate", "drop"] = "truncate",
        drop_last: bool = True,
        max_length: int | None = None,
        multiple_of: int = 1,
    ) -> None:
        if (batch_size is None) == (tokens_per_batch is None):
            raise ValueError(
                "give exactly one of batch_size or tokens_per_batch; "
                f"got batch_size={batch_size!r} and tokens_per_batch={tokens_per_batch!r}"
            )
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} is not allowed: must be >= 1")
        if tokens_per_batch is not None and tokens_per_batch < 1:
            raise ValueError(f"tokens_per_batch={tokens_per_batch!r} is not allowed: must be >= 1")
        if dp_size < 1:
            raise ValueError(f"dp_size={dp_size!r} is not allowed: must be >= 1")
        if overflow not in ("truncate", "drop"):
            raise ValueError(f"overflow={overflow!r} is not allowed: expected 'truncate' or 'drop'")
        if not drop_last and dp_size > 1:
            # A bucket's remainder has len % size rows, which need not be a multiple of dp_size:
            # the batch would not split evenly over the data-parallel replicas.
            raise ValueError(
                f"drop_last={drop_last!r} is not allowed with dp_size={dp_size}: "
                "use drop_last=True (remainders are left out and counted in report()) or dp_size=1"
            )
        if not isinstance(multiple_of, (int, np.integer)) or multiple_of < 1:
            raise ValueError(f"multiple_of={multiple_of!r} is not allowed: must be an int >= 1")
        self.lengths = np.asarray(lengths, dtype=np.int64).ravel()
        if self.lengths.size == 0:
            raise ValueError("lengths is empty: nothing to batch")
        self.boundaries = None if boundaries is None else sorted(int(b) for b in boundaries)
        if self.boundaries is not None and (not self.boundaries or self.boundaries[0] < 1):
            raise ValueError(f"boundaries={boundaries!r} is not allowed: need at least one boundary >= 1")
        self.batch_size, self.tokens_per_batch = batch_size, tokens_per_batch
        self.dp_size, self.seed, self.shuffle = int(dp_size), int(seed), bool(shuffle)
        self.overflow, self.drop_last = overflow, bool(drop_last)
        self.multiple_of = int(multiple_of)
        self.epoch, self._position, self._resume_at = 0, 0, 0
        self.notes: dict[str, Any] = {}
        """Extra facts for `report()` (e.g. what packing did before these rows were batched)."""

        limits = [b for b in (max_length, self.boundaries[-1] if self.boundaries else None) if b is not None]
        self.limit = min(limits) if limits else None
        over = self.lengths > self.limit if self.limit is not None else np.zeros(self.lengths.size, bool)
        self.overflow_count = int(over.sum())
        self.overflow_tokens = int((self.lengths[over] - self.limit).sum()) if self.overflow_count else 0
        keep = ~over if overflow == "drop" else np.ones(self.lengths.size, bool)
        clipped = np.minimum(self.lengths, self.limit) if self.limit is not None else self.lengths
        if self.boundaries is None:
            self._groups = [np.flatnonzero(keep)]
            group_lengths = [int(clipped[keep].max()) if keep.any() else 1]
        else:
            which = np.searchsorted(np.asarray(self.boundaries), clipped, side="left")
            self._groups = [np.flatnonzero(keep & (which == b)) for b in range(len(self.boundaries))]
            group_lengths = list(self.boundaries)
        self._group_lengths = group_lengths
        self._sizes = [self._batch_size_for(length) for length in group_lengths]
        self._clipped = clipped
        if self.overflow_count:
            warnings.warn(
                f"{self.overflow_count} of {self.lengths.size} sequences are longer than {self.limit} tokens: "
                f"{'truncated' if overflow == 'truncate' else 'dropped'} "
                f"({self.overflow_tokens} tokens cut); see report()",
                RuntimeWarning,
                stacklevel=2,
            )

    def _batch_size_for(self, length: int) -> int:
        raw = self.batch_size if self.batch_size is not None else self.tokens_per_batch // max(1, length)
        return max(self.dp_size, (int(raw) // self.dp_size) * self.dp_size)

    # ---- epochs and resuming ----
    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` (its own deterministic order) from its first batch."""
        self.epoch, self._position, self._resume_at = int(epoch), 0, 0

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        batches: list[list[int]] = []
        for members, size in zip(self._groups, self._sizes):
            order = rng.permutation(members) if self.shuffle else members
            full = len(order) // size
            for k in range(full):
                batches.append(order[k * size : (k + 1) * size].tolist())
            if not self.drop_last and len(order) % size:
                batches.append(order[full * size :].tolist())
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._epoch_batches(self.epoch)
        start, self._resume_at = self._resume_at, 0
        for position in range(start, len(batches)):
            self._position = position + 1
            yield batches[position]

    def __len__(self) -> int:
        if self.drop_last:
            return sum(len(m) // s for m, s in zip(self._groups, self._sizes))
        return sum(math.ceil(len(m) / s) for m, s in zip(self._groups, self._sizes))

    def state_dict(self) -> dict[str, int]:
        """Where the sampler is: epoch and batches handed out in it (resume with load_state_dict)."""
        return {"epoch": self.epoch, "position": self._position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at `state`: the next iteration yields the rest of that epoch, in the same order."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(f"state seed={state['seed']} differs from this sampler's seed={self.seed}")
        self.epoch = int(state["epoch"])
        self._position = self._resume_at = int(state["position"])

    # ---- shapes and reports ----
    def batch_shapes(self) -> list[tuple[int, int]]:
        """Every (batch, length) shape this sampler can emit, in every epoch.

        With ``boundaries=None`` that is one shape per length (rounded up to ``multiple_of``, as
        the collator pads) that a batch could have as its longest member — the cost of not
        bucketing.
        """
        shapes: set[tuple[int, int]] = set()
        if self.boundaries is None:
            members = self._groups[0]
            size = self._sizes[0]
            padded = np.sort(_round_up(np.maximum(self._clipped[members], 1), self.multiple_of))
            rows = [size] if len(members) >= size else []
            if not self.drop_last and len(members) % size:
                rows.append(len(members) % size)
            for n in rows:
                # A batch of n is at least as long as its n-th shortest possible member: shorter
                # padded lengths can never be a batch's longest member (prewarm skips them).
                for length in np.unique(padded[n - 1 :]):
                    shapes.add((n, int(length)))
            return sorted(shapes)
        for members, size, length in zip(self._groups, self._sizes, self._group_lengths):
            if len(members) >= size:
                shapes.add((size, length))
            if not self.drop_last and len(members) % size:
                shapes.add((len(members) % size, length))
        return sorted(shapes)

    def report(self) -> dict[str, Any]:
        """Counts nobody should have to guess: overflow, dropped remainders, per-bucket sizes."""
        remainder = 0 if not self.drop_last else sum(len(m) % s for m, s in zip(self._groups, self._sizes))
        return {
            "sequences": int(self.lengths.size),
            "limit": self.limit,
            "overflow": self.overflow_count,
            "overflow_action": self.overflow,
            "overflow_tokens_cut": self.overflow_tokens,
            "dropped_overflow": self.overflow_count if self.overflow == "drop" else 0,
            "dropped_remainder_per_epoch": int(remainder),
            "batches_per_epoch": len(self),
            **self.notes,
            "buckets": [
                {"length": int(length), "sequences": len(m), "batch_size": int(s)}
                for m, s, length in zip(self._groups, self._sizes, self._group_lengths)
            ],
        }


# ---- collators -------------------------------------------------------------------------------


def _ids_and_labels(example: Any) -> tuple[list[int], list[int]]:
    if isinstance(example, dict):
        ids = list(example["input_ids"])
        labels = example.get("labels")
        return ids, list(labels) if labels is not None else list(ids)
    ids = list(example)
    return ids, list(ids)


class BucketCollator:
    """Pads a batch to the boundary of its longest member: ``input_ids``, ``attention_mask``, ``labels``.

    Examples are dicts with ``input_ids`` (and optionally ``labels``; missing labels copy the
    ids) or plain id lists. Sequences longer than ``max_length`` (or the last boundary) are cut.
    ``boundaries=None`` pads to the longest member itself (rounded up to ``multiple_of``).
    """

    def __init__(
        self,
        pad_token_id: int,
        boundaries: Sequence[int] | None,
        max_length: int | None = None,
        *,
        multiple_of: int = 1,
    ) -> None:
        self.pad_token_id = int(pad_token_id)
        self.boundaries = None if boundaries is None else sorted(int(b) for b in boundaries)
        limits = [b for b in (max_length, self.boundaries[-1] if self.boundaries else None) if b is not None]
        self.limit = min(limits) if limits else None
        self.multiple_of = int(multiple_of)

    def padded_length(self, longest: int) -> int:
        if self.boundaries is None:
            return int(_round_up(max(1, longest), self.multiple_of))
        return self.boundaries[bisect.bisect_left(self.boundaries, longest)]

    def __call__(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        pairs = [_ids_and_labels(e) for e in examples]
        if self.limit is not None:
            pairs = [(ids[: self.limit], labels[: self.limit]) for ids, labels in pairs]
        length = self.padded_length(max(len(ids) for ids, _ in pairs))
        n = len(pairs)
        input_ids = torch.full((n, length), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, length), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((n, length), dtype=torch.long)
        for row, (ids, labs) in enumerate(pairs):
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            labels[row, : len(labs)] = torch.as_tensor(labs, dtype=torch.long)
            mask[row, : len(ids)] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


# ---- packing ---------------------------------------------------------------------------------


def pack_plan(lengths: Sequence[int] | np.ndarray, row_length: int) -> list[list[int]]:
    """Group sequence indices into rows of at most `row_length` tokens (best-fit decreasing).

    Longer sequences get a row of their own (the collator truncates them). Deterministic:
    ties break by index.
    """
    if row_length < 1:
        raise ValueError(f"row_length={row_length!r} is not allowed: must be >= 1")
    arr = np.minimum(np.asarray(lengths, dtype=np.int64).ravel(), row_length)
    order = np.lexsort((np.arange(arr.size), -arr))  # longest first, then by index
    rows: list[list[int]] = []
    free_values: list[int] = []  # sorted distinct free capacities present
    rows_by_free: dict[int, list[int]] = {}
    for index in order.tolist():
        need = int(arr[index])
        pos = bisect.bisect_left(free_values, need)
        if pos < len(free_values):
            free = free_values[pos]
            row = rows_by_free[free].pop()
            if not rows_by_free[free]:
                del rows_by_free[free]
                free_values.pop(pos)
        else:
            row, free = len(rows), row_length
            rows.append([])
        rows[row].append(index)
        left = free - need
        if left > 0:
            if left not in rows_by_free:
                rows_by_free[left] = []
                bisect.insort(free_values, left)
            rows_by_free[left].append(row)
    return rows


def packing_efficiency(lengths: Sequence[int] | np.ndarray, row_length: int) -> dict[str, float | int]:
    """Real tokens / row tokens when packing `lengths` (clipped to `row_length`)."""
    arr = np.minimum(np.asarray(lengths, dtype=np.int64), row_length)
    rows = pack_plan(arr, row_length)
    real = int(arr.sum())
    return {
        "rows": len(rows),
        "real_tokens": real,
        "padded_tokens": len(rows) * row_length,
        "efficiency": real / (len(rows) * row_length),
        "num_shapes": 1,
    }


def pack_sequences(examples: Sequence[Any], row_length: int) -> list[dict[str, list[int]]]:
    """Packed rows: each ``{"input_ids", "labels", "position_ids", "seq_lengths"}`` (unpadded).

    ``position_ids`` restart at 0 for each sequence; each sequence's first label is -100 (it
    would be predicted across the border); sequences longer than the row are truncated.
    """
    pairs = [_ids_and_labels(e) for e in examples]
    pairs = [(ids[:row_length], labels[:row_length]) for ids, labels in pairs]
    rows = []
    for members in pack_plan([len(ids) for ids, _ in pairs], row_length):
        row: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": [], "seq_lengths": []}
        for index in members:
            ids, labels = pairs[index]
            row["input_ids"].extend(ids)
            row["labels"].extend([IGNORE_INDEX, *labels[1:]])
            row["position_ids"].extend(range(len(ids)))
            row["seq_lengths"].append(len(ids))
        rows.append(row)
    return rows


def _packed_attention_default() -> str:
    """ "position_ids" where transformers both detects packed rows and applies the mask, else "mask4d"."""
    try:
        from transformers import masking_utils
    except ImportError:  # transformers without masking_utils: no packed detection at all
        return "mask4d"
    if not hasattr(masking_utils, "find_packed_sequence_indices"):  # transformers < 4.53
        return "mask4d"
    # transformers detects the packing under any torch but applies its mask only when this flag
    # of its own is true (torch >= 2.6); read the flag rather than re-derive the condition. A
    # transformers without the flag is one we do not know: mask4d is correct everywhere.
    if not getattr(masking_utils, "_is_torch_greater_or_equal_than_2_6", False):
        return "mask4d"
    return "position_ids"


class PackedCollator:
    """Pads packed rows to `row_length` and adds what keeps their sequences apart.

    ``attention="position_ids"``: ``input_ids``, ``labels``, ``position_ids`` (no attention
    mask, so transformers builds the block-diagonal causal mask from the position resets);
    ``attention="mask4d"``: also a ``(batch, 1, L, L)`` additive float ``attention_mask``.
    Padding at a row's end is its own segment (positions from 0, labels -100).
    """

    def __init__(
        self,
        pad_token_id: int,
        row_length: int,
        *,
        attention: Literal["auto", "position_ids", "mask4d"] = "auto",
        mask_dtype: torch.dtype = torch.float32,
    ) -> None:
        if attention not in ("auto", "position_ids", "mask4d"):
            raise ValueError(
                f"attention={attention!r} is not allowed: expected 'auto', 'position_ids' or 'mask4d'"
            )
        self.pad_token_id, self.row_length = int(pad_token_id), int(row_length)
        self.attention = _packed_attention_default() if attention == "auto" else attention
        self.mask_dtype = mask_dtype

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        n, length = len(rows), self.row_length
        input_ids = torch.full((n, length), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, length), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros((n, length), dtype=torch.long)
        segments = torch.full((n, length), -1, dtype=torch.long)
        for r, row in enumerate(rows):
            used = min(len(row["input_ids"]), length)
            input_ids[r, :used] = torch.as_tensor(row["input_ids"][:used], dtype=torch.long)
            labels[r, :used] = torch.as_tensor(row["labels"][:used], dtype=torch.long)
            positions[r, :used] = torch.as_tensor(row["position_ids"][:used], dtype=torch.long)
            start = 0
            for s, seq_len in enumerate(row["seq_lengths"]):
                segments[r, start : min(start + seq_len, length)] = s
                start += seq_len
            positions[r, used:] = torch.arange(length - used)
        batch = {"input_ids": input_ids, "labels": labels, "position_ids": positions}
        if self.attention == "mask4d":
            same = segments[:, :, None] == segments[:, None, :]
            causal = torch.ones(length, length, dtype=torch.bool).tril()
            allowed = (same & causal) | torch.eye(length, dtype=torch.bool)  # pads attend to themselves
            mask = torch.zeros((n, 1, length, length), dtype=self.mask_dtype)
            mask.masked_fill_(~allowed[:, None], torch.finfo(self.mask_dtype).min)
            batch["attention_mask"] = mask
        return batch


class _RowDataset(torch.utils.data.Dataset):
    """Packed rows as a map-style dataset."""

    def __init__(self, rows: list[dict[str, list[int]]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.rows[index]


# ---- prewarm ---------------------------------------------------------------------------------


def prewarm(
    step_fn: Callable[[Any], Any],
    batch_shapes: Sequence[tuple[int, int]],
    make_batch: Callable[[tuple[int, int]], Any],
    *,
    repeats: int = 1,
) -> int:
    """Compile the training step for every shape before the first real step; returns programs compiled.

    For each shape, ``step_fn(make_batch(shape))`` runs ``repeats`` times, each followed by a
    sync (use 2 when the first step's graph differs from later ones, e.g. optimizer state that
    is created on the first step). The step really runs: pass a step whose updates you discard
    (snapshot and restore the weights and optimizer state around it) or accept them as warm-up.
    Off XLA nothing compiles and this returns 0 without running anything.

    What ``step_fn`` returns stays alive across the sync, as the loss does in a loop that hands
    it to a step closure. The loop must match: a tensor alive at the sync is a program output,
    so a loop that drops the step's outputs before syncing runs a different program and
    compiles again.
    """
    from workbench import runtime

    if not runtime.xla_imported():
        return 0
    before = runtime.compile_count()
    for shape in batch_shapes:
        batch = make_batch(tuple(shape))
        for _ in range(repeats):
            out = step_fn(batch)
            runtime.sync()
            del out
    runtime.wait_device_ops()
    return runtime.compile_count() - before


def synthetic_batch(
    shape: tuple[int, int],
    *,
    vocab_size: int,
    pad_token_id: int = 0,
    seed: int = 0,
    template: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """A host batch of `shape` (batch, length) with random ids, all tokens real, for `prewarm`.

    Without `template`: ``input_ids``, ``attention_mask`` and ``labels``, the layout of
    `BucketCollator`. With one (a real batch from the loader in use), the template's keys,
    dtypes and extra dimensions: ``position_ids`` count up, a packed 4-D attention mask is the
    template's first row broadcast to the new shape, so the compiled program is the loop's own.
    Ids come from a private generator: prewarming does not move the training RNG.
    """
    rows, length = int(shape[0]), int(shape[1])
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rows * 10_007 + length)
    ids = torch.randint(0, vocab_size, (rows, length), generator=gen)
    if template is None:
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    t_len = template["input_ids"].shape[1]
    out: dict[str, torch.Tensor] = {}
    for key, value in template.items():
        dims = [rows if i == 0 else (length if d == t_len else d) for i, d in enumerate(value.shape)]
        if key == "input_ids":
            out[key] = ids.to(value.dtype)
        elif key == "labels":
            out[key] = ids.clone().to(value.dtype)
        elif key == "position_ids":
            out[key] = torch.arange(length).expand(rows, length).contiguous().to(value.dtype)
        elif key == "attention_mask" and value.dim() == 2:
            out[key] = torch.ones(rows, length, dtype=value.dtype)
        else:  # e.g. a 4-D packed attention mask: the template's first entry, broadcast to the new shape
            sample = value.detach().to("cpu")
            base = sample[tuple(slice(0, 1) if i == 0 else slice(None) for i in range(sample.dim()))]
            if base.shape[1:] != tuple(dims[1:]):
                base = torch.zeros([1, *dims[1:]], dtype=value.dtype)
            out[key] = base.expand(*dims).contiguous()
    return out


# ---- the training loader ----------------------------------------------------------------------


def _examples_of(dataset: Any) -> list[dict[str, list[int]]]:
    """``input_ids`` (and ``labels``) of every example; whole columns at once for a `datasets.Dataset`."""
    names = getattr(dataset, "column_names", None)
    if names is not None:
        ids = dataset["input_ids"]
        labels = dataset["labels"] if "labels" in names else ids
        return [{"input_ids": list(a), "labels": list(b)} for a, b in zip(ids, labels)]
    return [dict(zip(("input_ids", "labels"), _ids_and_labels(dataset[i]))) for i in range(len(dataset))]


def _lengths_of(dataset: Any) -> np.ndarray:
    names = getattr(dataset, "column_names", None) or []
    if "length" in names:
        return np.asarray(dataset["length"], dtype=np.int64)
    return np.asarray([len(dataset[i]["input_ids"]) for i in range(len(dataset))], dtype=np.int64)


def plan_for_config(lengths: Sequence[int] | np.ndarray, cfg: Any) -> BucketPlan | None:
    """The plan `make_loader` uses for `cfg.bucketing` (None for strategy "none" or packing)."""
    b = cfg.bucketing
    if b.packing or b.strategy == "none":
        return None
    return plan_buckets(
        lengths, b.max_buckets, multiple_of=b.multiple_of, max_length=cfg.data.max_length, strategy=b.strategy
    )


def make_loader(
    dataset: Any, cfg: Any, *, pad_token_id: int, dp_size: int = 1, seed: int = 0
) -> tuple[torch.utils.data.DataLoader, BucketBatchSampler | None]:
    """The training loader for `cfg`: bucketed batches, or packed rows when ``cfg.bucketing.packing``.

    `dataset` has ``input_ids`` (and ``labels``, ``length``) per example, e.g. from
    `workbench.data.build_datasets`. Batch sizes: ``cfg.bucketing.tokens_per_batch`` when set,
    else ``cfg.train.batch_size``, rounded down to a multiple of ``dp_size``. The returned
    sampler (also ``loader.batch_sampler``) has ``batch_shapes()`` for prewarm, ``set_epoch``,
    ``state_dict``/``load_state_dict`` and ``report()``.
    """
    from torch.utils.data import DataLoader

    b = cfg.bucketing
    max_length = int(cfg.data.max_length)
    sizes = (
        {"tokens_per_batch": b.tokens_per_batch}
        if b.tokens_per_batch is not None
        else {"batch_size": cfg.train.batch_size}
    )
    if len(dataset) == 0:
        raise ValueError("the dataset is empty: nothing to load")
    if b.packing:
        examples = _examples_of(dataset)
        too_long = [i for i, e in enumerate(examples) if len(e["input_ids"]) > max_length]
        cut = sum(len(examples[i]["input_ids"]) - max_length for i in too_long)
        if too_long and b.overflow == "drop":
            dropped = set(too_long)
            examples = [e for i, e in enumerate(examples) if i not in dropped]
        if not examples:
            raise ValueError(
                f"every sequence is longer than data.max_length={max_length} and overflow='drop'"
            )
        rows = pack_sequences(examples, max_length)
        sampler = BucketBatchSampler(
            [len(r["input_ids"]) for r in rows], [max_length], dp_size=dp_size, seed=seed, **sizes
        )
        sampler.notes["packing"] = {
            "sequences": len(examples),
            "rows": len(rows),
            "efficiency": sum(len(r["input_ids"]) for r in rows) / (len(rows) * max_length),
            "overflow": len(too_long),
            "overflow_action": b.overflow,
            "overflow_tokens_cut": cut,
        }
        if too_long:
            warnings.warn(
                f"{len(too_long)} of {len(dataset)} sequences are longer than data.max_length={max_length}: "
                f"{'truncated' if b.overflow == 'truncate' else 'dropped'} before packing "
                f"({cut} tokens cut); see the sampler's report()",
                RuntimeWarning,
                stacklevel=2,
            )
        collate: Callable[..., Any] = PackedCollator(pad_token_id, max_length)
        return DataLoader(_RowDataset(rows), batch_sampler=sampler, collate_fn=collate), sampler

    lengths = _lengths_of(dataset)
    plan = plan_for_config(lengths, cfg)
    boundaries = plan.boundaries if plan is not None else None
    sampler = BucketBatchSampler(
        lengths,
        boundaries,
        dp_size=dp_size,
        seed=seed,
        overflow=b.overflow,
        max_length=max_length,
        multiple_of=b.multiple_of,
        **sizes,
    )
    # multiple_of matters only without boundaries (strategy "none"): the collator rounds each
    # batch's longest member up to it, and the sampler must list those lengths for prewarm.
    collate = BucketCollator(pad_token_id, boundaries, max_length, multiple_of=b.multiple_of)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate), sampler


__all__ = [
    "IGNORE_INDEX",
    "STRATEGIES",
    "BucketBatchSampler",
    "BucketCollator",
    "BucketPlan",
    "PackedCollator",
    "make_loader",
    "pack_plan",
    "pack_sequences",
    "packing_efficiency",
    "padded_tokens_for",
    "plan_buckets",
    "plan_for_config",
    "prewarm",
    "synthetic_batch",
]
