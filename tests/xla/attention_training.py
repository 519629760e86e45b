"""The Trainer with chunked attention on a data x fsdp x model mesh of the 8 virtual devices
(tests/test_attention.py): bucketed rows and packed rows, eager beside it for the losses.

Reported per run: the losses, the compiles after warm-up, the transfers between log steps and the
attention notice. Chunked in blocks of 8 queries (rows of up to 32 tokens span several blocks).
"""

from __future__ import annotations

from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run

MESH = {"mesh.enabled": True, "mesh.data": 2, "mesh.fsdp": 2, "mesh.model": 2}


def _run(overrides: dict[str, Any]) -> dict[str, Any]:
    from workbench.train import Trainer

    cfg = tiny_cfg(
        **{"train.device_type": "xla", "train.batch_size": 8, "train.steps": 6, **MESH, **overrides}
    )
    trainer = Trainer(cfg, train_dataset=token_dataset(96), eval_dataset=token_dataset(16, seed=1))
    result = trainer.fit()
    return {
        "implementation": trainer.model.config._attn_implementation,
        "losses": [m["loss"] for m in result.history],
        "eval_loss": float(result.eval_loss) if result.eval_loss is not None else None,
        "compiles_after_warmup": result.compiles_after_warmup,
        "transfers": [m["transfers"] for m in result.history],
        "attention": [n for n in result.notices if n.startswith("model.attention")],
    }


def main() -> dict[str, Any]:
    from workbench.models import attention

    attention.QUERY_CHUNK = 8  # several blocks per row at these lengths
    return {
        "eager": _run({"model.attention": "eager"}),
        "chunked": _run({"model.attention": "chunked"}),
        "auto": _run({"model.attention": "auto"}),  # 32-token rows on XLA: eager
        "packed_eager": _run({"model.attention": "eager", "bucketing.packing": True}),
        "packed_chunked": _run({"model.attention": "chunked", "bucketing.packing": True}),
    }


if __name__ == "__main__":
    run(main)
