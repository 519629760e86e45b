"""Any `transformers` family, sharded by its own tensor-parallel plan (tests/test_tp_plan.py).

Each family's tiny model trains three AdamW steps on plain CPU torch and on the mesh
data=2 x fsdp=2 x model=2 of 8 virtual XLA:CPU devices (`shard_model` with the default rules:
the family's plan), one family after another in this one SPMD process. Reported per family:
both loss curves, the plan's per-device parameter bytes, which parameters are split over
``model``, where the rules came from, and any shard XLA holds in another shape than the plan
says. With `lora`, the same for PEFT LoRA models of some families (when peft is installed).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run

TINY: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
"""Every family's tiny size (its config class ignores what it does not use)."""
EXTRA: dict[str, dict[str, Any]] = {
    # the attention scale is query_pre_attn_scalar ** -0.5 (256 by default): use the head dim
    "gemma2": {"query_pre_attn_scalar": 16},
    "gemma3_text": {"query_pre_attn_scalar": 16},
}
"""Per-family fields the tiny size needs besides `TINY`."""
STEPS = 3
MESH = {"data": 2, "fsdp": 2, "model": 2}


def tiny_config(model_type: str) -> Any:
    """A tiny config of `model_type` (hidden 64, 2 layers, 4 heads, vocab 256), dropout off."""
    from transformers import CONFIG_MAPPING

    cfg = CONFIG_MAPPING[model_type](**TINY, **EXTRA.get(model_type, {}))
    for key, value in cfg.to_dict().items():
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            setattr(cfg, key, 0.0)
    return cfg


def build(model_type: str, lora: bool = False) -> Any:
    """The same weights on every call (seeded), optionally wrapped in LoRA on every linear layer."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type))
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(1)
        model = get_peft_model(
            model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
        )
    return model


def train(model: Any, ids: torch.Tensor) -> list[Any]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if ids.device.type == "xla":
            from workbench.backend.xla import runtime

            runtime.sync()
    return losses


def one_family(model_type: str, mesh: Any, ids: torch.Tensor, lora: bool) -> dict[str, Any]:
    from workbench.backend.xla import runtime
    from workbench.parallel.apply import shard_batch, shard_model

    cpu = [float(v) for v in train(build(model_type, lora), ids)]
    model = build(model_type, lora)
    report = shard_model(model, mesh)
    batch = shard_batch({"input_ids": ids}, mesh)
    xla = [float(v) for v in runtime.to_cpu(train(model, batch["input_ids"]))]
    runtime.sync(wait=True)
    params = dict(model.named_parameters())
    wrong_shape = []
    for e in report.entries:
        if any(e.spec):
            shapes = {tuple(s) for s in runtime.local_shard_shapes(params[e.name])}
            if shapes != {e.local_shape}:
                wrong_shape.append([e.name, sorted(shapes), e.local_shape])
    per_device = report.per_device_bytes()
    return {
        "cpu": cpu,
        "xla": xla,
        "total_bytes": report.total_bytes,
        "max_device_fraction": max(per_device.values()) / report.total_bytes,
        "split_over_model": [e.name for e in report.entries if any("model" in str(a) for a in e.spec)],
        "sources": report.sources(),
        "notes": report.notes,
        "fallbacks": report.fallbacks,
        "wrong_shape": wrong_shape,
        "specs": {e.name: e.spec for e in report.entries},
    }


def main(families: list[str], lora_families: list[str] = ()) -> dict[str, Any]:
    from workbench.parallel.mesh import MeshSpec

    mesh = MeshSpec(**MESH).build()  # SPMD on before the first XLA tensor
    ids = torch.randint(3, TINY["vocab_size"], (8, 32), generator=torch.Generator().manual_seed(0))
    results: dict[str, Any] = {"families": {}, "lora": {}}
    for model_type in families:
        results["families"][model_type] = one_family(model_type, mesh, ids, lora=False)
    for model_type in lora_families:
        results["lora"][model_type] = one_family(model_type, mesh, ids, lora=True)
    return results


if __name__ == "__main__":
    run(main)
