"""What the loss in chunks saves, by the XLA compiler's own memory analysis (tests/test_chunked_loss.py).

A vocabulary large enough to dominate (a 2-layer, 64-wide Llama-style model, vocabulary 32768)
at 2 rows x 256 positions on one XLA:CPU device: one training step (objective, backward, SGD
update) compiled per way, the plain loss, then chunks of 128 and of 64 positions. Reported per
way: the program's temporary bytes (activations, gradients, scratch) from torch_xla's compile
log, the loss, and the logits term the chunk-length rule counts (``logits_bytes``: 16 bytes a
vocabulary entry), whole and per chunk.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from tests.tiny import tiny
from tests.xla import run
from workbench.backend.xla import compile_log, runtime
from workbench.models.build import build_model
from workbench.models.lm_head import logits_bytes
from workbench.train.objective import CausalLMObjective, LossChunking

ROWS, LENGTH, VOCAB = 2, 256, 32768


def main(positions: tuple[int, ...] = (128, 64)) -> dict[str, Any]:
    log = Path(tempfile.mkdtemp()) / "compile.log"
    compile_log.enable_compile_log(log)  # before the first compile
    dev = runtime.device()
    ids = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids.to(dev), "attention_mask": torch.ones_like(ids).to(dev), "labels": ids.to(dev)}
    ways = {"plain": 0, **{f"chunks of {p}": p * ROWS for p in positions}}
    results: dict[str, Any] = {}
    for way, tokens in ways.items():
        model = build_model(tiny("llama", vocab_size=VOCAB, max_position_embeddings=LENGTH), seed=0).to(dev)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        out = CausalLMObjective(LossChunking(tokens))(model, batch)
        out["loss_sum"].backward()
        opt.step()
        loss = out["loss_sum"].detach()
        del out  # nothing of the step's intermediates stays a program output
        runtime.sync()
        record = compile_log.compiled_memory_records(log)[-1]
        results[way] = {
            "loss": float(runtime.to_cpu([loss])[0]),
            "temp_bytes": record.temp_bytes,
            "logits_term": logits_bytes(rows=ROWS, positions=tokens // ROWS or LENGTH, vocab=VOCAB),
        }
    results["programs"] = len(compile_log.compiled_memory_records(log))
    return results


if __name__ == "__main__":
    run(main)
