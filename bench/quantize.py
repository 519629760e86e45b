"""Quantized base and chunked loss, side by side: step time and the compiler's peak memory on XLA:CPU.

Six variants of one LoRA fine-tune (rank 16, bf16, a mid-width Llama-shaped model with a large
vocabulary so the logits matter): the frozen base in bf16 (what users run today), int8 or int4
(`model.quantize`), each with the plain loss and with the chunked one (`train.loss_chunk_tokens`).
Each variant runs the real `Trainer` in a fresh process (XLA keeps a process's compiled programs,
and the compile log must be on before the first compile) and reports:

- the compiler's own memory analysis of the training step program (per device: arguments,
  temporaries and the peak, `workbench.backend.xla.compile_log`), beside `estimate`'s figure;
- the base weights' bytes on the device (the sharding report's bytes of the frozen base);
- a steady step's wall time (tokens/s over the timed steps) and the final loss.

Ratios are against the bf16 base with the plain loss, run in the same invocation. XLA:CPU runs
with its memory-minimising scheduler (``--xla_cpu_enable_concurrency_optimized_scheduler=false``,
`runtime.XLA_CPU_MEMORY_SCHEDULER`; ``--default-scheduler`` turns it off): the default one computes every
weight-only value (each layer's weight converted to the compute dtype) at the start of the program,
which holds a converted copy of the whole base at once, quantized or not; TPU's scheduler is
memory-aware.

    .venv/bin/python bench/quantize.py [--hidden 1024 --layers 4 --vocab 32768 --batch 2 --seq 256 --steps 6]

Prints a table and writes bench/results/quantize.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from workbench.backend.xla.runtime import XLA_CPU_MEMORY_SCHEDULER

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before anything imports torch_xla
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results" / "quantize.json"
_MARK = "__VARIANT_RESULT__"
VARIANTS = [(q, chunk) for q in ("none", "int8", "int4") for chunk in (0, "chunked")]


def config(args: argparse.Namespace, quantize: str, chunk: int | str):
    from workbench.config import WorkbenchConfig

    return WorkbenchConfig().with_overrides(
        {
            "model.family": "llama",
            "model.hidden_size": args.hidden,
            "model.num_layers": args.layers,
            "model.num_heads": args.hidden // 64,
            "model.num_kv_heads": max(1, args.hidden // 256),
            "model.intermediate_size": args.hidden * 4,
            "model.tie_word_embeddings": False,
            "model.max_position_embeddings": args.seq,
            "model.quantize": quantize,
            "data.max_length": args.seq,
            "data.max_examples": args.batch * (args.steps + 2),
            "bucketing.strategy": "max",
            "lora.rank": 16,
            "train.device_type": "xla",
            "train.precision": "bf16",
            "train.gradient_checkpointing": True,
            "train.steps": args.steps,
            "train.batch_size": args.batch,
            "train.log_every": args.steps,
            "train.loss_chunk_tokens": args.batch * args.seq // 4 if chunk == "chunked" else 0,
            "train.learning_rate": 1e-3,
            "train.progress_bar": False,
            "train.compile_cache_dir": None,
        }
    )


def run_variant(args: argparse.Namespace, quantize: str, chunk: int | str) -> dict:
    """One variant in this process: the real Trainer, then the compiler's analysis of its step."""
    from workbench.analysis.estimate import estimate
    from workbench.backend.xla import compile_log
    from workbench.data.records import build_datasets
    from workbench.models.build import build_model
    from workbench.train import Trainer

    cfg = config(args, quantize, chunk)
    train_ds, eval_ds, tokenizer = build_datasets(cfg)
    model = build_model(cfg.model, vocab_size=args.vocab, seed=0)  # the tokenizer's ids are a subset
    trainer = Trainer(cfg, model=model, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds)
    result = trainer.fit()
    step = max(compile_log.compiled_memory_records(), key=lambda r: r.peak_bytes)
    est = estimate(
        trainer.model,
        batch_size=args.batch,
        seq_len=args.seq,
        precision="bf16",
        gradient_checkpointing=True,
        lora_rank=16,
        quantize=quantize,
        loss_chunk_tokens=cfg.train.loss_chunk_tokens,
    )
    base = [p for p in trainer.model.parameters() if not p.requires_grad]
    return {
        "quantize": quantize,
        "loss": "chunked" if chunk else "plain",
        "chunk_tokens": cfg.train.loss_chunk_tokens,
        "compiler_peak_bytes": step.peak_bytes,
        "compiler_argument_bytes": step.argument_bytes,
        "compiler_temp_bytes": step.temp_bytes,
        "estimate_bytes": est.total_bytes,
        "base_bytes": sum(p.numel() * p.element_size() for p in {id(p): p for p in base}.values()),
        "tokens_per_s": result.tokens_per_s,
        "final_loss": result.final_loss,
        "compiles_after_warmup": result.compiles_after_warmup,
    }


def in_fresh_process(args: argparse.Namespace, quantize: str, chunk: int | str) -> dict:
    argv = [sys.executable, __file__, "--variant", f"{quantize}:{chunk}", *args.passthrough]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT_XLA_DEBUG")}
    if not args.default_scheduler:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {XLA_CPU_MEMORY_SCHEDULER}".strip()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line[len(_MARK) :] for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"variant {quantize}/{chunk} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def table(rows: list[dict]) -> str:
    base = rows[0]
    mib = 2**20
    head = (
        f"{'base':<5} {'loss':<8} {'base MiB':>9} {'compiler peak MiB':>18} {'x':>5} {'temp MiB':>9} "
        f"{'estimate MiB':>13} {'est/comp':>8} {'tok/s':>8} {'x':>5} {'loss':>8} {'recompiles':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['quantize']:<5} {r['loss']:<8} {r['base_bytes'] / mib:>9.1f} {r['compiler_peak_bytes'] / mib:>18.1f} "
            f"{r['compiler_peak_bytes'] / base['compiler_peak_bytes']:>5.2f} {r['compiler_temp_bytes'] / mib:>9.1f} "
            f"{r['estimate_bytes'] / mib:>13.1f} {r['estimate_bytes'] / r['compiler_peak_bytes']:>8.2f} "
            f"{r['tokens_per_s'] or 0:>8.0f} {(r['tokens_per_s'] or 0) / (base['tokens_per_s'] or 1):>5.2f} "
            f"{r['final_loss']:>8.4f} {r['compiles_after_warmup']:>10}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--default-scheduler", action="store_true", help="XLA:CPU's default scheduler")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.passthrough = [
        f"--{k}={getattr(args, k)}" for k in ("hidden", "layers", "vocab", "batch", "seq", "steps")
    ]
    if args.variant:
        quantize, chunk = args.variant.split(":")
        print(_MARK + json.dumps(run_variant(args, quantize, 0 if chunk == "0" else chunk)), flush=True)
        return
    rows = []
    for quantize, chunk in VARIANTS:
        rows.append(in_fresh_process(args, quantize, chunk))
        print(f"  {quantize}/{rows[-1]['loss']} done", flush=True)
    scheduler = "default" if args.default_scheduler else "memory-minimising"
    print(
        f"\nLoRA r16, bf16, gradient checkpointing; llama hidden {args.hidden} x {args.layers} layers, vocab "
        f"{args.vocab}, batch {args.batch} x {args.seq}, XLA:CPU ({scheduler} scheduler; x: against the bf16 "
        "base, plain loss)\n"
    )
    print(table(rows))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k != "passthrough"}, "rows": rows}, indent=1
        )
    )
    print(f"\nwrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
