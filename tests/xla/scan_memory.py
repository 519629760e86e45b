"""What gradient checkpointing saves in a scanned stack, by the XLA compiler's own memory analysis
(tests/test_scan.py).

An 8-layer Llama-style model's forward + backward at 4 x 256 tokens, compiled four ways, one
program each: unrolled, unrolled with transformers' per-layer checkpointing (torch_xla's
checkpoint), scanned, and scanned with ``remat`` (the scan's rematerialisation). Reported: each
program's temporary bytes (activations, gradients, scratch) from torch_xla's compile log, and
the loss and one gradient's sum, which must not depend on the way.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from tests.tiny import tiny
from tests.xla import run
from workbench.backend.xla import compile_log, runtime
from workbench.models.build import build_model, enable_gradient_checkpointing
from workbench.models.inputs import model_inputs
from workbench.models.scan import install_scan

WAYS = ("unrolled", "unrolled, checkpointing", "scanned", "scanned, remat")


def down_proj_grad(model: torch.nn.Module, index: int) -> torch.Tensor:
    """Layer `index`'s down_proj gradient: its slice of the stacked gradient when the stack is scanned."""
    params = dict(model.named_parameters())
    stacked = params.get("model.layers.stacked.mlp.down_proj.weight")
    if stacked is not None:
        return stacked.grad[index]
    return params[f"model.layers.{index}.mlp.down_proj.weight"].grad


def main(layers: int = 8, length: int = 256) -> dict[str, Any]:
    log = Path(tempfile.mkdtemp()) / "compile.log"
    compile_log.enable_compile_log(log)  # before the first compile
    dev = runtime.device()
    ids = torch.randint(3, 500, (4, length), generator=torch.Generator().manual_seed(0)).to(dev)
    results: dict[str, Any] = {}
    for way in WAYS:
        cfg = tiny(
            "llama", num_layers=layers, hidden_size=128, intermediate_size=512, max_position_embeddings=length
        )
        model = build_model(cfg, seed=0)
        if way == "unrolled, checkpointing":
            enable_gradient_checkpointing(model, xla=True)
        elif way.startswith("scanned"):
            install_scan(model, remat=way.endswith("remat"))
        model.to(dev)
        model.train()
        loss = model(**model_inputs({"input_ids": ids}, model), labels=ids).loss
        loss.backward()
        grad = down_proj_grad(model, layers // 2).abs().sum()
        runtime.sync()
        loss_value, grad_value = (float(v) for v in runtime.to_cpu([loss.detach(), grad]))
        results[way] = {"loss": loss_value, "grad_sum": grad_value}
    records = compile_log.compiled_memory_records(log)
    for way, record in zip(WAYS, records[-len(WAYS) :]):
        results[way]["temp_bytes"] = record.temp_bytes
    results["programs"] = len(records)
    return results


if __name__ == "__main__":
    run(main)
