"""The compiled native step (``train.compile: on``, inductor) against the eager one, on the CPU.

Two runs per config, the same seed, data and batches, one process each after the other:
``train.compile=off`` (eager) and ``train.compile=on`` (torch.compile, inductor, static shapes: one
graph per bucket shape, compiled in warm-up). Configs:

- **quickstart**: ``configs/quickstart.yaml`` as shipped (2 layers, 64 wide, 4 buckets, 30 steps);
- **smollm2-135m**: SmolLM2-135M's published shape (`bench/real_shapes.py`: 30 layers, 576 wide, a
  49152 vocabulary, random weights), a full fine-tune in fp32 at a short length with packed rows
  (one shape), a few steps.

Each row: tokens/s after warm-up (the trainer's own clock), warm-up seconds (the compiled run's:
every shape compiled and run once; an eager CPU run has no warm-up), the compile seconds
(warm-up less what its steps take eagerly; inductor's own time for the forward graphs beside it),
graphs compiled and compiles after warm-up, the final loss, and for the compiled run the steps it
must train before its compile has paid for itself (``break_even_steps``: compile seconds over the
seconds it saves per step; None when it saves none). These figures set ``train.compile: auto``'s
rule (`workbench.train.compiled_step`). Prints a table and writes bench/results/compile_native.json.

    .venv/bin/python bench/compile_native.py [--configs quickstart smollm2-135m] [--smol-steps 6]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("USE_TORCH_XLA", "0")  # a plain-torch run: nothing may pick torch_xla's device
# a cold compile: inductor's on-disk caches (kernels, FX graphs) start empty, as in a fresh session
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-cache-"))

from bench.real_shapes import make_checkpoint  # noqa: E402

RESULTS = REPO / "bench" / "results" / "compile_native.json"


def overrides(name: str, args: argparse.Namespace, work: Path) -> tuple[Path | None, list[str]]:
    """The config file and overrides of bench config `name` (the compile setting added per run)."""
    common = ["train.device_type=cpu", "train.progress_bar=false", "train.checkpoint_dir=null"]
    if name == "quickstart":
        return REPO / "configs" / "quickstart.yaml", [*common, f"train.steps={args.steps}"]
    ckpt = make_checkpoint("smollm2-135m", work / "smollm2-135m", dtype="float32")
    return None, [
        *common,
        f"model.pretrained_path={ckpt}",
        "data.source=embedded",
        f"data.max_length={args.smol_length}",
        "bucketing.packing=true",
        f"train.batch_size={args.smol_batch}",
        f"train.steps={args.smol_steps}",
        f"train.log_every={args.smol_steps}",
        "train.warmup_steps=1",
        "train.learning_rate=1e-5",
        "train.loss_chunk_tokens=0",
    ]


def run(config_file: Path | None, settings: list[str], compile_setting: str) -> dict[str, Any]:
    """One `Trainer.fit()`; its throughput, warm-up and compile figures."""
    import torch

    from workbench.backend.native import dynamo_compiles
    from workbench.config import load_config
    from workbench.data.records import build_datasets
    from workbench.train import Trainer

    torch.manual_seed(0)
    cfg = load_config(config_file, [*settings, f"train.compile={compile_setting}"])
    train_ds, eval_ds, tokenizer = build_datasets(cfg)
    trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds)
    timed: dict[str, float] = {}
    warm_up = trainer._warm_up

    def timed_warm_up() -> int:  # the bench's own clock around the trainer's warm-up
        start = time.perf_counter()
        try:
            return warm_up()
        finally:
            timed["warmup_s"] = time.perf_counter() - start

    trainer._warm_up = timed_warm_up  # type: ignore[method-assign]
    backend_s = dynamo_compiles.graph_compile_s()
    start = time.perf_counter()
    result = trainer.fit()
    wall = time.perf_counter() - start
    shapes = trainer.data.shapes(trainer.loop.batch_size, trainer.data.train_dataset)
    row = {
        "compile": compile_setting,
        "compiled": trainer.engine.compiled is not None,
        "tokens_per_s": result.tokens_per_s,
        "warmup_s": timed.get("warmup_s", 0.0),
        "inductor_forward_compile_s": dynamo_compiles.graph_compile_s() - backend_s,
        "graphs": result.warmup_compiles,
        "compiles_after_warmup": result.compiles_after_warmup,
        "bucket_shapes": len(shapes),
        "steps": result.steps,
        "wall_s": wall,
        "final_loss": result.final_loss,
        "tokens_per_step": trainer.loop.tokens_seen / max(result.steps, 1),
    }
    del trainer
    gc.collect()
    return row


def compare(eager: dict[str, Any], compiled: dict[str, Any]) -> dict[str, Any]:
    """Speed-up, compile seconds and the steps a compiled run needs to pay for its compile."""
    step_eager = eager["tokens_per_step"] / eager["tokens_per_s"]
    step_compiled = compiled["tokens_per_step"] / compiled["tokens_per_s"]
    # warm-up runs one step per shape: what those steps cost eagerly is not compiling
    compile_s = max(compiled["warmup_s"] - compiled["bucket_shapes"] * step_eager, 0.0)
    saved = step_eager - step_compiled
    return {
        "speedup": compiled["tokens_per_s"] / eager["tokens_per_s"],
        "compile_s": compile_s,
        "step_s_eager": step_eager,
        "step_s_compiled": step_compiled,
        "break_even_steps": compile_s / saved if saved > 0 else None,
        "final_loss_difference": abs(compiled["final_loss"] - eager["final_loss"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=["quickstart", "smollm2-135m"])
    parser.add_argument("--steps", type=int, default=30, help="quickstart steps")
    parser.add_argument("--smol-steps", type=int, default=6)
    parser.add_argument("--smol-length", type=int, default=128)
    parser.add_argument("--smol-batch", type=int, default=2)
    args = parser.parse_args()
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            config_file, settings = overrides(name, args, Path(tmp))
            eager = run(config_file, settings, "off")
            compiled = run(config_file, settings, "on")
            rows.append({"config": name, "eager": eager, "compiled": compiled, **compare(eager, compiled)})
            print(json.dumps(rows[-1], indent=1), flush=True)
    header = f"{'config':<14}{'eager tok/s':>12}{'compiled':>10}{'speed-up':>9}{'compile s':>10}{'graphs':>7}"
    print(header + f"{'after':>6}{'break-even steps':>17}{'loss diff':>10}")
    for r in rows:
        even = "never" if r["break_even_steps"] is None else f"{r['break_even_steps']:.0f}"
        print(
            f"{r['config']:<14}{r['eager']['tokens_per_s']:>12.0f}{r['compiled']['tokens_per_s']:>10.0f}"
            f"{r['speedup']:>8.2f}x{r['compile_s']:>10.1f}{r['compiled']['graphs']:>7}"
            f"{r['compiled']['compiles_after_warmup']:>6}{even:>17}{r['final_loss_difference']:>10.1e}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {"torch": torch.__version__, "cpus": os.cpu_count(), "backend": "inductor", "rows": rows}
    RESULTS.write_text(json.dumps(payload, indent=1))
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
