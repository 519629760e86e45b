"""The memory estimate against the XLA compiler's analysis of a training step, eager and chunked attention.

A tiny Llama (hidden 64, 4 heads, 2 key/value heads, 2 layers, vocabulary 512), one row of `length`
tokens on one XLA:CPU device: two real training steps (forward, backward, AdamW) with
`workbench.analysis.probe.compiled_step_memory`, once per kernel, beside
`workbench.analysis.estimate.estimate` for the same kernel (fp32, XLA:CPU's precision). Reported per
length and kernel: the compiler's peak, the estimate's total and its scores term. The kernel is the
config's own ``model.attention``, which both functions read (neither is told it separately).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tests.tiny import tiny
from tests.xla import run


def main(lengths: tuple[int, ...] = (2048, 4096)) -> dict[str, Any]:
    from workbench.analysis.estimate import estimate
    from workbench.analysis.probe import compiled_step_memory
    from workbench.backend.xla import compile_log

    compile_log.enable_compile_log(Path(tempfile.mkdtemp()) / "compile.log")  # before the first compile
    rows: dict[str, Any] = {}
    for length in lengths:
        for kernel in ("eager", "chunked"):
            cfg = tiny("llama", max_position_embeddings=length, attention=kernel)
            compiled = compiled_step_memory(cfg, batch_size=1, seq_len=length)
            est = estimate(cfg, batch_size=1, seq_len=length, precision="fp32")
            rows[f"{kernel}/{length}"] = {
                "compiled": compiled.peak_bytes,
                "estimate": est.total_bytes,
                "scores": est.scores_bytes,
                "eager_scores": est.eager_scores_bytes,
            }
    return rows


if __name__ == "__main__":
    run(main)
