"""Sampling speed and compiles on XLA:CPU: `workbench.generate.generate` vs ``model.generate``, in one process.

Both decode the same Llama-style model (random weights, seeded), greedy, with no end-of-sequence
id (every prompt gets exactly `--new-tokens` tokens), for two calls whose prompts have different
lengths and counts that fall in the same buckets (16 and 32):

- model.generate: transformers' own loop on the XLA device with its dynamic KV cache; each call's
  prompts left-padded together to the longest one. The cache grows every step, so every step is
  a new shape, and it checks on the host every step whether all rows have finished;
- workbench: `generate` with a static KV cache, prompts bucketed (left-padded to 16 or 32), every
  batch at `max_batch_size` rows and one fixed-shape decode program per bucket; no host read per token.

Reports per call: new tokens, seconds, tokens/s, programs compiled, host transfers, and whether
the tokens equal model.generate's. Timings on XLA:CPU are indicative (the host's cores are shared);
the second call is the one that shows what bucketing buys: other lengths and another number of
prompts per bucket, and it compiles nothing.
Prints a table and writes bench/results/generate.json.

    .venv/bin/python bench/generate.py [--new-tokens 32 --hidden 128]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CALLS = {"call 1": (9, 14, 23, 30), "call 2": (11, 16, 5, 20)}  # 2 + 2, then 3 + 1 prompts in buckets 16, 32
BUCKETS = [16, 32]


def prompt_ids(lengths: tuple[int, ...], vocab: int, seed: int) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def hf_generate(model, prompts: list[list[int]], new_tokens: int, dev) -> dict:
    """model.generate on the device: the batch left-padded to its longest prompt, dynamic cache."""
    import torch

    from workbench.backend.xla import runtime

    longest = max(map(len, prompts))
    ids = torch.zeros((len(prompts), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, longest - len(p) :] = torch.tensor(p)
        mask[r, longest - len(p) :] = 1
    compiles, transfers = runtime.compile_count(), runtime.transfer_count()
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids.to(dev),
        attention_mask=mask.to(dev),
        max_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
    )
    tokens = out[:, longest:].cpu().tolist()
    runtime.wait_device_ops()
    seconds = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": seconds,
        "compiles": runtime.compile_count() - compiles,
        "transfers": runtime.transfer_count() - transfers,
    }


def ours(model, prompts: list[list[int]], new_tokens: int) -> dict:
    from workbench.backend.xla import runtime
    from workbench.generate import generate

    transfers = runtime.transfer_count()
    result = generate(model, prompts, max_new_tokens=new_tokens, buckets=BUCKETS)
    return {
        "tokens": result.token_ids,
        "seconds": result.seconds,
        "compiles": result.compiles,
        "transfers": runtime.transfer_count() - transfers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2048)
    args = parser.parse_args()

    from workbench.analysis.tables import format_table
    from workbench.backend.hardware import detect
    from workbench.backend.xla import runtime
    from workbench.config import ModelConfig
    from workbench.models.build import build_model

    hw = detect("xla")
    cfg = ModelConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=args.hidden * 4,
        vocab_size=args.vocab,
        max_position_embeddings=256,
    )
    dev = runtime.device()
    model = build_model(cfg, seed=0).eval().to(dev)
    model.generation_config.eos_token_id = None  # every prompt decodes exactly --new-tokens tokens
    model.generation_config.pad_token_id = 0

    runs: dict[str, dict[str, dict]] = {"model.generate": {}, "workbench generate": {}}
    for i, (call, lengths) in enumerate(CALLS.items()):
        prompts = prompt_ids(lengths, args.vocab, seed=i)
        runs["model.generate"][call] = hf_generate(model, prompts, args.new_tokens, dev)
        runs["workbench generate"][call] = ours(model, prompts, args.new_tokens)
        print(f"{call} done", flush=True)

    rows = []
    for name, calls in runs.items():
        for call, run in calls.items():
            new = sum(map(len, run["tokens"]))
            rows.append(
                {
                    "": name,
                    "call": f"{call}: lengths {','.join(map(str, CALLS[call]))}",
                    "new tokens": new,
                    "seconds": round(run["seconds"], 2),
                    "tokens/s": round(new / run["seconds"], 1),
                    "compiles": run["compiles"],
                    "host transfers": run["transfers"],
                    "same tokens as model.generate": run["tokens"] == runs["model.generate"][call]["tokens"],
                }
            )
    print()
    print(
        f"XLA:CPU ({hw.num_devices} device), Llama hidden={args.hidden} x{args.layers} layers, vocab "
        f"{args.vocab}, greedy, {args.new_tokens} new tokens each, "
        f"workbench buckets {BUCKETS}"
    )
    print(format_table(rows))
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "device": f"XLA:CPU x{hw.num_devices}",
        "args": vars(args),
        "calls": {call: list(lengths) for call, lengths in CALLS.items()},
        "buckets": BUCKETS,
        "rows": rows,
    }
    (out_dir / "generate.json").write_text(json.dumps(payload, indent=2))
    print(f"wrote {out_dir / 'generate.json'}")


if __name__ == "__main__":
    main()
