"""StepProfiler on XLA:CPU around a hand-written loop: no sync between log steps, and each kind
of advice provoked in turn; exports and a trace (tests/test_profiling.py). Needs the compile
memory log (PT_XLA_DEBUG_LEVEL=1, PT_XLA_DEBUG_FILE) in the environment."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from tests.xla import run
from workbench.analysis.flops import training_flops_per_token
from workbench.analysis.profiler import StepProfiler
from workbench.analysis.trace import trace
from workbench.backend.hardware import detect
from workbench.backend.xla import compile_log, runtime
from workbench.config import ModelConfig
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs

B, T = 4, 32


def main(out_dir: str) -> dict[str, Any]:
    out = Path(out_dir)
    hw = detect("xla")
    dev = runtime.device()
    cfg = ModelConfig(
        hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=256
    )
    model = build_model(cfg).to(dev)
    model.tie_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (B, T)).to(dev)
    fpt = training_flops_per_token(model, T)

    def step(batch: torch.Tensor = ids) -> torch.Tensor:
        # with a mask, as the Trainer's forwards: transformers 5 reads the device without one
        loss = model(**model_inputs({"input_ids": batch}, model), labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        runtime.sync()
        return loss

    for _ in range(2):  # warm-up: the first step and the steady-state step compile
        step()
    runtime.wait_device_ops()
    res: dict[str, Any] = {}

    # clean loop: the profiler reads the loss tensor only at its log steps
    prof = StepProfiler(hw, flops_per_token=fpt, log_every=5, warmup_steps=0)
    per_step = []
    for _ in range(10):
        loss = step()
        before = runtime.transfer_count()
        m = prof.step(B * T, loss=loss, lr=1e-3)
        per_step.append([runtime.transfer_count() - before, m is not None])
    res["clean"] = {"per_step": per_step, "history": prof.history, "advice": [a.kind for a in prof.advice()]}

    # .item() every step
    prof = StepProfiler(hw, log_every=5, warmup_steps=0)
    for _ in range(5):
        loss = step()
        loss.item()
        prof.step(B * T, loss=loss)
    res["item"] = {"advice": [a.kind for a in prof.advice()], "transfers": prof.history[-1]["transfers"]}

    # new shapes after warm-up
    prof = StepProfiler(hw, log_every=5, warmup_steps=0)
    for t in (16, 24, 40, 48, 56):
        batch = ids[:, :t].contiguous() if t < T else torch.randint(0, 256, (B, t)).to(dev)
        prof.step(B * t, loss=step(batch))
    res["recompile"] = {"advice": [a.kind for a in prof.advice()], "history": prof.history}

    # input wait
    prof = StepProfiler(hw, log_every=5, warmup_steps=0)
    for _ in range(5):
        with prof.input_wait():
            time.sleep(0.05)
        prof.step(B * T, loss=step())
    res["input"] = {
        "advice": [a.kind for a in prof.advice()],
        "fraction": prof.history[-1]["input_wait_fraction"],
    }

    # MFU against a peak: far too high a peak -> low MFU; a tiny one -> none
    for name, peak in (("low_mfu", 1e18), ("high_mfu", 1.0)):
        prof = StepProfiler(hw, flops_per_token=fpt, log_every=5, warmup_steps=0, peak_flops=peak)
        for _ in range(5):
            prof.step(B * T, loss=step())
        res[name] = {"advice": [a.kind for a in prof.advice()], "mfu": prof.history[-1]["mfu"]}

    # memory: the compiled program's own figure against a limit just above / far above it
    peak = max(r.peak_bytes for r in compile_log.compiled_memory_records())
    for name, limit in (("mem_near", int(peak * 1.05)), ("mem_far", peak * 3)):
        prof = StepProfiler(hw, log_every=5, warmup_steps=0, memory_limit_bytes=limit)
        for _ in range(5):
            prof.step(B * T, loss=step())
        res[name] = {
            "advice": [a.kind for a in prof.advice()],
            "compiled": prof.history[-1]["compiled_program_bytes"],
            "peak": peak,
        }
    prof.to_json(str(out / "prof.json"))
    prof.to_csv(str(out / "prof.csv"))

    logdir = trace(step, steps=2, logdir=str(out / "tb"), warmup=1, hw=hw)
    res["trace_files"] = [p.name for p in logdir.glob("*.pt.trace.json")]
    return res


if __name__ == "__main__":
    run(main)
