"""Packed rows on XLA: each sequence's loss inside a packed row equals its loss alone, for both
attention layouts (tests/test_bucketing.py)."""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.backend import runtime
from workbench.config import ModelConfig
from workbench.data.collate import PackedCollator, pack_sequences
from workbench.models.build import build_model


def worst_difference(model: torch.nn.Module, rows: list[dict], attention: str, dev: Any) -> float:
    batch = PackedCollator(0, 32, attention=attention)(rows)
    with torch.no_grad():
        inputs = {k: v.to(dev) for k, v in batch.items() if k != "labels"}
        logits = model(**inputs, use_cache=False).logits.cpu()
        diffs = []
        for r, row in enumerate(rows):
            start = 0
            for n in row["seq_lengths"]:
                ids = batch["input_ids"][r, start : start + n]
                packed = torch.nn.functional.cross_entropy(logits[r, start : start + n - 1], ids[1:])
                alone = model(
                    input_ids=ids[None].to(dev), labels=ids[None].to(dev), use_cache=False
                ).loss.cpu()
                diffs.append(abs(float(packed) - float(alone)))
                start += n
    return max(diffs)


def main() -> dict[str, Any]:
    dev = runtime.device()
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (6, 11, 9)]
    rows = pack_sequences(seqs, 32)  # one row: three sequences and six pads
    result = {}
    for family in ("llama", "qwen2"):
        cfg = ModelConfig(
            family=family,
            hidden_size=32,
            num_layers=1,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=64,
            vocab_size=128,
        )
        model = build_model(cfg).eval().to(dev)
        for attention in ("position_ids", "mask4d"):
            result[f"{family}/{attention}"] = worst_difference(model, rows, attention, dev)
    return {"rows": len(rows), "diffs": result}


if __name__ == "__main__":
    run(main)
