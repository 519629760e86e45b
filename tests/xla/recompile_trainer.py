"""Recompile forensics in the real training path (tests/test_recompiles.py): a `Trainer` run on
XLA:CPU without prewarm, on sequences of random length, so steps after the profiler's warm-up
meet bucket shapes not compiled yet. The Trainer switches torch_xla's compile log on itself
(nothing in the environment); the result carries the causes and where the Trainer syncs."""

from __future__ import annotations

import inspect
import os
from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.backend.xla import compile_log
from workbench.train import Trainer


def main(steps: int = 12) -> dict[str, Any]:
    env_before = {k: os.environ.get(k) for k in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE")}
    cfg = tiny_cfg(
        **{
            "train.device_type": "xla",
            "train.steps": steps,
            "train.log_every": 4,
            "train.prewarm": False,
            "bucketing.max_buckets": 4,
        }
    )
    trainer = Trainer(cfg, train_dataset=token_dataset(64, lo=4, hi=32))
    result = trainer.fit()
    source, first = inspect.getsourcelines(Trainer._step)
    sync_line = first + next(i for i, text in enumerate(source) if "self.engine.sync()" in text)
    return {
        "env_before": env_before,
        "log_path": compile_log.compile_memory_log_path(),
        "records": len(compile_log.compile_records()),
        "notices": result.notices,
        "sync_line": sync_line,
        "trainer_file": inspect.getsourcefile(Trainer),
        "recompile_steps": [s for m in result.history for s in m["recompile_steps"]],
        "recompile_causes": [c for m in result.history for c in m["recompile_causes"]],
        "advice": [a.message for a in trainer.profiler.advice() if a.kind == "recompilation"],
    }


if __name__ == "__main__":
    run(main)
