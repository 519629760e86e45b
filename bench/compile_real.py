"""Real-shape rows of bench/compile.py: the user's training command, timed whole, unrolled vs scanned vs auto.

For each published shape (`bench/real_shapes.py`: SmolLM2-135M at its 30 layers, Qwen2.5-0.5B at
its 24; random weights saved in bf16 with a tokenizer, made once into a cache directory) x mode
(full fine-tune, LoRA rank 16) x ``model.scan_layers`` (false, true, auto), one fresh process runs
the command a user types, timed from outside from start to exit:

    python -m workbench train --config configs/quickstart.yaml model.pretrained_path=DIR
        data.tokenizer_path=DIR data.source=chat-sample data.chat=true lora.rank=16 train.steps=6
        train.batch_size=4 train.device_type=xla train.log_every=1 model.scan_layers=S --metrics-out F

(``lora.rank=0`` for the full fine-tune; ``train.log_every=1`` so every step's time and loss land
in ``--metrics-out``). The process is ``bench/compile_real.py --cli COUNTERS train ...``, which calls
`workbench.__main__.main` as ``-m workbench`` does and then writes the process's XLA compile count
and seconds (torch_xla's CompileTime metric), which ``--metrics-out`` does not carry: its intervals
start after the warm-up.

Reported per run: the whole command's wall seconds, the warm-up's programs (the trainer's count),
every program the process compiled and the seconds XLA spent on them, the steady step (median of
the steps after the first) and the final loss; with several rounds, each run's fastest round (least
wall time: the machine is shared). Per shape and mode: scanned / unrolled (wall, compile, step),
auto / min(unrolled, scanned) wall, what auto chose, and |loss scanned - loss unrolled| / |loss unrolled|.

    .venv/bin/python bench/compile.py --real [--shapes smollm2-135m qwen2.5-0.5b --modes full lora
        --scan false true auto --steps 6 --rounds 1 --layers-override N --checkpoints DIR]

Prints two tables and writes bench/results/compile_real.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "compile_real.json"
CHECKPOINTS = REPO / "bench" / "results" / "checkpoints"  # bench/results/ is git-ignored
SHAPES = ("smollm2-135m", "qwen2.5-0.5b")
MODES = {"full": 0, "lora": 16}
"""Mode -> ``lora.rank``."""
SCAN_SETTINGS = ("false", "true", "auto")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The real-shape flags of bench/compile.py (``--steps`` and ``--rounds`` are shared)."""
    parser.add_argument(
        "--real", action="store_true", help="run the real-shape rows instead of the depth rows"
    )
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=list(MODES))
    parser.add_argument("--scan", nargs="+", choices=SCAN_SETTINGS, default=list(SCAN_SETTINGS))
    parser.add_argument(
        "--layers-override", type=int, default=None, help="cut every shape to N layers (smoke tests)"
    )
    parser.add_argument("--checkpoints", default=str(CHECKPOINTS), help="checkpoint cache directory")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])


def checkpoint(shape: str, args: argparse.Namespace) -> tuple[Path, int]:
    """The cached checkpoint of `shape` (made in a subprocess the first time) and its depth."""
    from bench.real_shapes import REAL_SHAPES

    layers = args.layers_override or int(REAL_SHAPES[shape]["num_hidden_layers"])
    out = Path(args.checkpoints) / f"{shape}-{layers}l-{args.dtype}"
    if not (out / "config.json").is_file():
        print(f"making {out} ...", file=sys.stderr, flush=True)
        make = [sys.executable, str(REPO / "bench" / "real_shapes.py"), shape, str(out)]
        subprocess.run([*make, "--layers", str(layers), "--dtype", args.dtype], check=True, cwd=REPO)
    return out, layers


def train_arguments(ckpt: Path, mode: str, scan: str, steps: int, metrics_out: Path) -> list[str]:
    """``train ...``: the user's command line after ``python -m workbench``."""
    return [
        "train",
        "--config",
        "configs/quickstart.yaml",
        f"model.pretrained_path={ckpt}",
        f"data.tokenizer_path={ckpt}",
        "data.source=chat-sample",
        "data.chat=true",
        f"lora.rank={MODES[mode]}",
        f"train.steps={steps}",
        "train.batch_size=4",
        "train.device_type=xla",
        "train.log_every=1",
        f"model.scan_layers={scan}",
        "--metrics-out",
        str(metrics_out),
    ]


def run_command(shape: str, ckpt: Path, layers: int, mode: str, scan: str, steps: int) -> dict[str, Any]:
    """One fresh process of the training command, timed whole; its figures as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics_out, counters_out = Path(tmp) / "metrics.json", Path(tmp) / "counters.json"
        argv = train_arguments(ckpt, mode, scan, steps, metrics_out)
        start = time.perf_counter()
        child = subprocess.run(
            [sys.executable, __file__, "--cli", str(counters_out), *argv],
            cwd=REPO,
            env=os.environ | {"PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")},  # XLA:CPU unless set
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wall_s = time.perf_counter() - start
        report = json.loads(metrics_out.read_text()) if metrics_out.is_file() else {}
        counters = json.loads(counters_out.read_text()) if counters_out.is_file() else {}
    run = {"shape": shape, "layers": layers, "mode": mode, "scan_layers": scan, "wall_s": wall_s}
    run |= {"exit_code": child.returncode, "status": report.get("status", "no metrics")}
    run |= {"command": shlex.join([".venv/bin/python", "-m", "workbench", *argv])}
    if child.returncode != 0 or not counters:
        return run | {"output_tail": child.stdout.splitlines()[-20:]}
    result, history = report["result"], report["history"]
    step_times = [h["step_time_s"] for h in history]
    notices = [n for n in result["notices"] if n.startswith("model.scan_layers=auto:")]
    return run | {
        "warmup_compiles": result["warmup_compiles"],
        "compiles_after_warmup": result["compiles_after_warmup"],
        "programs": counters["compiles"],
        "compile_s": counters["compile_s"],
        "step_times_s": step_times,
        "steady_step_s": statistics.median(step_times[1:] or step_times),
        "losses": [h["loss"] for h in history],
        "final_loss": result["final_loss"],
        "auto_notice": notices[0] if notices else None,
    }


def describe(run: dict[str, Any]) -> str:
    """One progress line for a finished run."""
    head = f"{run['shape']} ({run['layers']} layers) {run['mode']} scan_layers={run['scan_layers']}"
    if "compile_s" not in run:
        return f"{head}: FAILED (exit {run['exit_code']}) after {run['wall_s']:.0f} s\n  " + "\n  ".join(
            run.get("output_tail", [])
        )
    return (
        f"{head}: {run['wall_s']:.1f} s wall, {run['warmup_compiles']} warm-up compiles, "
        f"{run['compile_s']:.1f} s compiling, {run['steady_step_s']:.2f} s/step, loss {run['final_loss']:.4f}"
    )


def fastest(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (shape, mode, setting), the round with the least wall time, every round's figures beside it."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["shape"], run["mode"], run["scan_layers"]), []).append(run)
    best = []
    for group in groups.values():
        ok = [r for r in group if "compile_s" in r] or group
        pick = dict(min(ok, key=lambda r: r["wall_s"]))
        pick["rounds"] = [{k: r.get(k) for k in ("wall_s", "compile_s", "steady_step_s")} for r in group]
        best.append(pick)
    return best


def run_table(runs: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One row per run: the figures the brief asks for."""
    rows = []
    for r in runs:
        ok = "compile_s" in r
        rows.append(
            {
                "shape": r["shape"],
                "layers": str(r["layers"]),
                "mode": r["mode"],
                "scan_layers": r["scan_layers"],
                "wall s": f"{r['wall_s']:.1f}",
                "warm-up compiles": str(r["warmup_compiles"]) if ok else "failed",
                "programs": str(r["programs"]) if ok else "-",
                "compile s": f"{r['compile_s']:.1f}" if ok else "-",
                "steady step s": f"{r['steady_step_s']:.3f}" if ok else "-",
                "final loss": f"{r['final_loss']:.4f}" if ok else "-",
            }
        )
    return rows


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> str:
    return f"{a[key] / b[key]:.2f}" if a and b and b[key] else "n/a"


def ratio_table(runs: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Per shape and mode: scanned / unrolled, auto / the better of the two, the loss difference."""
    by_key = {(r["shape"], r["mode"], r["scan_layers"]): r for r in runs if "compile_s" in r}
    rows = []
    for shape, mode in dict.fromkeys((r["shape"], r["mode"]) for r in runs):
        unr, scan, auto = (by_key.get((shape, mode, s)) for s in SCAN_SETTINGS)
        best = min((unr, scan), key=lambda r: r["wall_s"]) if unr and scan else None
        notice = (auto or {}).get("auto_notice") or ""
        chose = "scanned" if ": scanned" in notice else "unrolled" if ": unrolled" in notice else "n/a"
        diff = abs(scan["final_loss"] - unr["final_loss"]) / abs(unr["final_loss"]) if unr and scan else None
        rows.append(
            {
                "shape": shape,
                "mode": mode,
                "wall scan/unr": _ratio(scan, unr, "wall_s"),
                "compile s scan/unr": _ratio(scan, unr, "compile_s"),
                "step scan/unr": _ratio(scan, unr, "steady_step_s"),
                "auto chose": chose,
                "wall auto/min(unr, scan)": _ratio(auto, best, "wall_s"),
                "rel loss diff scan vs unr": "n/a" if diff is None else f"{diff:.1e}",
            }
        )
    return rows


def run_real(args: argparse.Namespace) -> None:
    """Every shape x mode x setting, `args.rounds` times (round-major, so rounds spread over time)."""
    from workbench.analysis.tables import format_table

    checkpoints = {shape: checkpoint(shape, args) for shape in args.shapes}
    runs = []
    for index in range(args.rounds):
        print(f"round {index + 1}/{args.rounds}", file=sys.stderr, flush=True)
        for shape, (ckpt, layers) in checkpoints.items():
            for mode in args.modes:
                for scan in args.scan:
                    runs.append(run_command(shape, ckpt, layers, mode, scan, args.steps) | {"round": index})
                    print("  " + describe(runs[-1]), file=sys.stderr, flush=True)
    best = fastest(runs)
    print()
    print(
        f"XLA:CPU, `python -m workbench train` (quickstart config, chat-sample data, batch 4, {args.steps} steps, "
        f"{args.dtype} checkpoint, trained in its dtype), one fresh process per run, fastest of {args.rounds} round(s)"
    )
    print(format_table(run_table(best)))
    print()
    print(format_table(ratio_table(best)))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    env = {k: os.environ.get(k) for k in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "XLA_FLAGS")}
    RESULTS.write_text(
        json.dumps({"device": "XLA:CPU", "env": env, "args": vars(args), "runs": best}, indent=2)
    )
    print(f"wrote {RESULTS}")


def cli_child(counters_out: str, argv: list[str]) -> None:
    """``python -m workbench ARGV``, then the process's XLA compile count and seconds to `counters_out`."""
    sys.path[0] = str(REPO)  # as `python -m` from the repository: not bench/, whose modules shadow names
    from workbench.__main__ import main

    code = main(argv)
    from workbench.backend.xla import runtime

    counters = {"compiles": runtime.compile_count(), "compile_s": runtime.compile_time_s()}
    Path(counters_out).write_text(json.dumps(counters))
    sys.exit(code)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--cli":
        sys.exit(
            "run through bench/compile.py --real (this module's own entry is `--cli COUNTERS train ...`)"
        )
    cli_child(sys.argv[2], sys.argv[3:])
