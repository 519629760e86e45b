"""Recompile forensics on XLA:CPU around a hand-written loop (tests/test_recompiles.py).

After two warm-up steps at length 32, a batch of length 48 is fed and synced at a known line,
then a length seen before (no compile), then an int32 batch of a known length (a dtype change),
then a step whose graph changes with the same inputs (a Python float baked into the graph).
Needs the compile log (PT_XLA_DEBUG_LEVEL=1, PT_XLA_DEBUG_FILE) in the environment; with
`log=False` it must be off, and the scenario asks for it after the first compile (too late).
The test finds the syncing lines by their comments.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.analysis.profiler import StepProfiler
from workbench.backend.hardware import detect
from workbench.backend.xla import compile_log, runtime
from workbench.config import ModelConfig
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs

B, T = 4, 32


def main(log: bool = True) -> dict[str, Any]:
    if log and compile_log.compile_memory_log_path() is None:
        raise RuntimeError("run with PT_XLA_DEBUG_LEVEL=1 and PT_XLA_DEBUG_FILE set")
    dev = runtime.device()
    cfg = ModelConfig(
        hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=256
    )
    model = build_model(cfg).to(dev)
    model.tie_weights()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def launch(batch: dict[str, torch.Tensor], scale: float = 1.0) -> torch.Tensor:
        """Trace one training step (no sync: the caller syncs, at the line the test checks)."""
        ids = batch["input_ids"]
        loss = model(**model_inputs({"input_ids": ids}, model), labels=ids.long()).loss * scale
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def batch(length: int, dtype: torch.dtype = torch.long) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.randint(0, 256, (B, length), dtype=dtype).to(dev)}

    prof = StepProfiler(detect("xla"), log_every=100, warmup_steps=2)
    for length in (T, T):  # warm-up: the first step and the steady-state step compile
        inputs = batch(length)
        loss = launch(inputs)
        runtime.sync()
        prof.step(B * length, loss=loss, inputs=inputs)
    compiles_before = runtime.compile_count()
    late_notice = compile_log.start_run_log(xla=True) if not log else []

    inputs = batch(48)
    loss = launch(inputs)
    runtime.sync()  # compiles: input_ids (4, 32) -> (4, 48)
    prof.step(B * 48, loss=loss, inputs=inputs)

    inputs = batch(T)
    loss = launch(inputs)
    runtime.sync()  # a length compiled before: no compile
    prof.step(B * T, loss=loss, inputs=inputs)

    inputs = batch(T, torch.int32)
    loss = launch(inputs)
    runtime.sync()  # compiles: input_ids int64 -> int32
    prof.step(B * T, loss=loss, inputs=inputs)

    inputs = batch(T)
    loss = launch(inputs, scale=0.5)  # a Python float in the graph: a new program, same inputs
    runtime.sync()  # compiles: same inputs, a new graph
    metrics = prof.step(B * T, loss=loss, inputs=inputs, log=True)

    advice = [a for a in prof.advice() if a.kind == "recompilation"]
    return {
        "late_notice": late_notice,
        "compiles_after_warmup": runtime.compile_count() - compiles_before,
        "recompile_steps": metrics["recompile_steps"],
        "recompile_causes": metrics["recompile_causes"],
        "advice": advice[0].message if advice else None,
        "advice_causes": advice[0].evidence.get("causes") if advice else None,
        "frames": [
            [str(f) for f in r.records[0].frames] if r.records else [] for r in prof.recompiles.recompiles
        ],
    }


if __name__ == "__main__":
    run(main)
