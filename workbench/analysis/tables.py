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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workbench.analysis.batch import max_batch_size
from workbench.analysis.estimate import estimate
from workbench.units import GiB

# sharding imports only `workbench.runtime` (no torch_xla at import time) and nothing imports
# memory back, so the mesh sizes, the batch rule and the byte formatter come from one place


def estimate_table(
    model_config: Any,
    batch_sizes: Iterable[int],
    seq_lens: Iterable[int],
    *,
    memory_bytes: int | None = None,
    headroom: float = 0.1,
    **estimate_kwargs: Any,
) -> list[dict[str, Any]]:
    """One row per (batch size, sequence length): total bytes, GiB, the largest parts, and whether it fits."""
    rows = []
    for seq_len in seq_lens:
        for batch_size in batch_sizes:
            est = estimate(model_config, batch_size=batch_size, seq_len=seq_len, **estimate_kwargs)
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
        est = estimate(model_config, batch_size=batch, seq_len=seq_len, mesh=mesh, **estimate_kwargs)
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
