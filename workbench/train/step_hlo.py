"""The communication of the real training step, read from its compiled program on virtual devices.

XLA writes a program's optimised HLO only when ``XLA_FLAGS=--xla_dump_to=DIR`` is set before the
PJRT client starts, so `capture_step_communication` runs the workbench's own `Trainer` (a tiny
config by default, one optimizer step, fixed-length synthetic rows) in a fresh Python on
``devices`` virtual XLA:CPU devices with the dump flags, on the mesh it is given, then reads the
step's program (`workbench.analysis.communication.from_hlo`): the largest module, forward,
backward and update in one with a single micro-batch; with gradient accumulation the largest
module is the micro-step (counted ``grad_accum`` times) and the update is the largest module
without a matrix multiply.

The collectives depend on the mesh, the shapes and the program, not on the chip: the report of
an 8-device mesh here is what a v5e-8 would run, and `CommunicationReport.price` prices it
with the target's bandwidth ("it runs on the virtual devices here for any target"). XLA:CPU's
pipeline differs from TPU's in one way that matters here, marked in the report: it leaves the
partitioner's all-reduce + slice as written where TPU's makes it a reduce-scatter.

Run by hand: ``python -m workbench.train.step_hlo '{"mesh": {"data": 2, "fsdp": 4, "model": 1}}'``
(with ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=8 XLA_FLAGS=--xla_dump_to=DIR``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.analysis.communication import CommunicationReport, from_hlo
from workbench.analysis.hlo_collectives import largest_module, optimized_modules
from workbench.backend.xla.virtual_devices import virtual_devices_environment

RESULT_MARK = "__STEP_HLO__"
REPO_ROOT = Path(__file__).resolve().parents[2]

TINY_RUN: dict[str, Any] = {
    "model.vocab_size": 512,
    "model.hidden_size": 64,
    "model.intermediate_size": 128,
    "model.num_heads": 8,
    "model.num_kv_heads": 8,
    "model.num_layers": 2,
    "data.max_length": 32,
    "train.batch_size": 8,
    "train.warmup_steps": 1,
}
"""The default run: a 2-layer, 64-wide Llama whose every size, heads and key/value heads included,
divides 8 devices on any mesh axis (with fewer key/value heads than the model axis the partitioner
splits heads across devices and reshuffles them with irregular groups)."""


def tiny_run_model() -> Any:
    """`TINY_RUN`'s model as a workbench `ModelConfig`: what the analytic model is set beside the capture with."""
    from workbench.config import WorkbenchConfig

    return (
        WorkbenchConfig().with_overrides({k: v for k, v in TINY_RUN.items() if k.startswith("model.")}).model
    )


class StepCaptureError(RuntimeError):
    """The training step could not be compiled in the subprocess; the message has its output's end."""


def capture_step_communication(
    mesh: Mapping[str, int],
    overrides: Mapping[str, Any] | None = None,
    *,
    devices: int = 8,
    dump_dir: str | Path | None = None,
    timeout: float = 600,
) -> CommunicationReport:
    """Compile and run one step of the `Trainer` on `mesh` (``{"data": d, "fsdp": f, "model": m}``,
    multiplying to `devices`) of virtual XLA:CPU devices and report its collectives.

    `overrides`: dotted config overrides on top of `TINY_RUN` (``"lora.rank": 8``,
    ``"model.scan_layers": True``, ``"train.grad_accum": 2``, a real shape's ``model.*``).
    `dump_dir`: where XLA writes the HLO (default: a temporary directory, removed afterwards).
    """
    sizes = {axis: int(mesh.get(axis, 1)) for axis in ("data", "fsdp", "model")}
    unknown = set(mesh) - set(sizes)
    if unknown:
        raise ValueError(f"mesh has axes {sorted(unknown)}: allowed are data, fsdp and model")
    if sizes["data"] * sizes["fsdp"] * sizes["model"] != devices:
        raise ValueError(
            f"mesh={sizes} multiplies to {sizes['data'] * sizes['fsdp'] * sizes['model']}, not devices={devices}"
        )
    settings = {**TINY_RUN, **dict(overrides or {})}
    with tempfile.TemporaryDirectory(prefix="step-hlo-") as scratch:
        where = Path(dump_dir) if dump_dir is not None else Path(scratch)
        result = _run_child({"mesh": sizes, "overrides": settings}, where, devices, timeout)
        modules = optimized_modules(where)
        accum = int(settings.get("train.grad_accum", 1))
        step = largest_module(modules)
        extra = []
        if accum > 1:
            updates = [p for p in modules if p != step and " dot(" not in p.read_text()]
            extra = [largest_module(updates)] if updates else []
        report = from_hlo(step, sizes, result["device_grid"], repeat=accum, extra=extra)
    report.flops_per_step = result.get("flops_per_step")
    report.notes.append(
        f"read from the compiled training step on {devices} virtual XLA:CPU devices ({len(modules)} programs "
        f"compiled, step program {step.name.split('.cpu_after')[0]})"
    )
    return report


def _run_child(params: dict[str, Any], dump_dir: Path, devices: int, timeout: float) -> dict[str, Any]:
    env = virtual_devices_environment(devices, xla_flags=f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-m", "workbench.train.step_hlo", json.dumps(params)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )
    marked = [line[len(RESULT_MARK) :] for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not marked:
        tail = "\n".join((proc.stdout + "\n" + proc.stderr).strip().splitlines()[-30:])
        raise StepCaptureError(
            f"the training step did not compile on mesh {params['mesh']} (exit {proc.returncode}):\n{tail}"
        )
    return json.loads(marked[-1])


def _child(mesh: dict[str, int], overrides: dict[str, Any]) -> dict[str, Any]:
    """In the subprocess: one optimizer step of the `Trainer` on `mesh`; returns the device grid."""
    import datasets

    from workbench.analysis.flops import training_flops_per_token
    from workbench.config import WorkbenchConfig
    from workbench.parallel.mesh import axis_sizes_of, device_grid
    from workbench.train.trainer import Trainer

    settings = {
        **overrides,
        "mesh.enabled": True,
        "mesh.data": mesh["data"],
        "mesh.fsdp": mesh["fsdp"],
        "mesh.model": mesh["model"],
        "train.device_type": "xla",
        "train.steps": 1,
        "train.log_every": 1,
        "train.eval_every": 0,
        "train.progress_bar": False,
        "bucketing.max_buckets": 1,
    }
    cfg = WorkbenchConfig().with_overrides(settings)
    length = cfg.data.max_length
    settings["bucketing.multiple_of"] = length  # one bucket: every row is `length` long, one program
    cfg = WorkbenchConfig().with_overrides(settings)
    rows = cfg.train.batch_size * cfg.train.grad_accum * 2
    vocab = cfg.model.vocab_size
    ids = [[(r * 7 + i * 3) % (vocab - 1) + 1 for i in range(length)] for r in range(rows)]
    dataset = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids, "length": [length] * rows})
    trainer = Trainer(cfg, train_dataset=dataset)
    trainer.fit()
    sizes = axis_sizes_of(trainer.mesh)
    tokens = cfg.train.batch_size * cfg.train.grad_accum * length
    flops = training_flops_per_token(cfg.model, length) * tokens
    if cfg.lora.rank:
        flops *= (
            2 / 3
        )  # the frozen base's weight-gradient matmuls (2 of the 6 FLOPs per parameter) do not run
    return {"device_grid": device_grid(trainer.mesh, sizes), "axis_sizes": sizes, "flops_per_step": flops}


if __name__ == "__main__":
    params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    out = _child(
        params.get("mesh", {"data": 1, "fsdp": 8, "model": 1}), params.get("overrides", dict(TINY_RUN))
    )
    print(RESULT_MARK + json.dumps(out), flush=True)
