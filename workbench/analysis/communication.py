"""The communication of one training step: its collectives per mesh axis, priced on a target chip.

A `CommunicationReport` holds a step's collectives (`workbench.analysis.hlo_collectives.Collective`:
read from the compiled program's optimised HLO, `from_hlo`; or predicted from shapes,
`workbench.analysis.comm_model.predict_communication`) and sums them per mesh axis
(`per_axis`). `price` turns them into time on a target (`workbench.backend.targets`): each
collective's ring wire bytes over the chip's ICI collective bandwidth
(`workbench.backend.hardware.ChipSpec.collective_bandwidth`), or its DCN bandwidth where a
multi-slice target puts the axis across slices, against the step's compute time at the chip's
peak (`workbench.analysis.flops`). `communication_advice` says in sentences what could move less.

Bytes are per device and per optimizer step. ``size`` is a collective's logical size (the tensor
all-reduced, the whole tensor gathered or scattered); ``wire`` what each device sends with the
ring algorithm (all-reduce 2(n-1)/n x size, all-gather and reduce-scatter (n-1)/n x size). Pricing
uses ``tpu_wire``: the wire bytes once XLA's TPU pipeline has turned each all-reduce + slice
into a reduce-scatter (XLA:CPU leaves it as written). Times assume a collective runs alone at the
full bandwidth (no latency term, no overlap with compute): a lower bound for each, an upper
bound for their share of the step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.analysis.hlo_collectives import Collective, read_collectives
from workbench.backend.hardware import CHIPS
from workbench.backend.targets import Target, resolve_target
from workbench.units import format_bytes, format_step_time

AXIS_ORDER: tuple[str, ...] = ("data", "fsdp", "model")


@dataclass(frozen=True)
class AxisTraffic:
    """The collectives over one group of mesh axes (``fsdp``, ``data+fsdp``, ...) in one step."""

    axes: str
    """The axes joined by '+' (mesh order); an irregular group is named by its size."""
    count: int
    size_bytes: float
    wire_bytes: float
    tpu_wire_bytes: float
    by_kind: dict[str, float] = field(default_factory=dict)
    """Wire bytes (TPU pipeline) per collective kind."""


@dataclass
class CommunicationReport:
    """A step's collectives and the mesh they run on. `source`: 'hlo' (read from the compiled
    program) or 'model' (predicted from shapes)."""

    collectives: list[Collective]
    axis_sizes: dict[str, int]
    source: str = "hlo"
    notes: list[str] = field(default_factory=list)
    program: str = ""
    """The HLO module the figures come from (a read report), or what was modelled."""
    flops_per_step: float | None = None
    """Model FLOPs of the step over all devices (for the compute share), when known."""
    micro_steps: int = 1
    """Micro-batches per optimizer step; `collectives` already count them."""
    num_slices: int = 1
    """TPU slices the mesh spans; above 1, groups over `dcn_axis` cross the data-centre network."""
    dcn_axis: str = "data"

    def per_axis(self) -> dict[str, AxisTraffic]:
        """Traffic per axis group, in mesh order (``data``, ``data+fsdp``, ``fsdp``, ...)."""
        sums: dict[str, list[float]] = {}
        kinds: dict[str, dict[str, float]] = {}
        for c in self.collectives:
            if c.group_size <= 1:
                continue
            row = sums.setdefault(c.axis_label, [0, 0.0, 0.0, 0.0])
            row[0] += c.count
            row[1] += c.size_bytes * c.count
            row[2] += c.wire_bytes * c.count
            row[3] += c.tpu_wire_bytes * c.count
            kind = "reduce-scatter" if c.scatter_pattern else c.kind
            kinds.setdefault(c.axis_label, {})[kind] = kinds.get(c.axis_label, {}).get(kind, 0.0) + (
                c.tpu_wire_bytes * c.count
            )
        return {
            label: AxisTraffic(label, int(v[0]), v[1], v[2], v[3], kinds[label])
            for label, v in sorted(sums.items(), key=lambda kv: _axis_rank(kv[0]))
        }

    @property
    def wire_bytes(self) -> float:
        return sum(t.wire_bytes for t in self.per_axis().values())

    @property
    def tpu_wire_bytes(self) -> float:
        return sum(t.tpu_wire_bytes for t in self.per_axis().values())

    @property
    def scatter_patterns(self) -> list[Collective]:
        """All-reduces followed by a slice (reduce-scatters on TPU; see the module doc)."""
        return [c for c in self.collectives if c.scatter_pattern]

    def table(self) -> str:
        """Per axis: collectives, their logical size, wire bytes as compiled and on TPU."""
        lines = [f"{'axes':<16}{'ops':>6}{'size':>14}{'wire':>14}{'wire (TPU)':>14}  kinds (TPU wire)"]
        for t in self.per_axis().values():
            kinds = ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(t.by_kind.items()))
            lines.append(
                f"{t.axes:<16}{t.count:>6}{format_bytes(t.size_bytes):>14}{format_bytes(t.wire_bytes):>14}"
                f"{format_bytes(t.tpu_wire_bytes):>14}  {kinds}"
            )
        lines.append(
            f"{'total':<16}{'':>6}{'':>14}{format_bytes(self.wire_bytes):>14}{format_bytes(self.tpu_wire_bytes):>14}"
        )
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def price(self, target: str | Target, *, dcn_axis: str | None = None) -> CommunicationCost:
        """Time of each axis group's traffic on `target` (a name in `TARGETS` or a `Target`) and the
        share of the step it costs against the compute time at the chip's peak."""
        return price(self, target, dcn_axis=dcn_axis)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "program": self.program,
            "axis_sizes": self.axis_sizes,
            "micro_steps": self.micro_steps,
            "per_axis": {k: vars(v) for k, v in self.per_axis().items()},
            "wire_bytes": self.wire_bytes,
            "tpu_wire_bytes": self.tpu_wire_bytes,
            "notes": self.notes,
        }


def _axis_rank(label: str) -> tuple[int, ...]:
    parts = label.split("+")
    return (*(AXIS_ORDER.index(p) if p in AXIS_ORDER else 9 for p in parts), len(parts))


def from_hlo(
    text_or_path: str | Path,
    axis_sizes: Mapping[str, int],
    device_ids: Sequence[int] | None = None,
    *,
    repeat: int = 1,
    extra: Iterable[str | Path] = (),
) -> CommunicationReport:
    """The report of one compiled program (its optimised HLO text, or the dump file's path) on a
    mesh of `axis_sizes` (`device_ids`: the mesh's device grid, row-major; default ``0..n-1``).

    `repeat`: executions per optimizer step (micro-batches, when the update is its own program:
    then pass the update program's text or path in `extra`, counted once)."""
    texts = []
    for item, times in [(text_or_path, repeat), *((e, 1) for e in extra)]:
        path = Path(item) if not isinstance(item, str) or "\n" not in item else None
        texts.append((path.read_text() if path else str(item), times, path.name if path else "text"))
    sizes = {a: int(axis_sizes.get(a, 1)) for a in AXIS_ORDER}
    collectives = []
    for text, times, _name in texts:
        for c in read_collectives(text, sizes, device_ids):
            collectives.append(_times(c, times))
    report = CommunicationReport(collectives, sizes, "hlo", program=", ".join(n for _t, _r, n in texts))
    report.micro_steps = repeat
    if report.scatter_patterns:
        n = len(report.scatter_patterns)
        report.notes.append(
            f"{n} all-reduce(s) followed by a slice: XLA:CPU runs them as written, TPU's XLA as "
            "reduce-scatters (half the wire bytes); priced as reduce-scatters"
        )
    unknown = [c for c in collectives if not c.count_known]
    if unknown:
        report.notes.append(f"{len(unknown)} collective(s) in a loop of unknown trip count: counted once")
    return report


def _times(c: Collective, times: int) -> Collective:
    from dataclasses import replace

    return replace(c, count=c.count * times) if times != 1 else c


# ---- pricing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommunicationCost:
    """A report priced on one target: seconds per axis group, the step's compute, the share."""

    target: str
    chip: str
    seconds_per_axis: dict[str, float | None]
    """None where the chip's bandwidth for that link is not published."""
    network_per_axis: dict[str, str]
    """'ICI' or 'DCN' per axis group."""
    communication_s: float | None
    compute_s: float | None
    """The step's model FLOPs per device at the chip's peak; None when unknown."""
    bandwidth_ici: float | None
    bandwidth_dcn: float | None

    @property
    def share(self) -> float | None:
        """Communication over (communication + compute): the share of a step without overlap."""
        if self.communication_s is None or self.compute_s is None:
            return None
        total = self.communication_s + self.compute_s
        return self.communication_s / total if total else 0.0

    def lines(self) -> list[str]:
        out = []
        for axes, seconds in self.seconds_per_axis.items():
            shown = "unknown (no published bandwidth)" if seconds is None else format_step_time(seconds)
            out.append(f"{axes:<16}{self.network_per_axis[axes]:>5}  {shown}")
        total = "unknown" if self.communication_s is None else format_step_time(self.communication_s)
        compute = "unknown" if self.compute_s is None else format_step_time(self.compute_s)
        share = "" if self.share is None else f", {100 * self.share:.1f}% of the step without overlap"
        out.append(f"communication {total} vs compute {compute} at peak{share}")
        return out


def price(
    report: CommunicationReport, target: str | Target, *, dcn_axis: str | None = None
) -> CommunicationCost:
    """`CommunicationReport.price`: ICI (or DCN, for groups that cross slices) time per axis group.
    The slices are the target's or, above 1, the report's (a multi-slice run's mesh); `dcn_axis`
    defaults to the report's."""
    resolved = resolve_target(target)
    chip = CHIPS.get(resolved.chip)
    ici = chip.collective_bandwidth if chip else None
    dcn = chip.dcn_bandwidth_bytes_per_s if chip else None
    slices = max(getattr(resolved, "num_slices", 1), report.num_slices)
    dcn_axis = dcn_axis or report.dcn_axis
    seconds: dict[str, float | None] = {}
    network: dict[str, str] = {}
    for label, traffic in report.per_axis().items():
        crosses = slices > 1 and dcn_axis in label.split("+")
        bandwidth = dcn if crosses else ici
        network[label] = "DCN" if crosses else "ICI"
        seconds[label] = traffic.tpu_wire_bytes / bandwidth if bandwidth else None
    known = [s for s in seconds.values() if s is not None]
    total = sum(known) if len(known) == len(seconds) else None
    compute = None
    if chip and report.flops_per_step:
        devices = math.prod(report.axis_sizes.values())
        compute = report.flops_per_step / devices / (chip.peak_bf16_flops / chip.devices_per_chip)
    return CommunicationCost(resolved.name, resolved.chip, seconds, network, total, compute, ici, dcn)


# ---- advice -------------------------------------------------------------------------------------


def communication_advice(report: CommunicationReport, target: str | Target | None = None) -> list[str]:
    """Sentences on what a step's collectives cost and what could move less: whole-gradient
    all-reduces that a reduce-scatter would halve, activations rematerialised whole, weights
    gathered more than once; with a `target`, the time per axis and the share of the step."""
    advice = []
    scatters = report.scatter_patterns
    if scatters:
        n = max(c.group_size for c in scatters)
        wire = sum(c.wire_bytes * c.count for c in scatters)
        axes = sorted({c.axis_label for c in scatters})
        advice.append(
            f"{sum(c.count for c in scatters)} tensors ({format_bytes(sum(c.size_bytes * c.count for c in scatters))}) are "
            f"all-reduced whole over {' and '.join(axes)} (up to {n} devices) and then sliced: a reduce-scatter "
            f"moves half ({format_bytes(wire / 2)} instead of {format_bytes(wire)} per device). TPU's XLA makes "
            "that rewrite itself; XLA:CPU does not, so these figures from the CPU overstate the TPU's traffic"
        )
    whole = [c for c in report.collectives if c.kind == "all-gather" and c.dtype in ("s64", "s32", "pred")]
    if whole:
        big = sum(c.size_bytes * c.count for c in whole)
        advice.append(
            f"{sum(c.count for c in whole)} integer/boolean tensors ({format_bytes(big)}) are all-gathered: the partitioner "
            "rematerialised a batch-sharded mask or index tensor to match a differently sharded one (see its "
            "'Involuntary full rematerialization' warnings); it grows with batch x vocabulary"
        )
    gathered: dict[tuple[Any, str], int] = {}
    for c in report.collectives:
        if c.kind == "all-gather" and c.dtype.startswith(("f", "bf")) and c.axes and "fsdp" in c.axes:
            # a compiled collective has its shape; a predicted one (no shape) its weight's name
            key = (tuple(sorted(c.shape)) or c.name, c.axis_label)
            gathered[key] = gathered.get(key, 0) + c.count
    twice = sum(1 for v in gathered.values() if v >= 2 * report.micro_steps)
    if twice:
        advice.append(
            f"{twice} weight shapes are all-gathered over fsdp at least twice a step (forward, and again "
            "for the backward pass in another layout): FSDP's usual trade of bytes for memory"
        )
    if target is not None:
        cost = report.price(target)
        per_axis = ", ".join(
            f"{axes} {format_step_time(s)}" if s is not None else f"{axes} unknown"
            for axes, s in cost.seconds_per_axis.items()
        )
        if cost.share is not None:
            advice.append(
                f"on {cost.target}: communication {format_step_time(cost.communication_s or 0)} per step ({per_axis}), "
                f"{100 * cost.share:.0f}% of a step at peak compute if nothing overlaps"
            )
        elif per_axis:
            advice.append(f"on {cost.target}: communication per step {per_axis}")
    return advice


__all__ = [
    "AxisTraffic",
    "CommunicationCost",
    "CommunicationReport",
    "communication_advice",
    "from_hlo",
    "price",
]
