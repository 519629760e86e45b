"""What a checkpoint save costs the training loop: written on the step (``train.async_checkpoint=false``)
against written in the background (the default), on XLA:CPU, in one process.

The model is Llama-shaped and sized so that its full fine-tuning state (fp32 weights and two AdamW
moments) takes seconds to write: ``--hidden 512 --layers 8`` is about 40M parameters, 0.5 GB of
state. Two targets: the local disk, and a slow one (a Drive mount, a network disk) simulated by a
throttled writer (`workbench.train.state_io.write_block` sleeping to hold ``--slow-mb-s``).

Each run trains ``--steps`` steps with a save every ``--every`` steps (the loop's own saves) and a
callback timing every iteration. Reported per run:
- stall per save: how long the loop waited for a save (``checkpoint_stall_s``: the copy to the host
  in the background mode; the copy and the whole write otherwise);
- the host copy alone and the whole write, timed inside the save;
- the median iteration without a save, and during a background write (the write shares the host);
- the run's wall time over the timed steps.

Also the file writer itself on the same state: `safetensors.torch.save_file` followed by the SHA-256
read the manifest needs (the previous writer) against the streaming writer that hashes as it
writes. Prints a table and writes bench/results/checkpoint.json.

    .venv/bin/python bench/checkpoint.py [--steps 24 --every 6 --slow-mb-s 100]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def throttle(bytes_per_s: float | None) -> None:
    """Make every block of a checkpoint file take at least its size / `bytes_per_s` to write."""
    from workbench.train import state_io

    real = getattr(throttle, "real", state_io.write_block)
    throttle.real = real  # type: ignore[attr-defined]
    if bytes_per_s is None:
        state_io.write_block = real
        return

    def slow(handle, block) -> None:
        start = time.perf_counter()
        real(handle, block)
        time.sleep(max(0.0, len(block) / bytes_per_s - (time.perf_counter() - start)))

    state_io.write_block = slow


def run(args: argparse.Namespace, *, background: bool, slow: bool, root: Path) -> dict:
    from workbench.config import WorkbenchConfig
    from workbench.train import Trainer

    throttle(args.slow_mb_s * 1e6 if slow else None)
    out = root / f"{'async' if background else 'sync'}-{'slow' if slow else 'disk'}"
    cfg = WorkbenchConfig().with_overrides(
        {
            "model.family": "llama",
            "model.hidden_size": args.hidden,
            "model.intermediate_size": args.hidden * 3,
            "model.num_layers": args.layers,
            "model.num_heads": 8,
            "model.num_kv_heads": 4,
            "data.max_length": 128,
            "bucketing.max_buckets": 1,
            "train.device_type": "xla",
            "train.steps": args.steps,
            "train.batch_size": 4,
            "train.log_every": 1,
            "train.progress_bar": False,
            "train.checkpoint_dir": str(out),
            "train.checkpoint_every": args.every,
            "train.keep_checkpoints": 1,
            "train.async_checkpoint": background,
        }
    )
    ends: list[float] = []
    trainer = Trainer(cfg, callbacks=[lambda m: ends.append(time.perf_counter())])
    timings = {"copy": [], "write": []}
    saves = trainer.checkpoints
    snapshot, write = saves.manager.snapshot, saves.manager.write

    def timed_snapshot(*a, **k):
        start = time.perf_counter()
        try:
            return snapshot(*a, **k)
        finally:
            timings["copy"].append(time.perf_counter() - start)

    def timed_write(*a, **k):
        start = time.perf_counter()
        try:
            return write(*a, **k)
        finally:
            timings["write"].append(time.perf_counter() - start)

    saves.manager.snapshot, saves.manager.write = timed_snapshot, timed_write
    result = trainer.fit()
    throttle(None)
    stalls = sorted({m["checkpoint_stall_s"] for m in result.history if m["checkpoint_stall_s"] is not None})
    iterations = [b - a for a, b in itertools.pairwise(ends)]  # iteration k+1: after step k's callback
    steps = [m["step"] for m in result.history]
    saved_after = {s for s in steps if s % args.every == 0}
    plain = [
        t for s, t in zip(steps[1:], iterations) if s - 1 not in saved_after and (s - 1) % args.every > 2
    ]
    during = [t for s, t in zip(steps[1:], iterations) if (s - 1) in saved_after]
    shutil.rmtree(out, ignore_errors=True)
    return {
        "mode": "background" if background else "on the step",
        "target": f"throttled {args.slow_mb_s:.0f} MB/s" if slow else "local disk",
        "saves": len(timings["write"]),
        "stall_per_save_s": statistics.median(stalls) if stalls else None,
        "host_copy_s": statistics.median(timings["copy"][:-1] or timings["copy"]),
        "write_s": statistics.median(timings["write"][:-1] or timings["write"]),
        "iteration_s": statistics.median(plain) if plain else None,
        "iteration_after_save_s": statistics.median(during) if during else None,
        "wall_s": ends[-1] - ends[0],
        "state_bytes": trainer.training_state.nbytes(),
    }


def writer_comparison(args: argparse.Namespace, root: Path) -> dict:
    """The previous file writer (save_file, then read back for SHA-256) against the streaming one: medians
    of 5 alternating rounds."""
    import torch
    from safetensors.torch import save_file

    from workbench.train.state_io import save_safetensors, sha256

    n = args.hidden * args.hidden * args.layers * 12 * 3  # about the runs' state, as fp32 tensors
    tensors = {f"t{i}": torch.randn(n // 24) for i in range(24)}
    olds, news = [], []
    for round_ in range(5):  # alternating, medians: one write swings with the page cache
        for writer in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
            start = time.perf_counter()
            if writer == "old":
                save_file(tensors, str(root / "old.safetensors"))
                sha256(root / "old.safetensors")
                olds.append(time.perf_counter() - start)
            else:
                save_safetensors(tensors, root / "new.safetensors")
                news.append(time.perf_counter() - start)
    old, new = statistics.median(olds), statistics.median(news)
    size = (root / "new.safetensors").stat().st_size
    return {"bytes": size, "save_file_then_hash_s": old, "streaming_hashed_s": new, "ratio": old / new}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--slow-mb-s", type=float, default=100.0)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "checkpoint.json"))
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    rows = []
    for slow in (False, True):
        for background in (False, True):
            rows.append(run(args, background=background, slow=slow, root=root))
            print(f"  done: {rows[-1]['mode']}, {rows[-1]['target']}", flush=True)
    writer = writer_comparison(args, root)
    shutil.rmtree(root, ignore_errors=True)

    state = rows[0]["state_bytes"] / 1e6
    print(
        f"\ncheckpoint saves on XLA:CPU: {state:.0f} MB of state, a save every {args.every} of {args.steps} steps"
    )
    head = f"{'target':<22}{'save':<14}{'stall/save':>11}{'host copy':>11}{'write':>9}{'iter':>8}{'iter@save':>11}{'wall':>8}"
    print(head)
    for r in rows:

        def f(v):
            return "n/a" if v is None else f"{v:.2f}s"

        print(
            f"{r['target']:<22}{r['mode']:<14}{f(r['stall_per_save_s']):>11}{f(r['host_copy_s']):>11}"
            f"{f(r['write_s']):>9}{f(r['iteration_s']):>8}{f(r['iteration_after_save_s']):>11}{r['wall_s']:>7.1f}s"
        )
    for target in ("local disk", f"throttled {args.slow_mb_s:.0f} MB/s"):
        sync, bg = (
            next(r for r in rows if r["target"] == target and r["mode"] == m)
            for m in ("on the step", "background")
        )
        print(
            f"{target}: stall per save {sync['stall_per_save_s']:.2f}s -> {bg['stall_per_save_s']:.2f}s "
            f"({sync['stall_per_save_s'] / bg['stall_per_save_s']:.0f}x less)"
        )
    print(
        f"file writer, {writer['bytes'] / 1e6:.0f} MB: save_file + SHA-256 read {writer['save_file_then_hash_s']:.2f}s, "
        f"streaming with the hash {writer['streaming_hashed_s']:.2f}s ({writer['ratio']:.2f}x)"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "runs": rows, "writer": writer}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
