"""A Trainer run with ``bucketing.max_buckets: auto`` on one XLA:CPU device: the per-token cost is
measured on the run's first shape, the plan chosen with it, then trained (tests/test_bucket_choice.py)."""

from __future__ import annotations

from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.train import Trainer


def main(steps: int = 12, compile_seconds: float | None = 0.02) -> dict[str, Any]:
    overrides: dict[str, Any] = {
        "train.device_type": "xla",
        "train.steps": steps,
        "train.batch_size": 8,
        "train.log_every": 4,
        "data.max_length": 128,
        "bucketing.max_buckets": "auto",
    }
    if compile_seconds is not None:  # a small compile cost keeps several shapes worth it in a short run
        overrides["bucketing.compile_seconds"] = compile_seconds
    trainer = Trainer(tiny_cfg(**overrides), train_dataset=token_dataset(96, lo=6, hi=128))
    result = trainer.fit()
    _, sampler = trainer.data.loader(trainer.data.train_dataset, trainer.loop.batch_size)
    _, doubled = trainer.data.loader(trainer.data.train_dataset, 2 * trainer.loop.batch_size)

    # The same shapes again in this process: nothing compiles while measuring, so the compile
    # cost must come from elsewhere (this process's mean compile), not read as zero.
    overrides.pop("bucketing.compile_seconds", None)
    again = Trainer(tiny_cfg(**overrides), train_dataset=token_dataset(96, lo=6, hi=128))
    again_result = again.fit()
    return {
        "boundaries_at_double_batch": doubled.boundaries,
        "again_measurement": again.data.bucket_choice.summary()["measurement"],
        "again_shapes": again.data.bucket_choice.chosen,
        "again_compiles_after_warmup": again_result.compiles_after_warmup,
        "steps": result.steps,
        "expected_steps": steps,
        "compiles_after_warmup": result.compiles_after_warmup,
        "warmup_compiles": result.warmup_compiles,
        "notices": result.notices,
        "boundaries": sampler.boundaries,
        "lengths_trained": sorted({n for _, n in sampler.batch_shapes()}),
        "choice": trainer.data.bucket_choice.summary(),
        "plan_choice": sampler.report()["bucket_choice"],
        "final_loss": result.final_loss,
    }


if __name__ == "__main__":
    run(main)
