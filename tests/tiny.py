"""The tiny model config the sharding, family and generation tests build: small enough for XLA:CPU,
with every size divisible by the meshes the tests use (heads and hidden over model=2 or 4)."""

from __future__ import annotations

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
