"""The sharding plan: every parameter's partition spec and per-device shard, from shapes alone.

`plan_sharding` takes (name, shape, dtype) per parameter, the mesh's axis sizes and a rule
table (`workbench.parallel.rules`) and decides each parameter's final spec: the first matching
rule's tensor-parallel spec, then the FSDP axis on the largest dimension the rule leaves free
(one that divides by the fsdp size). A parameter no rule matches is replicated and *reported*
(with a warning); an axis that does not divide a dimension is an error naming the parameter,
the dimension, its size and the axis. The `ShardingReport` holds a `ShardEntry` per parameter,
the totals per device and, through `shard_map`, which device holds which slice (`ShardMap`,
what the mesh widget draws). Each entry says where its rule came from (`ShardEntry.source`).
Rules see through PEFT's wrappers and LoRA adapters follow their base layer (`lora_spec`). A
quantized layer's ``weight`` (int8 ``[out, in]`` or packed int4 ``[out, in / 2]``,
`workbench.models.quantize`) takes its layer's rule like any weight, and its ``weight_scale``
follows that weight's final spec (`scale_spec`), so each device scales the rows and blocks it holds.

Plain Python, nothing is built or moved: the plan can be made for hardware that is not here.
`workbench.parallel.apply` applies it to a real model.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.parallel.mesh import AXES
from workbench.parallel.rules import rules_for_mesh
from workbench.parallel.sharding_rule import (
    FSDP_FALLBACK,
    AxisEntry,
    PartitionSpec,
    ShardingError,
    ShardingRule,
    as_rules,
)
from workbench.units import format_bytes

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
    transposed: Collection[str] = (),
    adjust_for_mesh: bool = True,
) -> ShardingReport:
    """Decide every parameter's partition spec from the rules (shapes only; nothing runs).

    `params` yields (name, shape, dtype). The first matching rule wins; rules see through PEFT's
    wrappers (a LoRA layer's ``q_proj.base_layer.weight`` matches as ``q_proj.weight``, see
    `rule_name`), and a LoRA adapter follows its base layer (`lora_spec`). `transposed` names
    base weights stored [in, out] (Conv1D, PEFT's ``fan_in_fan_out``), which a square shape
    cannot tell. The notes of a `RuleTable` go into the report. Errors name the parameter, the
    dimension, its size and the mesh axis that does not divide it.

    The rules are taken as the mesh applies them (`workbench.parallel.rules.rules_for_mesh`, where fsdp
    divides the weights it moves); rules already adjusted, or a caller's (``adjust_for_mesh=False``), as they are.
    """
    sizes = {str(k): int(v) for k, v in axis_sizes.items()}
    notes = list(getattr(rules, "notes", ()))
    params = [(name, tuple(int(s) for s in shape), dtype) for name, shape, dtype in params]
    rule_list = _for_mesh(as_rules(rules), sizes, params) if adjust_for_mesh else as_rules(rules)
    scales = {name: shape for name, shape, _dtype in params if _SCALE.match(name)}
    entries: dict[str, ShardEntry] = {}
    for name, shape, dtype in params:
        if _ADAPTER.match(name) or name in scales:
            continue  # after every base layer has its spec
        matched = next((r for r in rule_list if r.applies(rule_name(name), len(shape))), None)
        entries[name] = _entry(
            name,
            shape,
            dtype,
            _spec_for(name, shape, matched, sizes),
            sizes,
            matched.pattern if matched else None,
            matched.note if matched else "replicated: no rule matched",
            matched.source if matched else "no rule",
        )
    for name, shape, dtype in params:
        if name in scales:
            entries[name] = _scale_entry(name, shape, dtype, entries, sizes)
        elif name not in entries:
            entries[name] = _adapter_entry(name, shape, dtype, entries, sizes, set(transposed), scales)
    report = ShardingReport(
        [entries[name] for name, _shape, _dtype in params],
        sizes,
        list(device_ids) if device_ids else list(range(math.prod(sizes.values()))),
        notes,
    )
    if report.fallbacks and warn_fallback:
        warnings.warn(
            f"{len(report.fallbacks)} parameter(s) matched no sharding rule and stay replicated on every "
            f"device: {', '.join(report.fallbacks[:8])}{' ...' if len(report.fallbacks) > 8 else ''}",
            stacklevel=3,
        )
    return report


def _for_mesh(
    rule_list: list[ShardingRule],
    sizes: Mapping[str, int],
    params: Sequence[tuple[str, tuple[int, ...], Any]],
) -> list[ShardingRule]:
    """`rule_list` with `rules_for_mesh`'s rule in front, unless it is there or fsdp cannot split a weight it names."""
    adjusted = list(rules_for_mesh(rule_list, sizes))
    added = adjusted[: len(adjusted) - len(rule_list)]
    if all(rule in rule_list for rule in added):
        return rule_list
    fsdp = sizes.get("fsdp", 1)
    for mesh_rule in added:
        hits = [shape for name, shape, _ in params if mesh_rule.applies(rule_name(name), len(shape))]
        if any(len(shape) != 2 or shape[1] % fsdp for shape in hits):
            return rule_list
    return adjusted


def _entry(
    name: str,
    shape: tuple[int, ...],
    dtype: Any,
    spec: PartitionSpec,
    sizes: dict[str, int],
    rule: str | None,
    note: str,
    source: str,
) -> ShardEntry:
    local = tuple(dim // math.prod(sizes[a] for a in _axes_of(e)) for dim, e in zip(shape, spec, strict=True))
    return ShardEntry(
        name=name,
        shape=shape,
        dtype=str(dtype).replace("torch.", ""),
        itemsize=_itemsize(dtype),
        spec=spec,
        local_shape=local,
        rule=rule,
        note=note,
        source=source,
    )


# ---- PEFT: wrapped base layers and LoRA adapters ---------------------------------------

# PEFT keeps a wrapped layer's own weight under `base_layer` (LoRA), a trainable copy under
# `modules_to_save.<adapter>` next to the frozen `original_module`: all name the same weight.
_WRAPPERS = re.compile(r"\.(?:base_layer|original_module|modules_to_save\.[^.]+)(?=\.)")
_ADAPTER = re.compile(
    r"^(?P<layer>.+)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)"
    r"\.[^.]+(?:\.weight)?$"
)
_SCALE = re.compile(r"^(?P<weight>.+\.weight)_scale$")
"""A quantized layer's scales (`workbench.models.quantize.QuantizedLinear.weight_scale`)."""


def rule_name(name: str) -> str:
    """The name rules match: PEFT's wrappers left out (``q_proj.base_layer.weight`` -> ``q_proj.weight``)."""
    return _WRAPPERS.sub("", name)


def lora_spec(
    kind: str, shape: tuple[int, ...], base_shape: tuple[int, ...], base_spec: PartitionSpec, transposed: bool
) -> PartitionSpec:
    """A LoRA adapter's `model`-axis spec, consistent with its base weight's spec.

    A Linear base is [out, in] with ``lora_A`` [r, in] and ``lora_B`` [out, r] (the delta is
    B @ A): ``lora_A`` takes the base's `model` split of `in`, ``lora_B`` that of `out`, the
    rank dimension is never split. So a column-parallel base (out on `model`) gets ``lora_B``
    split like its output and ``lora_A`` replicated over `model`; a row-parallel base (in on
    `model`) gets ``lora_A`` split like its input and ``lora_B`` replicated over `model`. A base
    stored [in, out] (`transposed`: Conv1D, and embeddings, whose ``lora_embedding_A`` is
    [r, vocab] and ``lora_embedding_B`` [hidden, r]) swaps the roles of its dimensions; DoRA's
    magnitude [out] follows `out`. Only the `model` axis is taken over: FSDP is placed apart.
    """
    in_dim, out_dim = (0, 1) if transposed or kind.startswith("lora_embedding") else (1, 0)
    if kind.endswith("_A"):
        own_in = shape[1]
        if base_shape[in_dim] != own_in and base_shape[out_dim] == own_in:  # a Conv1D nobody named
            in_dim, out_dim = out_dim, in_dim
        return (None, _model_part(base_spec[in_dim]))
    own_out = shape[0]
    if base_shape[out_dim] != own_out and base_shape[in_dim] == own_out:
        in_dim, out_dim = out_dim, in_dim
    return (_model_part(base_spec[out_dim]),) + (None,) * (len(shape) - 1)


def _model_part(entry: AxisEntry) -> AxisEntry:
    return "model" if "model" in _axes_of(entry) else None


def _adapter_entry(
    name: str,
    shape: tuple[int, ...],
    dtype: Any,
    entries: Mapping[str, ShardEntry],
    sizes: dict[str, int],
    transposed: set[str],
    scales: Mapping[str, tuple[int, ...]],
) -> ShardEntry:
    """A LoRA adapter's entry: `lora_spec` from its base layer, then FSDP where it divides."""
    found = _ADAPTER.match(name)
    assert found is not None
    layer, kind = found["layer"], found["kind"]
    base = next((entries[n] for n in (f"{layer}.base_layer.weight", f"{layer}.weight") if n in entries), None)
    if base is None or len(base.shape) != 2 or len(shape) not in (1, 2):
        spec = _fsdp_where_it_divides((None,) * len(shape), shape, sizes)
        note = f"{kind}: no 2-D base weight of {layer} found, FSDP only"
        return _entry(name, shape, dtype, spec, sizes, None, note, FSDP_FALLBACK)
    base_shape = base.shape
    scale = scales.get(f"{base.name}_scale")
    if scale is not None:  # a quantized Linear: [out, in], in packed two a byte when its scales are blockwise
        base_shape = (base.shape[0], base.shape[1] * (2 if len(scale) == 2 else 1))
    model = lora_spec(kind, shape, base_shape, base.spec, base.name in transposed)
    spec = _fsdp_where_it_divides(model, shape, sizes)
    split = "split over model" if any(model) else "replicated over model"
    note = f"{kind} of {layer.rsplit('.', 1)[-1]}: {split}, like its base"
    return _entry(name, shape, dtype, spec, sizes, base.rule, note, base.source)


def scale_spec(shape: tuple[int, ...], weight_spec: PartitionSpec, sizes: Mapping[str, int]) -> PartitionSpec:
    """A quantized weight's scales' spec, from the weight's final spec: per-channel scales ``[out]``
    take the weight's dim-0 entry; blockwise scales ``[out, blocks]`` take the weight's entry per
    dimension where it divides (a shard of the packed ``in`` holds whole blocks), else replicate it."""
    spec: list[AxisEntry] = []
    for dim, size in enumerate(shape):
        entry = weight_spec[dim] if dim < len(weight_spec) else None
        parts = math.prod(sizes.get(a, 1) for a in _axes_of(entry))
        spec.append(entry if size % parts == 0 else None)
    return tuple(spec)


def _scale_entry(
    name: str, shape: tuple[int, ...], dtype: Any, entries: Mapping[str, ShardEntry], sizes: dict[str, int]
) -> ShardEntry:
    """A quantized weight's scales: `scale_spec` from the weight's entry (FSDP only without one)."""
    found = _SCALE.match(name)
    assert found is not None
    weight = entries.get(found["weight"])
    if weight is None:
        spec = _fsdp_where_it_divides((None,) * len(shape), shape, sizes)
        note = f"scales: no weight {found['weight']} found, FSDP only"
        return _entry(name, shape, dtype, spec, sizes, None, note, FSDP_FALLBACK)
    spec = scale_spec(shape, weight.spec, sizes)
    layer = rule_name(found["weight"]).rsplit(".", 2)[-2]
    note = f"scales of {layer}: follow its weight"
    return _entry(name, shape, dtype, spec, sizes, weight.rule, note, weight.source)


def _fsdp_where_it_divides(
    spec: PartitionSpec, shape: tuple[int, ...], sizes: dict[str, int]
) -> PartitionSpec:
    """`spec` (axes of size 1 dropped) with `fsdp` on the largest free dimension it divides, if any."""
    out = [e if e is not None and all(sizes.get(a, 1) > 1 for a in _axes_of(e)) else None for e in spec]
    fsdp = sizes.get("fsdp", 1)
    fitting = [d for d in range(len(shape)) if out[d] is None and shape[d] % fsdp == 0]
    if fsdp > 1 and fitting:
        out[max(fitting, key=lambda d: (shape[d], -d))] = "fsdp"
    return tuple(out)


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
