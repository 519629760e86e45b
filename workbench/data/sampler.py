"""The batch sampler: dataset indices batched inside one bucket, so every batch has a planned shape.

`BucketBatchSampler` groups the indices by bucket boundary (from a `workbench.data.buckets`
plan), shuffles and batches inside each bucket, deterministically in (seed, epoch), and knows
every (batch, length) shape it can emit (`batch_shapes`), so `workbench.data.loader.prewarm`
compiles them all before the first step. Its position in an epoch is checkpointed and resumed
(`state_dict`, `load_state_dict`), and what it leaves out or cuts (sequences over the length
limit, each bucket's incomplete remainder) is counted in `report`, never silently.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import numpy as np

from workbench.data.buckets import round_up

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
    split evenly over the replicas). ``fill_last`` (evaluation: every example counted, no new shape)
    fills each remainder to the full batch with fillers, copies of its members given as negative
    indices ``-1 - i`` (`workbench.data.collate.FillerMasked` gives them no labels).
    ``boundaries=None`` puts everything in one group: batches
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
        fill_last: bool = False,
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
        self.fill_last = bool(fill_last)
        self.overflow, self.drop_last = overflow, bool(drop_last) and not self.fill_last
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
        return batch_rows(
            length, batch_size=self.batch_size, tokens_per_batch=self.tokens_per_batch, dp_size=self.dp_size
        )

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
            rest = order[full * size :].tolist()
            if rest and self.fill_last:  # the same rows again as fillers: the shape stays a full batch
                batches.append(rest + [-1 - rest[k % len(rest)] for k in range(size - len(rest))])
            elif rest and not self.drop_last:
                batches.append(rest)
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
            padded = np.sort(round_up(np.maximum(self._clipped[members], 1), self.multiple_of))
            rows = [size] if len(members) >= size or (self.fill_last and len(members)) else []
            if not self.drop_last and not self.fill_last and len(members) % size:
                rows.append(len(members) % size)
            for n in rows:
                # A batch of n is at least as long as its n-th shortest possible member: shorter
                # padded lengths can never be a batch's longest member (prewarm skips them).
                for length in np.unique(padded[n - 1 :]):
                    shapes.add((n, int(length)))
            return sorted(shapes)
        for members, size, length in zip(self._groups, self._sizes, self._group_lengths):
            if len(members) >= size or (self.fill_last and len(members)):
                shapes.add((size, length))
            if not self.drop_last and not self.fill_last and len(members) % size:
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


def batch_rows(length: int, *, batch_size: int | None, tokens_per_batch: int | None, dp_size: int = 1) -> int:
    """Rows of a batch padded to `length`: `batch_size`, or ``tokens_per_batch // length``; a
    multiple of `dp_size` (at least one row per data-parallel replica)."""
    raw = batch_size if batch_size is not None else int(tokens_per_batch or 0) // max(1, length)
    return max(dp_size, (int(raw) // dp_size) * dp_size)
