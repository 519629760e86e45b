"""Long rows on one chip: the memory estimate of an 8B LoRA by length, and what the two settings cost in time.

Part one, the estimate (no device needed): Llama-3.1-8B (int4 base, LoRA r16, flash attention, the
loss in chunks, gradient checkpointing, batch 1, bf16) on one v5e chip at 12k to 128k tokens, with
neither long-context setting, then with the layers' checkpoints in host memory
(``train.offload_activations``) and the MLP in tiles (``model.mlp_chunk_tokens``): device GiB (the
activations' share), host GiB; and the longest context that fits (16 GiB less the estimate's 10%
headroom) with each setting alone and both.

Part two (``--time``), step times on this machine's CPU (plain torch): a LoRA step of a model of
Llama-3.2-1B's width with 2 layers at 2 x 1024 tokens, side by side in one process: checkpointing,
checkpointing with the checkpoints offloaded, with the MLP in tiles of 256 tokens, and both. On the
CPU the "host copy" is a copy in the same memory, so this prices the machinery (hooks, copies,
recomputed tiles), not a PCIe link; no accelerator was lent here to measure one.

Prints the tables and writes bench/results/long_context.json.

    .venv/bin/python bench/long_context.py          # the estimate (a few seconds)
    .venv/bin/python bench/long_context.py --time   # and the CPU step times (a few minutes)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workbench.analysis.estimate import estimate  # noqa: E402
from workbench.config import WorkbenchConfig  # noqa: E402
from workbench.models.presets import MODEL_PRESETS  # noqa: E402
from workbench.units import GiB  # noqa: E402

LENGTHS = (12288, 16384, 32768, 65536, 131072)
SETTING = dict(
    batch_size=1,
    precision="bf16",
    gradient_checkpointing=True,
    attention="flash",
    lora_rank=16,
    quantize="int4",
    loss_chunk_tokens="auto",
    memory_bytes=16 * GiB,
)
WAYS = {
    "neither": {},
    "offload": {"offload_activations": "on"},
    "tiles": {"mlp_chunk_tokens": "auto"},
    "both": {"offload_activations": "on", "mlp_chunk_tokens": "auto"},
}


def llama_8b() -> Any:
    shape = {f"model.{k}": v for k, v in MODEL_PRESETS["Llama-3.1-8B shape"].items()}
    overrides = {**shape, "model.vocab_size": 128256, "model.max_position_embeddings": 131072}
    return WorkbenchConfig().with_overrides(overrides).model


def estimate_table() -> dict[str, Any]:
    model = llama_8b()
    rows = []
    for length in LENGTHS:
        row: dict[str, Any] = {"tokens": length}
        for way, kwargs in WAYS.items():
            est = estimate(model, seq_len=length, **SETTING, **kwargs)
            row[way] = {
                "device_gib": round(est.total_bytes / GiB, 2),
                "activations_gib": round(est.breakdown["activations"] / GiB, 2),
                "host_gib": round(est.host_bytes / GiB, 2),
                "fits": est.fits(16 * GiB),
            }
        rows.append(row)
    longest = {way: longest_context(model, kwargs) for way, kwargs in WAYS.items()}
    return {"rows": rows, "longest": longest}


def longest_context(model: Any, kwargs: dict[str, Any], step: int = 1024) -> dict[str, Any]:
    """The longest length, a multiple of `step`, whose estimate fits a v5e chip."""

    def fits(length: int) -> bool:
        return estimate(model, seq_len=length, **SETTING, **kwargs).fits(16 * GiB)

    low, high = step, step
    while fits(high):
        low, high = high, 2 * high
    while high - low > step:
        mid = (low + high) // 2 // step * step
        low, high = (mid, high) if fits(mid) else (low, mid)
    est = estimate(model, seq_len=low, **SETTING, **kwargs)
    return {
        "tokens": low,
        "device_gib": round(est.total_bytes / GiB, 2),
        "host_gib": round(est.host_bytes / GiB, 2),
    }


def step_times(repeats: int = 5) -> dict[str, Any]:
    import torch

    from workbench.config import LoraConfig
    from workbench.models.build import build_model, enable_gradient_checkpointing
    from workbench.models.mlp_tiles import MlpTiling, install_mlp_tiles
    from workbench.train.lora import apply_lora

    cfg = WorkbenchConfig().with_overrides(
        {f"model.{k}": v for k, v in MODEL_PRESETS["Llama-3.2-1B shape"].items()}
        | {"model.num_layers": 2, "model.vocab_size": 8192, "model.max_position_embeddings": 2048}
    )
    ids = torch.randint(3, 8000, (2, 1024), generator=torch.Generator().manual_seed(0))
    models = {}
    for way, (offload, tiles) in {
        "checkpointing": (False, None),
        "+ offload": (True, None),
        "+ MLP tiles": (False, 256),
        "+ both": (True, 256),
    }.items():
        model = build_model(cfg.model, seed=0)
        if tiles:
            install_mlp_tiles(model, MlpTiling(tiles))
        enable_gradient_checkpointing(model, xla=False, offload=offload)
        models[way] = apply_lora(model, LoraConfig(rank=16), seed=0).train()
    seconds: dict[str, list[float]] = {way: [] for way in models}
    for _ in range(repeats):  # the ways interleaved, so a busy machine slows each alike
        for way, model in models.items():
            start = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            seconds[way].append(time.perf_counter() - start)
    base = statistics.median(seconds["checkpointing"][1:])
    return {
        way: {
            "median_s": round(statistics.median(s[1:]), 3),
            "ratio": round(statistics.median(s[1:]) / base, 3),
        }
        for way, s in seconds.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time", action="store_true", help="also time the CPU steps (a few minutes)")
    args = parser.parse_args()
    result: dict[str, Any] = {"estimate": estimate_table()}
    print("Llama-3.1-8B QLoRA on one v5e chip (16 GiB; fits: under 14.4): device GiB (activations), host GiB")
    print(f"{'tokens':>8}  " + "  ".join(f"{way:>22}" for way in WAYS))
    for row in result["estimate"]["rows"]:
        cells = [
            f"{row[w]['device_gib']:6.1f} ({row[w]['activations_gib']:5.1f}) h{row[w]['host_gib']:5.1f}"
            + (" ✔" if row[w]["fits"] else "  ")
            for w in WAYS
        ]
        print(f"{row['tokens']:>8,}  " + "  ".join(f"{c:>22}" for c in cells))
    print("longest context that fits:")
    for way, found in result["estimate"]["longest"].items():
        print(
            f"  {way:>8}: {found['tokens']:>7,} tokens "
            f"({found['device_gib']} GiB, host {found['host_gib']} GiB)"
        )
    if args.time:
        result["cpu_step_times"] = step_times()
        print("CPU step time, LoRA r16, 2 layers of Llama-3.2-1B's width, 2 x 1024 tokens:")
        for way, found in result["cpu_step_times"].items():
            print(f"  {way:>14}: {found['median_s']:.3f} s  x{found['ratio']:.2f}")
    out = REPO / "bench" / "results" / "long_context.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
