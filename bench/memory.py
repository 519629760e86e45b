"""The memory estimator against the XLA compiler's own memory analysis of the real training step.

For each row of a matrix of tiny configs (family, global batch, length, activation
checkpointing on/off, unsharded or FSDP over 8 virtual devices) this runs two real training
steps on XLA:CPU with the compile memory log on, reads the compiler's analysis of the step
program (inputs + non-aliased outputs + temporaries, per device) and sets
`workbench.analysis.estimate.estimate` (precision fp32: XLA:CPU's native precision) beside it.

Unsharded and sharded rows run in separate subprocesses (SPMD must be switched on before the
first XLA tensor).

A second table holds the trainer's own LoRA step with a quantized base (int8, int4) and the loss
plain or in chunks (`tests/xla/memory_quantized.trainer_step_memory`: compiled, not run; the
test's shape, Llama 3.1 8B's proportions at hidden 512, 3 layers, vocabulary 16384, 2 x 256
tokens, chunks of 128 tokens), in fp32 and bf16, under XLA:CPU's memory-minimising scheduler
(``--xla_cpu_enable_concurrency_optimized_scheduler=false``) with the default scheduler's figure
beside the bf16 rows. Two things XLA:CPU does that the estimate (modelled on TPU) does not: it
computes a bf16 program's intermediates in fp32 (no bf16 buffer is live at the peak), and its dot
takes no converted operand, so an int8 head is converted to fp32 and, under a chunked loss, held
twice through the loss (``cpu_extra``, added before the 15% check, as tests/test_memory_quantized.py
does). ``--real`` runs bench/memory_real.py (Llama 3.1 8B's full width) after.

Prints the tables and writes bench/results/memory.json.

    .venv/bin/python bench/memory.py            # both matrices (about 6 minutes on 2 cores)
    .venv/bin/python bench/memory.py --quick    # four rows + two quantized rows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench.analysis.estimate import estimate
from workbench.analysis.probe import compiled_step_memory
from workbench.backend.xla.runtime import XLA_CPU_MEMORY_SCHEDULER

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TINY = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
}


def matrix(quick: bool = False) -> list[dict]:
    """The rows: (family, batch, length, checkpointing, fsdp)."""
    rows = []
    for fsdp, batches in ((1, (2, 8)), (8, (8, 16))):
        for batch in batches:
            for length in (32, 128):
                for ckpt in (False, True):
                    rows.append(
                        {"family": "llama", "batch": batch, "length": length, "ckpt": ckpt, "fsdp": fsdp}
                    )
    rows += [
        {"family": "qwen2", "batch": 4, "length": 64, "ckpt": False, "fsdp": 1},
        {"family": "gpt2", "batch": 4, "length": 64, "ckpt": False, "fsdp": 1},
        {"family": "llama", "batch": 4, "length": 64, "ckpt": False, "fsdp": 1, "layers": 6},
        {"family": "llama", "batch": 4, "length": 64, "ckpt": True, "fsdp": 1, "layers": 6},
    ]
    if quick:
        plain = [r for r in rows if r["batch"] in (2, 8) and r["length"] == 32 and not r["ckpt"]][:2]
        rows = [
            *plain,
            {"family": "llama", "batch": 8, "length": 32, "ckpt": True, "fsdp": 1},
            {"family": "llama", "batch": 8, "length": 32, "ckpt": False, "fsdp": 8},
        ]
    return rows


def quantized_matrix(quick: bool = False) -> list[dict]:
    """The trainer-step rows: (base, chunked loss, precision, checkpointing, scheduler)."""
    rows = [
        {"kind": "quantized", "quantize": q, "chunked": c, "precision": p, "ckpt": False}
        for p in ("fp32", "bf16")
        for q in ("int8", "int4")
        for c in (False, True)
    ]
    rows += [
        {"kind": "quantized", "quantize": q, "chunked": True, "precision": "bf16", "ckpt": True}
        for q in ("int8", "int4")
    ]
    if quick:
        rows = [r for r in rows if r["quantize"] == "int8" and r["chunked"] and not r["ckpt"]]
    return [
        dict(r, scheduler=s)
        for r in rows
        for s in (("min", "default") if r["precision"] == "bf16" else ("min",))
    ]


def quantized_row(row: dict) -> dict:
    """Runs inside the subprocess: the trainer's step at the test's shape, compiled only."""
    from tests.xla.memory_quantized import (
        CHUNK_TOKENS,
        LENGTH,
        ROWS,
        SHAPE,
        trainer_step_memory,
        xla_cpu_int8_head_copies,
    )

    r = trainer_step_memory(
        SHAPE,
        quantize=row["quantize"],
        rows=ROWS,
        length=LENGTH,
        loss_chunk_tokens=CHUNK_TOKENS if row["chunked"] else 0,
        gradient_checkpointing=row["ckpt"],
        precision=row["precision"],
    )
    extra = xla_cpu_int8_head_copies(SHAPE) if row["quantize"] == "int8" and row["chunked"] else 0
    return dict(
        row,
        compiler_bytes=r["compiler"],
        estimate_bytes=r["estimate"],
        cpu_extra=extra,
        error_pct=round(100 * (r["estimate"] + extra - r["compiler"]) / r["compiler"], 1),
        compiler_temp=r["temporaries"],
        compiler_args=r["arguments"],
        breakdown=r["breakdown"],
        base_bytes=r["base_bytes"],
    )


def model_config(row: dict):
    from workbench.config import ModelConfig

    kw = dict(TINY, family=row["family"])
    if "layers" in row:
        kw["num_layers"] = row["layers"]
    if row["family"] == "gpt2":
        kw.update(num_kv_heads=4, intermediate_size=256)
    return ModelConfig(**kw)


def worker(rows: list[dict]) -> None:
    """Runs inside the subprocess: measure each row, print one JSON line per row."""
    from workbench.backend.xla import runtime

    if any(r.get("fsdp", 1) > 1 for r in rows):
        runtime.use_spmd()
    for row in rows:
        t0 = time.perf_counter()
        if row.get("kind") == "quantized":
            out = dict(quantized_row(row), seconds=round(time.perf_counter() - t0, 1))
            print("ROW " + json.dumps(out), flush=True)
            continue
        measured = compiled_step_memory(
            model_config(row),
            batch_size=row["batch"],
            seq_len=row["length"],
            gradient_checkpointing=row["ckpt"],
            fsdp=row["fsdp"],
        )
        mesh = {"data": 1, "fsdp": row["fsdp"], "model": 1}
        est = estimate(
            model_config(row),
            batch_size=row["batch"],
            seq_len=row["length"],
            precision="fp32",
            gradient_checkpointing=row["ckpt"],
            mesh=mesh,
        )
        out = dict(
            row,
            compiler_bytes=measured.peak_bytes,
            estimate_bytes=est.total_bytes,
            error_pct=round(100 * (est.total_bytes - measured.peak_bytes) / measured.peak_bytes, 1),
            compiler_temp=measured.temp_bytes,
            compiler_args=measured.argument_bytes,
            compiler_out=measured.output_bytes,
            compiler_alias=measured.alias_bytes,
            programs=measured.programs,
            breakdown=est.breakdown,
            seconds=round(time.perf_counter() - t0, 1),
        )
        print("ROW " + json.dumps(out), flush=True)


def run_group(rows: list[dict], *, devices: int = 8, xla_flags: str | None = None) -> list[dict]:
    if not rows:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(
            os.environ,
            PJRT_DEVICE="CPU",
            CPU_NUM_DEVICES=str(devices),
            TF_CPP_MIN_LOG_LEVEL="2",
            PT_XLA_DEBUG_LEVEL="1",
            PT_XLA_DEBUG_FILE=str(Path(tmp) / "compile.log"),
            PYTHONPATH=str(REPO),
        )
        if xla_flags is not None:
            env["XLA_FLAGS"] = xla_flags
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(rows)],
            env=env,
            capture_output=True,
            text=True,
            cwd=REPO,
        )
    results = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    if proc.returncode != 0 or len(results) != len(rows):
        raise SystemExit(f"worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--real", action="store_true", help="then bench/memory_real.py (Llama 3.1 8B width)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    rows = matrix(args.quick)
    results = run_group([r for r in rows if r["fsdp"] == 1]) + run_group([r for r in rows if r["fsdp"] > 1])
    from workbench.analysis.tables import format_table

    table = [
        {
            "family": r["family"] + (f"-L{r['layers']}" if "layers" in r else ""),
            "batch": r["batch"],
            "len": r["length"],
            "ckpt": "on" if r["ckpt"] else "off",
            "mesh": f"fsdp{r['fsdp']}" if r["fsdp"] > 1 else "1 dev",
            "compiler_KiB": round(r["compiler_bytes"] / 1024),
            "estimate_KiB": round(r["estimate_bytes"] / 1024),
            "error_%": r["error_pct"],
            "within_15%": abs(r["error_pct"]) <= 15,
        }
        for r in results
    ]
    print("Estimator vs the XLA compiler's memory analysis (per device, fp32, XLA:CPU, AdamW;")
    print("model: hidden 64, 2 layers unless -L, 4 heads / 2 kv heads, MLP 128, vocab 512, tied)")
    print(format_table(table))
    hits = sum(t["within_15%"] for t in table)
    print(f"{hits}/{len(table)} rows within 15%")

    quantized = quantized_matrix(args.quick)
    by_scheduler = {
        s: run_group([r for r in quantized if r["scheduler"] == s], devices=1, xla_flags=flags)
        for s, flags in (("min", XLA_CPU_MEMORY_SCHEDULER), ("default", ""))
    }
    default = {_key(r): r for r in by_scheduler["default"]}
    q_table = [
        {
            "base": r["quantize"],
            "loss": "chunked" if r["chunked"] else "plain",
            "precision": r["precision"],
            "ckpt": "on" if r["ckpt"] else "off",
            "compiler_MiB": round(r["compiler_bytes"] / 2**20, 1),
            "estimate_MiB": round(r["estimate_bytes"] / 2**20, 1),
            "cpu_extra_MiB": round(r["cpu_extra"] / 2**20, 1),
            "error_%": r["error_pct"],
            "within_15%": abs(r["error_pct"]) <= 15,
            "default_sched_MiB": round(default[_key(r)]["compiler_bytes"] / 2**20, 1)
            if _key(r) in default
            else "",
        }
        for r in by_scheduler["min"]
    ]
    print()
    print("The trainer's LoRA step (r16, AdamW) with a quantized base, compiled only, one XLA:CPU device,")
    print("memory-minimising scheduler (default scheduler's peak beside); llama hidden 512, MLP 1792,")
    print("3 layers, 8/2 heads, vocab 16384, untied; 2 x 256 tokens; chunks of 128 tokens.")
    print("error_% = (estimate + cpu_extra - compiler) / compiler; cpu_extra: an int8 head's two fp32 copies")
    print("under a chunked loss (XLA:CPU's dot takes no converted operand). bf16 rows: XLA:CPU computes")
    print("bf16 programs in fp32: the estimate's bf16 activations (and int4's dequantized copies) are half")
    print("what it holds. Chunked rows hold about what plain ones do here: the head's fp32 copies cost")
    print("what the chunks save (see tests/xla/memory_quantized.py).")
    print(format_table(q_table))
    out = REPO / "bench" / "results" / "memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "rows": results,
        "table": table,
        "quantized_rows": [*by_scheduler["min"], *by_scheduler["default"]],
    }
    out.write_text(json.dumps({**payload, "quantized_table": q_table}, indent=2))
    print(f"wrote {out.relative_to(REPO)}")
    if args.real:
        subprocess.run([sys.executable, str(REPO / "bench" / "memory_real.py")], cwd=REPO, check=True)


def _key(row: dict) -> tuple:
    return (row["quantize"], row["chunked"], row["precision"], row["ckpt"])


if __name__ == "__main__":
    main()
