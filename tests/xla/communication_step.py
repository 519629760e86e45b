"""The training step's collectives read from its compiled HLO on several meshes of 8 virtual devices,
beside the analytic model's prediction for the same run (tests/test_communication.py).

Every mesh is compiled in this one process (the `Trainer` of `workbench.train.step_hlo`, one step
per mesh, each on its own mesh): XLA's dump flags are set here, before the PJRT client starts, and
each mesh's programs are the files the dump directory gained while it ran. One process rather than
`capture_step_communication`'s one per mesh saves the interpreter, torch_xla and transformers start
(about 7 s a mesh on 2 cores); ``per_process=True`` checks the same through that function instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

DUMP = Path(tempfile.mkdtemp(prefix="communication-step-"))
os.environ["XLA_FLAGS"] = (
    f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={DUMP} --xla_dump_hlo_as_text".strip()
)

from tests.xla import run  # noqa: E402  (the dump flags first: XLA reads them once, at its start)
from workbench.analysis.comm_model import predict_communication  # noqa: E402
from workbench.analysis.communication import CommunicationReport, from_hlo  # noqa: E402
from workbench.analysis.hlo_collectives import largest_module, optimized_modules  # noqa: E402
from workbench.train.step_hlo import TINY_RUN, _child, capture_step_communication, tiny_run_model  # noqa: E402

MODEL = tiny_run_model()


def step_in_process(mesh: dict[str, int], overrides: dict[str, Any]) -> CommunicationReport:
    """One step of the `Trainer` on `mesh` here; its collectives read from the largest new program."""
    before = set(optimized_modules(DUMP))
    result = _child(mesh, {**TINY_RUN, **overrides})
    new = [p for p in optimized_modules(DUMP) if p not in before]
    return from_hlo(largest_module(new), mesh, result["device_grid"])


def main(meshes: list[list[int]], lora_rank: int = 0, per_process: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    overrides = {"lora.rank": lora_rank} if lora_rank else {}
    try:
        for data, fsdp, model in meshes:
            mesh = {"data": data, "fsdp": fsdp, "model": model}
            if per_process:
                read = capture_step_communication(mesh, overrides)
            else:
                read = step_in_process(mesh, overrides)
            predicted = predict_communication(
                MODEL,
                mesh,
                batch_size=TINY_RUN["train.batch_size"],
                seq_len=TINY_RUN["data.max_length"],
                lora_rank=lora_rank,
            )
            out[f"{data}x{fsdp}x{model}"] = {
                "hlo": {k: v.tpu_wire_bytes for k, v in read.per_axis().items()},
                "hlo_cpu": {k: v.wire_bytes for k, v in read.per_axis().items()},
                "model": {k: v.tpu_wire_bytes for k, v in predicted.per_axis().items()},
                "scatter_patterns": len(read.scatter_patterns),
                "kinds": sorted({c.kind for c in read.collectives}),
                "notes": read.notes,
            }
    finally:
        shutil.rmtree(DUMP, ignore_errors=True)
    return out


if __name__ == "__main__":
    run(main)
