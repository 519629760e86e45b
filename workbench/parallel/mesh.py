"""The SPMD mesh: named axes ``data x fsdp x model``, validated in pure Python before torch_xla builds it.

`MeshSpec` names the axes (at most one ``-1``, filled from the device count). `resolve`
validates the sizes and spells the product out when it is wrong; `build` switches torch_xla
into SPMD mode in the order it needs (`ensure_spmd`: before the XLA device is first used) and
returns the torch_xla mesh (a hybrid ICI x DCN mesh when `num_slices > 1`). `mesh_preset` and
`mesh_from_config` choose the mesh for the hardware and ``cfg.mesh``.

The batch splits over ``data x fsdp`` (`BATCH_AXES`): `batch_size_problem` is the one
divisibility rule for batches, which `check_batch_size` and the memory estimate both apply.

Every torch_xla call goes through `workbench.backend.xla.runtime`. Importing this module starts nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from workbench.backend.xla import presence, runtime
from workbench.parallel.sharding_rule import ShardingError
from workbench.units import nearby_multiples

if TYPE_CHECKING:  # imported for annotations only: no runtime cost, no cycles
    from workbench.backend.hardware import HardwareInfo
    from workbench.config import MeshConfig

AXES: tuple[str, ...] = ("data", "fsdp", "model")
"""Mesh axis names, outermost first. `model` is innermost: tensor parallelism talks the most,
so its devices should be neighbours (torch_xla's HybridMesh orders axes the same way)."""

BATCH_AXES: tuple[str, ...] = ("data", "fsdp")
"""Axes the batch dimension is split over (FSDP is data parallel for activations)."""


class MeshError(ValueError):
    """A mesh that cannot exist on these devices; the message shows the arithmetic."""


# ---- the mesh ------------------------------------------------------------------------


@dataclass(frozen=True)
class MeshSpec:
    """Named mesh axes. Sizes multiply to the device count; one axis may be -1 (filled in).

    `num_slices` > 1 describes a multi-slice run (several TPU slices joined over the data-centre
    network, DCN): the `dcn_axis` is split into `num_slices` groups across slices and every other
    axis stays inside a slice (ICI).
    """

    data: int = -1
    """Data-parallel degree (replicated parameters, batch split); -1 fills from the device count."""
    fsdp: int = 1
    """Fully-sharded data-parallel degree (parameters and batch split)."""
    model: int = 1
    """Tensor-parallel degree (weights split column/row-wise, activations all-reduced)."""
    num_slices: int = 1
    """TPU slices joined over DCN; 1 for a single slice, host or Colab/Kaggle VM."""
    dcn_axis: str = "data"
    """The axis that spans slices when `num_slices` > 1 (`data` or `fsdp`; never `model`)."""

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis)
            if isinstance(value, bool) or not isinstance(value, int):
                raise MeshError(f"MeshSpec.{axis}={value!r} is not allowed: expected an int >= 1, or -1")
            if value != -1 and value < 1:
                raise MeshError(
                    f"MeshSpec.{axis}={value!r} is not allowed: must be >= 1, or -1 to fill from the device count"
                )
        unknown = [axis for axis in AXES if getattr(self, axis) == -1]
        if len(unknown) > 1:
            raise MeshError(
                f"MeshSpec has -1 on {' and '.join(unknown)}: at most one axis may be -1 "
                f"(the device count fills one unknown, not {len(unknown)})"
            )
        if isinstance(self.num_slices, bool) or not isinstance(self.num_slices, int) or self.num_slices < 1:
            raise MeshError(f"MeshSpec.num_slices={self.num_slices!r} is not allowed: must be an int >= 1")
        if self.dcn_axis not in BATCH_AXES:
            raise MeshError(
                f"MeshSpec.dcn_axis={self.dcn_axis!r} is not allowed: one of {', '.join(map(repr, BATCH_AXES))} "
                "(tensor parallelism across slices would put its all-reduces on the slow network)"
            )

    # ---- sizes ----------------------------------------------------------------------
    @property
    def axis_sizes(self) -> dict[str, int]:
        """``{"data": d, "fsdp": f, "model": m}`` in mesh order (-1 where still unresolved)."""
        return {axis: getattr(self, axis) for axis in AXES}

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.axis_sizes.values())

    @property
    def is_resolved(self) -> bool:
        return -1 not in self.shape

    @property
    def num_devices(self) -> int:
        self._require_resolved("num_devices")
        return math.prod(self.shape)

    @property
    def dp_size(self) -> int:
        """How many ways the batch splits: data x fsdp."""
        self._require_resolved("dp_size")
        return self.data * self.fsdp

    def describe(self) -> str:
        """``data(2) x fsdp(2) x model(2)``."""
        text = " x ".join(f"{axis}({size})" for axis, size in self.axis_sizes.items())
        if self.num_slices > 1:
            text += f" over {self.num_slices} slices ({self.dcn_axis} across DCN)"
        return text

    def __str__(self) -> str:
        return self.describe()

    def _require_resolved(self, what: str) -> None:
        if not self.is_resolved:
            raise MeshError(f"{what} of {self.describe()} is unknown until resolve(num_devices) fills the -1")

    def resolve(self, num_devices: int) -> MeshSpec:
        """This spec with the -1 filled in, checked against `num_devices`."""
        if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
            raise MeshError(f"num_devices={num_devices!r} is not allowed: must be an int >= 1")
        sizes = self.axis_sizes
        unknown = [axis for axis, size in sizes.items() if size == -1]
        if unknown:
            axis = unknown[0]
            known = {a: s for a, s in sizes.items() if a != axis}
            known_product = math.prod(known.values())
            if num_devices % known_product:
                spelled = " x ".join(f"{a}({s})" for a, s in known.items())
                raise MeshError(
                    f"cannot fill {axis}=-1: {num_devices} devices are not divisible by "
                    f"{spelled} = {known_product}"
                )
            sizes[axis] = num_devices // known_product
        resolved = replace(self, **sizes)
        product = math.prod(resolved.shape)
        if product != num_devices:
            raise MeshError(f"{resolved.describe()} = {product} != {num_devices} devices")
        if self.num_slices > 1:
            across = sizes[self.dcn_axis]
            if across % self.num_slices:
                raise MeshError(
                    f"{self.dcn_axis}({across}) must be divisible by num_slices({self.num_slices}): "
                    f"the {self.dcn_axis} axis is split into one group per slice"
                )
        return resolved

    def hybrid_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(ICI shape, DCN shape) for torch_xla's HybridMesh; DCN is all ones on one slice."""
        self._require_resolved("hybrid_shapes")
        dcn = tuple(self.num_slices if axis == self.dcn_axis else 1 for axis in AXES)
        ici = tuple(size // d for size, d in zip(self.shape, dcn, strict=True))
        return ici, dcn

    # ---- building the torch_xla mesh -----------------------------------------------
    def build(self) -> Any:
        """The torch_xla SPMD mesh over every device of the run (SPMD is switched on first).

        torch_xla can only enter SPMD mode before the XLA device is first used (a tensor on it,
        ``torch_xla.device()``, RNG seeding): after that, ``use_spmd()`` leads to a segfault at
        the next execution (pytorch/xla#9735). So this refuses, with the fix in the message.
        Starting the runtime alone (`hardware.detect`, device counts) is fine.
        """
        ensure_spmd()
        resolved = self.resolve(runtime.global_device_count())
        if resolved.num_slices > 1:
            ici, dcn = resolved.hybrid_shapes()
            try:
                mesh = runtime.hybrid_mesh(ici, dcn, AXES)
            except (ValueError, AssertionError) as err:
                raise MeshError(
                    f"cannot build the multi-slice mesh {resolved.describe()} (ICI {ici} x DCN {dcn}): "
                    f"{err}. Multi-slice needs a TPU multi-slice run; use num_slices=1 elsewhere"
                ) from err
        else:
            mesh = runtime.spmd_mesh(range(resolved.num_devices), resolved.shape, AXES)
        runtime.set_global_mesh(mesh)  # the Pallas attention kernels split q, k and v by it
        return mesh

    @classmethod
    def from_config(cls, mesh_cfg: MeshConfig) -> MeshSpec:
        """The spec a `MeshConfig` section describes (whether or not it is enabled)."""
        return cls(
            data=mesh_cfg.data,
            fsdp=mesh_cfg.fsdp,
            model=mesh_cfg.model,
            num_slices=getattr(mesh_cfg, "num_slices", 1),
        )


def ensure_spmd() -> None:
    """Switch torch_xla into SPMD mode, or fail clearly when it is too late to."""
    if not presence.xla_installed():
        raise MeshError("SPMD meshes need torch_xla (pip install 'xla-workbench[xla-cpu]' or the TPU build)")
    if runtime.is_spmd():
        return
    if runtime.spmd_config_locked():
        created = runtime.xla_tensors_created()
        raise MeshError(
            "the XLA device was already used without SPMD "
            f"({created} XLA tensor(s) created; torch_xla.device(), RNG seeding or a tensor on the "
            "device fix the mode), and switching to SPMD now crashes later (pytorch/xla#9735). "
            "Restart the Python process (or notebook kernel) and build the mesh first: "
            "MeshSpec(...).build() (or workbench.parallel.mesh.ensure_spmd()) before touching the XLA "
            "device, moving the model or seeding it; hardware.detect() may run before or after"
        )
    runtime.use_spmd()


def mesh_preset(hw: HardwareInfo, user: MeshSpec | None = None) -> MeshSpec | None:
    """The mesh for this hardware: the user's (validated now), else one chip -> None, several -> FSDP.

    None means "no mesh": one device, or a backend without torch_xla SPMD (CUDA, plain CPU).
    """
    if user is not None:
        return user.resolve(hw.num_devices)
    if not hw.via_xla or hw.num_devices <= 1:
        return None
    # 8 chips (v5e-8, v4-8, v3-8 cores) and pods: FSDP over everything keeps one copy of the
    # weights and optimizer state spread across all devices; the batch splits the same way.
    return MeshSpec(data=1, fsdp=hw.num_devices, model=1)


def mesh_from_config(mesh_cfg: MeshConfig, hw: HardwareInfo) -> MeshSpec | None:
    """`cfg.mesh` applied to `hw`: None when disabled, else the resolved spec (errors name the sizes)."""
    if not mesh_cfg.enabled:
        return None
    return mesh_preset(hw, MeshSpec.from_config(mesh_cfg))


def axis_sizes_of(mesh: Any) -> dict[str, int]:
    """Axis sizes of a torch_xla mesh, a resolved `MeshSpec` or a plain mapping."""
    if isinstance(mesh, MeshSpec):
        mesh._require_resolved("axis sizes")
        return mesh.axis_sizes
    if isinstance(mesh, Mapping):
        return {str(k): int(v) for k, v in mesh.items()}
    if not callable(getattr(mesh, "shape", None)):
        raise MeshError(
            f"mesh of type {type(mesh).__name__} is not allowed: expected a torch_xla Mesh, "
            "a MeshSpec or a mapping of axis name -> size"
        )
    shape = mesh.shape()  # torch_xla Mesh: OrderedDict(axis name -> size)
    return {str(k): int(v) for k, v in shape.items()}


def data_parallel_size(axis_sizes: Mapping[str, int]) -> int:
    """How many ways the batch splits: the product of the `BATCH_AXES` sizes (data x fsdp)."""
    return math.prod(int(axis_sizes.get(a, 1)) for a in BATCH_AXES)


def device_grid(mesh: Any, sizes: Mapping[str, int]) -> list[int]:
    """Device ids in row-major mesh order (`mesh.get_logical_mesh()` flattened)."""
    if hasattr(mesh, "get_logical_mesh"):
        return [int(d) for d in mesh.get_logical_mesh().reshape(-1)]
    return list(range(math.prod(sizes.values())))


def batch_size_problem(batch_size: int, axis_sizes: Mapping[str, int]) -> str | None:
    """None when `batch_size` splits evenly over data x fsdp, else why not and what to use instead.

    The one divisibility rule for batches: `check_batch_size` and
    `workbench.analysis.estimate.estimate` each put their own subject in front of it.
    """
    dp = data_parallel_size(axis_sizes)
    if batch_size % dp == 0:
        return None
    spelled = " x ".join(f"{a}({axis_sizes.get(a, 1)})" for a in BATCH_AXES)
    return (
        f"not divisible by the data-parallel size {spelled} = {dp}; use a multiple of {dp} "
        f"(e.g. {nearby_multiples(batch_size, dp)})"
    )


def check_batch_size(batch_size: int, axis_sizes: Mapping[str, int], name: str = "batch") -> None:
    """Raise when `batch_size` does not split evenly over the data-parallel axes."""
    problem = batch_size_problem(batch_size, axis_sizes)
    if problem is not None:
        raise ShardingError(f"{name} has batch size {batch_size}, {problem}")
