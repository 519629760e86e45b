"""The training loader for ``cfg.bucketing``, and the prewarm that compiles every shape it can emit.

`make_loader` puts the pieces together: a bucket plan (`plan_for_config`, from
`workbench.data.buckets`), a `BucketBatchSampler` and a collator that pads to the bucket
boundary (`PairCollator` for preference pairs, two rows a pair); or, with
``cfg.bucketing.packing``, packed rows of ``data.max_length`` tokens.

XLA compiles one program per input shape, so a program first met mid-run stalls the loop
while it compiles. `prewarm` runs the step once per shape the sampler lists
(`BucketBatchSampler.batch_shapes`) on a `synthetic_batch` of that shape, so every compile
happens before the clock starts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from workbench.data.bucket_choice import choose_buckets
from workbench.data.buckets import BucketPlan, plan_buckets
from workbench.data.collate import (
    BucketCollator,
    FillerMasked,
    PackedCollator,
    PairCollator,
    RowDataset,
    ids_and_labels,
    pack_sequences,
)
from workbench.data.preference import is_pair_dataset
from workbench.data.sampler import BucketBatchSampler

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
    from workbench.backend.xla import runtime

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
    return [dict(zip(("input_ids", "labels"), ids_and_labels(dataset[i]))) for i in range(len(dataset))]


def dataset_lengths(dataset: Any) -> np.ndarray:
    """Token length of every example (its ``length`` column when it has one)."""
    names = getattr(dataset, "column_names", None) or []
    if "length" in names:
        return np.asarray(dataset["length"], dtype=np.int64)
    return np.asarray([len(dataset[i]["input_ids"]) for i in range(len(dataset))], dtype=np.int64)


def training_epochs(lengths: Sequence[int] | np.ndarray, cfg: Any) -> float:
    """Passes the run makes over `lengths`: ``train.steps`` optimizer steps of ``grad_accum`` batches,
    each ``train.batch_size`` sequences (or ``bucketing.tokens_per_batch`` tokens, counted as real
    tokens: padding makes it a little fewer passes)."""
    arr = np.asarray(lengths, dtype=np.int64)
    batches = cfg.train.steps * cfg.train.grad_accum
    if cfg.bucketing.tokens_per_batch is not None:
        real = np.minimum(arr, cfg.data.max_length).sum()
        return batches * cfg.bucketing.tokens_per_batch / max(int(real), 1)
    return batches * cfg.train.batch_size / max(len(arr), 1)


def plan_for_config(
    lengths: Sequence[int] | np.ndarray, cfg: Any, *, epochs: float | None = None
) -> BucketPlan | None:
    """The plan `make_loader` uses for `cfg.bucketing` (None for strategy "none" or packing).

    With ``max_buckets: auto`` the plan comes from `choose_buckets` over `epochs` passes (default:
    `training_epochs`), with ``bucketing.compile_seconds`` and ``seconds_per_padded_token``. The
    trainer measures those on XLA when they are not set (`workbench.train.warmup.choose_auto_buckets`);
    either left unset here means no compile cost (eager CUDA or CPU compiles nothing): the plan with
    the fewest padded tokens, one shape per distinct rounded length.
    """
    b = cfg.bucketing
    if b.packing or b.strategy == "none":
        return None
    if b.max_buckets != "auto":
        return plan_buckets(
            lengths,
            b.max_buckets,
            multiple_of=b.multiple_of,
            max_length=cfg.data.max_length,
            strategy=b.strategy,
        )
    if b.strategy != "optimal":
        raise ValueError(
            f"bucketing.strategy={b.strategy!r} is not allowed with bucketing.max_buckets='auto': "
            "'auto' chooses among exact optimal plans; use strategy 'optimal' (or a number of buckets)"
        )
    known = b.compile_seconds is not None and b.seconds_per_padded_token is not None
    return choose_buckets(
        lengths,
        compile_seconds=b.compile_seconds if known else 0.0,
        seconds_per_padded_token=b.seconds_per_padded_token if known else 1.0,
        epochs=epochs if epochs is not None else training_epochs(lengths, cfg),
        multiple_of=b.multiple_of,
        max_length=cfg.data.max_length,
        source="config" if known else "no compile cost",
    )


def make_loader(
    dataset: Any,
    cfg: Any,
    *,
    pad_token_id: int,
    dp_size: int = 1,
    seed: int = 0,
    epochs: float | None = None,
    fill_last: bool = False,
) -> tuple[torch.utils.data.DataLoader, BucketBatchSampler | None]:
    """The training loader for `cfg`: bucketed batches, or packed rows when ``cfg.bucketing.packing``.

    `dataset` has ``input_ids`` (and ``labels``, ``length``) per example, e.g. from
    `workbench.data.build_datasets`; preference pairs (``rejected_input_ids`` too) are batched by
    pairs and collated by `PairCollator` into twice as many rows. Batch sizes (in pairs for pairs):
    ``cfg.bucketing.tokens_per_batch`` when set, else ``cfg.train.batch_size``, rounded down to a
    multiple of ``dp_size``. The returned
    sampler (also ``loader.batch_sampler``) has ``batch_shapes()`` for prewarm, ``set_epoch``,
    ``state_dict``/``load_state_dict`` and ``report()``. `epochs`: passes the run makes over
    `dataset`, for ``max_buckets: auto`` (default: `training_epochs`). `fill_last` (evaluation):
    every example is batched, a bucket's remainder filled to the full batch with label-less copies
    (`FillerMasked`), so no example is left out and no new shape appears.
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
    pairs = is_pair_dataset(dataset)
    if pairs and b.tokens_per_batch is not None:
        # a pair is two rows of the bucket's length: the collated batch holds the budget
        sizes = {"tokens_per_batch": max(1, b.tokens_per_batch // 2)}
    if b.packing and pairs:
        raise ValueError(
            "bucketing.packing=True is not allowed for preference pairs: a pair's chosen and rejected "
            "answers are rows of their own; set bucketing.packing=false"
        )
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
            [len(r["input_ids"]) for r in rows],
            [max_length],
            dp_size=dp_size,
            seed=seed,
            fill_last=fill_last,
            **sizes,
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
        packed = FillerMasked(RowDataset(rows)) if fill_last else RowDataset(rows)
        return DataLoader(packed, batch_sampler=sampler, collate_fn=collate), sampler

    lengths = dataset_lengths(dataset)
    plan = plan_for_config(lengths, cfg, epochs=epochs)
    boundaries = plan.boundaries if plan is not None else None
    sampler = BucketBatchSampler(
        lengths,
        boundaries,
        dp_size=dp_size,
        seed=seed,
        overflow=b.overflow,
        fill_last=fill_last,
        max_length=max_length,
        multiple_of=b.multiple_of,
        **sizes,
    )
    if plan is not None and plan.choice is not None:
        sampler.notes["bucket_choice"] = plan.choice.summary()
    # multiple_of matters only without boundaries (strategy "none"): the collator rounds each
    # batch's longest member up to it, and the sampler must list those lengths for prewarm.
    # Pairs: the sampler batches B pairs by their longer member; the collator makes 2B rows.
    rows = PairCollator if pairs else BucketCollator
    collate = rows(pad_token_id, boundaries, max_length, multiple_of=b.multiple_of)
    source = FillerMasked(dataset) if fill_last else dataset
    return DataLoader(source, batch_sampler=sampler, collate_fn=collate), sampler
