"""TPU only: torch_xla's Pallas attention kernels, called in the workbench's mesh layout.

The second module allowed to import torch_xla (after `workbench.backend.xla.runtime`), and only inside
its functions: `workbench.models.attention.flash_attention` calls `flash` (causal flash attention
with segment ids) or `splash` (a causal sliding window) after converting layouts, grouped-query
heads and masks. Both kernels trace through JAX and lower to a TPU custom call: they do not run on
XLA:CPU or anywhere else, so everything here is marked ``# TPU only``.

Under SPMD the kernels run per shard (torch_xla wraps them in a shard_map), given the partition
of ``q/k/v [batch, heads, T, d]`` over the mesh axes `_BATCH_AXES` (batch) and `_HEAD_AXIS` (heads):
`partition_spec`. The mesh is torch_xla's global mesh (`current_mesh`).
"""

from __future__ import annotations

from typing import Any

import torch

_BATCH_AXES = ("data", "fsdp")
"""Mesh axes the batch is split over (`workbench.parallel.mesh.BATCH_AXES`)."""
_HEAD_AXIS = "model"
"""Mesh axis the attention heads are split over under tensor parallelism."""
_KERNEL_BLOCK = 512
"""Query and key block of both kernels (torch_xla's flash defaults; splash set to match)."""


def current_mesh() -> Any | None:  # TPU only (None anywhere SPMD is off)
    """torch_xla's global SPMD mesh, or None without SPMD. Under SPMD with no global mesh set,
    raises: the kernels must know how q, k and v are split."""
    import sys

    if "torch_xla" not in sys.modules:  # never start torch_xla from here
        return None
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if not xr.is_spmd():
        return None
    mesh = xs.get_global_mesh()
    if mesh is None:
        raise RuntimeError(
            "model.attention=flash under SPMD needs torch_xla's global mesh "
            "(torch_xla.distributed.spmd.set_global_mesh) to split the Pallas kernels like q/k/v"
        )
    return mesh


def partition_spec(mesh: Any, batch: int, heads: int) -> tuple[Any, ...] | None:
    """The split of ``[batch, heads, T, d]`` over `mesh`: batch over `_BATCH_AXES`, heads over
    `_HEAD_AXIS` when they divide evenly (else replicated); None without a mesh."""
    if mesh is None:
        return None
    sizes = dict(zip(mesh.axis_names, mesh.mesh_shape, strict=True))
    batch_axes = tuple(a for a in _BATCH_AXES if a in sizes)
    split = 1
    for axis in batch_axes:
        split *= sizes[axis]
    if batch % split:
        raise ValueError(f"a batch of {batch} rows cannot be split over {batch_axes} ({split} devices)")
    head_axis = _HEAD_AXIS if _HEAD_AXIS in sizes and heads % sizes[_HEAD_AXIS] == 0 else None
    return (batch_axes or None, head_axis, None, None)


def flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    segment_ids: torch.Tensor | None,
    scale: float,
    mesh: Any,
) -> torch.Tensor:  # TPU only
    """Causal Pallas flash attention: q/k/v ``[B, H, T, d]`` (as many k/v heads as query heads),
    `segment_ids` ``[B, T]`` int32 (a query sees keys of its own segment) -> ``[B, H, T, d]``."""
    from torch_xla.experimental.custom_kernel import flash_attention

    spec = partition_spec(mesh, q.shape[0], q.shape[1])
    return flash_attention(
        q,
        k,
        v,
        causal=True,
        q_segment_ids=segment_ids,
        kv_segment_ids=segment_ids,
        sm_scale=scale,
        partition_spec=spec,
        mesh=mesh,
    )


def splash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    segment_ids: torch.Tensor | None,
    scale: float,
    window: int,
    mesh: Any,
) -> torch.Tensor:  # TPU only
    """Causal Pallas splash attention over a sliding window (a key is seen iff ``q - window < k <= q``)
    under a mesh; same layouts as `flash`. Splash has no scale argument: q is scaled first."""
    from torch_xla.experimental.splash_attention import SplashAttentionConfig, splash_attention

    spec = partition_spec(mesh, q.shape[0], q.shape[1])
    assert spec is not None, "splash attention runs under a mesh"
    blocks = {
        name: min(_KERNEL_BLOCK, q.shape[2])
        for name in (
            "sa_block_q",
            "sa_block_kv",
            "sa_block_kv_compute",
            "sa_block_q_dkv",
            "sa_block_kv_dkv",
            "sa_block_kv_dkv_compute",
            "sa_block_q_dq",
            "sa_block_kv_dq",
        )
    }
    config = SplashAttentionConfig(
        mesh=str(mesh),
        qkv_partition_spec=spec,
        segment_ids_partition_spec=(spec[0], None),
        attentiontype_local_sliding=True,
        slide_window_size=window - 1,  # splash's LocalMask(left=w) sees q - w <= k: HF's window - 1
        **blocks,
    ).to_json()
    return splash_attention(q * scale, k, v, config, segment_ids, causal=True)
