"""Packed rows on XLA: each sequence's loss inside a packed row equals its loss alone, for both
attention layouts and for the position-ids batch through the workbench's own inputs
(`workbench.models.inputs.model_inputs`), and the host transfers of each packed forward
(tests/test_bucketing.py)."""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.backend.xla import runtime
from workbench.config import ModelConfig
from workbench.data.collate import PackedCollator, pack_sequences
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs

LAYOUTS = {"position_ids": "position_ids", "mask4d": "mask4d", "objective": "position_ids"}
"""What the forward gets: transformers' own packed mask, the host's 4-D mask, or the position-ids
batch through `model_inputs` (the mask built on the device)."""


def worst_difference(model: torch.nn.Module, rows: list[dict], layout: str, dev: Any) -> tuple[float, int]:
    """(worst |packed - alone| loss difference, host transfers of the packed forward)."""
    batch = PackedCollator(0, 32, attention=LAYOUTS[layout])(rows)
    with torch.no_grad():
        moved = {k: v.to(dev) for k, v in batch.items() if k != "labels"}
        inputs = model_inputs(moved, model) if layout == "objective" else moved
        runtime.sync()
        before = runtime.transfer_count()
        logits = model(**inputs).logits
        runtime.sync()
        transfers = runtime.transfer_count() - before
        logits = logits.cpu()
        diffs = []
        for r, row in enumerate(rows):
            start = 0
            for n in row["seq_lengths"]:
                ids = batch["input_ids"][r, start : start + n]
                packed = torch.nn.functional.cross_entropy(logits[r, start : start + n - 1], ids[1:])
                alone = model(input_ids=ids[None].to(dev), labels=ids[None].to(dev)).loss.cpu()
                diffs.append(abs(float(packed) - float(alone)))
                start += n
    return max(diffs), transfers


def main() -> dict[str, Any]:
    import transformers

    dev = runtime.device()
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (6, 11, 9)]
    rows = pack_sequences(seqs, 32)  # one row: three sequences and six pads
    diffs, transfers = {}, {}
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
        for layout in LAYOUTS:
            key = f"{family}/{layout}"
            diffs[key], transfers[key] = worst_difference(model, rows, layout, dev)
    return {
        "rows": len(rows),
        "diffs": diffs,
        "transfers": transfers,
        "transformers": transformers.__version__,
    }


if __name__ == "__main__":
    run(main)
