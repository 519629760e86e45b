"""Per-device memory and step time of each SPMD mesh against the unsharded model.

Run: ``PJRT_DEVICE=CPU python bench/sharding.py`` (8 virtual devices unless CPU_NUM_DEVICES says
otherwise). A small Llama trains with AdamW on each mesh; after warm-up we time steps and then
read back the shards torch_xla really holds for parameters, gradients and optimizer state
(measured, not taken from the plan; the plan's figure is printed beside them).

Baselines, side by side: "unsharded" is the same SPMD process with no mesh (every device holds
and computes everything: the obvious alternative), and "1 device" is a separate non-SPMD
process (SPMD mode cannot be switched off again in one process), for step time only.

Step times on XLA:CPU are indicative only: the 8 "devices" share the host's cores, so
collectives are memory copies and sharding mostly splits work rather than adding chips.
Writes bench/results/sharding.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from workbench.backend.xla import runtime
from workbench.config import ModelConfig
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs

MESHES = [
    {"data": 1, "fsdp": 8, "model": 1},
    {"data": 2, "fsdp": 4, "model": 1},
    {"data": 2, "fsdp": 2, "model": 2},
    {"data": 1, "fsdp": 4, "model": 2},
    {"data": 8, "fsdp": 1, "model": 1},
]
MODEL = ModelConfig(
    family="llama",
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=512,
    vocab_size=512,
    max_position_embeddings=128,
)
BATCH, SEQ, WARMUP, STEPS = 8, 64, 2, 7


def mesh_name(spec: dict[str, int] | None) -> str:
    return "unsharded" if spec is None else " x ".join(f"{k}={v}" for k, v in spec.items() if v > 1)


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes the largest shard of `tensor` takes on one device (the whole tensor if unsharded)."""
    shapes = runtime.local_shard_shapes(tensor) if runtime.sharding_spec(tensor) else [tuple(tensor.shape)]
    return max(math.prod(s) for s in shapes) * tensor.element_size()


def train_and_measure(spec: dict[str, int] | None) -> dict:
    from workbench.parallel.apply import move_model, shard_batch, shard_model
    from workbench.parallel.mesh import MeshSpec

    model = build_model(MODEL, seed=0)
    ids = torch.randint(0, MODEL.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    plan_bytes = None
    if spec is None:
        move_model(model)
        batch = ids.to(runtime.device())
    else:
        mesh = MeshSpec(**spec).build()
        report = shard_model(model, mesh)
        plan_bytes = report.bytes_per_device
        batch = shard_batch({"input_ids": ids}, mesh)["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> torch.Tensor:
        loss = model(**model_inputs({"input_ids": batch}, model), labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        runtime.sync()
        return loss

    for _ in range(WARMUP):
        step()
    runtime.wait_device_ops()
    compiles = runtime.compile_count()
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        step()
        runtime.wait_device_ops()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)  # the median resists the other jobs sharing this host
    recompiles = runtime.compile_count() - compiles

    # One more backward so gradients exist, then read every shard back.
    loss = model(**model_inputs({"input_ids": batch}, model), labels=batch).loss
    loss.backward()
    runtime.sync(wait=True)  # shards can only be read once the step has finished
    params = list(model.parameters())
    param_bytes = sum(local_bytes(p) for p in params)
    grad_bytes = sum(local_bytes(p.grad) for p in params)
    state_bytes = sum(
        local_bytes(v)
        for p in params
        for v in optimizer.state[p].values()
        if isinstance(v, torch.Tensor) and v.dim()
    )
    return {
        "mesh": mesh_name(spec),
        "spec": spec,
        "params_bytes": param_bytes,
        "grads_bytes": grad_bytes,
        "optimizer_bytes": state_bytes,
        "total_bytes": param_bytes + grad_bytes + state_bytes,
        "plan_params_bytes": plan_bytes,
        "step_s": step_s,
        "recompiles_after_warmup": recompiles,
        "final_loss": float(loss.detach()),
    }


def single_device_step_s() -> float:
    """Step time of the same model on one XLA device without SPMD, in a child process."""
    proc = subprocess.run(
        [sys.executable, __file__, "--single"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        check=True,
    )
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["step_s"])


def kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", action="store_true", help="child mode: one device, no SPMD")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "sharding.json"))
    args = parser.parse_args()
    if args.single:
        print(json.dumps(train_and_measure(None)))
        return

    from workbench.parallel.mesh import ensure_spmd

    single_s = single_device_step_s()
    ensure_spmd()
    rows = [train_and_measure(None)] + [train_and_measure(spec) for spec in MESHES]
    base = rows[0]
    for row in rows:
        row["memory_vs_unsharded"] = row["total_bytes"] / base["total_bytes"]
        row["step_vs_unsharded"] = row["step_s"] / base["step_s"]
        row["step_vs_single_device"] = row["step_s"] / single_s

    header = (
        "mesh",
        "params KiB/dev",
        "(plan)",
        "grads KiB/dev",
        "AdamW KiB/dev",
        "total KiB/dev",
        "mem vs unsharded",
        "step ms",
        "step vs unsharded",
        "step vs 1 device",
    )
    table = [
        (
            r["mesh"],
            kib(r["params_bytes"]),
            kib(r["plan_params_bytes"]),
            kib(r["grads_bytes"]),
            kib(r["optimizer_bytes"]),
            kib(r["total_bytes"]),
            f"{r['memory_vs_unsharded']:.3f}x",
            f"{r['step_s'] * 1000:.1f}",
            f"{r['step_vs_unsharded']:.2f}x",
            f"{r['step_vs_single_device']:.2f}x",
        )
        for r in rows
    ]
    widths = [max(len(str(x[i])) for x in [header, *table]) for i in range(len(header))]
    print(
        f"Llama h={MODEL.hidden_size} L={MODEL.num_layers} ffn={MODEL.intermediate_size} V={MODEL.vocab_size}, ",
        end="",
    )
    print(
        f"batch {BATCH}x{SEQ}, AdamW fp32, {runtime.global_device_count()} XLA:CPU devices; 1-device step {single_s * 1000:.1f} ms"
    )
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for line in table:
        print(" | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)))
    print("Step times on XLA:CPU are indicative only (8 virtual devices share the host's cores).")
    recompiled = [r["mesh"] for r in rows if r["recompiles_after_warmup"]]
    print("recompiles after warm-up:", ", ".join(recompiled) if recompiled else "none")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": {
            k: getattr(MODEL, k)
            for k in ("family", "hidden_size", "num_layers", "intermediate_size", "vocab_size")
        },
        "batch": [BATCH, SEQ],
        "devices": runtime.global_device_count(),
        "single_device_step_s": single_s,
        "note": "XLA:CPU step times are indicative only",
        "rows": rows,
    }
    out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
