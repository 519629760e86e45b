"""The compiler's memory analysis of the real training step against the estimate, unsharded, and
the compile-only probe the batch finder uses (tests/test_memory.py). Needs the compile memory log
(PT_XLA_DEBUG_LEVEL=1, PT_XLA_DEBUG_FILE) in the environment."""

from __future__ import annotations

from typing import Any

from tests.xla import run
from workbench.analysis.batch import find_batch_size
from workbench.analysis.estimate import estimate
from workbench.analysis.probe import compiled_step_memory, compiled_step_probe
from workbench.backend.xla import runtime
from workbench.config import ModelConfig

CFG = ModelConfig(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512
)


def main() -> dict[str, Any]:
    rows = []
    for b, t in [(2, 128), (8, 32)]:
        m = compiled_step_memory(CFG, batch_size=b, seq_len=t)
        e = estimate(CFG, batch_size=b, seq_len=t, precision="fp32")
        rows.append([b, t, m.peak_bytes, e.total_bytes, m.programs])
    runtime.wait_device_ops()  # the earlier programs run asynchronously: count none of them below
    executed = runtime.execute_count()
    probe = compiled_step_probe(CFG, seq_len=32)
    probed = probe(16)
    budget = int(estimate(CFG, batch_size=16, seq_len=32, precision="fp32").total_bytes * 1.2)
    plan = find_batch_size(
        CFG,
        seq_len=32,
        memory_bytes=budget,
        dp_size=8,
        headroom=0.0,
        compiled_bytes=probe,
        precision="fp32",
    )
    return {
        "rows": rows,
        "probed": probed,
        "probe_executed": runtime.execute_count() - executed,
        "est16": estimate(CFG, batch_size=16, seq_len=32, precision="fp32").total_bytes,
        "plan": [plan.batch_size, plan.compiled_bytes],
    }


if __name__ == "__main__":
    run(main)
