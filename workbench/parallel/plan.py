"""[from sharding] Declarative SPMD meshes and parameter sharding, validated before anything runs.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.parallel.mesh import AXES
from workbench.parallel.rules import AxisEntry, PartitionSpec, ShardingError, ShardingRule, as_rules
from workbench.units import format_bytes

if TYPE_CHECKING:  # imported for annotations only: no runtime cost, no cycles
    pass


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
    rule_list = as_rules(rules)
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
