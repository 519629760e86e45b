"""The execution backend: what the training layer asks of the machine a run executes on.

One small protocol in two parts, so the training layer (`workbench.train`, `workbench.rl`) never
branches on which execution model it runs under:

- `Backend`, the device: where tensors live and how batches reach it, what ends a step (a sync that
  cuts and runs the traced graph, or nothing), how many programs have been compiled, autocast,
  host copies, the device's RNG state, memory figures, the checkpoint planners of its tensors.
  Implementations, each in its room: `xla.spmd.XlaSpmd` (torch_xla, one controller driving every
  device of a mesh), `native.torch_native.NativeTorch` (plain torch on the CPU or CUDA, eager or
  compiled with ``train.compile``), `torchtpu.backend.TorchTpu` (TorchTPU's ``tpu`` device, TPU-only).
- `Replicas`, the data-parallel processes around it: this process's rows of a global batch, the
  forward through the data-parallel wrapper, the gradient reduction on an accumulated step's last
  micro-batch only, sums and norms over every replica, a decision the main process takes for all,
  collective checkpoint writes. `OneProcess` is one process (torch_xla's SPMD is one process whatever
  its mesh); torchrun's ranks are `workbench.train.ranks.RankTraining` (DDP and FSDP2 sit above
  this layer, in `workbench.parallel.torch_parallel`).

`workbench.backend.selection.backend_for(hw)` picks the `Backend` from detection's `HardwareInfo`
(that module sits above the implementations, which build on this one).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from workbench.backend.hardware import HardwareInfo

Batch = dict[str, torch.Tensor]


class Backend(ABC):
    """The device a run executes on (see the module docstring)."""

    name: str = ""
    """What `info` and notices call it: 'torch_xla', 'native', 'torchtpu'."""
    compiles_every_shape: bool = False
    """Every new input shape is a compiled program (torch_xla): warm-up compiles every step and eval
    shape, and a failed step is not retried (its input buffers may have been donated)."""
    gspmd: bool = False
    """One program spread over a mesh of devices by the compiler (``mesh.*`` places tensors)."""
    reduce_scatter_as_all_reduce: bool = False
    """The compiler runs a reduce-scatter as an all-reduce of the whole tensor, then a slice (XLA on the
    CPU), so what a step sends is told as it runs there (`workbench.analysis.advice`)."""

    def __init__(self, hw: HardwareInfo) -> None:
        self.hw = hw

    def joins_torchrun(self, cfg: Any) -> bool:
        """Whether this process joins torchrun's ranks when torchrun started it (a config the backend
        cannot run across them is refused here)."""
        return True

    # ---- placement ----
    @abstractmethod
    def device(self) -> torch.device:
        """The device this process puts tensors on (under SPMD the one the whole mesh sits behind)."""

    @abstractmethod
    def device_batches(
        self, batches: Iterable[Batch], device: torch.device, *, sharding: Any = None
    ) -> Iterator[Batch]:
        """`batches` (host tensors) on `device`, copied ahead of use where the backend can."""

    def close_batches(self, batches: Iterator[Batch]) -> None:
        """Stop whatever copies batches in the background for a `device_batches` iterator."""
        return None  # nothing to do here by default

    def place_like(self, parameter: torch.Tensor, state: torch.Tensor) -> None:
        """Lay out an optimizer `state` tensor like its `parameter` (a no-op where placement follows)."""
        return None  # nothing to do here by default

    # ---- the step ----
    def step_boundary(self) -> None:
        """End a step's (or a batch's) work: torch_xla cuts and runs the traced graph; eager does nothing."""
        return None  # nothing to do here by default

    def wait(self) -> None:
        """Return once the device has finished the work queued so far."""
        return None  # nothing to do here by default

    def autocast(self, precision: str) -> contextlib.AbstractContextManager:
        """The autocast of a step under `precision` ('bf16-mixed': bf16 compute; else none)."""
        if precision != "bf16-mixed":
            return contextlib.nullcontext()
        return torch.autocast(self.autocast_device_type(), dtype=torch.bfloat16)

    def autocast_device_type(self) -> str:
        return self.device().type

    # ---- compiles ----
    @abstractmethod
    def compile_count(self) -> int:
        """Programs (or graphs) compiled in this process so far."""

    def compile_time_s(self) -> float:
        """Seconds this process has spent compiling them (0.0 where the backend does not time its compiles)."""
        return 0.0

    def start_compile_log(self) -> list[str]:
        """Switch on the record of why each program compiles, for the recompile forensics; its notices."""
        return []

    def compile_reader(self) -> Any:
        """A reader of the compile records from now on (`new_records`, `skip`; `path` None while off), or None."""
        return None

    def compiled_program_bytes(self) -> int | None:
        """The most memory any program compiled so far needs (the compile log's peak); None where unlogged."""
        return None

    def transfer_count(self) -> int:
        """Device->host transfers in this process so far (0 where the backend does not count them)."""
        return 0

    def host_copies(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """`tensors` (this device's) copied to the host: one batched transfer where the device batches
        them (torch_xla), else each copied as it is."""
        return [t.cpu() for t in tensors]

    # ---- state ----
    def rng_state(self) -> dict[str, Any]:
        """The device's RNG state beyond torch's CPU and CUDA generators (saved in checkpoints)."""
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what `rng_state` returned (keys another backend wrote are ignored)."""
        return None  # nothing to do here by default

    @contextlib.contextmanager
    def seeded_rng(self, seed: int, device: torch.device) -> Iterator[torch.Generator | None]:
        """Random draws on `device` seeded by `seed` while inside (sampling's): yields the generator to
        draw from, a fresh one on `device`; or None where draws take the device's own RNG, which is
        seeded here and restored on leaving (torch_xla, whose tensors take no generator)."""
        yield torch.Generator(device=device).manual_seed(seed)

    def memory_in_use(self) -> dict[str, int] | None:
        """Device memory in use and its limit (``bytes_used``, ``bytes_limit``), or None where unknown."""
        return None

    def checkpoint_planners(self) -> tuple[Any, Any] | None:
        """(save planner, load planner) for torch.distributed.checkpoint of this device's sharded
        tensors, or None for DCP's defaults."""
        return None

    def mesh_sharded(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is laid out over a mesh of devices by the compiler (GSPMD), so that a
        checkpoint writes its local shards (`local_shards_to_host`) rather than one host copy."""
        return False

    def local_shards_to_host(self, tensors: Sequence[torch.Tensor]) -> list[Any]:
        """Each of `tensors` (`mesh_sharded` ones) as its local shards copied to the host in one transfer,
        in the form this backend's checkpoint save planner writes; a tensor of a backend without a mesh
        is its own one shard, a host copy."""
        return host_copies(tensors)

    # ---- profiling ----
    def profiler_activities(self) -> list[Any]:
        """What `torch.profiler` records of this device's work: the host's ops (and CUDA's kernels)."""
        return [torch.profiler.ProfilerActivity.CPU]

    def capture_trace(self, step_fn: Any, steps: int, logdir: Any, *, step_s: float, port: int) -> bool:
        """Run `step_fn` `steps` times under the device's own profiler, its trace written into `logdir`,
        where `torch.profiler` does not see the device's work (torch_xla on a TPU: its profiler server,
        a capture lasting about `steps` x `step_s` seconds); False, having run nothing, where it does."""
        return False

    def attention_kernels(self) -> tuple[str, ...]:
        """The ``model.attention`` kernels this backend runs."""
        return ("eager", "sdpa", "chunked")

    def describe(self) -> str:
        return f"{self.name} on {self.hw.backend}"


class Replicas(ABC):
    """The data-parallel processes of a run (see the module docstring); `OneProcess` is the trivial one."""

    rank: int = 0
    world_size: int = 1
    is_main: bool = True
    retries_failed_steps: bool = True
    """Whether an out-of-memory step may be retried with smaller micro-batches (not across processes:
    one retrying alone would leave the others in a collective)."""
    gradient_scale: float = 1.0
    """What undoes the data-parallel wrapper's averaging of gradients over the replicas."""
    device: torch.device
    wrapped: Any = None
    """The data-parallel wrapper `wrap` put around model and objective (``wrapped(batch, objective=)``),
    which a compiled step compiles in their place; None where there is none."""

    @abstractmethod
    def take_rows(self, batch: Batch, rows_per_example: int = 1) -> Batch:
        """This process's share of a global batch's rows (a preference pair's two rows together)."""

    @abstractmethod
    def wrap(self, model: torch.nn.Module, objective: torch.nn.Module) -> None:
        """Put the data-parallel wrapper around model and objective (before the optimizer is built)."""

    @abstractmethod
    def forward(self, model: torch.nn.Module, objective: torch.nn.Module, batch: Batch) -> Any:
        """``objective(model, batch)``, through the wrapper where there is one."""

    def gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager:
        """Gradients reduced over the replicas in this backward only when `enabled`."""
        return contextlib.nullcontext()

    def reduce_sums(self, sums: list[torch.Tensor]) -> None:
        """Each 0-d tensor of `sums` replaced in place by its sum over the replicas."""
        return None  # nothing to do here by default

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The global L2 norm of `grads`, summed in fp32 whatever their dtype."""
        norms = torch.stack([torch.linalg.vector_norm(g, 2, dtype=torch.float32) for g in grads])
        return torch.linalg.vector_norm(norms, 2)

    def broadcast(self, value: Any) -> Any:
        """The main process's `value`, on every process."""
        return value

    def gather(self, value: Any) -> list[Any]:
        """Every process's `value`, in rank order, on every process."""
        return [value]

    def barrier(self) -> None:
        """Return once every process has reached it."""
        return None  # nothing to do here by default

    def report(self, model: torch.nn.Module, placed: Any) -> Any:
        """What the run says about how `model` is laid out: `placed` (the single-controller placement's
        report), or every rank's share."""
        return placed

    def finish(self, *, failed: bool = False) -> None:
        """This process is done: the others stop waiting for it (or, `failed`, stop too)."""
        return None  # nothing to do here by default

    def describe(self) -> str:
        return "one process"


class OneProcess(Replicas):
    """One process: every row is its own, sums and decisions are already global."""

    def __init__(self, backend: Backend | None = None) -> None:
        self.backend = backend
        """None: a process that only takes part in checkpoints (`is_main`, `broadcast`, ...) written or read
        outside a run (an export, `workbench.train.start`, a test); its tensors are wherever they are."""

    @property
    def retries_failed_steps(self) -> bool:  # type: ignore[override]
        return (
            self.backend is None or not self.backend.compiles_every_shape
        )  # an XLA step may have donated its inputs

    @property
    def device(self) -> torch.device:  # asked late: under SPMD, once the mesh is set up
        return self.backend.device()

    def take_rows(self, batch: Batch, rows_per_example: int = 1) -> Batch:
        return batch

    def wrap(self, model: torch.nn.Module, objective: torch.nn.Module) -> None:
        return None

    def forward(self, model: torch.nn.Module, objective: torch.nn.Module, batch: Batch) -> Any:
        return objective(model, batch)


def host_copies(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`tensors` on the host whatever device each is on, for a caller that holds no `Backend` (an export,
    a checkpoint): torch_xla's tensors in one batched transfer, as `Backend.host_copies` of torch_xla's
    backend, any other copied as it is."""
    from workbench.backend.xla import runtime

    return runtime.fetch_to_host(tensors)
