"""What recompile forensics cost per training step: torch_xla's compile log, and the profiler's part.

torch_xla reads ``PT_XLA_DEBUG_LEVEL`` once per process, so the log levels cannot be set side by
side in one process: each level runs the same hand-written loop (a tiny llama on XLA:CPU, a
fixed shape after warm-up) in its own subprocess, the levels alternating over rounds so drift
hits them alike. Reported per level: the steady step time (the fastest block of steps, each
block ending in a device wait: the least disturbed by other processes on a shared machine;
median over rounds), its ratio to level 0, and the bytes the log grew by over the
steady steps (level 1 writes only per compile: 0; level 2 writes per execution). Inside the
level-1 process, `StepProfiler.step` is timed side by side with and without ``inputs=`` (the
per-step share of the forensics: reading shapes and dtypes).

Prints two tables and writes bench/results/compile_log_cost.json.

    .venv/bin/python bench/compile_log_cost.py            # 3 rounds (about 2 minutes on 2 cores)
    .venv/bin/python bench/compile_log_cost.py --quick    # 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LEVELS = (0, 1, 2)
BATCH, LENGTH = 4, 32


def worker(level: int, blocks: int, steps_per_block: int) -> dict:
    """Runs inside the subprocess (the level is in its environment): the loop, then the profiler."""
    import torch

    from workbench.analysis.profiler import StepProfiler
    from workbench.backend.hardware import detect
    from workbench.backend.xla import runtime
    from workbench.config import ModelConfig
    from workbench.models.build import build_model
    from workbench.models.inputs import model_inputs

    dev = runtime.device()
    cfg = ModelConfig(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512
    )
    model = build_model(cfg).to(dev)
    model.tie_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = {"input_ids": torch.randint(0, 512, (BATCH, LENGTH)).to(dev)}

    def step() -> None:
        ids = batch["input_ids"]
        loss = model(**model_inputs({"input_ids": ids}, model), labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        runtime.sync()

    for _ in range(3):
        step()
    runtime.wait_device_ops()
    log = os.environ["PT_XLA_DEBUG_FILE"]
    size = os.path.getsize(log) if os.path.exists(log) else 0
    compiles = runtime.compile_count()
    block_times = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(steps_per_block):
            step()
        runtime.wait_device_ops()
        block_times.append((time.perf_counter() - t0) / steps_per_block)
    grown = (os.path.getsize(log) if os.path.exists(log) else 0) - size
    out = {
        "level": level,
        "step_s": min(block_times),
        "block_step_s": block_times,
        "steady_steps": blocks * steps_per_block,
        "log_bytes_per_step": grown / (blocks * steps_per_block),
        "steady_compiles": runtime.compile_count() - compiles,
    }
    if level == 1:  # the profiler's own per-step cost, with and without the input signature
        calls, timings = 2000, {"without": [], "with": []}
        for _ in range(5):
            for name, inputs in (("without", None), ("with", batch)):
                prof = StepProfiler(detect("xla"), log_every=10**9, warmup_steps=0)
                t0 = time.perf_counter()
                for _ in range(calls):
                    prof.step(BATCH * LENGTH, inputs=inputs)
                timings[name].append((time.perf_counter() - t0) / calls)
        out["profiler_step_s"] = {name: min(values) for name, values in timings.items()}
    return out


def run_level(level: int, blocks: int, steps_per_block: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(
            os.environ,
            PJRT_DEVICE="CPU",
            CPU_NUM_DEVICES="1",
            TF_CPP_MIN_LOG_LEVEL="2",
            PT_XLA_DEBUG_LEVEL=str(level),
            PT_XLA_DEBUG_FILE=str(Path(tmp) / "compile.log"),
            PYTHONPATH=str(REPO),
        )
        args = json.dumps({"level": level, "blocks": blocks, "steps_per_block": steps_per_block})
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", args], env=env, capture_output=True, text=True, cwd=REPO
        )
    rows = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    if proc.returncode != 0 or not rows:
        raise SystemExit(f"worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return rows[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("ROW " + json.dumps(worker(**json.loads(args.worker))), flush=True)
        return
    rounds, blocks, steps_per_block = (1, 5, 10) if args.quick else (3, 7, 15)
    runs: list[dict] = []
    for r in range(rounds):
        order = LEVELS if r % 2 == 0 else tuple(reversed(LEVELS))
        runs += [run_level(level, blocks, steps_per_block) for level in order]
    from workbench.analysis.tables import format_table

    by_level = {level: [run for run in runs if run["level"] == level] for level in LEVELS}
    base = statistics.median(run["step_s"] for run in by_level[0])
    table = []
    for level, level_runs in by_level.items():
        step_s = statistics.median(run["step_s"] for run in level_runs)
        table.append(
            {
                "PT_XLA_DEBUG_LEVEL": level,
                "step_ms": round(1e3 * step_s, 2),
                "vs_level_0": round(step_s / base, 3),
                "log_bytes/step": round(statistics.median(run["log_bytes_per_step"] for run in level_runs)),
                "steady_compiles": max(run["steady_compiles"] for run in level_runs),
            }
        )
    prof = [run["profiler_step_s"] for run in by_level[1]]
    without = min(p["without"] for p in prof)
    with_inputs = min(p["with"] for p in prof)
    profiler_table = [
        {"StepProfiler.step": "without inputs=", "us/call": round(1e6 * without, 2), "ratio": 1.0},
        {
            "StepProfiler.step": "with inputs= (forensics)",
            "us/call": round(1e6 * with_inputs, 2),
            "ratio": round(with_inputs / without, 2),
        },
    ]
    print(
        f"Steady training step on XLA:CPU (tiny llama, batch {BATCH} x {LENGTH}, AdamW), "
        f"fastest of {blocks} blocks x {steps_per_block} steps, median of {rounds} round(s)"
    )
    print(format_table(table))
    print("The profiler's per-step call on XLA (no log step), side by side in one process")
    print(format_table(profiler_table))
    out = REPO / "bench" / "results" / "compile_log_cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": runs, "table": table, "profiler": profiler_table}, indent=2))
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
