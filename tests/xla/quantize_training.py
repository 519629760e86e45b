"""The real `Trainer` with a quantized base (``model.quantize`` int8, int4) under LoRA on XLA:CPU, on one
device or a data=2 x fsdp=2 x model=2 mesh (tests/test_quantize.py). Per run: the logged losses,
the device->host transfers counted at each log step, compiles after warm-up, the frozen integers
unchanged, where the sharding report put the base weights and their scales (bytes per logical
parameter, local shard shapes); on one device also a scanned run (``model.scan_layers``) and
`workbench.generate.generate` on the trained model."""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.backend.xla import runtime
from workbench.generate import generate
from workbench.models.quantize import quantized_layers
from workbench.train import Trainer

MESH = {"mesh.enabled": True, "mesh.data": 2, "mesh.fsdp": 2, "mesh.model": 2}
STEPS, LOG_EVERY = 8, 2


def train(mode: str, *, mesh: bool, scan: bool = False, sample: bool = False) -> dict[str, Any]:
    from tests.test_lora import lora_cfg, lora_data

    transfers: dict[int, int] = {}

    def count(metrics: dict[str, Any]) -> None:  # at each log step, after the profiler's reads
        transfers[metrics["step"]] = runtime.transfer_count()

    overrides = {
        "model.quantize": mode,
        "model.scan_layers": scan,
        "train.device_type": "xla",
        "train.batch_size": 8,
        "train.steps": STEPS,
        "train.log_every": LOG_EVERY,
        "train.learning_rate": 3e-2,
        **(MESH if mesh else {}),
    }
    trainer = Trainer(lora_cfg(**overrides), train_dataset=lora_data(), callbacks=[count])
    frozen = {n: p for n, p in trainer.model.named_parameters() if not p.requires_grad}
    before = dict(zip(frozen, runtime.to_cpu(list(frozen.values()))))
    result = trainer.fit()
    after = dict(zip(frozen, runtime.to_cpu(list(frozen.values()))))
    layers = quantized_layers(trainer.model)
    out: dict[str, Any] = {
        "losses": [m["loss"] for m in result.history],
        "compiles_after_warmup": result.compiles_after_warmup,
        "transfers_at_log": [transfers[s] for s in sorted(transfers)],
        "base_unchanged": all(torch.equal(before[n], after[n]) for n in frozen),
        "integer_dtypes": sorted({str(t.dtype) for t in before.values() if not t.is_floating_point()}),
        "layers": len(layers),
        "notices": result.notices,
    }
    report = trainer.sharding_report
    if report is not None:
        weights = [report.entry(f"{name}.weight") for name in layers]
        logical = sum(m.in_features * m.out_features for m in layers.values())
        out["bytes_per_param"] = sum(e.bytes for e in weights) / logical
        out["device_bytes_per_param"] = sum(e.bytes_per_device for e in weights) / logical
        out["specs"] = {
            e.name: [list(a) if isinstance(a, tuple) else a for a in e.spec] for e in report.entries
        }
        out["fallbacks"] = report.fallbacks
        out["local_shapes"] = {
            f"{name}.{part}": list(runtime.local_shard_shapes(getattr(layer, part))[0])
            for name, layer in layers.items()
            for part in ("weight", "weight_scale")
        }
    if sample:
        prompts = [[5, 6, 7, 8], [10, 12, 14, 16, 18, 20]]
        first = generate(trainer.model, prompts, max_new_tokens=6, eos_token_id=None)
        again = generate(trainer.model, prompts, max_new_tokens=6, eos_token_id=None)
        out["generated"] = [first.token_ids, again.token_ids, again.compiles]
    return out


def main(modes: list[str], mesh: bool, scan: bool = False) -> dict[str, Any]:
    runs = {mode: train(mode, mesh=mesh, sample=not mesh) for mode in modes}
    if scan:
        runs["int4-scan"] = train("int4", mesh=mesh, scan=True)
    return runs


if __name__ == "__main__":
    run(main)
