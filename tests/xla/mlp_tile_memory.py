"""What the MLP in tiles saves, by the XLA compiler's own memory analysis (tests/test_mlp_tiles.py).

A model whose MLP dominates at a long row (a 2-layer Llama-style model, 64 wide, MLP 2048 wide,
one row of 2048 tokens, chunked attention, fp32) trains one step (forward and backward) on one
XLA:CPU device, the decoder stack scanned with ``remat`` (the long-context configuration: each
layer recomputed in the backward pass), once with the MLP whole and once in tiles. Reported per
way: the loss, the gradients' sum, the program's peak from torch_xla's compile log, and the memory
estimate's total for the same step (`workbench.analysis.estimate.estimate`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from tests.tiny import tiny
from tests.xla import run
from workbench.analysis.estimate import estimate
from workbench.backend.xla import compile_log, runtime
from workbench.models.attention_choice import use_attention
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs
from workbench.models.mlp_tiles import MlpTiling, install_mlp_tiles
from workbench.models.scan import install_scan


def main(length: int = 2048, intermediate: int = 2048, tile_tokens: int = 256) -> dict[str, Any]:
    log = Path(tempfile.mkdtemp()) / "compile.log"
    compile_log.enable_compile_log(log)  # before the first compile
    dev = runtime.device()
    cfg = tiny(
        "llama",
        hidden_size=64,
        intermediate_size=intermediate,
        max_position_embeddings=length,
        vocab_size=256,
    )
    ids = torch.randint(3, 250, (1, length), generator=torch.Generator().manual_seed(0)).to(dev)
    results: dict[str, Any] = {}
    for way, tokens in (("whole", None), ("tiles", tile_tokens)):
        model = build_model(cfg, seed=0)
        use_attention(model, "chunked")
        if tokens:
            install_mlp_tiles(model, MlpTiling(tokens))
        install_scan(model, remat=True)
        model.to(dev).train()
        loss = model(**model_inputs({"input_ids": ids}, model), labels=ids).loss
        loss.backward()
        grad = sum(p.grad.abs().sum() for p in model.parameters())
        runtime.sync()
        record = compile_log.compiled_memory_records(log)[-1]
        est = estimate(
            cfg, batch_size=1, seq_len=length, precision="fp32", gradient_checkpointing=True,
            attention="chunked", mlp_chunk_tokens=tokens,
        )  # fmt: skip
        loss_value, grad_value = (float(v) for v in runtime.to_cpu([loss.detach(), grad.detach()]))
        results[way] = {
            "loss": loss_value,
            "grad_sum": grad_value,
            "peak_bytes": record.peak_bytes,
            "estimate_bytes": est.total_bytes,
            "tile_positions": est.mlp_chunk_positions,
        }
    return results


if __name__ == "__main__":
    run(main)
