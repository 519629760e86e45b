"""Declarative SPMD meshes and parameter sharding, validated before anything runs.

Three pieces, kept apart so each can be checked without the others:

- `MeshSpec`: the named mesh axes ``data x fsdp x model`` (at most one ``-1`` filled from
  the device count). `resolve` validates the sizes in pure Python and spells the product
  out when it is wrong; `build` switches torch_xla into SPMD mode in the order it needs and
  returns the torch_xla mesh (a hybrid ICI x DCN mesh when `num_slices > 1`).
- Sharding rules as data: per model family, an ordered list of (parameter-name regex ->
  tensor-parallel partition spec). The FSDP axis is then placed on the largest dimension
  the rule leaves free. A parameter no rule matches is replicated and *reported*.
- `plan_sharding` (pure Python, shapes only) -> `ShardingReport`; `shard_model` applies a
  plan to a real model with ``mark_sharding``; `shard_batch` splits inputs over data x fsdp.

Every torch_xla call goes through `workbench.runtime`. Importing this module starts nothing.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from workbench import runtime

if TYPE_CHECKING:  # imported for annotations only: no runtime cost, no cycles
    from workbench.config import MeshConfig
    from workbench.hardware import HardwareInfo

AXES: tuple[str, ...] = ("data", "fsdp", "model")
"""Mesh axis names, outermost first. `model` is innermost: tensor parallelism talks the most,
so its devices should be neighbours (torch_xla's HybridMesh orders axes the same way)."""

BATCH_AXES: tuple[str, ...] = ("data", "fsdp")
"""Axes the batch dimension is split over (FSDP is data parallel for activations)."""

AxisEntry = str | tuple[str, ...] | None
"""One entry of a partition spec: a mesh axis, several axes (major first) or None (replicated)."""
PartitionSpec = tuple[AxisEntry, ...]


class MeshError(ValueError):
    """A mesh that cannot exist on these devices; the message shows the arithmetic."""


class ShardingError(ValueError):
    """A sharding that cannot be applied; the message names the parameter, dimension and axis."""


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
                return runtime.hybrid_mesh(ici, dcn, AXES)
            except (ValueError, AssertionError) as err:
                raise MeshError(
                    f"cannot build the multi-slice mesh {resolved.describe()} (ICI {ici} x DCN {dcn}): "
                    f"{err}. Multi-slice needs a TPU multi-slice run; use num_slices=1 elsewhere"
                ) from err
        return runtime.spmd_mesh(range(resolved.num_devices), resolved.shape, AXES)

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
    if not runtime.xla_installed():
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
            "MeshSpec(...).build() (or workbench.sharding.ensure_spmd()) before touching the XLA "
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


def _device_grid(mesh: Any, sizes: Mapping[str, int]) -> list[int]:
    """Device ids in row-major mesh order (`mesh.get_logical_mesh()` flattened)."""
    if hasattr(mesh, "get_logical_mesh"):
        return [int(d) for d in mesh.get_logical_mesh().reshape(-1)]
    return list(range(math.prod(sizes.values())))


# ---- rules as data -------------------------------------------------------------------


@dataclass(frozen=True)
class ShardingRule:
    """Parameters whose name matches `pattern` (``re.search``) get `spec` over the `model` axis.

    `spec` has one entry per tensor dimension (a mesh axis, a tuple of axes, or None), or is
    None for "replicate everywhere". With `fsdp=True` the `fsdp` axis then goes on the largest
    dimension the spec leaves free (one that divides by the fsdp size).
    """

    pattern: str
    spec: PartitionSpec | None
    note: str = ""
    fsdp: bool = True


def rule(pattern: str, spec: PartitionSpec | None, note: str = "", *, fsdp: bool = True) -> ShardingRule:
    return ShardingRule(pattern, spec, note, fsdp)


# Llama, Mistral, Qwen2 and Gemma share module names in `transformers`. nn.Linear stores
# weight as [out_features, in_features]: column-parallel shards dim 0, row-parallel dim 1.
DECODER_RULES: tuple[ShardingRule, ...] = (
    rule(r"embed_tokens\.weight$", ("model", None), "vocab-parallel embedding"),
    rule(r"self_attn\.(q|k|v)_proj\.weight$", ("model", None), "column-parallel"),
    rule(r"self_attn\.(q|k|v)_proj\.bias$", ("model",), "column-parallel bias (qwen2)", fsdp=False),
    rule(r"self_attn\.o_proj\.weight$", (None, "model"), "row-parallel"),
    rule(r"mlp\.(gate|up)_proj\.weight$", ("model", None), "column-parallel"),
    rule(r"mlp\.down_proj\.weight$", (None, "model"), "row-parallel"),
    rule(r"(o|down)_proj\.bias$", None, "row-parallel bias: added after the reduction"),
    rule(r"norm\.weight$", None, "norm scale: tiny, replicated"),
    rule(r"lm_head\.weight$", ("model", None), "vocab-parallel output"),
)

# GPT-2 uses transformers' Conv1D, which stores weight as [in_features, out_features] (the
# transpose of nn.Linear): column-parallel shards dim 1 and row-parallel dim 0. c_attn fuses
# q|k|v along its output, so a model-axis shard can straddle the q/k/v boundary; GSPMD keeps
# that correct by resharding at the split, at some communication cost.
GPT2_RULES: tuple[ShardingRule, ...] = (
    rule(r"wte\.weight$", ("model", None), "vocab-parallel embedding"),
    rule(r"wpe\.weight$", (None, None), "position embedding: FSDP only"),
    rule(r"attn\.c_attn\.weight$", (None, "model"), "column-parallel (Conv1D [in, out])"),
    rule(r"attn\.c_attn\.bias$", ("model",), "column-parallel bias", fsdp=False),
    rule(r"mlp\.c_fc\.weight$", (None, "model"), "column-parallel (Conv1D [in, out])"),
    rule(r"mlp\.c_fc\.bias$", ("model",), "column-parallel bias", fsdp=False),
    rule(r"(attn|mlp)\.c_proj\.weight$", ("model", None), "row-parallel (Conv1D [in, out])"),
    rule(r"(attn|mlp)\.c_proj\.bias$", None, "row-parallel bias: added after the reduction"),
    rule(r"ln_(1|2|f)\.(weight|bias)$", None, "layer norm: tiny, replicated"),
    rule(r"lm_head\.weight$", ("model", None), "vocab-parallel output"),
)

FSDP_ONLY_RULES: tuple[ShardingRule, ...] = (
    rule(r"(norm|ln_\w+)\.(weight|bias)$", None, "norm: tiny, replicated"),
    rule(r"\.bias$", None, "bias: tiny, replicated"),
    rule(r".", tuple(), "FSDP: largest dimension over fsdp"),
)
"""Family-agnostic rules: FSDP on every weight, no tensor parallelism (`model` must be 1)."""

FAMILY_RULES: dict[str, tuple[ShardingRule, ...]] = {
    "llama": DECODER_RULES,
    "mistral": DECODER_RULES,
    "qwen2": DECODER_RULES,
    "gemma": DECODER_RULES,
    "gpt2": GPT2_RULES,
}


def rules_for(model_or_type: Any) -> tuple[ShardingRule, ...]:
    """The rule table for a model (by ``config.model_type``) or a model-type string."""
    model_type = model_or_type if isinstance(model_or_type, str) else _model_type(model_or_type)
    if model_type not in FAMILY_RULES:
        raise ShardingError(
            f"no sharding rules for model_type={model_type!r}: known families are "
            f"{', '.join(sorted(FAMILY_RULES))}; pass rules=FSDP_ONLY_RULES for FSDP without tensor "
            "parallelism, or your own list of (pattern, spec) rules"
        )
    return FAMILY_RULES[model_type]


def _model_type(model: Any) -> str | None:
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "get_base_model"):  # PEFT wrappers
        config = getattr(model.get_base_model(), "config", None)
    return getattr(config, "model_type", None)


def _as_rules(rules: Iterable[Any]) -> list[ShardingRule]:
    out = []
    for item in rules:
        if isinstance(item, ShardingRule):
            out.append(item)
        elif isinstance(item, Sequence) and len(item) in (2, 3) and isinstance(item[0], str):
            out.append(ShardingRule(item[0], None if item[1] is None else tuple(item[1]), *item[2:]))
        else:
            raise ShardingError(f"rule {item!r} is not allowed: expected ShardingRule or (pattern, spec)")
    return out


# ---- the plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardEntry:
    """How one parameter is laid out over the mesh."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    spec: PartitionSpec
    """Final partition spec (axes of size 1 dropped: it shows only what really splits)."""
    local_shape: tuple[int, ...]
    """Shape of the shard one device holds."""
    rule: str | None
    """The matching rule's pattern; None for the replicated fallback."""
    note: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        """Bytes of the whole (unsharded) parameter."""
        return self.numel * self.itemsize

    @property
    def bytes_per_device(self) -> int:
        return math.prod(self.local_shape) * self.itemsize

    @property
    def fraction(self) -> float:
        """Share of the parameter one device holds (1.0 = replicated)."""
        return math.prod(self.local_shape) / max(1, self.numel)

    @property
    def fallback(self) -> bool:
        return self.rule is None


@dataclass(frozen=True)
class DeviceShard:
    device: int
    coords: dict[str, int]
    """The device's position on each mesh axis."""
    index: tuple[tuple[int, int], ...]
    """(start, stop) per tensor dimension of the slice this device holds."""


@dataclass(frozen=True)
class ShardMap:
    """Which device holds which slice of one tensor: the data the mesh widget draws."""

    name: str
    shape: tuple[int, ...]
    spec: PartitionSpec
    axis_sizes: dict[str, int]
    shards: list[DeviceShard]
    """One per device, in device-id order."""

    def tiles(self) -> list[list[tuple[tuple[tuple[int, int], ...], list[int]]]]:
        """A 2-D grid of tiles (rows = slices of dim 0, cols = slices of dim 1, when present);
        each cell is (index, devices holding that tile). 1-D tensors give one row."""
        by_index: dict[tuple[tuple[int, int], ...], list[int]] = {}
        for shard in self.shards:
            by_index.setdefault(shard.index, []).append(shard.device)
        rows = sorted({idx[0] if idx else (0, 1) for idx in by_index})
        cols = sorted({idx[1] for idx in by_index}) if len(self.shape) >= 2 else [None]
        grid = []
        for r in rows:
            line = []
            for c in cols:
                cell = [(idx, devs) for idx, devs in by_index.items() if (not idx or idx[0] == r)]
                if c is not None:
                    cell = [(idx, devs) for idx, devs in cell if idx[1] == c]
                devices = sorted(d for _idx, devs in cell for d in devs)
                line.append((cell[0][0] if cell else (), devices))
            grid.append(line)
        return grid

    def text(self) -> str:
        """The tile grid as text: one cell per tile, listing the devices that hold it."""
        head = (
            f"{self.name} {list(self.shape)} spec={_spec_text(self.spec)} mesh={_sizes_text(self.axis_sizes)}"
        )
        grid = self.tiles()
        if not self.shape:
            return head + "\n  scalar: every device holds it"

        def span(pair: tuple[int, int]) -> str:
            return f"{pair[0]}:{pair[1]}"

        cells = [[f"d{','.join(map(str, devs))}" for _idx, devs in line] for line in grid]
        row_labels = [f"[{span(line[0][0][0])}]" for line in grid]
        if len(self.shape) >= 2:
            col_labels = [f"[:, {span(idx[1])}]" for idx, _devs in grid[0]]
        else:
            col_labels = ["devices"]
        widths = [max(len(col_labels[j]), *(len(row[j]) for row in cells)) for j in range(len(col_labels))]
        label_w = max(len(x) for x in row_labels)
        lines = [
            head,
            " " * label_w + "  " + "  ".join(c.ljust(w) for c, w in zip(col_labels, widths, strict=True)),
        ]
        for label, row in zip(row_labels, cells, strict=True):
            lines.append(
                label.ljust(label_w) + "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
            )
        return "\n".join(lines)


@dataclass
class ShardingReport:
    """Per-parameter layout plus totals; `table()` and `device_map(name)` show it."""

    entries: list[ShardEntry]
    axis_sizes: dict[str, int]
    device_ids: list[int] = field(default_factory=list)
    """Device ids in row-major mesh order."""

    @property
    def total_bytes(self) -> int:
        """Bytes of the unsharded model."""
        return sum(e.bytes for e in self.entries)

    def per_device_bytes(self) -> dict[int, int]:
        """Parameter bytes each device holds."""
        totals = dict.fromkeys(self.device_ids, 0)
        for entry in self.entries:
            for shard in self.device_map(entry.name).shards:
                totals[shard.device] += math.prod(b - a for a, b in shard.index) * entry.itemsize
        return totals

    @property
    def bytes_per_device(self) -> int:
        """The most parameter bytes any one device holds."""
        return max(self.per_device_bytes().values(), default=0)

    @property
    def fallbacks(self) -> list[str]:
        """Parameters no rule matched (replicated by the fallback)."""
        return [e.name for e in self.entries if e.fallback]

    def entry(self, name: str) -> ShardEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"no parameter {name!r} in the report (it has {len(self.entries)} entries)")

    def device_map(self, name: str) -> ShardMap:
        """Which device holds which slice of parameter `name`."""
        e = self.entry(name)
        return shard_map(name, e.shape, e.spec, self.axis_sizes, self.device_ids)

    def table(self, max_rows: int | None = None) -> str:
        """A fixed-width table: parameter, shape, spec, local shape, bytes per device, rule."""
        header = ("parameter", "shape", "spec", "local shard", "bytes/device", "rule")
        rows = [
            (
                e.name,
                "x".join(map(str, e.shape)) or "scalar",
                _spec_text(e.spec),
                "x".join(map(str, e.local_shape)) or "scalar",
                format_bytes(e.bytes_per_device),
                "FALLBACK: replicated, no rule matched" if e.fallback else e.note,
            )
            for e in self.entries
        ]
        if max_rows is not None and len(rows) > max_rows:
            rows = [*rows[:max_rows], ("...", "", "", "", "", f"{len(rows) - max_rows} more")]
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
        lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.append(
            f"mesh {_sizes_text(self.axis_sizes)}: {len(self.entries)} parameters, "
            f"total {format_bytes(self.total_bytes)}, at most {format_bytes(self.bytes_per_device)} per device"
            + (f"; {len(self.fallbacks)} replicated by fallback" if self.fallbacks else "")
        )
        return "\n".join(lines)

    def device_table(self) -> str:
        """One line per device: its mesh coordinates and the parameter bytes it holds."""
        sizes = list(self.axis_sizes.values())
        per_device = self.per_device_bytes()
        lines = ["device  " + "  ".join(self.axis_sizes) + "  parameter bytes"]
        for flat, device in enumerate(self.device_ids):
            coords, rest = [], flat
            for size in reversed(sizes):
                coords.append(rest % size)
                rest //= size
            cells = "  ".join(
                str(c).rjust(len(a)) for c, a in zip(reversed(coords), self.axis_sizes, strict=True)
            )
            lines.append(f"d{device:<6d}  {cells}  {format_bytes(per_device[device])}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def shard_map(
    name: str,
    shape: Sequence[int],
    spec: PartitionSpec,
    axis_sizes: Mapping[str, int],
    device_ids: Sequence[int] | None = None,
) -> ShardMap:
    """Which device holds which slice of a tensor with `spec` over a mesh of `axis_sizes`.

    Devices sit on the mesh in row-major order of `device_ids`; a dimension split over several
    axes counts the first axis as the major one (as torch_xla's tile assignment does).
    """
    sizes = dict(axis_sizes)
    names = list(sizes)
    ids = list(device_ids) if device_ids else list(range(math.prod(sizes.values())))
    shards = []
    for flat, device in enumerate(ids):
        coords, rest = {}, flat
        for axis in reversed(names):
            coords[axis] = rest % sizes[axis]
            rest //= sizes[axis]
        coords = {axis: coords[axis] for axis in names}
        index = []
        for dim, entry in enumerate(spec):
            axes = _axes_of(entry)
            parts, position = 1, 0
            for axis in axes:
                parts *= sizes[axis]
                position = position * sizes[axis] + coords[axis]
            step = shape[dim] // parts
            index.append((position * step, (position + 1) * step))
        shards.append(DeviceShard(device, coords, tuple(index)))
    shards.sort(key=lambda s: s.device)
    return ShardMap(name, tuple(shape), tuple(spec), sizes, shards)


def _axes_of(entry: AxisEntry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _spec_text(spec: PartitionSpec) -> str:
    if not spec or all(e is None for e in spec):
        return "replicated"
    return "(" + ", ".join("-" if e is None else "+".join(_axes_of(e)) for e in spec) + ")"


def _sizes_text(sizes: Mapping[str, int]) -> str:
    return " x ".join(f"{a}({s})" for a, s in sizes.items())


def format_bytes(n: float) -> str:
    """``1.50 GiB``, ``12.00 MiB``, ``512 B``: binary units, two decimals above a KiB.

    The one byte formatter of the package (`workbench.memory` uses it too), so a report and
    an estimate of the same size print the same.
    """
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _itemsize(dtype: Any) -> int:
    """Bytes per element of a torch dtype or its name ('float32', 'torch.bfloat16')."""
    import torch

    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        resolved = getattr(torch, name, None)
        if not isinstance(resolved, torch.dtype):
            raise ShardingError(f"dtype {dtype!r} is not a torch dtype name (e.g. 'float32', 'bfloat16')")
        dtype = resolved
    return int(dtype.itemsize)


def plan_sharding(
    params: Iterable[tuple[str, Sequence[int], Any]],
    axis_sizes: Mapping[str, int],
    rules: Iterable[Any],
    *,
    device_ids: Sequence[int] | None = None,
    warn_fallback: bool = True,
) -> ShardingReport:
    """Decide every parameter's partition spec from the rules (shapes only; nothing runs).

    `params` yields (name, shape, dtype). The first matching rule wins. Errors name the
    parameter, the dimension, its size and the mesh axis that does not divide it.
    """
    sizes = {str(k): int(v) for k, v in axis_sizes.items()}
    rule_list = _as_rules(rules)
    entries = []
    for name, shape, dtype in params:
        shape = tuple(int(s) for s in shape)
        matched = next((r for r in rule_list if re.search(r.pattern, name)), None)
        spec = _spec_for(name, shape, matched, sizes)
        local = tuple(
            dim // math.prod(sizes[a] for a in _axes_of(e)) for dim, e in zip(shape, spec, strict=True)
        )
        entries.append(
            ShardEntry(
                name=name,
                shape=shape,
                dtype=str(dtype).replace("torch.", ""),
                itemsize=_itemsize(dtype),
                spec=spec,
                local_shape=local,
                rule=matched.pattern if matched else None,
                note=matched.note if matched else "replicated: no rule matched",
            )
        )
    report = ShardingReport(
        entries, sizes, list(device_ids) if device_ids else list(range(math.prod(sizes.values())))
    )
    if report.fallbacks and warn_fallback:
        warnings.warn(
            f"{len(report.fallbacks)} parameter(s) matched no sharding rule and stay replicated on every "
            f"device: {', '.join(report.fallbacks[:8])}{' ...' if len(report.fallbacks) > 8 else ''}",
            stacklevel=3,
        )
    return report


def _spec_for(
    name: str, shape: tuple[int, ...], matched: ShardingRule | None, sizes: dict[str, int]
) -> PartitionSpec:
    ndim = len(shape)
    if matched is None or matched.spec is None or ndim == 0:
        return (None,) * ndim
    spec: list[AxisEntry] = list(matched.spec) if matched.spec else [None] * ndim
    if len(spec) != ndim:
        raise ShardingError(
            f"rule {matched.pattern!r} gives {len(spec)} spec entries but parameter {name!r} has "
            f"{ndim} dimension(s) (shape {list(shape)})"
        )
    # Drop axes of size 1 (and workbench axes a hand-made mesh lacks): they split nothing, and
    # the report should show only real splits. An axis name nobody knows is a typo: refuse it.
    for dim, entry in enumerate(spec):
        axes = _axes_of(entry)
        for axis in axes:
            if axis not in sizes and axis not in AXES:
                raise ShardingError(
                    f"rule {matched.pattern!r} for {name!r} names mesh axis {axis!r}; the mesh has "
                    f"{', '.join(sizes)}"
                )
        kept = tuple(a for a in axes if sizes.get(a, 1) > 1)
        spec[dim] = None if not kept else kept[0] if len(kept) == 1 else kept
    used = {a for e in spec for a in _axes_of(e)}
    fsdp = sizes.get("fsdp", 1)
    if matched.fsdp and fsdp > 1 and "fsdp" not in used:
        free = [d for d in range(ndim) if spec[d] is None]
        fitting = [d for d in free if shape[d] % fsdp == 0]
        if free and not fitting:
            largest = max(free, key=lambda d: shape[d])
            raise ShardingError(
                f"parameter {name!r} (shape {list(shape)}): no free dimension divides by mesh axis "
                f"'fsdp' ({fsdp}); dim {largest} has size {shape[largest]}. Pick an fsdp size that "
                "divides it, or add a rule that replicates this parameter"
            )
        if fitting:
            # Largest dimension first; the lower index wins a tie (stable, predictable layouts).
            spec[max(fitting, key=lambda d: (shape[d], -d))] = "fsdp"
    for dim, entry in enumerate(spec):
        parts = math.prod(sizes[a] for a in _axes_of(entry))
        if shape[dim] % parts:
            axes = "+".join(_axes_of(entry))
            raise ShardingError(
                f"parameter {name!r} (shape {list(shape)}): dim {dim} has size {shape[dim]}, not "
                f"divisible by mesh axis {axes!r} ({parts}). Choose a mesh size that divides it "
                "(or pad the dimension, e.g. resize the vocabulary to a multiple of it)"
            )
    return tuple(spec)


# ---- applying it ---------------------------------------------------------------------


def unique_parameters(model: Any) -> list[tuple[str, Any]]:
    """(name, parameter) with tied weights once (the first name wins, like named_parameters)."""
    return list(model.named_parameters())


def move_model(model: Any) -> Any:
    """Move `model` to the XLA device (if it is not there) and tie its embeddings again.

    ``module.to(xla)`` unties shared parameters (lm_head and the input embedding become two
    tensors), which would shard, update and store them separately; `tie_weights()` restores
    the sharing the config asks for.
    """
    if any(not runtime.is_xla_tensor(p) for p in model.parameters()):
        model.to(runtime.device())
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


def shard_model(
    model: Any, mesh: Any, rules: Iterable[Any] | None = None, *, shard_grads: bool = True
) -> ShardingReport:
    """Move `model` to the XLA device if needed and annotate every parameter with its sharding.

    `mesh` is a torch_xla mesh or a `MeshSpec` (built here). `rules` defaults to the model
    family's table (`rules_for(model)`). Optimizer state created afterwards follows the
    parameters' sharding; build the optimizer after calling this.

    With `shard_grads` each gradient is annotated like its parameter as soon as backward
    accumulates it. Without that, GSPMD is free to return gradients that outlive a step (gradient
    accumulation, or a sync between backward and the optimizer) fully replicated: measured on
    fsdp=8, every device then held the whole gradient.
    """
    if isinstance(mesh, MeshSpec):
        mesh = mesh.build()
    sizes = axis_sizes_of(mesh)
    move_model(model)
    params = unique_parameters(model)
    report = plan_sharding(
        ((name, tuple(p.shape), p.dtype) for name, p in params),
        sizes,
        rules_for(model) if rules is None else rules,
        device_ids=_device_grid(mesh, sizes),
    )
    by_name = dict(params)
    for entry in report.entries:
        if entry.shape:
            param = by_name[entry.name]
            runtime.mark_sharding(param, mesh, entry.spec)
            if shard_grads and param.requires_grad:
                param.register_post_accumulate_grad_hook(_grad_sharder(mesh, entry.spec))
    return report


def _grad_sharder(mesh: Any, spec: PartitionSpec) -> Any:
    def hook(param: Any) -> None:
        if param.grad is not None:
            runtime.mark_sharding(param.grad, mesh, spec)

    return hook


def batch_spec(ndim: int, axis_sizes: Mapping[str, int]) -> PartitionSpec:
    """Dim 0 over data x fsdp (axes of size 1 left out), the rest replicated."""
    kept = tuple(a for a in BATCH_AXES if axis_sizes.get(a, 1) > 1)
    first: AxisEntry = None if not kept else kept[0] if len(kept) == 1 else kept
    return (first,) + (None,) * (ndim - 1)


def batch_size_problem(batch_size: int, axis_sizes: Mapping[str, int]) -> str | None:
    """None when `batch_size` splits evenly over data x fsdp, else why not and what to use instead.

    The one divisibility rule for batches: `check_batch_size` and `workbench.memory.estimate`
    each put their own subject in front of it.
    """
    dp = data_parallel_size(axis_sizes)
    if batch_size % dp == 0:
        return None
    spelled = " x ".join(f"{a}({axis_sizes.get(a, 1)})" for a in BATCH_AXES)
    return (
        f"not divisible by the data-parallel size {spelled} = {dp}; use a multiple of {dp} "
        f"(e.g. {nearby_multiples(batch_size, dp)})"
    )


def nearby_multiples(value: int, divisor: int) -> str:
    """The multiples of `divisor` either side of `value` ("28 or 32"); only the upper one when
    the lower would be 0, which is no batch at all ("4", not "4 or 4")."""
    lower = value - value % divisor
    return f"{lower} or {lower + divisor}" if lower else str(divisor)


def check_batch_size(batch_size: int, axis_sizes: Mapping[str, int], name: str = "batch") -> None:
    """Raise when `batch_size` does not split evenly over the data-parallel axes."""
    problem = batch_size_problem(batch_size, axis_sizes)
    if problem is not None:
        raise ShardingError(f"{name} has batch size {batch_size}, {problem}")


def shard_batch(batch: Mapping[str, Any], mesh: Any) -> dict[str, Any]:
    """Move a batch's tensors to the XLA device with dim 0 split over data x fsdp.

    Non-tensor values and scalars pass through unchanged.
    """
    import torch

    if isinstance(mesh, MeshSpec):
        mesh = mesh.build()
    sizes = axis_sizes_of(mesh)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            out[key] = value
            continue
        check_batch_size(int(value.shape[0]), sizes, name=f"batch[{key!r}]")
        tensor = value if runtime.is_xla_tensor(value) else value.to(runtime.device())
        runtime.mark_sharding(tensor, mesh, batch_spec(tensor.dim(), sizes))
        out[key] = tensor
    return out


def batch_sharding(mesh: Any, ndim: int = 2) -> Any:
    """The ShardingSpec `runtime.device_loader(..., batch_sharding=...)` applies to each batch."""
    if isinstance(mesh, MeshSpec):
        mesh = mesh.build()
    return runtime.batch_sharding_spec(mesh, batch_spec(ndim, axis_sizes_of(mesh)))
