"""The one seam between the workbench and torch_xla.

Every ``import torch_xla`` in the package lives in this module, behind small functions,
so a successor backend (TorchTPU, say) can slot in by reimplementing this file alone.
Nothing here runs at import time: importing ``workbench`` never starts the XLA runtime.
Functions that need the runtime import torch_xla on first use; the others
(`xla_imported`, `runtime_started`, `spmd_config_locked`) only look. Whether torch_xla is installed
and a TPU is on this host is `workbench.backend.xla.presence`'s to say (the machine, not the runtime).

What the rest of the package may ask of the backend:

- this process: `xla_imported`
- runtime facts: `runtime_summary` (`RuntimeSummary`: device type and counts, device kind,
  process index/count, memory limit), `runtime_started`, `global_device_count`,
  `xla_process_index`, `xla_process_count`
- execution: `device`, `sync`, `wait_device_ops`, `add_step_closure`, `device_loader`,
  `close_device_iterator`, `to_cpu`, `is_xla_tensor`
- SPMD: `use_spmd`, `is_spmd`, `spmd_config_locked`, `xla_tensors_created`, `spmd_mesh`,
  `hybrid_mesh`, `mark_sharding`, `batch_sharding_spec`, `copy_sharding`, `sharding_spec`,
  `local_shard_shapes`, `local_shard_indices`
- measurement: `compile_count`, `compile_time_s`, `transfer_count`, `execute_count`,
  `metrics_snapshot`, `clear_metrics`, `metrics_report`, `memory_info`
- compiling: `compile_only`, `XLA_CPU_MEMORY_SCHEDULER`, `initialize_compile_cache`, `scan`, `counter_value` (torch_xla's compile log is read by `workbench.backend.xla.compile_log`)
- training: `gradient_checkpoint_function`, `rng_state`, `set_rng_state`,
  `spmd_save_planner`, `spmd_load_planner`, `local_shards_to_cpu` (sharded checkpoints), `quantized_matmul` (int8 weights)
- profiler: `profiler` (the module; TPU traces)
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.backend.xla import presence, scan_support

# ---- looking without starting anything: torch_xla in this process ---------------------


def xla_imported() -> bool:
    """True once something in this process imported torch_xla."""
    return "torch_xla" in sys.modules


# ---- the modules, imported lazily ----------------------------------------------------


def _xla() -> Any:
    import torch_xla

    return torch_xla


def _xr() -> Any:
    import torch_xla.runtime as xr

    return xr


def _xm() -> Any:
    import torch_xla.core.xla_model as xm

    return xm


def _met() -> Any:
    import torch_xla.debug.metrics as met

    return met


def _xs() -> Any:
    import torch_xla.distributed.spmd as xs

    return xs


# ---- runtime facts -------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeSummary:
    """What the XLA runtime reports about its devices (starting it if needed)."""

    device_type: str
    """PJRT device type as torch_xla names it: 'TPU', 'CPU', 'CUDA'."""
    device_kind: str
    """Chip name as the runtime reports it, e.g. 'TPU v5 lite'; 'CPU' on XLA:CPU."""
    global_devices: int
    local_devices: int
    process_count: int
    process_index: int
    memory_bytes_limit: int | None
    """Bytes the runtime reports for one device, when it reports any."""


def runtime_summary() -> RuntimeSummary:
    """Start the XLA runtime (PJRT client) if needed and describe its devices."""
    xr = _xr()
    device_type = str(xr.device_type() or "CPU").upper()
    # Touching the XLA device (xla_device_kind, memory_info) before SPMD is on locks torch_xla
    # out of SPMD: a later use_spmd() then segfaults (pytorch/xla#9735). So while SPMD could
    # still be chosen, ask only lock-free sources: the TPU type from tpu-env, sizes from the table.
    free_to_touch = is_spmd() or spmd_config_locked()
    tpu_type = _tpu_type() if device_type == "TPU" and not free_to_touch else "TPU"
    if device_type == "CPU":
        kind = "CPU"
    elif tpu_type != "TPU":
        kind = tpu_type
    else:
        try:
            # PJRT's device kind: 'TPU v5 lite', 'TPU v6 lite', ...
            kind = str(_xm().xla_device_kind())
        except Exception:  # older plugins: fall back to the accelerator type ('v5litepod-8' -> 'v5litepod')
            kind = _tpu_type() if device_type == "TPU" else device_type
    limit = None
    if device_type != "CPU" and free_to_touch:
        info = memory_info()
        limit = info.get("bytes_limit") if info else None
    # In SPMD mode torch_xla exposes one virtual device; the counts below are the real ones.
    return RuntimeSummary(
        device_type=device_type,
        device_kind=kind,
        global_devices=int(xr.global_runtime_device_count()),
        local_devices=int(xr.addressable_runtime_device_count()),
        process_count=int(xr.process_count()),
        process_index=int(xr.process_index()),
        memory_bytes_limit=limit,
    )


def _tpu_type() -> str:
    try:
        import torch_xla._internal.tpu as tpu

        return f"TPU {tpu.get_tpu_type()}"
    except Exception:
        return "TPU"


# ---- execution -----------------------------------------------------------------------


def device(index: int | None = None) -> Any:
    """The XLA torch device (the SPMD virtual device under SPMD)."""
    xla = _xla()
    return xla.device(index) if index is not None else xla.device()


def sync(wait: bool = False) -> None:
    """Cut the lazy graph here and launch it: one training step per call."""
    _xla().sync(wait=wait)


def wait_device_ops() -> None:
    """Block until every launched computation has finished (for timing only)."""
    _xm().wait_device_ops()


def add_step_closure(fn: Callable[..., Any], args: Sequence[Any] = ()) -> None:
    """Run `fn(*args)` on the host after the current step's graph executes.

    The way to log a device tensor without stalling: the values are read once the step
    has run anyway, instead of forcing a sync in the middle of the loop.
    """
    _xm().add_step_closure(fn, args=tuple(args))


def device_loader(loader: Iterable[Any], dev: Any, *, batch_sharding: Any = None, prefetch: int = 2) -> Any:
    """Wrap a host loader so batches are copied to the device in the background."""
    import torch_xla.distributed.parallel_loader as pl

    kwargs: dict[str, Any] = {"loader_prefetch_size": prefetch, "device_prefetch_size": prefetch}
    if batch_sharding is not None:
        kwargs["input_sharding"] = batch_sharding
    return pl.MpDeviceLoader(loader, dev, **kwargs)


def close_device_iterator(batches: Any) -> None:
    """Stop the background threads behind an iterator of `device_loader` (a no-op for other iterators).

    torch_xla's per-device iterator keeps its `ParallelLoader` in a private attribute; this is
    the one place that knows it.
    """
    parallel = getattr(batches, "_loader", None)
    if parallel is not None and hasattr(parallel, "close"):
        with contextlib.suppress(Exception):
            parallel.close()


# ---- SPMD ----------------------------------------------------------------------------


def runtime_started() -> bool:
    """True when the PJRT client exists (so SPMD can no longer be switched on)."""
    if not xla_imported():
        return False
    try:
        return bool(_xla()._XLAC._xla_runtime_is_initialized())
    except AttributeError:
        return False


def spmd_config_locked() -> bool:
    """True once torch_xla has fixed its device mode (any use of the XLA device, RNG seeding, ...).

    Locked while not in SPMD mode means SPMD can no longer be switched on safely.
    """
    if not xla_imported():
        return False
    return bool(_xla()._XLAC._xla_get_spmd_config_is_locked())


def use_spmd() -> None:
    """Switch torch_xla into SPMD mode (must happen before any XLA tensor exists)."""
    _xr().use_spmd()


def is_spmd() -> bool:
    return xla_imported() and bool(_xr().is_spmd())


def spmd_mesh(device_ids: Sequence[int], shape: Sequence[int], axis_names: Sequence[str]) -> Any:
    """A torch_xla SPMD mesh over the given logical device ids."""
    import numpy as np

    return _xs().Mesh(np.asarray(device_ids), tuple(shape), tuple(axis_names))


def set_global_mesh(mesh: Any) -> None:
    """Make `mesh` torch_xla's global SPMD mesh, the one its Pallas kernels shard over."""
    _xs().set_global_mesh(mesh)


def hybrid_mesh(ici_shape: Sequence[int], dcn_shape: Sequence[int], axis_names: Sequence[str]) -> Any:
    """A multi-slice mesh: ICI axes inside a slice, DCN axes across slices."""
    return _xs().HybridMesh(
        ici_mesh_shape=tuple(ici_shape), dcn_mesh_shape=tuple(dcn_shape), axis_names=tuple(axis_names)
    )


def mark_sharding(tensor: Any, mesh: Any, spec: Sequence[str | tuple[str, ...] | None]) -> Any:
    """Annotate `tensor` with a partition spec over `mesh`'s named axes."""
    return _xs().mark_sharding(tensor, mesh, tuple(spec))


def batch_sharding_spec(mesh: Any, spec: Sequence[str | tuple[str, ...] | None]) -> Any:
    """A ShardingSpec the device loader applies to every batch it moves."""
    return _xs().ShardingSpec(mesh, tuple(spec))


def sharding_spec(tensor: Any) -> str:
    """The HLO sharding string XLA holds for `tensor` ('' when unsharded)."""
    return str(_xla()._XLAC._get_xla_sharding_spec(tensor))


def local_shard_shapes(tensor: Any) -> list[tuple[int, ...]]:
    """Shapes of the shards each addressable device holds (materialises the tensor)."""
    shards = _xla()._XLAC._get_local_shards([tensor])[0]
    return [tuple(shard.shape) for shard, _device in shards]


# ---- devices, processes and shards across hosts --------------------------------------


def global_device_count() -> int:
    """Runtime devices across all processes (the real count, also under SPMD)."""
    return int(_xr().global_runtime_device_count())


def xla_process_index() -> int:
    """This process's index as the XLA runtime numbers it (starts the runtime).

    `workbench.backend.multihost.process_index` is the one to ask: it falls back to the
    launcher's environment where the runtime is not in use.
    """
    return int(_xr().process_index())


def xla_process_count() -> int:
    """Processes the XLA runtime knows in the run, one per host on a TPU pod (starts the runtime).

    `workbench.backend.multihost.process_count` is the one to ask: it falls back to the
    launcher's environment where the runtime is not in use.
    """
    return int(_xr().process_count())


def xla_tensors_created() -> int:
    """XLA tensors created so far in this process (0 when torch_xla is not imported).

    Switching SPMD on after tensors exist on a non-SPMD device crashes later (segfault on
    XLA:CPU in torch_xla 2.9), so `MeshSpec.build` refuses then.
    """
    if not xla_imported():
        return 0
    value = _met().counter_value("CreateXlaTensor")
    return int(value or 0)


def local_shard_indices(tensor: Any) -> list[tuple[str, list[tuple[int, int]] | None]]:
    """Per addressable device: (device name, [(start, stop) per dim]), or None for a full replica.

    Empty when the tensor carries no sharding annotation (it is then replicated everywhere).
    """
    xla = _xla()
    if not sharding_spec(tensor):
        return []
    shards = xla._XLAC._get_local_shards([tensor])[0]
    replicas = xla._XLAC._get_local_shard_replica_and_indices([tensor])[0]
    out: list[tuple[str, list[tuple[int, int]] | None]] = []
    for (_shard, dev), (_replica, indices) in zip(shards, replicas, strict=True):
        if indices is Ellipsis or indices == Ellipsis:
            out.append((str(dev), None))
        else:
            out.append((str(dev), [(int(s.start), int(s.stop)) for s in indices]))
    return out


# ---- measurement ---------------------------------------------------------------------


def compile_count() -> int:
    """Programs compiled so far in this process."""
    data = _met().metric_data("CompileTime")
    return int(data[0]) if data else 0


def compile_time_s() -> float:
    """Seconds spent compiling so far in this process."""
    data = _met().metric_data("CompileTime")
    return float(data[1]) / 1e9 if data else 0.0


def transfer_count() -> int:
    """Device-to-host transfers so far (each `.item()`, print or `.cpu()` of a device tensor)."""
    data = _met().metric_data("TransferFromDeviceTime")
    return int(data[0]) if data else 0


def execute_count() -> int:
    """Graphs executed so far."""
    data = _met().metric_data("ExecuteTime")
    return int(data[0]) if data else 0


def metrics_snapshot() -> dict[str, float]:
    """The counters the profiler diffs between steps; zeros when torch_xla is not in use."""
    if not xla_imported():
        return {"compiles": 0, "compile_time_s": 0.0, "transfers": 0, "executions": 0}
    return {
        "compiles": compile_count(),
        "compile_time_s": compile_time_s(),
        "transfers": transfer_count(),
        "executions": execute_count(),
    }


def counter_value(name: str) -> int:
    """One of torch_xla's counters (e.g. ``PersistentCacheDeserializeFailure``); 0 when unset."""
    return int(_met().counter_value(name) or 0) if xla_imported() else 0


def clear_metrics() -> None:
    _met().clear_all()


def metrics_report() -> str:
    return str(_met().short_metrics_report())


def memory_info(dev: Any = None) -> dict[str, int] | None:
    """Device memory in use and its limit, or None where the backend cannot say (XLA:CPU)."""
    try:
        info = _xm().get_memory_info(dev if dev is not None else device())
    except Exception:  # XLA:CPU raises UNIMPLEMENTED: GetAllocatorStats
        return None
    if not info:
        return None
    return {"bytes_used": int(info.get("bytes_used", 0)), "bytes_limit": int(info.get("bytes_limit", 0))}


def profiler() -> Any:
    """torch_xla's profiler module (server, traces)."""
    import torch_xla.debug.profiler as xp

    return xp


# ---- compiling ahead and activation checkpointing ----------------------------

XLA_CPU_MEMORY_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
"""An ``XLA_FLAGS`` entry: XLA:CPU's memory-minimising scheduler. Its default one computes every
weight-only value (each layer's weight converted to the compute dtype) at the program's start,
holding them all at once; memory measured on XLA:CPU is read with this one (closer to a TPU's)."""


def compile_only(tensors: Sequence[Any]) -> None:
    """Compile the pending graph that produces `tensors` without running it (fills the cache)."""
    _xla()._XLAC._xla_warm_up_cache(list(tensors), [])


def initialize_compile_cache(path: str | os.PathLike[str], readonly: bool = False) -> bool:
    """Point torch_xla's persistent compilation cache at `path`; False when it is too late.

    torch_xla reads the cache setting when its computation cache is created (the first
    compile), so this must run before any XLA work in the process.
    """
    xla = _xla()
    if xla._XLAC._xla_computation_cache_is_initialized():
        return os.environ.get("XLA_PERSISTENT_CACHE_PATH") == str(path)
    _xr().initialize_cache(str(path), readonly=readonly)
    return True


def scan(fn: Callable[..., Any], init: Any, xs: Any, *, remat: bool = False, pure: bool = False) -> Any:
    """torch_xla's ``scan``: ``fn(carry, x) -> (carry, y)`` over the leading axis of `xs` as one
    traced loop body; returns ``(carry, ys)``. ``remat`` recomputes each iteration in the backward
    pass from its saved inputs (min-cut at activation budget 0): the scanned form of gradient
    checkpointing. ``pure``: `fn` has no side effects, so its trace is cached on the function
    object (pass the same object each call)."""
    from torch_xla.experimental.scan import scan as xla_scan

    _scan_backward_without_jax_bridge()
    return xla_scan(fn, init, xs, partition_fn=scan_support.scan_partition(remat), is_fn_pure=pure)


@functools.cache
def _scan_backward_without_jax_bridge() -> None:
    """Under SPMD torch_xla's (2.8, 2.9) scan backward ties gradient shardings with jax's ``shard_alike``
    through ``call_jax``; the plain backward runs instead on every stack and XLA's propagation shards
    the gradients (why: `workbench.backend.xla.scan_support`). Done once per process."""
    import torch_xla.experimental.scan as xla_scan_module

    if hasattr(xla_scan_module, "_backward_shard_alike"):
        xla_scan_module._backward_shard_alike = scan_support.backward_without_shard_alike


def gradient_checkpoint_function() -> Callable[..., Any]:
    """torch_xla's activation checkpoint (it puts optimization barriers around the recompute,
    which stops XLA from merging it back into the forward pass; torch.utils.checkpoint does not)."""
    import torch_xla.utils.checkpoint as xla_checkpoint

    return xla_checkpoint.checkpoint


def quantized_matmul(x: Any, weight: Any, scale: Any) -> Any:
    """``(x @ weight.T) * scale`` for an int8 ``[out, in]`` `weight` with per-output-channel `scale`
    ``[out]``: torch_xla's ``quantized_matmul`` op, traced into the graph (no host transfer)."""
    import torch
    import torch_xla.experimental.xla_quantized_matmul  # noqa: F401  (registers the op)

    return torch.ops.xla.quantized_matmul(x, weight, scale)


# ---- the training loop: host copies, RNG state, sharded checkpoints ------------------


def to_cpu(tensors: Sequence[Any]) -> list[Any]:
    """Copy XLA tensors to the host in one batched transfer (one sync for all of them)."""
    return list(_xm()._maybe_convert_to_cpu(list(tensors)))


def is_xla_tensor(tensor: Any) -> bool:
    return xla_imported() and bool(_xm().is_xla_tensor(tensor))


def fetch_to_host(tensors: Sequence[Any]) -> list[Any]:
    """Every tensor of `tensors` on the host, whatever its device: the XLA ones in one batched transfer,
    any other copied as it is (all of them, where torch_xla was never imported)."""
    on_device = [i for i, t in enumerate(tensors) if is_xla_tensor(t)]
    out = [t.detach().to("cpu") if i not in on_device else t for i, t in enumerate(tensors)]
    for i, fetched in zip(on_device, to_cpu([tensors[i].detach() for i in on_device]) if on_device else []):
        out[i] = fetched
    return out


def rng_state() -> int:
    """The XLA device's RNG seed state (an int)."""
    return int(_xm().get_rng_state())


def set_rng_state(seed: int) -> None:
    _xm().set_rng_state(int(seed))


def spmd_save_planner() -> Any:
    """torch.distributed.checkpoint planner that writes each device's local shards (SPMD)."""
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

    return SPMDSavePlanner()


def local_shards_to_cpu(tensors: Sequence[Any]) -> list[Any]:
    """Each sharded XLA tensor's local shards copied to the host in one transfer, in the form torch_xla's
    SPMD save planner writes (``.shards``: data, indices, replica id; ``.global_shape``): a sharded
    save from a copy, as torch_xla's own async checkpointing does, while training goes on."""
    from torch_xla.experimental.distributed_checkpoint._helpers import _cpu_shards_from_tensors

    return list(_cpu_shards_from_tensors(list(tensors))) if tensors else []


def spmd_load_planner() -> Any:
    """torch.distributed.checkpoint planner that loads shards into sharded XLA tensors in place."""
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner

    return SPMDLoadPlanner()


def copy_sharding(src: Any, dst: Any) -> bool:
    """Annotate `dst` with `src`'s SPMD sharding (same shape); False when `src` has none.

    Optimizer state created with ``zeros_like(param)`` carries no annotation until a step
    runs; annotating it up front keeps its sharding fixed across steps, checkpoint loads and
    restores (one program per batch shape instead of a recompile when shardings drift).
    """
    xla = _xla()
    op = xla._XLAC._get_xla_op_sharding(src)
    if op is None or tuple(src.shape) != tuple(dst.shape):
        return False
    xla._XLAC._xla_mark_sharding(dst, op)
    return True


_MOVED_TO_PRESENCE = ("xla_installed", "env_requests_xla", "tpu_pci_chips", "tpu_present")
"""Functions that moved to `workbench.backend.xla.presence`, by their old name here: a notebook saved from
an earlier version (``runtime.tpu_present()`` in its first cells) keeps working, with a warning."""


def __getattr__(name: str) -> Any:
    if name not in _MOVED_TO_PRESENCE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"workbench.backend.xla.runtime.{name} moved to workbench.backend.xla.presence.{name}: "
        "call it from there",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(presence, name)
