"""Plain torch as a `Backend`: the CPU or CUDA, eager unless ``train.compile`` compiles the step.

Nothing is traced, so a step ends without a sync; batches are copied to the device as they are
taken; compiles are Dynamo's graphs, counted by `dynamo_compiles`. Several devices are several
processes under torchrun (`workbench.train.ranks.RankTraining`), each one of these.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from workbench.backend.native import dynamo_compiles
from workbench.backend.protocol import Backend, Batch


class NativeTorch(Backend):
    """Plain torch on the CPU or CUDA (see the module docstring)."""

    name = "native"

    def device(self) -> torch.device:
        return torch.device(self.hw.backend)

    def device_batches(
        self, batches: Iterable[Batch], device: torch.device, *, sharding: Any = None
    ) -> Iterator[Batch]:
        pinned = torch.device(device).type == "cuda"
        for batch in batches:
            yield {
                k: v.to(device, non_blocking=pinned) if isinstance(v, torch.Tensor) else v
                for k, v in batch.items()
            }

    def wait(self) -> None:
        if torch.device(self.device()).type == "cuda" and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def autocast(self, precision: str):
        # a GPU without bf16 runs in fp32 (the trainer says so once)
        if (
            precision == "bf16-mixed"
            and self.autocast_device_type() == "cuda"
            and not torch.cuda.is_bf16_supported()
        ):
            return super().autocast("fp32")
        return super().autocast(precision)

    def compile_count(self) -> int:
        return dynamo_compiles.graphs_compiled()

    def compile_time_s(self) -> float:
        return dynamo_compiles.graph_compile_s()

    def compile_reader(self) -> dynamo_compiles.DynamoCompileReader:
        return dynamo_compiles.reader()

    def profiler_activities(self) -> list[Any]:
        cuda = [torch.profiler.ProfilerActivity.CUDA] if self.hw.backend == "cuda" else []
        return [*super().profiler_activities(), *cuda]

    def memory_in_use(self) -> dict[str, int] | None:
        if self.hw.backend != "cuda":  # the CPU's and TorchTPU's memory are not counted here
            return None
        # what torch's caching allocator holds in tensors (0 before CUDA starts), against the detected memory
        used = int(torch.cuda.memory_allocated())
        return {"bytes_used": used, "bytes_limit": int(self.hw.memory_per_device_bytes or 0)}
