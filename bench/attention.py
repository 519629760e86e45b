"""Eager against chunked attention on XLA:CPU: step time and the compiler's memory, 512 to 4096 tokens.

For each row length this builds the same Llama-proportioned model twice (hidden 256, 4 heads of 64,
2 key/value heads, 2 layers, vocabulary 2048), once with transformers' eager attention and once with
the workbench's chunked attention (`workbench.models.attention`, ``model.attention=chunked``), and
runs real training steps (forward, backward, AdamW) of one row on one XLA:CPU device, side by side
in one process:

- the compiler's memory analysis of the step program (`workbench.analysis.probe.compiled_step_memory`)
  beside `workbench.analysis.estimate.estimate` for the same kernel, and the scores term the estimate
  prices (eager: every layer's ``heads x T x T`` fp32 probabilities; chunked: one query block's);
- the median step time after warm-up, and chunked's time as a ratio of eager's.

The lengths where chunked is no slower than eager are where ``model.attention: auto`` picks it on
an XLA device that is not a TPU (`workbench.models.attention.AUTO_CHUNKED_MIN_LENGTH`).

Prints the table and writes bench/results/attention.json.

    .venv/bin/python bench/attention.py            # 512, 1024, 2048, 4096 (about 5 minutes on 2 cores)
    .venv/bin/python bench/attention.py --quick    # 512 and 2048
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "1")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHAPE = {
    "family": "llama",
    "hidden_size": 256,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 2048,
}
KERNELS = ("eager", "chunked")


def step_seconds(cfg, *, kernel: str, seq_len: int, steps: int) -> list[float]:
    """Wall time of `steps` training steps after one warm-up step (same program as the memory probe's)."""
    import torch

    from workbench.backend.xla import runtime
    from workbench.models.attention_choice import use_attention
    from workbench.models.build import build_model
    from workbench.models.inputs import model_inputs

    dev = runtime.device()
    model = build_model(cfg, seed=0)
    use_attention(model, kernel)
    model = model.to(dev)
    model.tie_weights()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(0)).to(dev)
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        loss = model(**model_inputs({"input_ids": ids}, model), labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        runtime.sync()
        runtime.wait_device_ops()
        if i:  # the first step compiles
            times.append(time.perf_counter() - start)
    return times


def measure(seq_len: int, kernel: str, steps: int) -> dict:
    from workbench.analysis.estimate import estimate
    from workbench.analysis.probe import compiled_step_memory
    from workbench.config import ModelConfig
    from workbench.units import MiB

    cfg = ModelConfig(**SHAPE, max_position_embeddings=max(4096, seq_len), attention=kernel)
    compiled = compiled_step_memory(cfg, batch_size=1, seq_len=seq_len, steps=2)
    est = estimate(cfg, batch_size=1, seq_len=seq_len, precision="fp32")
    times = step_seconds(cfg, kernel=kernel, seq_len=seq_len, steps=steps)
    return {
        "seq_len": seq_len,
        "kernel": kernel,
        "compiled_mib": round(compiled.peak_bytes / MiB, 1),
        "estimate_mib": round(est.total_bytes / MiB, 1),
        "estimate_scores_mib": round(est.scores_bytes / MiB, 1),
        "estimate_error": round(est.total_bytes / compiled.peak_bytes - 1, 3),
        "step_s": round(statistics.median(times), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="512 and 2048 tokens only")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per row (after one warm-up)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "attention.json"))
    args = parser.parse_args()

    from workbench.backend.xla import compile_log

    compile_log.enable_compile_log(Path(tempfile.mkdtemp()) / "compile.log")
    lengths = (512, 2048) if args.quick else (512, 1024, 2048, 4096)
    rows = [measure(t, kernel, args.steps) for t in lengths for kernel in KERNELS]
    by = {(r["seq_len"], r["kernel"]): r for r in rows}
    for r in rows:
        eager = by[(r["seq_len"], "eager")]
        r["time_vs_eager"] = round(r["step_s"] / eager["step_s"], 3)
        r["memory_vs_eager"] = round(r["compiled_mib"] / eager["compiled_mib"], 3)

    head = f"{'tokens':>6} {'kernel':>8} {'step s':>8} {'× eager':>8} {'compiled MiB':>13} {'estimate MiB':>13} {'est. err':>9} {'scores MiB':>11}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['seq_len']:>6} {r['kernel']:>8} {r['step_s']:>8.3f} {r['time_vs_eager']:>8.2f} "
            f"{r['compiled_mib']:>13.1f} {r['estimate_mib']:>13.1f} {r['estimate_error']:>+9.1%} "
            f"{r['estimate_scores_mib']:>11.1f}"
        )
    pays = [t for t in lengths if by[(t, "chunked")]["step_s"] <= by[(t, "eager")]["step_s"]]
    print(f"chunked no slower than eager from: {min(pays) if pays else 'none of these'} tokens")
    result = {
        "shape": SHAPE,
        "device": "XLA:CPU, one device",
        "rows": rows,
        "chunked_pays_from": min(pays) if pays else None,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
