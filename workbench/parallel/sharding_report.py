"""What a sharding plan says: every parameter's spec and shard, the totals per device, which device holds which slice.

`ShardingReport` (what `workbench.parallel.plan.plan_sharding` returns) holds a `ShardEntry` per parameter
(its spec, local shape, bytes per device, the rule it came from and that rule's source), the mesh's axis
sizes and devices, and notes; it prints as a table (`table`, `device_table`). `shard_map` says which device
holds which slice of one tensor (`ShardMap`, what the mesh widget draws). Plain Python, from shapes alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from workbench.parallel.sharding_rule import PartitionSpec, axes_of
from workbench.units import format_bytes


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
    source: str = ""
    """Where the rule came from: 'tp plan', 'hand rule' or 'fsdp fallback' (`ShardingRule.source`);
    'no rule' for the replicated fallback. A LoRA adapter's is its base layer's."""

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
    notes: list[str] = field(default_factory=list)
    """Lines about the whole plan (a family sharded by FSDP only, plan styles not mapped)."""

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

    def sources(self) -> dict[str, int]:
        """How many parameters got their rule from each source ('tp plan', 'hand rule', ...)."""
        counts: dict[str, int] = {}
        for e in self.entries:
            counts[e.source] = counts.get(e.source, 0) + 1
        return counts

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
        """A fixed-width table: parameter, shape, spec, local shape, bytes per device, where the
        rule came from and its note; then the totals, the parameters per source and the notes."""
        header = ("parameter", "shape", "spec", "local shard", "bytes/device", "source", "rule")
        rows = [
            (
                e.name,
                "x".join(map(str, e.shape)) or "scalar",
                _spec_text(e.spec),
                "x".join(map(str, e.local_shape)) or "scalar",
                format_bytes(e.bytes_per_device),
                e.source,
                "FALLBACK: replicated, no rule matched" if e.fallback else e.note,
            )
            for e in self.entries
        ]
        if max_rows is not None and len(rows) > max_rows:
            rows = [*rows[:max_rows], ("...", "", "", "", "", "", f"{len(rows) - max_rows} more")]
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
        lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.append(
            f"mesh {_sizes_text(self.axis_sizes)}: {len(self.entries)} parameters, "
            f"total {format_bytes(self.total_bytes)}, at most {format_bytes(self.bytes_per_device)} per device"
            + (f"; {len(self.fallbacks)} replicated by fallback" if self.fallbacks else "")
        )
        if self.entries:
            lines.append("rules from: " + ", ".join(f"{src} {n}" for src, n in self.sources().items()))
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def text(self) -> str:
        """The whole report as text: the table (every parameter) and the device table."""
        return self.table() + "\n\n" + self.device_table()

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
            axes = axes_of(entry)
            parts, position = 1, 0
            for axis in axes:
                parts *= sizes[axis]
                position = position * sizes[axis] + coords[axis]
            step = shape[dim] // parts
            index.append((position * step, (position + 1) * step))
        shards.append(DeviceShard(device, coords, tuple(index)))
    shards.sort(key=lambda s: s.device)
    return ShardMap(name, tuple(shape), tuple(spec), sizes, shards)


def _spec_text(spec: PartitionSpec) -> str:
    if not spec or all(e is None for e in spec):
        return "replicated"
    return "(" + ", ".join("-" if e is None else "+".join(axes_of(e)) for e in spec) + ")"


def _sizes_text(sizes: Mapping[str, int]) -> str:
    return " x ".join(f"{a}({s})" for a, s in sizes.items())
