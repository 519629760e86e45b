"""A short Trainer run with ``train.compile_cache_dir`` set (None: no cache), on one XLA:CPU device
(tests/test_compile_cache.py runs it twice on one directory: two sessions sharing a cache).

``compile_first`` compiles a small program before the Trainer exists, as a notebook's earlier
cells would: the cache can then no longer be switched on in this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.backend.xla import runtime
from workbench.train import Trainer


def main(cache_dir: str | None, compile_first: bool = False, steps: int = 2) -> dict[str, Any]:
    if compile_first:
        earlier_cell = (torch.ones(3, device=runtime.device()) * 2).sum()
        runtime.sync()  # compiles the program that computes it (kept alive, so it is not dropped)
        del earlier_cell
    cfg = tiny_cfg(
        **{
            "train.device_type": "xla",
            "train.steps": steps,
            "train.log_every": steps,
            "train.compile_cache_dir": cache_dir,
        }
    )
    trainer = Trainer(cfg, train_dataset=token_dataset(16))
    result = trainer.fit()
    cache = trainer.compile_cache
    root = Path(cache_dir) if cache_dir is not None else None
    files = (
        sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root is not None else []
    )
    return {
        "active": cache.active,
        "directory": str(cache.directory) if cache.directory is not None else None,
        "lookups": cache.lookups(),
        "notices": result.notices,
        "files": files,
        "compiles": runtime.compile_count(),
        "compile_s": runtime.compile_time_s(),
        "steps": result.steps,
        "final_loss": result.final_loss,
    }


if __name__ == "__main__":
    run(main)
