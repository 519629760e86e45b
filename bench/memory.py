"""The memory estimator against the XLA compiler's own memory analysis of the real training step.

For each row of a matrix of tiny configs (family, global batch, length, activation
checkpointing on/off, unsharded or FSDP over 8 virtual devices) this runs two real training
steps on XLA:CPU with the compile memory log on, reads the compiler's analysis of the step
program (inputs + non-aliased outputs + temporaries, per device) and sets
`workbench.analysis.estimate.estimate` (precision fp32: XLA:CPU's native precision) beside it.

Unsharded and sharded rows run in separate subprocesses (SPMD must be switched on before the
first XLA tensor). Prints a table and writes bench/results/memory.json.

    .venv/bin/python bench/memory.py            # the full matrix (about 2 minutes on 2 cores)
    .venv/bin/python bench/memory.py --quick    # four rows
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
    from workbench.backend import runtime

    if any(r["fsdp"] > 1 for r in rows):
        runtime.use_spmd()
    for row in rows:
        t0 = time.perf_counter()
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


def run_group(rows: list[dict]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(
            os.environ,
            PJRT_DEVICE="CPU",
            CPU_NUM_DEVICES="8",
            TF_CPP_MIN_LOG_LEVEL="2",
            PT_XLA_DEBUG_LEVEL="1",
            PT_XLA_DEBUG_FILE=str(Path(tmp) / "compile.log"),
            PYTHONPATH=str(REPO),
        )
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
    out = REPO / "bench" / "results" / "memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": results, "table": table}, indent=2))
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
