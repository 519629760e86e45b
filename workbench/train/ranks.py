"""Training across torchrun's ranks: what the trainer and its step engine ask of them.

`start_replicas(cfg, backend)` is the run's `Replicas` (`workbench.backend.protocol`): `OneProcess`
off torchrun and under torch_xla's SPMD, else `RankTraining.start`, which joins the launch's process
group, refuses a config that differs between ranks, lays ``mesh.data x mesh.fsdp`` over the ranks
(`workbench.parallel.torch_parallel`) and starts the watchdog that names a dead rank. Then:

- **Data.** Every rank runs the same sampler over the whole dataset and keeps its own equal slice
  of rows of each loaded batch (`take_rows`): the global batch is exactly the one a single process
  would train on, and every rank takes the same number of steps (no rank waits at a collective
  for a batch another never loads).
- **The step.** `wrap` puts DDP or FSDP2 around the model and objective; `forward` runs a
  micro-batch through it (the wrapper ran the model it was given); `gradient_sync(last)` lets only the last micro-batch of an accumulated
  step reduce gradients.
- **Sums.** `reduce_sums` adds the loss sums and real-token counts of every rank, so gradients are
  scaled by the global count (times `gradient_scale`: DDP and FSDP2 average over the ranks) and the
  logged loss and eval loss are the global means, equal on every rank.
- **Norms.** `grad_norm` is the global gradient norm over sharded (FSDP2) or replicated (DDP) gradients.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.backend.hardware import HardwareInfo
from workbench.backend.native import process_group
from workbench.backend.protocol import Backend, Batch, OneProcess, Replicas
from workbench.parallel import torch_parallel
from workbench.parallel.mesh import batch_size_problem
from workbench.parallel.torch_parallel import ObjectiveStep, RankMesh
from workbench.units import duration_or_none


def take_rows(batch: Batch, rank: int, world: int, *, rows_per_example: int = 1) -> Batch:
    """Rank `rank`'s equal share of `batch`'s rows (a preference pair's two rows stay together)."""
    rows = int(batch["input_ids"].shape[0])
    examples = rows // rows_per_example
    if examples % world:
        what = "pairs" if rows_per_example == 2 else "rows"
        raise ValueError(
            f"a batch of {examples} {what} does not split over {world} ranks: use a train.batch_size "
            f"(or bucketing.tokens_per_batch) that gives a multiple of {world}"
        )
    per = rows // world
    window = slice(rank * per, (rank + 1) * per)
    return {k: v[window] if v.dim() and v.shape[0] == rows else v for k, v in batch.items()}


def check_global_batch(cfg: Any, layout: RankMesh) -> None:
    """`RankMeshError` when ``train.batch_size`` does not split into equal shares for the ranks: the
    sampler would round each batch down to a multiple of the rank count and train on fewer rows than
    the config says. (A ``bucketing.tokens_per_batch`` plan sizes its batches in multiples of the
    rank count itself.)"""
    if cfg.bucketing.tokens_per_batch is not None:
        return
    problem = batch_size_problem(int(cfg.train.batch_size), {"data": layout.data, "fsdp": layout.fsdp})
    if problem is not None:
        raise torch_parallel.RankMeshError(
            f"train.batch_size={cfg.train.batch_size} is the global batch, {problem}: each of the "
            f"{layout.world_size} ranks takes an equal share of every batch"
        )


def start_replicas(cfg: Any, backend: Backend) -> Replicas:
    """The run's data-parallel processes: torchrun's ranks when torchrun started this process on a
    backend that joins them, else this process alone (`OneProcess`)."""
    joined = RankTraining.start(cfg, backend.hw) if backend.joins_torchrun(cfg) else None
    return joined or OneProcess(backend)


@dataclass(eq=False)
class RankTraining(Replicas):
    """This rank's part in a torchrun launch (see the module docstring)."""

    group: process_group.ProcessGroup
    layout: RankMesh
    device: torch.device
    precision: str
    watchdog: process_group.RankWatchdog | None = None
    mesh: Any = field(default=None, repr=False)
    """The `DeviceMesh` FSDP2 shards over (None for DDP and one rank)."""
    wrapped: Any = field(default=None, repr=False)
    """The DDP / FSDP2 module (`wrap`); None before."""
    retries_failed_steps = False  # a rank retrying alone would leave the others in a collective

    @classmethod
    def start(cls, cfg: Any, hw: HardwareInfo) -> RankTraining | None:
        """Join the process group when torchrun started this process (else None) and set up the ranks,
        on a backend that joins them (`Backend.joins_torchrun`)."""
        timeout = duration_or_none(cfg.train.rank_timeout) or 60.0
        group = process_group.init_from_env(hw.backend, timeout_s=max(600.0, 10 * timeout))
        if group is None:
            return None
        process_group.agree(cfg.to_dict())  # before anything collective depends on it
        layout = torch_parallel.rank_mesh(cfg.mesh, group.world_size)
        check_global_batch(cfg, layout)
        # a CUDA or TorchTPU rank drives its LOCAL_RANK device
        device = torch.device(hw.backend, group.local_rank) if hw.backend != "cpu" else torch.device("cpu")
        ranks = cls(group, layout, device, cfg.train.precision)
        ranks.mesh = torch_parallel.device_mesh(layout, device.type)
        ranks.watchdog = process_group.RankWatchdog.for_group(group, timeout)
        return ranks

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def is_main(self) -> bool:
        return self.group.is_main

    @property
    def gradient_scale(self) -> float:
        """What undoes the ranks' gradient averaging (DDP and FSDP2 divide the sum by the rank count)."""
        return float(self.world_size) if self.layout.strategy != "single" else 1.0

    def wrap(self, model: torch.nn.Module, objective: torch.nn.Module) -> None:
        """DDP / FSDP2 around `model` and `objective` (before the optimizer is built)."""
        self.wrapped = torch_parallel.wrap(
            ObjectiveStep(model, objective),
            self.layout,
            self.mesh,
            precision=self.precision,
            device=self.device,
        )

    def take_rows(self, batch: Batch, rows_per_example: int = 1) -> Batch:
        return take_rows(batch, self.rank, self.world_size, rows_per_example=rows_per_example)

    def forward(self, model: torch.nn.Module, objective: torch.nn.Module, batch: Batch) -> Any:
        """`objective` over `batch` through the wrapper (around the `model` `wrap` was given)."""
        return self.wrapped(batch, objective=objective)

    def gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager:
        return torch_parallel.sync_gradients(self.wrapped, enabled)

    def reduce_sums(self, sums: list[torch.Tensor]) -> None:
        """Each tensor of `sums` (0-d) replaced in place by its sum over the ranks: one all-reduce."""
        stacked = torch.stack([s.detach().float() for s in sums])
        process_group.all_reduce_sum(stacked)
        with torch.no_grad():
            for s, total in zip(sums, stacked):
                s.copy_(total)

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The global L2 norm of `grads` (fp32): sharded gradients' squares summed over the ranks
        (each shard counted once, however many replicas hold it), replicated ones taken as they are."""
        zero = torch.zeros((), dtype=torch.float32, device=self.device)
        sharded, whole = zero.clone(), zero.clone()
        for g in grads:
            local = torch_parallel.local_part(g).float().pow(2).sum()
            if torch_parallel.is_dtensor(g):
                sharded += local / torch_parallel.replicas(g)
            else:
                whole += local
        if any(torch_parallel.is_dtensor(g) for g in grads):
            process_group.all_reduce_sum(sharded)
        return (sharded + whole).sqrt()

    def broadcast(self, value: Any) -> Any:
        """The main rank's `value` on every rank (a decision every rank must take alike)."""
        return process_group.broadcast_object(value)

    def gather(self, value: Any) -> list[Any]:
        return process_group.gather_objects(value)

    def barrier(self) -> None:
        process_group.barrier()

    def report(self, model: torch.nn.Module, placed: Any = None) -> list[str]:
        """Every rank's share of the model, gathered on every rank (the main one prints it)."""
        return process_group.gather_objects(torch_parallel.rank_report(model, self.layout, self.rank))

    def describe(self) -> str:
        return f"{self.world_size} ranks ({self.group.backend}), {self.layout.describe()}"

    def finish(self, *, failed: bool = False) -> None:
        """This rank is done: the others stop waiting for it, or (`failed`) stop too, naming it."""
        if self.watchdog is not None:
            self.watchdog.finished(failed=failed)
