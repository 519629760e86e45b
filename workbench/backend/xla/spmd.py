"""torch_xla's execution model as a `Backend`: one controller process drives every device.

Tensors are lazy: a step is traced and the sync at its boundary compiles it (once per input shape)
and runs it; batches reach the device through torch_xla's background loader, sharded over the
mesh's data axes; a mesh of several devices is one program partitioned by GSPMD (``mesh.*``). What
torch_xla itself offers is reached through `runtime`, the room's one importer of torch_xla.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from workbench.backend.protocol import Backend, Batch
from workbench.backend.xla import compile_log, runtime


class XlaSpmd(Backend):
    """torch_xla single-controller SPMD (see the module docstring)."""

    name = "torch_xla"
    compiles_every_shape = True
    gspmd = True

    def device(self) -> torch.device:
        return runtime.device()

    def device_batches(
        self, batches: Iterable[Batch], device: torch.device, *, sharding: Any = None
    ) -> Iterator[Batch]:
        return iter(runtime.device_loader(batches, device, batch_sharding=sharding))

    def close_batches(self, batches: Iterator[Batch]) -> None:
        runtime.close_device_iterator(batches)

    def host_copies(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        on_device = [i for i, t in enumerate(tensors) if runtime.is_xla_tensor(t)]
        out = [t.detach().to("cpu") if i not in on_device else t for i, t in enumerate(tensors)]
        for i, fetched in zip(on_device, runtime.to_cpu([tensors[i].detach() for i in on_device])):
            out[i] = fetched
        return out

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

    def start_compile_log(self) -> list[str]:
        return compile_log.start_run_log()

    def rng_state(self) -> dict[str, Any]:
        return {"xla": runtime.rng_state()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        if "xla" in state:
            runtime.set_rng_state(int(state["xla"]))

    def memory_in_use(self) -> dict[str, int] | None:
        return runtime.memory_info()

    def checkpoint_planners(self) -> tuple[Any, Any] | None:
        return runtime.spmd_save_planner(), runtime.spmd_load_planner()

    def attention_kernels(self) -> tuple[str, ...]:
        kernels = ("eager", "sdpa", "chunked")
        return (*kernels, "flash") if self.hw.backend == "tpu" else kernels
