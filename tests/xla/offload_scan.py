"""Layer checkpoints in host memory under the scanned stack, on XLA:CPU (tests/test_offload.py).

``part="run"`` (one process):

- **exact**: a 3-layer Llama-style LoRA model (fp32, chunked attention, the stack scanned with
  ``remat``) trains one step without offload, with offload through the exact stand-in placements
  (`workbench.backend.xla.host_offload`: x2 out, x0.5 back), and through broken ones (x2 out, x1
  back: a control that the stand-ins are in the program). Losses and LoRA gradients reported.
- **in the program**: the same step with torch_xla's own placements, lowered to HLO (not compiled:
  XLA:CPU cannot), at `lengths`: each ``annotate_device_placement`` custom call's placement and
  operand shape. Beside them, the memory estimate's host bytes for the step.
- **the compiler's figure**: the step under plain ``remat`` compiled at each length (what XLA:CPU,
  whose host memory is its device's, runs for ``train.offload_activations``): its peak.

``part="compile"``: the real placements compiled, with ``XLA_FLAGS=--xla_dump_to`` set by the test.
XLA's HLO passes run and write the optimised module; its code generator then refuses the custom
call (a ``ValueError``, or the process dies): whatever happens is reported, the test reads the dump.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from tests.tiny import nonzero_adapters, tiny
from tests.xla import run
from workbench.analysis.estimate import estimate
from workbench.backend.xla import compile_log, host_offload, runtime
from workbench.config import LoraConfig
from workbench.models.attention_choice import use_attention
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs
from workbench.models.scan import install_scan
from workbench.train.lora import apply_lora

LAYERS, ROWS = 3, 2
PLACEMENT = re.compile(
    r"= (\w+)\[([\d,]*)\]\{[^}]*\} custom-call\([^)]*\), "
    r"custom_call_target=\"annotate_device_placement\".*_xla_buffer_placement=\"(\w+)\""
)


def _config(length: int) -> Any:
    return tiny("llama", num_layers=LAYERS, max_position_embeddings=max(256, length))


def _step(length: int, *, offload: bool, placements: Any = "none") -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One training step's loss and LoRA gradients (traced, not synced)."""
    host_offload.use_placements(placements)
    model = build_model(_config(length), seed=0)
    use_attention(model, "chunked")
    model = nonzero_adapters(apply_lora(model, LoraConfig(rank=4), seed=0))
    install_scan(model, remat=True, offload=offload)
    dev = runtime.device()
    model.to(dev).train()
    ids = torch.randint(3, 500, (ROWS, length), generator=torch.Generator().manual_seed(0)).to(dev)
    loss = model(**model_inputs({"input_ids": ids}, model), labels=ids).loss
    loss.backward()
    return loss, [p.grad for p in model.parameters() if p.requires_grad]


def _ran(length: int, **kwargs: Any) -> dict[str, Any]:
    loss, grads = _step(length, **kwargs)
    runtime.sync()
    values = runtime.to_cpu([loss.detach(), *grads])
    return {"loss": float(values[0]), "grads": [g.flatten().tolist() for g in values[1:]]}


def _placements(length: int) -> list[dict[str, Any]]:
    loss, grads = _step(length, offload=True, placements="xla")
    hlo = host_offload.lowered_hlo([loss, *grads])
    return [
        {"dtype": dtype, "shape": [int(d) for d in dims.split(",") if d], "placement": where}
        for dtype, dims, where in PLACEMENT.findall(hlo)
    ]


def _twice(tensor: torch.Tensor) -> torch.Tensor:
    return tensor * 2


def _as_is(tensor: torch.Tensor) -> torch.Tensor:
    return tensor * 1


def main(part: str = "run", lengths: tuple[int, ...] = (64, 128)) -> dict[str, Any]:
    if part == "compile":
        loss, grads = _step(lengths[0], offload=True, placements="xla")
        try:
            runtime.compile_only([loss, *grads])
        except Exception as err:  # XLA:CPU's code generator refuses the placement custom call
            return {"compiled": False, "error": f"{type(err).__name__}: {err}"}
        return {"compiled": True, "error": None}
    log = Path(tempfile.mkdtemp()) / "compile.log"
    compile_log.enable_compile_log(log)  # before the first compile
    results: dict[str, Any] = {
        "plain": _ran(lengths[0], offload=False),
        "scaled": _ran(lengths[0], offload=True, placements="scaled"),
        # the control: stand-ins that scale on the way out and forget to scale back
        "broken": _ran(lengths[0], offload=True, placements=(_twice, _as_is)),
    }
    for length in lengths:
        est = estimate(
            _config(length), batch_size=ROWS, seq_len=length, precision="fp32", gradient_checkpointing=True,
            attention="chunked", lora_rank=4, offload_activations="on",
        )  # fmt: skip
        before = len(compile_log.compiled_memory_records(log))
        loss, grads = _step(length, offload=True, placements="none")
        runtime.compile_only([loss, *grads])
        records = compile_log.compiled_memory_records(log)[before:]
        results[f"length {length}"] = {
            "placements": _placements(length),
            "estimate_host_bytes": est.host_bytes,
            "remat_peak_bytes": max(r.peak_bytes for r in records),
        }
    return results


if __name__ == "__main__":
    run(main)
