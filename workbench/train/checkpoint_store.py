"""Which format a checkpoint's tensors take, one strategy per way a run holds them (`store_for`).

`CheckpointManager` (``checkpoint.py``) saves in two halves: `snapshot` at the step boundary, `write`
after it (on a background thread where the store allows). A `TensorStore` is what those halves do
with each top-level part holding tensors:

- `TensorStore` (one process, tensors whole on one device or the host): the part's tensors copied
  to the host (`host_tensors`, one batched transfer where the device allows) and written as
  ``<part>.safetensors``.
- `MeshShards` (one process driving a mesh: torch_xla's SPMD, ``sharded=True``): a part holding
  tensors sharded over the mesh is copied as each tensor's local shards (`host_shards`) and written
  through torch.distributed.checkpoint with the backend's planners (``<part>.dcp/``), or, where
  DCP's index misses a tensor, as whole tensors in safetensors; any other part as above.
- `RankShards` (the processes of a torchrun launch): every part holding tensors is handed to DCP
  live, each rank writing its own shards (FSDP2) or one copy of replicated ones (DDP) into the same
  directory, synchronously (the write is collective: never on a background thread).

`store_for` picks one from the run's `Replicas` by their type: `OneProcess`, `MeshShards` or the
plain store by ``sharded``; any other `Replicas` are several processes (`RankShards`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.backend.protocol import Backend, OneProcess, Replicas
from workbench.train.state_io import (
    host_shards,
    host_tensors,
    load_dcp,
    save_dcp,
    save_dcp_shared,
    unique_tensors,
)


@dataclass
class HostSnapshot:
    """A checkpoint's state on the host, as `CheckpointManager.snapshot` copied it from the devices."""

    step: int
    structure: dict[str, Any] = field(default_factory=dict)
    """Each part's JSON structure (`flatten_state`): where its tensors go back."""
    files: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    """Parts written as safetensors: their host tensors by key."""
    sharded: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Parts written through DCP: their tensors' local shards on the host (`host_shards`), or under
    torchrun the live tensors themselves."""
    aliases: dict[str, dict[str, str]] = field(default_factory=dict)
    """A DCP part's every key -> the key of the tensor written for it (tied weights are written once)."""

    def hand_to_dcp(self, part: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Record `part` as a DCP part; its tensors, one key per tensor object (as `load_dcp` reads them)."""
        unique = unique_tensors(tensors)
        written_as = {id(t): key for key, t in unique.items()}
        self.aliases[part] = {key: written_as[id(t)] for key, t in tensors.items()}
        return unique


class TensorStore:
    """One process: host copies written as safetensors (see the module docstring). `backend`: the run's
    (None outside a run: host tensors, or any device's fetched as `host_tensors` does)."""

    background = True
    """Whether a write may run on a thread beside training (not when it is collective)."""

    def __init__(self, backend: Backend | None = None) -> None:
        self.backend = backend

    def copy_part(
        self, snap: HostSnapshot, part: str, tensors: dict[str, torch.Tensor], *, copy: bool
    ) -> None:
        """Put `part`'s `tensors` into `snap` as what the write needs (at the step boundary). `copy`:
        host tensors are copied too (training goes on changing them while a background write runs)."""
        snap.files[part] = host_tensors(tensors, copy=copy)

    def write_dcp(self, shards: dict[str, Any], directory: Path) -> bool:
        """Write a DCP part; False (nothing left behind) when it must go to safetensors instead."""
        planners = self.backend.checkpoint_planners() if self.backend is not None else None
        return save_dcp(shards, directory, planner=planners[0] if planners is not None else None)

    def load_dcp(self, targets: dict[str, torch.Tensor], directory: Path) -> None:
        """Read a DCP part into the live `targets`, resharded to their layout."""
        load_dcp(targets, directory, backend=self.backend)


class MeshShards(TensorStore):
    """One process driving a mesh of devices (SPMD): sharded parts as host copies of their local shards."""

    def __init__(self, backend: Backend | None) -> None:
        if backend is None:
            raise ValueError(
                "sharded=True needs the run's backend, whose mesh shards the tensors: pass "
                "replicas=OneProcess(backend)"
            )
        super().__init__(backend)
        self.mesh_backend: Backend = backend

    def copy_part(
        self, snap: HostSnapshot, part: str, tensors: dict[str, torch.Tensor], *, copy: bool
    ) -> None:
        if not any(self.mesh_backend.mesh_sharded(t) for t in tensors.values()):
            super().copy_part(snap, part, tensors, copy=copy)
            return
        snap.sharded[part] = host_shards(snap.hand_to_dcp(part, tensors), self.mesh_backend)


class RankShards(TensorStore):
    """The processes of a torchrun launch: every rank hands DCP its live tensors, synchronously."""

    background = False

    def copy_part(
        self, snap: HostSnapshot, part: str, tensors: dict[str, torch.Tensor], *, copy: bool
    ) -> None:
        # no copy: the write is synchronous, and DCP reads the live (sharded) tensors itself
        snap.sharded[part] = snap.hand_to_dcp(part, tensors)

    def write_dcp(self, shards: dict[str, Any], directory: Path) -> bool:
        save_dcp_shared(shards, directory)
        return True


@functools.singledispatch
def store_for(replicas: Replicas, *, sharded: bool) -> TensorStore:
    """The `TensorStore` of a run's `replicas`: several processes write one checkpoint together."""
    return RankShards()


@store_for.register
def _one_process(replicas: OneProcess, *, sharded: bool) -> TensorStore:
    """One process: its mesh's local shards (``sharded``, SPMD), else host copies."""
    return MeshShards(replicas.backend) if sharded else TensorStore(replicas.backend)
