"""What chunked attention saves, by the XLA compiler's own memory analysis (tests/test_attention.py).

A tiny Llama (hidden 64, 4 heads, 2 kv heads, vocabulary 512) at one row of `length` tokens on one
XLA:CPU device: a forward and backward of its loss, compiled without running
(`workbench.analysis.probe.compiled_program_memory`), once with eager attention and once chunked
(`query_chunk` rows a block), for 1 and 2 decoder layers. Reported per (kernel, layers): the
program's temporary bytes; and the scores term of one layer, ``heads x T x T x 4`` bytes, and one
query block's, ``heads x query_chunk(T) x T x 4``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from tests.tiny import tiny
from tests.xla import run


def main(length: int = 2048, layers: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    from workbench.analysis.probe import compiled_program_memory
    from workbench.backend.xla import compile_log, runtime
    from workbench.models.attention import query_chunk
    from workbench.models.attention_choice import use_attention
    from workbench.models.build import build_model

    compile_log.enable_compile_log(Path(tempfile.mkdtemp()) / "compile.log")  # before the first compile
    dev = runtime.device()
    heads = tiny("llama").num_heads
    results: dict[str, Any] = {
        "scores_term": heads * length * length * 4,
        "block_term": heads * query_chunk(length) * length * 4,
        "temp_bytes": {},
    }
    for n in layers:
        for kernel in ("eager", "chunked"):
            model = build_model(tiny("llama", num_layers=n, max_position_embeddings=length), seed=0)
            use_attention(model, kernel).to(dev).train()
            ids = torch.randint(3, 500, (1, length), generator=torch.Generator().manual_seed(0)).to(dev)

            def trace(model: torch.nn.Module = model, ids: torch.Tensor = ids) -> list[torch.Tensor]:
                out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
                out.loss.backward()
                return [out.loss.detach(), *(p.grad for p in model.parameters())]

            results["temp_bytes"][f"{kernel}/{n}"] = compiled_program_memory(trace).temp_bytes
    return results


if __name__ == "__main__":
    run(main)
