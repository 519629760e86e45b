"""The one seam between the workbench and torch_xla.

Every ``import torch_xla`` in the package lives in this module, behind small functions,
so a successor backend (TorchTPU, say) can slot in by reimplementing this file alone.
Nothing here runs at import time: importing ``workbench`` never starts the XLA runtime.
Functions that need the runtime import torch_xla on first use; the others
(`xla_installed`, `xla_imported`, `env_requests_xla`) only look.

What the rest of the package may ask of the backend:

- availability: `xla_installed`, `xla_imported`, `env_requests_xla`, `tpu_present`
- runtime facts: `runtime_summary` (device type and counts, device kinds, process index/count)
- execution: `device`, `sync`, `add_step_closure`, `device_loader`, `wait_device_ops`
- SPMD: `use_spmd`, `is_spmd`, `spmd_mesh`, `mark_sharding`, `sharding_spec`, `local_shard_shapes`
- measurement: `compile_count`, `compile_time_s`, `transfer_count`, `metrics_snapshot`,
  `clear_metrics`, `memory_info`, `metrics_report`
- profiler: `profiler` (the module; TPU traces)
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# ---- looking without starting anything ---------------------------------------------


def xla_installed() -> bool:
    """True when torch_xla can be imported (checked without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def xla_imported() -> bool:
    """True once something in this process imported torch_xla."""
    return "torch_xla" in sys.modules


def env_requests_xla() -> str | None:
    """The PJRT device the environment asks for (``PJRT_DEVICE``), upper-cased, or None."""
    value = os.environ.get("PJRT_DEVICE", "").strip()
    return value.upper() or None


def tpu_present() -> bool:
    """Cheap signs of a TPU on this host, without touching the runtime.

    TPU VMs expose ``/dev/accel*`` (v4 and later) or ``/dev/vfio`` devices and set
    ``TPU_ACCELERATOR_TYPE``/``TPU_NAME``; Colab and Kaggle TPU runtimes set one of
    ``COLAB_TPU_ADDR``, ``TPU_WORKER_ID`` or ``KAGGLE_TPU``-style variables.
    """
    if env_requests_xla() == "TPU":
        return True
    for var in ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "COLAB_TPU_ADDR", "TPU_WORKER_ID", "TPU_SKIP_MDS_QUERY"):
        if os.environ.get(var):
            return True
    try:
        return any(name.startswith("accel") for name in os.listdir("/dev")) or os.path.isdir(
            "/dev/vfio/devices"
        )
    except OSError:
        return False


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
    try:
        # PJRT's device kind: 'TPU v5 lite', 'TPU v6 lite', 'cpu', ...
        kind = str(_xm().xla_device_kind())
    except Exception:  # older plugins: fall back to the accelerator type ('v5litepod-8' -> 'v5litepod')
        kind = _tpu_type() if device_type == "TPU" else device_type
    if device_type == "CPU":
        kind = "CPU"
    limit = None
    if device_type != "CPU":
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


def optimizer_step(optimizer: Any) -> None:
    """The optimizer's step; gradients are already reduced under SPMD."""
    optimizer.step()


# ---- SPMD ----------------------------------------------------------------------------


def runtime_started() -> bool:
    """True when the PJRT client exists (so SPMD can no longer be switched on)."""
    if not xla_imported():
        return False
    try:
        return bool(_xla()._XLAC._xla_runtime_is_initialized())
    except AttributeError:
        return False


def use_spmd() -> None:
    """Switch torch_xla into SPMD mode (must happen before any XLA tensor exists)."""
    _xr().use_spmd()


def is_spmd() -> bool:
    return xla_imported() and bool(_xr().is_spmd())


def spmd_mesh(device_ids: Sequence[int], shape: Sequence[int], axis_names: Sequence[str]) -> Any:
    """A torch_xla SPMD mesh over the given logical device ids."""
    import numpy as np

    return _xs().Mesh(np.asarray(device_ids), tuple(shape), tuple(axis_names))


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
