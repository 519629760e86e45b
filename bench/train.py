"""The training loop's overhead against a minimal hand-written loop, on XLA:CPU, in one process.

Both train the same Llama-style model from the same seed on the same bucketed batches of the
embedded corpus (same `make_loader`, same device loader, AdamW, warm-up + cosine, gradient
clipping at 1.0, the loss read every `--log-every` steps):

- hand: the obvious loop: ``loss = model(**batch).loss; backward; clip; step; zero_grad; sync``,
  the loss read through a step closure at log steps;
- trainer: `workbench.train.Trainer.fit()` (token-mean accumulation buffers, host-side token
  counting, data position tracking, `StepProfiler`, callbacks, progress bar off).

Rounds alternate the order (hand, trainer), (trainer, hand), ... so drift on the shared machine
hits both alike. Round 0 compiles and is dropped. Each run times steps 2..N after waiting for
the device, and counts real (non-padding) tokens. Reports tokens/s per loop, the trainer's
overhead (1 - trainer/hand) per round and its median, compiles after warm-up.

On a shared 2-core machine one run's throughput swings by +-10-20% from round to round, for
every loop alike, and in both directions (a run can come out well above the loop's typical
speed, so a best-of-N figure is not a sound estimate here). The overhead is the median of the
per-round paired ratios, with their interquartile range printed beside it.
Prints a table and writes bench/results/train.json.

    .venv/bin/python bench/train.py [--steps 30 --rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def hand_loop(cfg, train_ds, tokenizer, steps: int, log_every: int, *, token_mean_loss: bool = False) -> dict:
    """The minimal loop a user would write; returns real tokens/s over steps 2..N.

    `token_mean_loss`: compute the loss as the trainer does (fp32 next-token cross-entropy
    summed over real tokens, divided by their count) instead of the model's own `.loss`, so
    the two programs do the same arithmetic and only the loop around them differs.
    """
    import torch

    from workbench.backend.xla import runtime
    from workbench.data.loader import make_loader
    from workbench.models.build import build_model
    from workbench.train.optim import lr_multiplier

    dev = runtime.device()
    model = build_model(cfg.model, vocab_size=len(tokenizer), seed=cfg.train.seed).to(dev)
    model.tie_weights()  # `.to(xla)` unties the LM head from the embedding; the Trainer ties them again
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.learning_rate, betas=(0.9, 0.95), foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_multiplier(
            s, warmup_steps=cfg.train.warmup_steps, total_steps=steps, min_lr_ratio=cfg.train.min_lr_ratio
        ),
    )
    loader, sampler = make_loader(train_ds, cfg, pad_token_id=tokenizer.pad_token_id, seed=cfg.train.seed)
    counts: deque[int] = deque()

    def host_batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            for batch in loader:
                counts.append(int(batch["attention_mask"].sum()))
                yield batch
            epoch += 1

    batches = iter(runtime.device_loader(host_batches(), dev))
    losses: list[float] = []
    timed_tokens, start = 0, None
    for step in range(steps):
        batch = next(batches)
        tokens = counts.popleft()
        if token_mean_loss:
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
            ).logits
            shifted, labels = logits[:, :-1].float(), batch["labels"][:, 1:]
            loss_sum = torch.nn.functional.cross_entropy(
                shifted.reshape(-1, shifted.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
            )
            loss = loss_sum / (labels != -100).sum().clamp(min=1)
        else:
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % log_every == 0:
            runtime.add_step_closure(lambda value: losses.append(float(value)), (loss.detach(),))
        runtime.sync()
        if start is None:
            runtime.wait_device_ops()
            start = time.perf_counter()
        else:
            timed_tokens += tokens
    runtime.wait_device_ops()
    elapsed = time.perf_counter() - start
    batches._loader.close()
    return {"tokens_per_s": timed_tokens / elapsed, "final_loss": losses[-1] if losses else None}


def trainer_loop(cfg, train_ds, tokenizer) -> dict:
    from workbench.train.trainer import Trainer

    trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds)
    result = trainer.fit()
    return {
        "tokens_per_s": result.tokens_per_s,
        "final_loss": result.final_loss,
        "compiles_after_warmup": result.compiles_after_warmup,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run")
    parser.add_argument("--rounds", type=int, default=15, help="rounds after the compile round")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()

    from workbench.analysis.tables import format_table
    from workbench.backend.hardware import detect
    from workbench.config import WorkbenchConfig
    from workbench.data.records import build_datasets

    hw = detect("xla")
    cfg = WorkbenchConfig().with_overrides(
        {
            "data.source": "embedded",
            "data.max_length": args.seq_len,
            "data.max_examples": 800,
            "data.eval_fraction": 0.0,
            "bucketing.max_buckets": 4,
            "bucketing.multiple_of": 16,
            "model.hidden_size": args.hidden,
            "model.intermediate_size": args.hidden * 4,
            "model.num_layers": 2,
            "model.max_position_embeddings": args.seq_len,
            "train.device_type": "xla",
            "train.steps": args.steps,
            "train.batch_size": args.batch,
            "train.log_every": args.log_every,
            "train.max_grad_norm": 1.0,
            "train.progress_bar": False,
        }
    )
    train_ds, _, tokenizer = build_datasets(cfg)

    runs: dict[str, list[dict]] = {"hand": [], "hand_same_loss": [], "trainer": []}
    for round_index in range(args.rounds + 1):
        names = ("hand", "hand_same_loss", "trainer")
        order = names if round_index % 2 == 0 else tuple(reversed(names))
        for name in order:
            if name == "trainer":
                out = trainer_loop(cfg, train_ds, tokenizer)
            else:
                same = name == "hand_same_loss"
                out = hand_loop(cfg, train_ds, tokenizer, args.steps, args.log_every, token_mean_loss=same)
            out["round"] = round_index
            if round_index > 0:  # round 0 compiles
                runs[name].append(out)
        if round_index:
            print(
                f"round {round_index}: "
                + ", ".join(f"{n} {runs[n][-1]['tokens_per_s']:.0f} tok/s" for n in names),
                flush=True,
            )

    def overheads(base: str) -> list[float]:
        return [1.0 - t["tokens_per_s"] / h["tokens_per_s"] for h, t in zip(runs[base], runs["trainer"])]

    medians = {n: statistics.median(r["tokens_per_s"] for r in runs[n]) for n in names}
    per_round = overheads("hand")
    per_round_same = overheads("hand_same_loss")
    overhead, overhead_same = statistics.median(per_round), statistics.median(per_round_same)
    rows = [
        {"loop": label, "tokens/s (median)": round(medians[name]),
         "final loss": round(runs[name][-1]["final_loss"] or float("nan"), 4),  # nan: no log step ran
         "Trainer overhead (median of paired rounds)":
             "-" if name == "trainer" else f"{statistics.median(overheads(name)) * 100:+.1f}%"}
        for name, label in (("hand", "hand-written (model .loss)"),
                            ("hand_same_loss", "hand-written (token-mean loss)"), ("trainer", "Trainer.fit"))
    ]  # fmt: skip
    print()
    print(
        f"XLA:CPU ({hw.num_devices} device), Llama hidden={args.hidden} x2 layers, batch {args.batch}, "
        f"buckets up to {args.seq_len}, {args.steps} steps/run, {args.rounds} rounds (interleaved)"
    )
    print(format_table(rows))
    for label, values in ((".loss loop", per_round), ("token-mean loop", per_round_same)):
        q1, _, q3 = statistics.quantiles(values, n=4)
        print(
            f"per-round overhead vs {label}: {', '.join(f'{x * 100:+.1f}%' for x in values)} "
            f"(interquartile range {q1 * 100:+.1f}% .. {q3 * 100:+.1f}%)"
        )
    print("(negative overhead = the Trainer is faster)")
    print(f"trainer compiles after warm-up: {[r['compiles_after_warmup'] for r in runs['trainer']]}")
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "device": f"XLA:CPU x{hw.num_devices}",
        "args": vars(args),
        "tokens_per_s_median": medians,
        "overhead_median_vs_hand": overhead,
        "overhead_median_vs_hand_same_loss": overhead_same,
        "overhead_per_round_vs_hand": per_round,
        "overhead_per_round_vs_hand_same_loss": per_round_same,
        "runs": runs,
    }
    (out_dir / "train.json").write_text(json.dumps(payload, indent=2))
    print(f"wrote {out_dir / 'train.json'}")


if __name__ == "__main__":
    main()
