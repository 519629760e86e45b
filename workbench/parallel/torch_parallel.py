"""The mesh config on torch.distributed ranks: a `DeviceMesh` and the model wrapped for it.

Under torchrun every rank is one device, and ``mesh.data x mesh.fsdp`` is laid over the ranks
(`rank_mesh`; -1 fills from the rank count, the product must equal it):

- ``fsdp > 1``: FSDP2 (`fully_shard`) on each decoder layer, then at the root, over a 1-D mesh of
  the fsdp ranks; with ``data > 1`` too, over a 2-D ``(data, fsdp)`` mesh: HSDP, each parameter
  sharded within an fsdp group and replicated across the data groups. Under ``bf16-mixed``
  parameters are gathered in bf16 and gradients reduced in fp32 against fp32 master weights.
- ``data`` only: `DistributedDataParallel` (replicated weights, all-reduced gradients).
- ``mesh.model > 1``: refused (`RankMeshError`): tensor parallelism across processes is not built.

What is wrapped is `ObjectiveStep`, the model and its objective as one module whose forward is a
micro-batch's loss: DDP's and FSDP2's hooks then see every forward, whichever way the objective
calls the model (the chunked loss runs the decoder and the head apart, never the model's own
forward). The model object itself stays the one the trainer holds: FSDP2 turns its parameters
into sharded `DTensor`s in place, DDP only wraps.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.config import ConfigError  # the layer table lets parallel/ import config, not config_parse
from workbench.parallel.mesh import MeshError, MeshSpec
from workbench.units import format_bytes


class RankMeshError(MeshError, ConfigError):
    """A mesh config that does not fit the ranks torchrun started; the message shows the arithmetic."""


@dataclass(frozen=True)
class RankMesh:
    """``mesh.data x mesh.fsdp`` over torchrun's ranks (resolved: sizes multiply to the rank count)."""

    data: int
    fsdp: int

    @property
    def world_size(self) -> int:
        return self.data * self.fsdp

    @property
    def strategy(self) -> str:
        """'single' (one rank), 'ddp' (data only), 'fsdp' (fsdp only) or 'hsdp' (both)."""
        if self.world_size == 1:
            return "single"
        if self.fsdp == 1:
            return "ddp"
        return "fsdp" if self.data == 1 else "hsdp"

    def describe(self) -> str:
        names = {
            "single": "one process",
            "ddp": f"DDP over {self.data} ranks",
            "fsdp": f"FSDP2 over {self.fsdp} ranks",
            "hsdp": f"HSDP: FSDP2 within {self.data} groups of {self.fsdp} ranks, replicated across them",
        }
        return f"data({self.data}) x fsdp({self.fsdp}): {names[self.strategy]}"


def rank_mesh(mesh_cfg: Any, world_size: int) -> RankMesh:
    """`mesh_cfg` (``cfg.mesh``) over `world_size` ranks; `RankMeshError` spells out a product that
    does not work, and refuses ``mesh.model > 1`` and ``mesh.num_slices > 1`` naming what is
    supported. ``mesh.enabled`` is not read: torchrun's ranks always split as data x fsdp."""
    slices = int(getattr(mesh_cfg, "num_slices", 1))
    if slices != 1:
        raise RankMeshError(
            f"mesh.num_slices={slices} is not supported across torchrun processes: slices are TPU slices "
            "joined over the data-centre network (SPMD); under torchrun every process is one device of "
            "one group: set mesh.num_slices=1"
        )
    model = int(mesh_cfg.model)
    if model != 1:
        raise RankMeshError(
            f"mesh.model={model} is not supported across torchrun processes: tensor parallelism runs on "
            "TPUs (SPMD) only; on GPUs and CPU ranks use mesh.data (DDP), mesh.fsdp (FSDP2) or both (HSDP), "
            "with mesh.model=1"
        )
    spec = MeshSpec(data=int(mesh_cfg.data), fsdp=int(mesh_cfg.fsdp), model=1)
    try:
        resolved = spec.resolve(world_size)
    except MeshError as err:
        raise RankMeshError(
            f"{err} (under torchrun each process is one device: {world_size} processes)"
        ) from None
    return RankMesh(data=resolved.data, fsdp=resolved.fsdp)


def device_mesh(layout: RankMesh, device_type: str) -> Any:
    """The torch `DeviceMesh` FSDP2 shards over: 1-D ``(fsdp,)``, or 2-D ``(data, fsdp)`` for HSDP;
    None for DDP and a single rank (DDP takes the whole process group)."""
    if layout.strategy not in ("fsdp", "hsdp"):
        return None
    from torch.distributed.device_mesh import init_device_mesh

    if layout.strategy == "fsdp":
        return init_device_mesh(device_type, (layout.fsdp,), mesh_dim_names=("fsdp",))
    return init_device_mesh(device_type, (layout.data, layout.fsdp), mesh_dim_names=("data", "fsdp"))


class ObjectiveStep(nn.Module):
    """The model and its objective as one module: ``forward(batch)`` is ``objective(model, batch)``
    (another objective, e.g. the eval's, with ``objective=``). What DDP and FSDP2 wrap."""

    def __init__(self, model: nn.Module, objective: nn.Module) -> None:
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, batch: dict[str, torch.Tensor], objective: nn.Module | None = None) -> Any:
        return (objective or self.objective)(self.model, batch)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder's layers of a transformers causal LM (or a peft model around one): FSDP2's units."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    get_decoder = getattr(base, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else getattr(base, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise RankMeshError(
            f"{type(base).__name__} has no decoder layers at .get_decoder().layers: FSDP2 shards layer by "
            "layer; use mesh.fsdp=1 (DDP) for this model"
        )
    return list(layers)


def mixed_precision(precision: str, device: torch.device) -> Any:
    """FSDP2's policy for ``train.precision``: bf16 gathers with fp32 gradient reduction under
    'bf16-mixed'; None (the parameters' own dtype) otherwise, and on a GPU without bf16, where the
    run trains in fp32 (`workbench.train.model_setup.precision_notices` says so)."""
    if precision != "bf16-mixed":
        return None
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def wrap(
    step: ObjectiveStep, layout: RankMesh, mesh: Any, *, precision: str, device: torch.device
) -> nn.Module:
    """`step` ready to train on the ranks: FSDP2 per decoder layer and at the root (fsdp, hsdp), DDP
    (ddp), or as it is (one rank). Call before the optimizer is built: FSDP2 replaces parameters."""
    if layout.strategy == "single":
        return step
    if layout.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(step, device_ids=ids, broadcast_buffers=False)
    from torch.distributed.fsdp import fully_shard

    same_start(step)

    kwargs: dict[str, Any] = {"mesh": mesh}
    # a quantized base's integer weights (`model.quantize`) stay whole on every rank: FSDP2 shards and
    # gathers floating-point parameters only
    integer = {p for p in step.parameters() if not p.is_floating_point()}
    if integer:
        kwargs["ignored_params"] = integer
    policy = mixed_precision(precision, device)
    if policy is not None:
        kwargs["mp_policy"] = policy
    for layer in decoder_layers(step.model):  # one all-gather per layer, freed after its backward
        fully_shard(layer, **kwargs)
    fully_shard(step, **kwargs)  # the rest: embeddings, final norm, head (tied or not), objective
    return step


def same_start(module: nn.Module) -> None:
    """Every rank's parameters and buffers set to rank 0's. DDP does this when it wraps; FSDP2 shards
    whatever each rank holds, so a weight initialised from an unseeded generator (or a checkpoint
    read differently) would start as a different matrix on each rank, and HSDP's replicas would
    train apart for good."""
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def sync_gradients(wrapped: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """A context in which backward does (`enabled`) or does not all-reduce/reduce-scatter gradients:
    accumulation syncs only on its last micro-batch (DDP's ``no_sync``; FSDP2's
    ``set_requires_gradient_sync``)."""
    if hasattr(wrapped, "no_sync"):
        return contextlib.nullcontext() if enabled else wrapped.no_sync()
    if hasattr(wrapped, "set_requires_gradient_sync"):
        wrapped.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def is_dtensor(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t`: a DTensor's local shard, any other tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def replicas(t: torch.Tensor) -> int:
    """How many ranks hold the same shard of DTensor `t` (its replicated mesh dims); 1 otherwise."""
    if not is_dtensor(t):
        return 1
    from torch.distributed.tensor import Replicate

    sizes = t.device_mesh.shape
    return math.prod(size for size, p in zip(sizes, t.placements) if isinstance(p, Replicate))


@dataclass
class HeldTensor:
    name: str
    shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    placement: str
    element_size: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.local_shape) * self.element_size

    @property
    def whole_nbytes(self) -> int:
        return math.prod(self.shape) * self.element_size


def held_tensors(model: nn.Module) -> Iterator[HeldTensor]:
    """What this rank holds of each parameter: the whole tensor, or its shard and placement."""
    for name, p in model.named_parameters():
        local = local_part(p.detach())
        placement = ", ".join(str(x) for x in p.placements) if is_dtensor(p) else "whole"
        yield HeldTensor(name, tuple(p.shape), tuple(local.shape), placement, p.element_size())


def rank_report(model: nn.Module, layout: RankMesh, rank: int, *, rows: int = 6) -> str:
    """This rank's share of the model: the strategy, bytes held against the whole, and the first
    parameters' global and local shapes."""
    held = list(held_tensors(model))
    local = sum(h.nbytes for h in held)
    whole = sum(h.whole_nbytes for h in held)
    lines = [
        f"rank {rank} of {layout.world_size} ({layout.describe()}): holds {format_bytes(local)} of "
        f"{format_bytes(whole)} of parameters"
    ]
    for h in held[:rows]:
        lines.append(f"  {h.name}: {list(h.shape)} -> {list(h.local_shape)} ({h.placement})")
    if len(held) > rows:
        lines.append(f"  ... {len(held) - rows} more")
    return "\n".join(lines)
