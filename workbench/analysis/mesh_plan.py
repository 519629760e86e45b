"""Which data x fsdp x model mesh to train on: every shape a target allows, ranked.

`plan_mesh` tries each factorisation of the target's devices
(`workbench.backend.targets.mesh_factorisations`) and gives each a `MeshOption`: whether the batch
splits, whether the weights shard (`workbench.parallel.plan`), the per-device memory of a step
(`workbench.analysis.estimate.estimate`) against the device's memory, the step's communication
(`workbench.analysis.comm_model.predict_communication` priced on the target's interconnect) and
its compute at the chip's peak. Meshes that fit rank by estimated step time (compute plus
communication, no overlap assumed), then by bytes moved; those that do not fit follow, smallest
memory first. `MeshPlan.reason` says in one sentence why the first wins; `MeshPlan.table` lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.comm_model import predict_communication
from workbench.analysis.estimate import estimate, estimate_attention
from workbench.analysis.shape import model_shape
from workbench.analysis.tables import format_table
from workbench.backend.targets import Target, mesh_factorisations, resolve_target
from workbench.parallel.sharding_rule import ShardingError
from workbench.units import GiB, format_bytes, format_step_time


@dataclass(frozen=True)
class MeshOption:
    """One mesh shape on the target, with its figures (None where it cannot run)."""

    data: int
    fsdp: int
    model: int
    memory_bytes: int | None = None
    """Per-device peak memory of a step (`estimate`)."""
    fits: bool = False
    wire_bytes: float | None = None
    """Bytes each device sends per optimizer step (ring algorithm, TPU pipeline)."""
    communication_s: float | None = None
    compute_s: float | None = None
    problem: str | None = None
    """Why this mesh cannot run (batch does not split, a weight does not shard); None when it can."""
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"data({self.data}) x fsdp({self.fsdp}) x model({self.model})"

    @property
    def step_s(self) -> float | None:
        """Compute plus communication (no overlap): the ranking figure."""
        if self.compute_s is None:
            return None
        return self.compute_s + (self.communication_s or 0.0)

    def row(self) -> dict[str, Any]:
        return {
            "mesh": f"{self.data}x{self.fsdp}x{self.model}",
            "GiB/device": None if self.memory_bytes is None else round(self.memory_bytes / GiB, 2),
            "fits": "-" if self.problem else ("yes" if self.fits else "no"),
            "sent/step": None if self.wire_bytes is None else format_bytes(self.wire_bytes),
            "comm ms": None if self.communication_s is None else round(self.communication_s * 1e3, 2),
            "compute ms": None if self.compute_s is None else round(self.compute_s * 1e3, 2),
            "note": self.problem or "; ".join(self.notes),
        }


@dataclass
class MeshPlan:
    """Every mesh shape of a target, best first, and why the first wins."""

    target: str
    options: list[MeshOption]
    reason: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> MeshOption | None:
        first = self.options[0] if self.options else None
        return first if first is not None and first.problem is None and first.fits else None

    def table(self) -> str:
        return format_table([o.row() for o in self.options])

    def text(self) -> str:
        return f"{self.target}: {self.reason}\n{self.table()}"

    def __str__(self) -> str:
        return self.text()


def plan_mesh(
    model_config: Any,
    target: str | Target,
    seq_len: int,
    batch: int,
    *,
    lora_rank: int = 0,
    grad_accum: int = 1,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    gradient_checkpointing: bool = False,
    headroom: float = 0.1,
    **estimate_options: Any,
) -> MeshPlan:
    """Rank every data x fsdp x model mesh of `target` for training `model_config` on `batch`
    sequences of `seq_len` tokens per micro-batch (`grad_accum` micro-batches per step).

    `estimate_options` go to `workbench.analysis.estimate.estimate` (``quantize``,
    ``loss_chunk_tokens``, ``attention``, ...); without ``attention``, the kernel ``model.attention``
    (a workbench config's, else 'auto') runs on the target (`estimate_attention`: flash on a TPU).
    Raises ValueError for a bad target or sizes.
    """
    resolved = resolve_target(target)
    shape = model_shape(model_config)
    if "attention" not in estimate_options:
        setting = getattr(model_config, "attention", "auto")
        kernel = estimate_attention(setting, resolved, seq_len=seq_len, model_config=model_config)
        estimate_options = {**estimate_options, "attention": kernel}
    options = []
    for data, fsdp, model in mesh_factorisations(resolved.num_devices):
        options.append(
            _option(
                model_config,
                shape,
                resolved,
                (data, fsdp, model),
                seq_len,
                batch,
                lora_rank,
                grad_accum,
                precision,
                optimizer,
                gradient_checkpointing,
                headroom,
                estimate_options,
            )
        )
    runnable = [o for o in options if o.problem is None]
    fitting = sorted((o for o in runnable if o.fits), key=lambda o: (o.step_s or 0.0, o.wire_bytes or 0.0))
    too_big = sorted((o for o in runnable if not o.fits), key=lambda o: o.memory_bytes or 0)
    ranked = fitting + too_big + [o for o in options if o.problem is not None]
    settings = {
        "seq_len": seq_len,
        "batch": batch,
        "lora_rank": lora_rank,
        "grad_accum": grad_accum,
        "precision": precision,
    }
    return MeshPlan(resolved.name, ranked, _reason(ranked, fitting, resolved), settings)


def _option(
    model_config: Any,
    shape: Any,
    target: Target,
    mesh: tuple[int, int, int],
    seq_len: int,
    batch: int,
    lora_rank: int,
    grad_accum: int,
    precision: str,
    optimizer: str,
    gradient_checkpointing: bool,
    headroom: float,
    estimate_options: dict[str, Any],
) -> MeshOption:
    data, fsdp, model = mesh
    sizes = {"data": data, "fsdp": fsdp, "model": model}
    if batch % (data * fsdp):
        return MeshOption(
            data, fsdp, model, problem=f"batch {batch} does not split over data x fsdp = {data * fsdp}"
        )
    notes = []
    if model > 1 and (shape.kv_heads % model or shape.heads % model):
        notes.append(
            f"{shape.kv_heads} key/value heads over model({model}): heads reshuffled, traffic not modelled"
        )
    try:
        est = estimate(
            model_config,
            batch_size=batch,
            seq_len=seq_len,
            mesh=sizes,
            grad_accum=grad_accum,
            lora_rank=lora_rank,
            precision=precision,
            optimizer=optimizer,
            gradient_checkpointing=gradient_checkpointing,
            memory_bytes=target.memory_per_device_bytes,
            **estimate_options,
        )
        comm = predict_communication(
            model_config,
            sizes,
            batch_size=batch,
            seq_len=seq_len,
            lora_rank=lora_rank,
            grad_accum=grad_accum,
            precision=precision,
        )
    except (ShardingError, ValueError) as err:
        return MeshOption(data, fsdp, model, problem=str(err).split(". ")[0])
    cost = comm.price(target)
    return MeshOption(
        data,
        fsdp,
        model,
        memory_bytes=est.total_bytes,
        fits=est.fits(target.memory_per_device_bytes, headroom),
        wire_bytes=comm.tpu_wire_bytes,
        communication_s=cost.communication_s,
        compute_s=cost.compute_s,
        notes=tuple(notes),
    )


def _reason(ranked: list[MeshOption], fitting: list[MeshOption], target: Target) -> str:
    if not ranked or ranked[0].problem is not None:
        return "no mesh shape can run this batch: " + (ranked[0].problem if ranked else "no devices")
    first = ranked[0]
    if not fitting:
        limit = (
            "unknown"
            if target.memory_per_device_bytes is None
            else format_bytes(target.memory_per_device_bytes)
        )
        return (
            f"nothing fits in {limit} per device; {first.label} comes closest at "
            f"{format_bytes(first.memory_bytes or 0)} (shrink the batch, checkpoint activations, or use LoRA)"
        )
    runner = fitting[1] if len(fitting) > 1 else None
    comm = "unknown" if first.communication_s is None else format_step_time(first.communication_s)
    sent = format_bytes(first.wire_bytes or 0)
    if runner is None:
        return (
            f"{first.label} is the only mesh that fits ({format_bytes(first.memory_bytes or 0)} per device)"
        )
    step = first.step_s or 0.0
    lead = ""
    if runner.step_s:
        gain = (runner.step_s - step) / runner.step_s
        lead = (
            f", level with {runner.label}"
            if gain < 0.01
            else f", {100 * gain:.0f}% quicker than {runner.label}"
        )
    return (
        f"{first.label} fits ({format_bytes(first.memory_bytes or 0)} per device) and has the shortest estimated "
        f"step: {format_step_time(step)} of compute and communication, of which {comm} sending {sent} per device{lead}"
    )


__all__ = ["MeshOption", "MeshPlan", "plan_mesh"]
