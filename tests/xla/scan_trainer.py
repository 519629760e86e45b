"""The Trainer with ``model.scan_layers`` on a mesh of 8 virtual XLA:CPU devices (tests/test_scan.py).

One variant of a tiny run (a 4-layer Llama-style model, SPMD over data x fsdp x model), trained
twice from the same seed: decoder stack unrolled, then scanned. Reported for each: the logged
losses, the programs compiled after warm-up, whether the scan is installed (and rematerialises),
the per-layer parameter names, and how the first layer's q_proj weight (scanned: the stacked
q_proj weight) is sharded, live and in the sharding report.
"""

from __future__ import annotations

from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.backend.xla import runtime
from workbench.models.layer_stack import per_layer_parameters
from workbench.models.scan import scanned_layers
from workbench.train import Trainer

VARIANTS: dict[str, dict[str, Any]] = {
    "fsdp+tp, checkpointing": {
        "mesh.enabled": True,
        "mesh.data": 2,
        "mesh.fsdp": 2,
        "mesh.model": 2,
        "train.gradient_checkpointing": True,
    },
    "fsdp, lora": {"mesh.enabled": True, "mesh.data": 2, "mesh.fsdp": 4, "lora.rank": 4, "lora.alpha": 8},
}


def _is_q_proj(name: str) -> bool:
    """Layer 0's q_proj base weight, or the stacked one (``layers.stacked.`` / ``layers.*.`` in reports)."""
    return any(f"layers.{i}.self_attn.q_proj." in name for i in ("0", "stacked", "*")) and "lora" not in name


def fit(variant: str, scan: bool) -> dict[str, Any]:
    opts = {"train.device_type": "xla", "train.steps": 4, "train.log_every": 1, "model.num_layers": 4}
    cfg = tiny_cfg(**opts, **VARIANTS[variant], **{"model.scan_layers": scan})
    trainer = Trainer(cfg, train_dataset=token_dataset(32))
    result = trainer.fit()
    stack = scanned_layers(trainer.model)
    q_proj_name = next(n for n, _ in trainer.model.named_parameters() if _is_q_proj(n))
    q_proj = trainer.model.get_parameter(q_proj_name)
    entry = next(e for e in trainer.sharding_report.entries if _is_q_proj(e.name))
    return {
        "losses": [m["loss"] for m in result.history],
        "after": result.compiles_after_warmup,
        "scanned": stack is not None,
        "remat": bool(stack.remat) if stack is not None else None,
        "names": sorted(n for n, _, _ in per_layer_parameters(trainer.model)),
        "q_proj_shape": list(q_proj.shape),
        "q_proj_sharding": runtime.sharding_spec(q_proj),
        "q_proj_report": [
            entry.name,
            list(entry.shape),
            [list(a) if isinstance(a, tuple) else a for a in entry.spec],
        ],
        "notices": list(result.notices),
    }


def main(variant: str) -> dict[str, Any]:
    return {"unrolled": fit(variant, scan=False), "scanned": fit(variant, scan=True)}


if __name__ == "__main__":
    run(main)
