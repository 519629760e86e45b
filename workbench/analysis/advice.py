"""What the step profiler tells a user: the `Advice` record, and the communication finding of a run.

`Advice` is one finding (a kind, a sentence saying what to do, its evidence); `StepProfiler.advice`
(`workbench.analysis.profiler`) returns them. The communication finding is worked out once per run,
from shapes alone: `run_communication` predicts a step's collectives on the run's mesh
(`workbench.analysis.comm_model`: no compile, no device read) and `communication_finding` turns them
into bytes per device and, on a chip with a published interconnect bandwidth, time and share of the
step (`workbench.analysis.communication.communication_advice`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from workbench.analysis.communication import CommunicationReport, communication_advice
from workbench.backend.hardware import CHIPS
from workbench.backend.selection import backend_for
from workbench.backend.targets import resolve_target
from workbench.units import format_bytes

if TYPE_CHECKING:
    from workbench.backend.hardware import HardwareInfo
    from workbench.backend.protocol import Backend


@dataclass(frozen=True)
class Advice:
    """One finding from the profile, with what to do about it."""

    kind: str
    """recompilation | host_transfer | low_mfu | memory_near_limit | input_bound | communication"""
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


# ---- communication ----------------------------------------------------------------------


def run_communication(model_config: Any, cfg: Any, mesh: Any) -> Callable[[], CommunicationReport] | None:
    """`StepProfiler(communication=...)` for a run: None off a mesh of several devices, else a function
    predicting (once, at the first advice) one step's collectives of `model_config` trained as `cfg` (a
    `WorkbenchConfig`: batch_size x max_length, grad_accum, precision, LoRA rank) on `mesh` (a `MeshSpec`
    or axis sizes). A model the shape reader does not know gives a report with a note instead."""
    sizes = dict(getattr(mesh, "axis_sizes", mesh) or {})
    if math.prod(sizes.values() or [1]) <= 1:
        return None
    slices, dcn_axis = getattr(mesh, "num_slices", 1), getattr(mesh, "dcn_axis", "data")

    def predict() -> CommunicationReport:
        from workbench.analysis.comm_model import predict_communication

        try:
            report = predict_communication(
                model_config,
                sizes,
                batch_size=cfg.train.batch_size,
                seq_len=cfg.data.max_length,
                lora_rank=cfg.lora.rank,
                grad_accum=cfg.train.grad_accum,
                precision=cfg.train.precision,
                scan=cfg.model.scan_layers is True,
            )
        except Exception as err:  # advice only: a model it cannot read never stops a run
            return CommunicationReport([], sizes, "model", notes=[f"not predicted from shapes: {err}"])
        report.num_slices, report.dcn_axis = slices, dcn_axis  # a multi-slice run's DCN axis
        return report

    return predict


def communication_finding(
    report: CommunicationReport, hw: HardwareInfo | None, backend: Backend | None = None
) -> list[Advice]:
    """One 'communication' `Advice` for `report` on `hw`: bytes each device sends per step and axis,
    `communication_advice`'s sentences, and time and share where the chip's bandwidth is published.
    Where the run's compiler runs a reduce-scatter as an all-reduce of the whole tensor, then a slice
    (`Backend.reduce_scatter_as_all_reduce`: XLA:CPU), the gradients' reduce-scatters are spelled that
    way, so the advice names what a reduce-scatter saves. `backend`: the run's (default:
    `backend_for(hw)`; none without `hw`)."""
    sizes = {a: s for a, s in report.axis_sizes.items() if s > 1}
    if math.prod(sizes.values() or [1]) <= 1:
        return []
    mesh = " x ".join(f"{a}={s}" for a, s in sizes.items())
    if not report.collectives:
        note = "; ".join(report.notes) or "no collectives"
        return [Advice("communication", f"communication on mesh {mesh}: {note}", {"mesh": sizes})]
    if backend is None and hw is not None:
        backend = backend_for(hw)
    as_all_reduce = backend is not None and backend.reduce_scatter_as_all_reduce
    if as_all_reduce and report.source == "model":
        report = _as_xla_cpu_compiles(report)
    target = _priced_target(hw, report.num_slices)
    per_axis = report.per_axis()
    parts = []
    for t in per_axis.values():
        kinds = ", ".join(
            f"{k} {format_bytes(v)}" for k, v in sorted(t.by_kind.items(), key=lambda kv: -kv[1])
        )
        parts.append(f"{t.axes} {format_bytes(t.tpu_wire_bytes)} ({kinds})")
    how = "predicted from shapes" if report.source == "model" else "read from the compiled step"
    how += ", as TPU's XLA compiles it" if as_all_reduce else ""
    sentences = [f"each device sends per step on mesh {mesh} ({how}): {'; '.join(parts)}"]
    sentences += communication_advice(report, target)
    evidence: dict[str, Any] = {
        "mesh": sizes,
        "wire_bytes_per_axis": {k: t.tpu_wire_bytes for k, t in per_axis.items()},
        "target": None,
    }
    if target is None:
        chip = "an unknown chip" if hw is None else "the CPU" if hw.backend == "cpu" else hw.chip
        sentences.append(f"no time: {chip} has no published interconnect bandwidth")
    else:
        cost = report.price(target)
        evidence.update(target=cost.target, seconds_per_axis=cost.seconds_per_axis, share=cost.share)
        if cost.share is not None and cost.share >= 0.25:
            sentences.append(
                "a mesh that moves less may train faster: workbench.analysis.mesh_plan.plan_mesh ranks them"
            )
    evidence["sentences"] = sentences
    return [Advice("communication", ". ".join(s[0].upper() + s[1:] for s in sentences) + ".", evidence)]


def _as_xla_cpu_compiles(report: CommunicationReport) -> CommunicationReport:
    """The predicted report as XLA:CPU compiles it: each reduce-scatter an all-reduce + slice, one record
    per execution (so `communication_advice` counts the tensors)."""
    collectives = []
    for c in report.collectives:
        if c.kind == "reduce-scatter":
            collectives += [replace(c, kind="all-reduce", scatter_pattern=True, count=1)] * c.count
        else:
            collectives.append(c)
    return replace(report, collectives=collectives, notes=list(report.notes))


def _priced_target(hw: HardwareInfo | None, num_slices: int = 1) -> Any:
    """The run's chip as a target to price on (its slices joined over DCN), or None (unknown, the
    CPU, no published bandwidth)."""
    if hw is None or hw.backend == "cpu" or getattr(CHIPS.get(hw.chip), "collective_bandwidth", None) is None:
        return None
    return replace(resolve_target(hw), num_slices=num_slices)
