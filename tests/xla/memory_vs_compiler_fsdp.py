"""The compiler's memory analysis of the training step under FSDP over 8 devices against the
estimate (tests/test_memory.py). Needs the compile memory log (PT_XLA_DEBUG_LEVEL=1,
PT_XLA_DEBUG_FILE) in the environment."""

from __future__ import annotations

from typing import Any

from tests.xla import run
from workbench.analysis.estimate import estimate
from workbench.analysis.probe import compiled_step_memory
from workbench.backend.xla import runtime
from workbench.config import ModelConfig

CFG = ModelConfig(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512
)


def main() -> dict[str, Any]:
    runtime.use_spmd()
    m = compiled_step_memory(CFG, batch_size=16, seq_len=32, fsdp=8)
    e = estimate(CFG, batch_size=16, seq_len=32, precision="fp32", mesh={"data": 1, "fsdp": 8, "model": 1})
    single = estimate(CFG, batch_size=16, seq_len=32, precision="fp32")
    return {
        "compiler": m.peak_bytes,
        "arguments": m.argument_bytes,
        "estimate": e.total_bytes,
        "params": e.breakdown["params"],
        "single": single.total_bytes,
    }


if __name__ == "__main__":
    run(main)
