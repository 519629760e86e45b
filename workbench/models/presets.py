"""Model presets: the shapes of well-known models, as `model.*` config overrides.

`MODEL_PRESETS` maps a display name to the `ModelConfig` fields that give a model that shape;
apply one with ``cfg.with_overrides({f"model.{k}": v for k, v in MODEL_PRESETS[name].items()})``.

No vocabulary size: a model built from a config takes its vocabulary from the tokenizer the run
uses (`Trainer` builds it with ``vocab_size=len(tokenizer)``), so the preset's own vocabulary
would only make the logits estimate describe a model that never trains. Add ``vocab_size`` by
hand to estimate the real model: 32000 for Llama 2, 128256 for Llama 3.x, 151936 for Qwen2.5-0.5B,
152064 for Qwen2.5-7B. (Shapes only: rope_theta and the like change no memory or FLOPs figure.)

Plain Python: no UI imports.
"""

from __future__ import annotations

from typing import Any


def _preset(
    family: str,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    mlp: int,
    positions: int,
    tie: bool,
) -> dict[str, Any]:
    return {
        "family": family,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "intermediate_size": mlp,
        "max_position_embeddings": positions,
        "tie_word_embeddings": tie,
    }


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "~125M (llama, 768×12)": _preset("llama", 768, 12, 12, 12, 3072, 4096, True),
    "~350M (llama, 1024×24)": _preset("llama", 1024, 24, 16, 16, 2816, 4096, True),
    "Qwen2.5-0.5B shape": _preset("qwen2", 896, 24, 14, 2, 4864, 32768, True),
    "Llama-3.2-1B shape": _preset("llama", 2048, 16, 32, 8, 8192, 8192, True),
    "Llama-3.2-3B shape": _preset("llama", 3072, 28, 24, 8, 8192, 8192, True),
    "Llama-2-7B shape": _preset("llama", 4096, 32, 32, 32, 11008, 4096, False),
    "Llama-3.1-8B shape": _preset("llama", 4096, 32, 32, 8, 14336, 131072, False),
    "Qwen2.5-7B shape": _preset("qwen2", 3584, 28, 28, 4, 18944, 32768, False),
}

__all__ = ["MODEL_PRESETS"]
