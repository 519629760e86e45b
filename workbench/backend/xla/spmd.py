"""torch_xla's execution model as a `Backend`: one controller process drives every device.

Tensors are lazy: a step is traced and the sync at its boundary compiles it (once per input shape)
and runs it; batches reach the device through torch_xla's background loader, sharded over the
mesh's data axes; a mesh of several devices is one program partitioned by GSPMD (``mesh.*``). What
torch_xla itself offers is reached through `runtime`, the room's one importer of torch_xla.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from workbench.backend.hardware import HardwareError, HardwareInfo
from workbench.backend.native import process_group
from workbench.backend.protocol import Backend, Batch
from workbench.backend.xla import compile_log, device_trace, runtime


class XlaSpmd(Backend):
    """torch_xla single-controller SPMD (see the module docstring)."""

    name = "torch_xla"
    compiles_every_shape = True
    gspmd = True
    _program_peak: tuple[tuple[str, int] | None, int | None] = (None, None)
    """(the compile log's path and size when last read, the peak it held then): read again only once it grew."""

    @property
    def reduce_scatter_as_all_reduce(self) -> bool:  # type: ignore[override]
        return self.hw.backend == "cpu"  # XLA:CPU has no reduce-scatter

    def device(self) -> torch.device:
        return runtime.device()

    def joins_torchrun(self, cfg: Any) -> bool:
        """Never: a pod's processes are the XLA runtime's, and torchrun's ranks that it does not join
        are refused (`refuse_lone_xla_ranks`)."""
        refuse_lone_xla_ranks(self.hw)
        return False

    def device_batches(
        self, batches: Iterable[Batch], device: torch.device, *, sharding: Any = None
    ) -> Iterator[Batch]:
        return iter(runtime.device_loader(batches, device, batch_sharding=sharding))

    def close_batches(self, batches: Iterator[Batch]) -> None:
        runtime.close_device_iterator(batches)

    def mesh_sharded(self, tensor: torch.Tensor) -> bool:
        return runtime.is_xla_tensor(tensor) and bool(runtime.sharding_spec(tensor))

    def local_shards_to_host(self, tensors: Sequence[torch.Tensor]) -> list[Any]:
        return runtime.local_shards_to_cpu(tensors)

    def place_like(self, parameter: torch.Tensor, state: torch.Tensor) -> None:
        unannotated = runtime.is_xla_tensor(state) and not runtime.sharding_spec(state)
        if unannotated and state.shape == parameter.shape:
            runtime.copy_sharding(parameter, state)

    def step_boundary(self) -> None:
        runtime.sync()

    def wait(self) -> None:
        runtime.wait_device_ops()

    def autocast_device_type(self) -> str:
        return "xla"

    def compile_count(self) -> int:
        return runtime.compile_count()

    def compile_time_s(self) -> float:
        return runtime.compile_time_s()

    def start_compile_log(self) -> list[str]:
        return compile_log.start_run_log()

    def compile_reader(self) -> compile_log.CompileLogReader:
        return compile_log.CompileLogReader()

    def compiled_program_bytes(self) -> int | None:
        path = compile_log.compile_memory_log_path()
        if path is None or not os.path.exists(path):
            return None
        size = os.path.getsize(path)
        if self._program_peak[0] != (path, size):  # the log grows only when a program compiles
            records = compile_log.compiled_memory_records(path)
            self._program_peak = ((path, size), max((r.peak_bytes for r in records), default=None))
        return self._program_peak[1]

    def transfer_count(self) -> int:
        return runtime.transfer_count()

    def host_copies(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return runtime.to_cpu(tensors)

    def rng_state(self) -> dict[str, Any]:
        return {"xla": runtime.rng_state()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        if "xla" in state:
            runtime.set_rng_state(int(state["xla"]))

    @contextlib.contextmanager
    def seeded_rng(self, seed: int, device: torch.device) -> Iterator[None]:
        before = runtime.rng_state()
        runtime.set_rng_state(seed)
        try:
            yield None
        finally:
            runtime.set_rng_state(before)

    def memory_in_use(self) -> dict[str, int] | None:
        return runtime.memory_info()

    def checkpoint_planners(self) -> tuple[Any, Any] | None:
        return runtime.spmd_save_planner(), runtime.spmd_load_planner()

    def capture_trace(self, step_fn: Any, steps: int, logdir: Any, *, step_s: float, port: int) -> bool:
        if self.hw.backend != "tpu":  # XLA:CPU's and XLA:GPU's steps: torch.profiler's trace
            return False
        device_trace.capture(step_fn, steps, logdir, step_s, port)  # pragma: no cover - TPU only
        return True  # pragma: no cover

    def attention_kernels(self) -> tuple[str, ...]:
        kernels = ("eager", "sdpa", "chunked")
        return (*kernels, "flash") if self.hw.backend == "tpu" else kernels


def refuse_lone_xla_ranks(hw: HardwareInfo) -> None:
    """`HardwareError` when torchrun started several ranks on an XLA device whose runtime sees this process
    alone: each rank would train the whole run by itself, all of them printing and writing the same
    checkpoint directory and metrics file. torchrun's ranks train on ``cuda`` or ``cpu``; XLA spreads one
    process over its devices with ``mesh.*`` (SPMD)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if process_group.launched_by_torchrun() and world > 1 and hw.num_processes == 1:
        raise HardwareError(
            f"torchrun started {world} ranks but this run's device ({hw.backend}) is an XLA one, whose "
            "runtime sees this process alone (each rank would train the whole run by itself): under "
            "torchrun use train.device_type=cuda or cpu (DDP/FSDP2 over the ranks); on XLA run one process "
            "and spread it over the devices with mesh.data/mesh.fsdp/mesh.model"
        )
