"""The compiled native step under torchrun: FSDP2 over the ranks, eager and compiled, in one launch.

    torchrun --standalone --nproc_per_node=2 -m tests.dist.compiled OUT.json

Each rank trains the same small config twice (``train.compile`` off, then on with torch.compile's
'aot_eager' backend: the graphs and guards without inductor's C++ build); the main rank writes each
run's logged losses, the graphs its warm-up compiled and the compiles after it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.dist.losses import COMMON


def main(out: str) -> None:
    from workbench.backend import multihost
    from workbench.config import WorkbenchConfig
    from workbench.train import Trainer, compiled_step

    compiled_step.BACKEND = "aot_eager"
    runs = {}
    for setting in ("off", "on"):
        cfg = WorkbenchConfig().with_overrides({**COMMON, "mesh.fsdp": 2, "train.compile": setting})
        trainer = Trainer(cfg)
        result = trainer.fit()
        runs[setting] = {
            "losses": [m["loss"] for m in result.history],
            "warmup_compiles": result.warmup_compiles,
            "compiles_after_warmup": result.compiles_after_warmup,
            "bucket_shapes": len(trainer.data.shapes(trainer.loop.batch_size, trainer.data.train_dataset)),
        }
        trainer.close()
    if multihost.is_main():
        Path(out).write_text(json.dumps(runs))


if __name__ == "__main__":
    main(sys.argv[1])
