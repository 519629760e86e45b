"""Collators: examples to host tensors, padded to their bucket boundary or packed into fixed-length rows.

`BucketCollator` pads ``input_ids``/``attention_mask``/``labels`` to the boundary of the
batch's bucket (or, without boundaries, to its longest member rounded up to ``multiple_of``).
Padding positions get the label `IGNORE_INDEX`, so they add nothing to the loss.
`PairCollator` does the same for preference pairs, the chosen and rejected side of each pair on
adjacent rows.

Packing puts several sequences in one row of fixed length instead: `pack_plan` groups them
(best-fit decreasing), `pack_sequences` builds the rows, `packing_efficiency` says how full
they are and `PackedCollator` turns a batch of rows into tensors. A packed row's sequences are
told apart by their ``position_ids``, which restart at 0 for each sequence, and kept apart by a
block-diagonal causal mask (each token sees the earlier tokens of its own sequence) under
eager attention (what `workbench.models.build_model` uses on XLA). The mask comes in one of two
layouts, both checked against per-sequence losses in the tests:

- ``attention="position_ids"`` (the default where transformers understands packed rows): the
  batch carries no ``attention_mask``, so only ``batch x length`` integers cross to the device.
  The workbench's forwards build the mask there from the position ids
  (`workbench.models.inputs.model_inputs`). A model called on the batch directly gets it from
  transformers: its ``masking_utils`` detects the position resets
  (``find_packed_sequence_indices``, transformers >= 4.53) and builds the same mask, only
  without a KV cache (the workbench's models have it off), and under transformers 5 after
  reading the device to see whether a row is packed at all (a host sync per forward, which
  `model_inputs` avoids). Transformers 4.x under torch < 2.6 detects the packing but does not
  apply it, so the default there is "mask4d".
- ``attention="mask4d"``: the mask built on the host, a ``(batch, 1, length, length)``
  additive float mask (0 inside a sequence's causal block, the dtype's minimum elsewhere), which
  transformers passes to eager attention unchanged. Works with any transformers and torch;
  costs ``length**2`` floats per row on the host-to-device link.

A ready 4-D mask replaces transformers' own masks, sliding windows included: "mask4d" is meant
for rows no longer than the model's sliding window (`model_inputs` leaves a model whose window
is shorter than the row to transformers).

In both, the label of each sequence's first token is set to -100: under the causal shift it
would otherwise be predicted from the previous sequence's last token.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from workbench.data.buckets import round_up
from workbench.data.chat import IGNORE_INDEX

# ---- collators -------------------------------------------------------------------------------


def padded_length(longest: int, boundaries: Sequence[int] | None, multiple_of: int = 1) -> int:
    """The length every collator pads a batch to: the first of the sorted `boundaries` that holds its
    `longest` member (the bucket the sampler chose), or without boundaries that member's length rounded
    up to `multiple_of` (at least one)."""
    if boundaries is None:
        return int(round_up(max(1, longest), multiple_of))
    return boundaries[bisect.bisect_left(boundaries, longest)]


def ids_and_labels(example: Any) -> tuple[list[int], list[int]]:
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

    def __call__(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        pairs = [ids_and_labels(e) for e in examples]
        if self.limit is not None:
            pairs = [(ids[: self.limit], labels[: self.limit]) for ids, labels in pairs]
        length = padded_length(max(len(ids) for ids, _ in pairs), self.boundaries, self.multiple_of)
        n = len(pairs)
        input_ids = torch.full((n, length), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, length), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((n, length), dtype=torch.long)
        for row, (ids, labs) in enumerate(pairs):
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            labels[row, : len(labs)] = torch.as_tensor(labs, dtype=torch.long)
            mask[row, : len(ids)] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


class PairCollator:
    """Preference pairs (`workbench.data.preference.tokenize_pairs`) as one padded batch of ``2B`` rows.

    Rows are interleaved, row ``2i`` the chosen side of pair ``i`` and row ``2i + 1`` its rejected
    side, so a loss reads the sides as ``[0::2]`` and ``[1::2]``, and any split of the batch along
    its rows that keeps an even count keeps pairs whole. Padding and cutting are `BucketCollator`'s
    (the bucket of the longest of all ``2B`` sequences, which is the bucket the sampler chose by
    each pair's ``length``). Examples carrying ``reference_chosen_logp`` and
    ``reference_rejected_logp`` (a precomputed reference) add ``reference_logps``, float32 ``[2B]``
    in the same order.
    """

    def __init__(
        self,
        pad_token_id: int,
        boundaries: Sequence[int] | None,
        max_length: int | None = None,
        *,
        multiple_of: int = 1,
    ) -> None:
        self.rows = BucketCollator(pad_token_id, boundaries, max_length, multiple_of=multiple_of)

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows = []
        for example in examples:
            rows.append({"input_ids": example["input_ids"], "labels": example["labels"]})
            rows.append({"input_ids": example["rejected_input_ids"], "labels": example["rejected_labels"]})
        batch = self.rows(rows)
        keys = ("reference_chosen_logp", "reference_rejected_logp")
        carried = [all(e.get(k) is not None for k in keys) for e in examples]
        if all(carried):
            logps = [float(e[k]) for e in examples for k in keys]
            batch["reference_logps"] = torch.tensor(logps, dtype=torch.float32)
        elif any(carried):
            raise ValueError(
                f"{carried.count(False)} of {len(examples)} pairs in a batch lack {' and '.join(keys)}: "
                "a precomputed reference must cover every pair"
            )
        return batch


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
    pairs = [ids_and_labels(e) for e in examples]
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


def _packed_attention_choice(detects: bool, applies_flag: bool | None, transformers_major: int) -> str:
    """ "position_ids" where transformers both detects packed rows and applies their mask, else "mask4d".

    `detects`: transformers has ``masking_utils.find_packed_sequence_indices`` (>= 4.53).
    `applies_flag`: its ``masking_utils._is_torch_greater_or_equal_than_2_6`` where it has one
    (4.x: it applies the packed mask only under torch >= 2.6), None where it has none.
    Transformers 5 has no such flag: it needs torch >= 2.6 and always applies the mask. A 4.x
    without the flag is one we do not know: "mask4d" is correct everywhere.
    """
    if not detects:
        return "mask4d"
    if applies_flag is None:
        return "position_ids" if transformers_major >= 5 else "mask4d"
    return "position_ids" if applies_flag else "mask4d"


def _packed_attention_default() -> str:
    """ "position_ids" where transformers both detects packed rows and applies the mask, else "mask4d"."""
    try:
        import transformers
        from transformers import masking_utils
    except ImportError:  # transformers without masking_utils: no packed detection at all
        return "mask4d"
    try:
        major = int(transformers.__version__.split(".")[0])
    except ValueError:
        major = 0
    return _packed_attention_choice(
        hasattr(masking_utils, "find_packed_sequence_indices"),
        getattr(masking_utils, "_is_torch_greater_or_equal_than_2_6", None),
        major,
    )


class PackedCollator:
    """Pads packed rows to `row_length` and adds what keeps their sequences apart.

    ``attention="position_ids"``: ``input_ids``, ``labels``, ``position_ids`` (no attention
    mask: the block-diagonal causal mask is built on the device from the position resets, by
    `workbench.models.inputs.model_inputs` or by transformers); ``attention="mask4d"``: also
    that mask, built here as a ``(batch, 1, L, L)`` additive float ``attention_mask``.
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


class RowDataset(torch.utils.data.Dataset):
    """Packed rows as a map-style dataset."""

    def __init__(self, rows: list[dict[str, list[int]]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.rows[index]


class FillerMasked(torch.utils.data.Dataset):
    """`dataset` with the fillers of a ``fill_last`` sampler: index ``-1 - i`` is example ``i`` with no
    labels, so a batch keeps its full shape and the loss counts every real example exactly once.
    Every label key is masked (a preference pair's ``rejected_labels`` beside its ``labels``)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if index >= 0:
            return self.dataset[index]
        example = self.dataset[-1 - index]
        ids, _ = ids_and_labels(example)
        if not isinstance(example, dict):
            return {"input_ids": ids, "labels": [IGNORE_INDEX] * len(ids)}
        fields = {**example, "labels": [IGNORE_INDEX] * len(ids)}
        for key in example:  # e.g. rejected_labels, masked to the length of rejected_input_ids
            if key.endswith("_labels"):
                fields[key] = [IGNORE_INDEX] * len(example[key.removesuffix("labels") + "input_ids"])
        return fields
