"""Compile time of a training step against depth, decoder stack unrolled and scanned, on XLA:CPU.

For each depth (2, 4, 8, 16, 32 layers by default) a Llama-style model of that depth (same
width, seed 0, fp32) is prepared by the trainer's `prepare_model` twice, unrolled and with
``model.scan_layers`` (`workbench.models.scan`), and trained `--steps` steps by the same
hand-written step (the trainer's inputs via `model_inputs`, the model's loss, backward, gradient
clipping at 1.0, AdamW with its state created up front as the trainer does, one sync). Both
variants of a depth run back to back in this one process, unrolled first, so drift on the
shared machine hits them alike.

Reported per depth and variant: the programs compiled and XLA's compile seconds
(`runtime.compile_time_s` deltas) over the run, the first step's wall time (tracing, lowering
and compiling: what a user waits for), a steady step's wall time (the last step), and the first
loss's difference between the two variants. Compile time of the unrolled step grows with depth;
the scanned step compiles one layer inside a loop, so its compile time stays about flat.

    .venv/bin/python bench/compile.py [--layers 2 4 8 16 32 --hidden 128 --seq 64 --steps 3]

Prints a table and writes bench/results/compile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before anything imports torch_xla
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results" / "compile.json"


def run_variant(args: argparse.Namespace, layers: int, *, scan: bool) -> dict:
    """Train `args.steps` steps of a `layers`-deep model; compile counts, seconds and losses."""
    import torch

    from workbench.backend import runtime
    from workbench.config import WorkbenchConfig
    from workbench.models.build import build_model
    from workbench.models.inputs import model_inputs
    from workbench.train.optim import build_optimizer, init_optimizer_state
    from workbench.train.trainer import prepare_model

    cfg = WorkbenchConfig().with_overrides(
        {
            "model.family": "llama",
            "model.num_layers": layers,
            "model.hidden_size": args.hidden,
            "model.num_heads": 4,
            "model.num_kv_heads": 2,
            "model.intermediate_size": args.hidden * 2,
            "model.vocab_size": args.vocab,
            "model.max_position_embeddings": args.seq,
            "model.scan_layers": scan,
            "train.learning_rate": 1e-3,
        }
    )
    dev = runtime.device()
    model = build_model(cfg.model, seed=0)
    model = prepare_model(model, cfg.train, xla=True, scan=scan)
    model.to(dev)
    model.tie_weights()  # `.to(xla)` unties the LM head from the embedding; the Trainer ties them again
    optimizer = build_optimizer(model, cfg.train)
    init_optimizer_state(optimizer)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, args.vocab, (args.batch, args.seq), generator=generator).to(dev)
    runtime.sync()
    runtime.wait_device_ops()

    compiles, compile_s = runtime.compile_count(), runtime.compile_time_s()
    step_walls, losses = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = model(**model_inputs({"input_ids": ids}, model), labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        runtime.sync()
        runtime.wait_device_ops()
        step_walls.append(time.perf_counter() - start)
    return {
        "layers": layers,
        "scanned": scan,
        "compiles": runtime.compile_count() - compiles,
        "compile_s": runtime.compile_time_s() - compile_s,
        "first_step_wall_s": step_walls[0],
        "steady_step_wall_s": step_walls[-1],
        "losses": [float(v) for v in runtime.to_cpu(losses)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error(f"--steps={args.steps} is not allowed: at least 2 (the last one is the steady step)")

    from workbench.analysis.tables import format_table

    runs = []
    for layers in args.layers:
        unrolled = run_variant(args, layers, scan=False)
        scanned = run_variant(args, layers, scan=True)
        runs += [unrolled, scanned]
        print(
            f"{layers:>3} layers: compile {unrolled['compile_s']:.1f} s unrolled, {scanned['compile_s']:.1f} s scanned",
            flush=True,
        )

    by_key = {(r["layers"], r["scanned"]): r for r in runs}
    base_unrolled = by_key[(args.layers[0], False)]["compile_s"]
    rows = []
    for layers in args.layers:
        unrolled, scanned = by_key[(layers, False)], by_key[(layers, True)]
        rows.append(
            {
                "layers": layers,
                "compile s unrolled": f"{unrolled['compile_s']:.1f}",
                "compile s scanned": f"{scanned['compile_s']:.1f}",
                "scanned / unrolled": f"{scanned['compile_s'] / unrolled['compile_s']:.2f}",
                f"unrolled / unrolled@{args.layers[0]}": f"{unrolled['compile_s'] / base_unrolled:.2f}",
                "first step s (unr / scan)": f"{unrolled['first_step_wall_s']:.1f} / {scanned['first_step_wall_s']:.1f}",
                "steady step s (unr / scan)": f"{unrolled['steady_step_wall_s']:.3f} / {scanned['steady_step_wall_s']:.3f}",
                "programs (unr / scan)": f"{unrolled['compiles']} / {scanned['compiles']}",
                "max |loss diff|": f"{max(abs(a - b) for a, b in zip(unrolled['losses'], scanned['losses'])):.1e}",
            }
        )
    print()
    print(
        f"XLA:CPU (1 device), Llama hidden={args.hidden}, vocab {args.vocab}, batch {args.batch} x {args.seq} tokens, "
        f"fp32, {args.steps} training steps per variant (forward, backward, clip, AdamW)"
    )
    print(format_table(rows))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"device": "XLA:CPU x1", "args": vars(args), "runs": runs}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
