"""Bytes each device sends per training step, read from the compiled step vs predicted from shapes.

Run: ``python bench/communication.py`` (about 3 minutes on 2 cores). For every (data, fsdp, model)
mesh of 8 virtual XLA:CPU devices, the workbench's own training step (`Trainer`, tiny Llama,
8 x 32 tokens, full fine-tuning) is compiled in a subprocess with XLA's dump flags
(`workbench.train.step_hlo.capture_step_communication`) and its collectives summed per mesh axis;
beside them, the analytic model's figures (`workbench.analysis.comm_model.predict_communication`).
Bytes are what each device sends with the ring algorithm, after TPU's XLA would turn each
all-reduce + slice into a reduce-scatter (XLA:CPU's own figure, without that rewrite, is printed
as ``cpu``).

Then, as text for docs/how-to/sharding.md: the report of the tiny step on a v5e-8 (the 8-device HLO priced
with v5e's bandwidth), the analytic figures of a real shape (Qwen2.5-0.5B) on a v5e-8, and
`plan_mesh` for Qwen2.5-0.5B on a v4-32, LoRA and full. Writes bench/results/communication.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.real_shapes import real_config
from workbench.analysis.comm_model import predict_communication
from workbench.analysis.communication import communication_advice
from workbench.analysis.mesh_plan import plan_mesh
from workbench.backend.targets import mesh_factorisations
from workbench.train.step_hlo import TINY_RUN, capture_step_communication, tiny_run_model

TINY = tiny_run_model()


def qwen_0_5b():
    return real_config("qwen2.5-0.5b")


def compare_meshes() -> list[dict]:
    rows = []
    batch, length = TINY_RUN["train.batch_size"], TINY_RUN["data.max_length"]
    for data, fsdp, model in mesh_factorisations(8):
        mesh = {"data": data, "fsdp": fsdp, "model": model}
        start = time.perf_counter()
        read = capture_step_communication(mesh)
        predicted = predict_communication(TINY, mesh, batch_size=batch, seq_len=length)
        measured, modelled = read.per_axis(), predicted.per_axis()
        for axes in sorted(set(measured) | set(modelled), key=lambda a: (a.count("+"), a)):
            hlo = measured[axes].tpu_wire_bytes if axes in measured else 0.0
            est = modelled[axes].tpu_wire_bytes if axes in modelled else 0.0
            rows.append(
                {
                    "mesh": f"{data}x{fsdp}x{model}",
                    "axes": axes,
                    "hlo_kB": round(hlo / 1e3, 1),
                    "cpu_kB": round(measured[axes].wire_bytes / 1e3, 1) if axes in measured else 0.0,
                    "model_kB": round(est / 1e3, 1),
                    "error_%": round(100 * (est - hlo) / hlo, 1) if hlo else None,
                }
            )
        print(f"{data}x{fsdp}x{model}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return rows


def print_rows(rows: list[dict]) -> None:
    from workbench.analysis.tables import format_table

    print(format_table(rows))


def readme_text() -> dict[str, str]:
    mesh = {"data": 1, "fsdp": 8, "model": 1}
    tiny = capture_step_communication(mesh)
    out = {
        "tiny_v5e8_hlo": "\n".join(
            [tiny.table(), *tiny.price("v5e-8").lines(), *communication_advice(tiny, "v5e-8")]
        )
    }
    qwen = qwen_0_5b()
    for lora in (16, 0):
        report = predict_communication(
            qwen, mesh, batch_size=16, seq_len=2048, lora_rank=lora, precision="bf16-mixed"
        )
        out[f"qwen_v5e8_model_{'lora' if lora else 'full'}"] = "\n".join(
            [report.table(), *report.price("v5e-8").lines()]
        )
        out[f"qwen_v4_32_plan_{'lora' if lora else 'full'}"] = plan_mesh(
            qwen, "v4-32", 2048, 32, lora_rank=lora
        ).text()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default=str(Path(__file__).resolve().parent / "results" / "communication.json")
    )
    args = parser.parse_args()
    rows = compare_meshes()
    print_rows(rows)
    texts = readme_text()
    for name, text in texts.items():
        print(f"\n== {name}\n{text}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meshes": rows, "texts": texts}, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
