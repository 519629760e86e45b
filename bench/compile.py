"""Compile time, decoder stack unrolled vs scanned (``model.scan_layers``), on XLA:CPU: depth rows; --real: published shapes.

The depth rows measure compile time against depth; ``--real`` times the real training command on
published shapes with ``model.scan_layers`` false, true and auto.

Depth rows (the default). For each depth (2, 4, 8, 16, 32 layers by default) a Llama-style model
of that depth (same width, seed 0, fp32) is prepared by the trainer's `prepare_model` twice,
unrolled and scanned (`workbench.models.scan`: the layers' weights held stacked, ``[layers, ...]``,
by `workbench.models.layer_stack`), and both run back to back in one process, unrolled first:

- forward + backward alone (the trainer's inputs via `model_inputs`, the model's loss,
  ``backward``, one sync): the part the scan compiles once for all layers;
- then `--steps` training steps (the same, plus gradient clipping at 1.0 and AdamW with its
  state created up front as the trainer does): one program, whose clipping and optimizer update
  are element-wise kernels per parameter tensor: one per layer's tensor unrolled, one per
  stacked tensor scanned.

Reported per depth and variant: XLA's compile seconds for each program (`runtime.compile_time_s`
deltas), the programs the training steps compiled, a steady step's wall time (the last step),
and the largest difference between the two variants' losses. Each round runs in a fresh
process (XLA keeps a process's compiled programs, so a repeat would compile nothing); the
table shows each figure's least disturbed round (fewest compile seconds; the machine is shared).

    .venv/bin/python bench/compile.py [--layers 2 4 8 16 32 --hidden 128 --seq 64 --steps 3 --rounds 2]

Prints a table and writes bench/results/compile.json.

Real-shape rows (``--real``, `bench/compile_real.py`): SmolLM2-135M (30 layers) and Qwen2.5-0.5B
(24 layers) checkpoints with random weights; for each, full fine-tune and LoRA rank 16, each with
``model.scan_layers`` false, true and auto, the user's ``python -m workbench train ...`` command in
a fresh process timed whole: wall seconds, warm-up compiles, compile seconds, steady step, final loss.

    .venv/bin/python bench/compile.py --real [--shapes ... --modes full lora --steps 6 --rounds 1]

Prints two tables and writes bench/results/compile_real.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before anything imports torch_xla
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results" / "compile.json"
_MARK = "__ROUND_RESULT__"


def run_variant(args: argparse.Namespace, layers: int, *, scan: bool) -> dict:
    """Train `args.steps` steps of a `layers`-deep model; compile counts, seconds and losses."""
    import torch

    from workbench.backend.xla import runtime
    from workbench.config import WorkbenchConfig
    from workbench.models.build import build_model
    from workbench.models.inputs import model_inputs
    from workbench.train.model_setup import prepare_model
    from workbench.train.optim import build_optimizer, init_optimizer_state

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
            "data.max_length": args.seq,
            "model.scan_layers": scan,
            "train.learning_rate": 1e-3,
        }
    )
    dev = runtime.device()
    model = build_model(cfg.model, seed=0)
    model = prepare_model(model, cfg.train, cfg.model, xla=True)
    model.to(dev)
    model.tie_weights()  # `.to(xla)` unties the LM head from the embedding; the Trainer ties them again
    optimizer = build_optimizer(model, cfg.train)
    init_optimizer_state(optimizer)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, args.vocab, (args.batch, args.seq), generator=generator).to(dev)
    runtime.sync()
    runtime.wait_device_ops()

    # forward + backward alone (the part the scan changes), as its own program
    compiles, compile_s = runtime.compile_count(), runtime.compile_time_s()
    start = time.perf_counter()
    model(**model_inputs({"input_ids": ids}, model), labels=ids).loss.backward()
    runtime.sync()
    runtime.wait_device_ops()
    grad_wall_s = time.perf_counter() - start
    grad_compile_s = runtime.compile_time_s() - compile_s
    optimizer.zero_grad(set_to_none=True)

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
        "grad_compile_s": grad_compile_s,
        "grad_wall_s": grad_wall_s,
        "compiles": runtime.compile_count() - compiles,
        "compile_s": runtime.compile_time_s() - compile_s,
        "first_step_wall_s": step_walls[0],
        "steady_step_wall_s": step_walls[-1],
        "losses": [float(v) for v in runtime.to_cpu(losses)],
    }


def one_round(args: argparse.Namespace) -> list[dict]:
    """Every depth, unrolled then scanned, in this process (a fresh one per round: XLA keeps
    compiled programs for the process's lifetime, so a repeat here would compile nothing)."""
    runs = []
    for layers in args.layers:
        for scan in (False, True):
            runs.append(run_variant(args, layers, scan=scan))
        unrolled, scanned = runs[-2:]
        print(
            f"{layers:>3} layers: forward+backward compile {unrolled['grad_compile_s']:.1f} s unrolled, "
            f"{scanned['grad_compile_s']:.1f} s scanned; training step {unrolled['compile_s']:.1f} s unrolled, "
            f"{scanned['compile_s']:.1f} s scanned",
            file=sys.stderr,
            flush=True,
        )
    return runs


def fastest(rounds: list[list[dict]]) -> list[dict]:
    """Per depth and variant, the round with the least compile seconds (the least disturbed by
    other work on a shared machine), with every round's figures beside it."""
    best = []
    for runs in zip(*rounds):
        pick = dict(min(runs, key=lambda r: r["grad_compile_s"] + r["compile_s"]))
        pick["rounds"] = [
            {k: r[k] for k in ("grad_compile_s", "compile_s", "steady_step_wall_s")} for r in runs
        ]
        best.append(pick)
    return best


def main() -> None:
    from bench import compile_real  # the real-shape rows (``--real``)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="default 3, with --real 6")
    parser.add_argument("--rounds", type=int, default=None, help="default 2, with --real 1")
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    compile_real.add_arguments(parser)
    args = parser.parse_args()
    args.steps = args.steps if args.steps is not None else 6 if args.real else 3
    args.rounds = args.rounds if args.rounds is not None else 1 if args.real else 2
    if args.steps < 2:
        parser.error(f"--steps={args.steps} is not allowed: at least 2 (the last one is the steady step)")
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} is not allowed: at least 1")
    if args.real:
        compile_real.run_real(args)
        return
    if args.one_round:
        print(_MARK + json.dumps(one_round(args)), flush=True)
        return

    from workbench.analysis.tables import format_table

    rounds = []
    for index in range(args.rounds):
        print(f"round {index + 1}/{args.rounds}", flush=True)
        child = subprocess.run(
            [sys.executable, __file__, "--one-round", *sys.argv[1:]],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
        (line,) = [x for x in child.stdout.splitlines() if x.startswith(_MARK)]
        rounds.append(json.loads(line[len(_MARK) :]))
    runs = fastest(rounds)

    by_key = {(r["layers"], r["scanned"]): r for r in runs}
    first = args.layers[0]
    rows = []
    for layers in args.layers:
        unrolled, scanned = by_key[(layers, False)], by_key[(layers, True)]
        rows.append(
            {
                "layers": layers,
                "fwd+bwd compile s unrolled": f"{unrolled['grad_compile_s']:.1f}",
                "fwd+bwd compile s scanned": f"{scanned['grad_compile_s']:.1f}",
                f"scanned vs scanned@{first}": f"{scanned['grad_compile_s'] / by_key[(first, True)]['grad_compile_s']:.2f}",
                "step compile s unrolled": f"{unrolled['compile_s']:.1f}",
                "step compile s scanned": f"{scanned['compile_s']:.1f}",
                "steady step s (unr / scan)": f"{unrolled['steady_step_wall_s']:.3f} / {scanned['steady_step_wall_s']:.3f}",
                "programs (unr / scan)": f"{unrolled['compiles']} / {scanned['compiles']}",
                "max |loss diff|": f"{max(abs(a - b) for a, b in zip(unrolled['losses'], scanned['losses'])):.1e}",
            }
        )
    print()
    print(
        f"XLA:CPU (1 device), Llama hidden={args.hidden}, vocab {args.vocab}, batch {args.batch} x {args.seq} tokens, "
        f"fp32, {args.steps} training steps per variant (forward, backward, clip, AdamW), "
        f"fastest of {args.rounds} rounds"
    )
    print(format_table(rows))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"device": "XLA:CPU x1", "args": vars(args), "runs": runs}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
