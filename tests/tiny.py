"""The tiny model config the sharding, family and generation tests build: small enough for XLA:CPU,
with every size divisible by the meshes the tests use (heads and hidden over model=2 or 4)."""

from __future__ import annotations

from typing import Any

from workbench.config import ModelConfig


def tiny(family: str, **overrides) -> ModelConfig:
    """A 2-layer, 64-wide `family` model (4 heads, 2 kv heads, vocab 512); `overrides` replace fields."""
    fields = dict(
        family=family,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        vocab_size=512,
        max_position_embeddings=128,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def nonzero_adapters(model: Any) -> Any:
    """`model` with its LoRA B matrices drawn from N(0, 0.02) under seed 1 (the global RNG left as it was):
    B starts at zero, which would leave every A's gradient zero. Returns `model`."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(parameter, std=0.02)
    return model
