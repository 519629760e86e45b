"""The CUDA path on one GPU, run for real: training (LoRA and full), generation and a torchrun rank.

On a real published shape (`bench/real_shapes.py`: Qwen2.5-0.5B by default, random weights in bf16,
a tokenizer beside them), in one process:

- **LoRA** as ``configs/qwen2.5-0.5b-lora.yaml`` sets it up (bf16 base, r16 on every projection,
  gradient checkpointing, chunked loss), and a **full fine-tune** (fp32 master weights, bf16-mixed
  autocast, AdamW): the workbench `Trainer` against `transformers.Trainer` (with peft for LoRA) on
  the same model, batch and length (its rows: random tokens, one full-length sequence each, so its
  loss is not comparable). The workbench's rows are packed full (``bucketing.packing``), so every token is real
  and the shape is the one the estimate is asked about. Each run reports tokens/s after warm-up and
  the step's peak memory (``torch.cuda.max_memory_allocated``) beside the workbench's estimate for
  the same config (`workbench.analysis.estimate.estimate`, the kernel the run chose).
- **Generation** from the LoRA run's saved adapter (``load_for_inference``, as ``generate --model``
  does): `workbench.generate` against ``model.generate``, greedy, the same prompts and lengths, the
  second of two calls timed.
- **torchrun on nccl**: ``python -m workbench train --nproc 1 train.device_type=cuda`` (the process
  group on nccl, the sums over ranks, a DCP checkpoint), then the same command again to resume.

``--set KEY=VALUE`` adds a config override to the workbench's runs (e.g. full-length rows instead of packed
ones: ``--set data.source=FILE --set bucketing.packing=false --set bucketing.strategy=max``). Prints a table and
writes bench/results/cuda.json. ``--device cpu`` runs the same path on the CPU
at a small size (a check of the script, not a measurement).

    python bench/cuda.py                                 # on a GPU machine
    python bench/cuda.py --device cpu --shape smollm2-135m --layers 2 --seq 128 --batch 2 --steps 4
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# no XLA here: accelerate (under transformers.Trainer and peft) would put a CPU run on torch_xla's device
os.environ.setdefault("USE_TORCH_XLA", "0")

from bench.real_shapes import make_checkpoint  # noqa: E402
from workbench.units import GiB  # noqa: E402

RESULTS = REPO / "bench" / "results" / "cuda.json"
PROMPTS = [
    "How do I open a file in Python?",
    "Write a haiku about the sea.",
    "What is the capital of France?",
    "Explain gradient descent in one sentence.",
    "List three prime numbers.",
    "Translate 'good morning' into German.",
    "Why is the sky blue?",
    "Name a sorting algorithm.",
]


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: str) -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated()) if device == "cuda" else None


def workbench_overrides(args: argparse.Namespace, ckpt: Path, lora: bool) -> list[str]:
    """The LoRA recipe's config (or a full fine-tune of the same model) at the bench's batch and length."""
    common = [
        f"model.pretrained_path={ckpt}",
        "data.source=embedded",
        "data.chat=false",
        "bucketing.packing=true",
        f"data.max_length={args.seq}",
        f"train.batch_size={args.batch}",
        f"train.steps={args.steps}",
        "train.warmup_steps=2",
        f"train.log_every={args.log_every}",
        "train.eval_every=0",
        "train.checkpoint_dir=null",
        "train.progress_bar=false",
        f"train.device_type={args.device}",
    ]
    common += args.set
    if lora:
        return common
    return [
        *common,
        "lora.rank=0",
        "train.precision=bf16-mixed",
        "train.gradient_checkpointing=false",
        "train.learning_rate=1e-5",
    ]


def workbench_run(
    args: argparse.Namespace, ckpt: Path, lora: bool, adapter_dir: Path | None
) -> dict[str, Any]:
    """One `Trainer.fit()` as the train command builds it; tokens/s, peak memory and the estimate."""
    import torch

    from workbench.analysis.estimate import config_settings, estimate
    from workbench.backend.hardware import detect
    from workbench.config import load_config
    from workbench.data.records import build_datasets
    from workbench.train import Trainer

    cfg = load_config(REPO / "configs" / "qwen2.5-0.5b-lora.yaml", workbench_overrides(args, ckpt, lora))
    hw = detect(cfg.train.device_type)
    train_ds, eval_ds, tokenizer = build_datasets(cfg)
    reset_peak(args.device)
    trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, hardware=hw)
    kernel = str(trainer.model.config._attn_implementation)
    start = time.perf_counter()
    result = trainer.fit()
    sync(args.device)
    wall = time.perf_counter() - start
    peak = peak_bytes(args.device)
    est = estimate(
        cfg.model,
        **config_settings(cfg),
        batch_size=cfg.train.batch_size,
        seq_len=cfg.data.max_length,
        attention=kernel,
        memory_bytes=hw.memory_per_device_bytes,
    )
    if adapter_dir is not None:
        trainer.save_pretrained(adapter_dir)
    row = {
        "run": "workbench",
        "mode": "LoRA r16" if lora else "full",
        "precision": cfg.train.precision,
        "gradient_checkpointing": cfg.train.gradient_checkpointing,
        "attention": kernel,
        "tokens_per_s": result.tokens_per_s,
        "final_loss": result.final_loss,
        "wall_s": wall,
        "peak_bytes": peak,
        "estimate_bytes": est.total_bytes,
        "estimate_breakdown": est.breakdown,
        "notices": result.notices,
    }
    del trainer
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return row


def hf_run(args: argparse.Namespace, ckpt: Path, lora: bool) -> dict[str, Any]:
    """`transformers.Trainer` on the same model, batch, length, precision and LoRA settings."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    vocab = tf.AutoTokenizer.from_pretrained(str(ckpt)).vocab_size
    rows = max(args.batch * args.steps, args.batch)
    ids = torch.randint(0, vocab, (rows, args.seq)).tolist()
    from datasets import Dataset

    data = Dataset.from_dict({"input_ids": ids, "labels": ids})
    dtype = torch.bfloat16 if lora else torch.float32
    model = tf.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(
            model, LoraConfig(r=16, lora_alpha=32, target_modules=targets, task_type="CAUSAL_LM")
        )
    times: list[float] = []

    class Clock(tf.TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            sync(args.device)
            times.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        training_args = tf.TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=args.batch,
            max_steps=args.steps,
            learning_rate=2e-4 if lora else 1e-5,
            warmup_steps=2,
            lr_scheduler_type="cosine",
            max_grad_norm=1.0,
            bf16=args.device == "cuda",
            gradient_checkpointing=lora,
            logging_steps=args.log_every,
            save_strategy="no",
            report_to=[],
            use_cpu=args.device == "cpu",
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        reset_peak(args.device)
        trainer = tf.Trainer(model=model, args=training_args, train_dataset=data, callbacks=[Clock()])
        start = time.perf_counter()
        out_metrics = trainer.train()
        sync(args.device)
        wall = time.perf_counter() - start
    peak = peak_bytes(args.device)
    warm = min(args.warmup_steps, len(times) - 2)
    timed = times[warm:]
    tokens_per_s = args.batch * args.seq * (len(timed) - 1) / (timed[-1] - timed[0])
    row = {
        "run": "transformers.Trainer",
        "mode": "LoRA r16" if lora else "full",
        "precision": "bf16 autocast" + (", bf16 base" if lora else ", fp32 weights"),
        "gradient_checkpointing": lora,
        "attention": "sdpa",
        "tokens_per_s": tokens_per_s,
        "final_loss": float(out_metrics.training_loss),
        "wall_s": wall,
        "peak_bytes": peak,
    }
    del trainer, model
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return row


def generation(args: argparse.Namespace, adapter_dir: Path) -> list[dict[str, Any]]:
    """`workbench.generate` and ``model.generate`` on the saved adapter, greedy, full length."""
    import torch

    from workbench.generate import generate
    from workbench.train.start import load_for_inference

    model, tokenizer = load_for_inference(adapter_dir, attn_implementation="sdpa")
    model.to(args.device).eval()
    if args.device == "cuda":
        model.to(torch.bfloat16)
    new = args.new_tokens
    rows = []
    ours = None
    for _ in range(2):  # the first call warms up (allocations, kernels); the second is timed
        ours = generate(
            model,
            PROMPTS,
            tokenizer=tokenizer,
            max_new_tokens=new,
            max_batch_size=len(PROMPTS),
            eos_token_id=None,
        )
    rows.append(
        {
            "run": "workbench.generate",
            "seconds": ours.seconds,
            "new_tokens": ours.new_tokens,
            "tokens_per_s": ours.tokens_per_s,
        }
    )
    tokenizer.padding_side = "left"
    encoded = tokenizer(PROMPTS, return_tensors="pt", padding=True).to(args.device)
    for _ in range(2):
        sync(args.device)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                **encoded,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        sync(args.device)
        seconds = time.perf_counter() - start
    generated = int(out.shape[0]) * (int(out.shape[1]) - int(encoded["input_ids"].shape[1]))
    rows.append(
        {
            "run": "model.generate",
            "seconds": seconds,
            "new_tokens": generated,
            "tokens_per_s": generated / seconds,
        }
    )
    same = sum(
        a[: min(len(a), 16)] == b.tolist()[: min(len(a), 16)]
        for a, b in zip(ours.token_ids, out[:, encoded["input_ids"].shape[1] :])
    )
    rows[0]["first_16_tokens_equal_rows"] = f"{same}/{len(PROMPTS)}"
    print(f"sample: {PROMPTS[0]!r} -> {ours.texts[0][:80]!r}", flush=True)
    del model
    gc.collect()
    return rows


def torchrun_rank(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``train --nproc 1`` on the tiny default model (nccl on CUDA), then the same command resuming."""
    ckpt = work / "rank-ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)  # a run of its own, not the resume of an earlier bench's
    base = [
        sys.executable,
        "-m",
        "workbench",
        "train",
        "--nproc",
        "1",
        f"train.device_type={args.device}",
        "train.batch_size=4",
        "train.log_every=2",
        "train.progress_bar=false",
        "data.max_examples=64",
        "data.max_length=64",
        f"train.checkpoint_dir={ckpt}",
        "train.checkpoint_every=3",
    ]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    out: dict[str, Any] = {}
    for name, steps in (("first", 6), ("resumed", 9)):
        start = time.perf_counter()
        done = subprocess.run(
            [*base, f"train.steps={steps}"], capture_output=True, text=True, env=env, cwd=REPO
        )
        text = done.stdout + done.stderr
        ranks = re.search(r"^ranks: (.*)$", text, re.M)
        loss = re.search(r"^\s*final loss\s+([\d.]+)", text, re.M)
        head = re.search(r"^(trained .*)$", text, re.M)
        out[name] = {
            "exit": done.returncode,
            "seconds": round(time.perf_counter() - start, 1),
            "ranks": ranks.group(1) if ranks else None,
            "summary": head.group(1) if head else None,
            "final_loss": float(loss.group(1)) if loss else None,
        }
        if done.returncode != 0:
            out[name]["tail"] = text.strip().splitlines()[-15:]
    return out


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument(
        "--layers", type=int, default=None, help="fewer layers than published (a quick check)"
    )
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--skip-hf", action="store_true", help="leave transformers.Trainer out")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument("--train-only", action="store_true", help="leave generation and torchrun out")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=None, help="where the checkpoint and adapter go")
    args = parser.parse_args()

    import torch

    work = args.work or Path(tempfile.mkdtemp(prefix="wb-cuda-"))
    work.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"device: {device_name}; torch {torch.__version__}", flush=True)
    start = time.perf_counter()
    ckpt = make_checkpoint(args.shape, work / args.shape, layers=args.layers)
    print(f"checkpoint {ckpt} in {time.perf_counter() - start:.0f} s", flush=True)

    adapter = work / "adapter"
    training: list[dict[str, Any]] = []
    for lora in (True, False):
        training.append(workbench_run(args, ckpt, lora, adapter if lora else None))
        print(json.dumps({k: v for k, v in training[-1].items() if k != "estimate_breakdown"}), flush=True)
        if not args.skip_hf:
            training.append(hf_run(args, ckpt, lora))
            print(json.dumps(training[-1]), flush=True)
    generated = [] if args.train_only else generation(args, adapter)
    ranks = {} if args.train_only else torchrun_rank(args, work)

    report = {
        "device": device_name,
        "torch": torch.__version__,
        "shape": args.shape,
        "layers": args.layers,
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "training": training,
        "generation": generated,
        "torchrun": ranks,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))

    print(f"\n{args.shape}, {args.batch} x {args.seq} tokens a step, {args.steps} steps, {device_name}")
    print(f"{'run':<22} {'mode':<9} {'tokens/s':>9} {'peak GiB':>9} {'estimate GiB':>13} {'final loss':>10}")
    for r in training:
        est = r.get("estimate_bytes")
        print(
            f"{r['run']:<22} {r['mode']:<9} {r['tokens_per_s'] or 0:>9.0f} {gib(r['peak_bytes']):>9} "
            f"{gib(est):>13} {r['final_loss'] or float('nan'):>10.4f}"
        )
    for r in generated:
        print(
            f"{r['run']:<22} generate  {r['tokens_per_s']:>9.0f} tokens/s ({r['new_tokens']} in {r['seconds']:.2f} s)"
        )
    for name, r in ranks.items():
        print(
            f"torchrun --nproc 1 {name}: exit {r['exit']}, {r['ranks']}, {r['seconds']} s: {r['summary']}, loss {r['final_loss']}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
