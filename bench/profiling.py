"""The step profiler's overhead against a bare training loop on XLA:CPU, in one process.

Three loops over the same tiny Llama training step, interleaved round by round so drift in
the shared machine hits them alike:

- bare: step, sync; nothing else (the loss is never read);
- profiled: the same plus `StepProfiler.step(tokens, loss=loss, lr=lr)` every step, logging
  every `--log-every` steps (it reads the loss there: one device->host transfer);
- naive: the obvious alternative, `loss.item()` every step (a transfer and a stall each step).

Reports the median wall time per step of each, the overhead against bare, and the
device->host transfers counted on the steps between log intervals (must be 0).
Prints a table and writes bench/results/profiling.json.

    .venv/bin/python bench/profiling.py [--steps 40 --rounds 5 --log-every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per loop per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()

    import torch

    from workbench.analysis.flops import training_flops_per_token
    from workbench.analysis.profiler import StepProfiler
    from workbench.analysis.tables import format_table
    from workbench.backend.hardware import detect
    from workbench.backend.xla import runtime
    from workbench.config import ModelConfig
    from workbench.models.build import build_model
    from workbench.models.inputs import model_inputs

    hw = detect("xla")
    dev = runtime.device()
    cfg = ModelConfig(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512
    )
    model = build_model(cfg).to(dev)
    model.tie_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len)).to(dev)
    tokens = args.batch * args.seq_len
    fpt = training_flops_per_token(model, args.seq_len)

    def step() -> torch.Tensor:
        loss = model(**model_inputs({"input_ids": ids}, model), labels=ids).loss  # masked: no device read
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        runtime.sync()
        return loss

    for _ in range(3):  # compile the first and the steady-state programs
        step()
    runtime.wait_device_ops()
    compiles_before = runtime.compile_count()

    def bare() -> dict:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        runtime.wait_device_ops()
        return {"wall": time.perf_counter() - t0}

    def naive() -> dict:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step().item()
        runtime.wait_device_ops()
        return {"wall": time.perf_counter() - t0}

    def profiled() -> dict:
        prof = StepProfiler(hw, flops_per_token=fpt, log_every=args.log_every, warmup_steps=0)
        between = 0
        in_call = 0.0  # host time inside prof.step() on non-log steps: the profiler's own cost
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
            before = runtime.transfer_count()
            c0 = time.perf_counter()
            m = prof.step(tokens, loss=loss, lr=1e-3)
            if m is None:
                in_call += time.perf_counter() - c0
                between += runtime.transfer_count() - before
        runtime.wait_device_ops()
        wall = time.perf_counter() - t0
        return {
            "wall": wall,
            "between": between,
            "in_call": in_call,
            "logs": len(prof.history),
            "advice": [a.kind for a in prof.advice()],
            "transfers_reported": sum(m["transfers"] for m in prof.history),
        }

    loops = {"bare": bare, "profiled": profiled, "naive .item()": naive}
    results: dict[str, list[dict]] = {name: [] for name in loops}
    for r in range(args.rounds):
        order = list(loops) if r % 2 == 0 else list(reversed(loops))
        for name in order:
            results[name].append(loops[name]())
    per_step = {
        name: statistics.median(x["wall"] for x in runs) / args.steps for name, runs in results.items()
    }
    # paired: each round ran every loop back to back, so the per-round ratio cancels slow drift
    ratio = {
        name: statistics.median(a["wall"] / b["wall"] for a, b in zip(runs, results["bare"]))
        for name, runs in results.items()
    }
    between = sum(x["between"] for x in results["profiled"])
    non_log_steps = args.steps - args.steps // args.log_every
    in_call_us = 1e6 * statistics.median(x["in_call"] / non_log_steps for x in results["profiled"])
    rows = [
        {
            "loop": name,
            "ms_per_step": round(1000 * per_step[name], 3),
            "overhead_vs_bare_%": round(100 * (ratio[name] - 1), 2),
            "min_ms": round(1000 * min(x["wall"] for x in results[name]) / args.steps, 3),
            "max_ms": round(1000 * max(x["wall"] for x in results[name]) / args.steps, 3),
        }
        for name in loops
    ]
    print(
        f"XLA:CPU, tiny Llama (hidden 64, 2 layers), batch {args.batch} x {args.seq_len}, "
        f"{args.steps} steps x {args.rounds} rounds per loop, profiler log_every={args.log_every}"
    )
    print(format_table(rows))
    print(
        f"device->host transfers on non-log steps of the profiled loop: {between} "
        f"(over {args.rounds * (args.steps - args.steps // args.log_every)} steps)"
    )
    print(
        f"profiler host time per non-log step (inside StepProfiler.step): {in_call_us:.1f} us "
        f"= {in_call_us / 1e3 / per_step['bare'] / 10:.3f}% of a bare step"
    )
    print(f"compiles during the measured loops: {runtime.compile_count() - compiles_before}")
    print(f"profiler advice on the profiled loop: {results['profiled'][-1]['advice']}")
    out = REPO / "bench" / "results" / "profiling.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "rows": rows,
                "transfers_between_logs": between,
                "profiler_us_per_non_log_step": in_call_us,
                "compiles_during_loops": runtime.compile_count() - compiles_before,
                "raw": results,
            },
            indent=2,
        )
    )
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
