"""Compile counts of a hand-written two-micro-batch step over bucketed and unbucketed loaders
(tests/test_bucketing.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import datasets
import numpy as np
import torch

from tests.xla import run
from workbench.backend.xla import runtime
from workbench.config import ModelConfig, WorkbenchConfig
from workbench.data.loader import make_loader, prewarm, synthetic_batch
from workbench.models.build import build_model


def main() -> dict[str, Any]:
    dev = runtime.device()
    rng = np.random.default_rng(0)
    ids = [rng.integers(3, 200, size=int(n)).tolist() for n in rng.integers(4, 100, size=120)]
    ds = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids, "length": [len(x) for x in ids]})
    model_cfg = ModelConfig(
        hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=256
    )
    model = build_model(model_cfg).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def step(batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        # Two micro-batches, a sync after each: two programs per step (first and accumulating pass).
        losses = []
        for half in (slice(0, 2), slice(2, 4)):
            micro = {k: v[half].to(dev) for k, v in batch.items()}
            loss = model(**micro, use_cache=False).loss
            loss.backward()
            losses.append(loss.detach())
            if half.start == 0:
                runtime.sync()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return losses

    def run_loader(
        strategy: str, steps: int, compiled_lengths: Sequence[int] = (), multiple_of: int = 16
    ) -> dict[str, Any]:
        cfg = WorkbenchConfig().with_overrides(
            {
                "data.max_length": 128,
                "bucketing.strategy": strategy,
                "bucketing.max_buckets": 2,
                "bucketing.multiple_of": multiple_of,
                "train.batch_size": 4,
            }
        )
        loader, sampler = make_loader(ds, cfg, pad_token_id=0, seed=0)
        shapes = sampler.batch_shapes()
        warm = 0
        if strategy != "none":
            warm = prewarm(step, shapes, lambda s: synthetic_batch(s, vocab_size=256))
        before, transfers = runtime.compile_count(), runtime.transfer_count()
        lengths = set()
        for i, batch in enumerate(loader):
            if i == steps:
                break
            lengths.add(int(batch["input_ids"].shape[1]))
            losses = step(batch)  # alive across the sync, as in prewarm: same program outputs
            runtime.sync()
            del losses
        runtime.wait_device_ops()
        return {
            "shapes": len(shapes),
            "warm": warm,
            "during": runtime.compile_count() - before,
            "lengths": len(lengths - set(compiled_lengths)),
            "compiled": sorted({n for _, n in shapes}),
            "transfers": runtime.transfer_count() - transfers,
        }

    bucketed = run_loader("optimal", 12)
    # Lengths the bucketed run compiled already are cached programs for the unbucketed run too.
    # multiple_of=1: each batch padded to its raw longest member, a new program per length.
    unbucketed = run_loader("none", 4, bucketed["compiled"], multiple_of=1)
    return {"bucketed": bucketed, "unbucketed": unbucketed}


if __name__ == "__main__":
    run(main)
