"""Memory estimates as tables: over batch sizes and lengths, over hardware targets, as aligned text.

`estimate_table` gives one row per (batch size, sequence length) with the total and its
largest parts; `fit_across_targets` one row per hardware target (does the model train there
with FSDP over all its devices, and how large a batch fits); `format_table` prints rows of
dicts as an aligned text table. The figures are `workbench.analysis.estimate`'s and
`workbench.analysis.batch`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workbench.analysis.batch import max_batch_size
from workbench.analysis.estimate import estimate
from workbench.units import GiB


def estimate_table(
    model_config: Any,
    batch_sizes: Iterable[int],
    seq_lens: Iterable[int],
    *,
    memory_bytes: int | None = None,
    headroom: float = 0.1,
    **estimate_kwargs: Any,
) -> list[dict[str, Any]]:
    """One row per (batch size, sequence length): total bytes, GiB, the largest parts, and whether it fits
    (`memory_bytes` also plans a ``loss_chunk_tokens='auto'`` estimate's loss chunks)."""
    rows = []
    for seq_len in seq_lens:
        for batch_size in batch_sizes:
            est = estimate(
                model_config,
                batch_size=batch_size,
                seq_len=seq_len,
                memory_bytes=memory_bytes,
                **estimate_kwargs,
            )
            rows.append(
                {
                    "batch_size": batch_size,
                    "seq_len": seq_len,
                    "total_bytes": est.total_bytes,
                    "total_gib": round(est.total_gib, 4),
                    **{
                        k: v
                        for k, v in est.breakdown.items()
                        if k in ("params", "grads", "optimizer", "activations", "logits")
                    },
                    "fits": est.fits(memory_bytes, headroom) if memory_bytes is not None else None,
                }
            )
    return rows


def fit_across_targets(
    model_config: Any,
    targets: Mapping[str, Any],
    *,
    batch_size: int,
    seq_len: int,
    headroom: float = 0.1,
    **estimate_kwargs: Any,
) -> list[dict[str, Any]]:
    """One row per target: will `model_config` train there, and how large a batch fits?

    A target is anything with ``memory_per_device_bytes`` and ``num_devices`` (a `HardwareInfo`,
    the config panel's named slices). Each is planned with FSDP over all its devices, the default
    the workbench uses on a multi-chip slice, and `batch_size` is rounded up to a multiple of
    the device count so every device gets whole sequences.
    """
    rows = []
    for name, target in targets.items():
        devices, limit = int(target.num_devices), target.memory_per_device_bytes
        mesh = {"data": 1, "fsdp": devices, "model": 1}
        batch = -(-batch_size // devices) * devices
        est = estimate(
            model_config, batch_size=batch, seq_len=seq_len, mesh=mesh, memory_bytes=limit, **estimate_kwargs
        )
        largest = (
            max_batch_size(
                model_config,
                seq_len=seq_len,
                memory_bytes=limit,
                headroom=headroom,
                mesh=mesh,
                **estimate_kwargs,
            )
            if limit
            else None
        )
        rows.append(
            {
                "target": name,
                "devices": devices,
                "batch_size": batch,
                "gib_per_device": round(est.total_gib, 3),
                "memory_gib": round(limit / GiB, 1) if limit else None,
                "fits": est.fits(limit, headroom) if limit else None,
                "largest_batch": largest,
            }
        )
    return rows


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as an aligned text table."""
    if not rows:
        return "(empty)"
    columns = list(columns or rows[0].keys())
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    head = "  ".join(c.rjust(w) for c, w in zip(columns, widths))
    return "\n".join(
        [head, "  ".join("-" * w for w in widths)]
        + ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
