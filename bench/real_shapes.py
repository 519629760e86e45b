"""Checkpoints of real published shapes, made here: random weights, `save_pretrained`, a tokenizer beside them.

There is no model hub on these machines, so a benchmark or a check that needs "a real model"
makes one with the published config of a model people fine-tune (depth, width, heads, vocabulary,
tying) and random weights. The tokenizer is the workbench's byte-level BPE with its chat template
(`workbench.data.tokenizer`), trained on the embedded corpus; the model's vocabulary keeps its
published size (rows past the tokenizer's are never looked up, as with any padded vocabulary).

    .venv/bin/python bench/real_shapes.py smollm2-135m /tmp/smollm2      # the whole model
    .venv/bin/python bench/real_shapes.py llama-3.1-8b /tmp/l8b --layers 2 # full width, 2 layers
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

REAL_SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "config": "LlamaConfig",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": {
        "config": "Qwen2Config",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    },
    "llama-3.2-1b": {
        "config": "LlamaConfig",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
    },
    "gemma-2-2b": {
        "config": "Gemma2Config",
        "vocab_size": 256000,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        # layers alternate sliding-window (4096 tokens) and full attention; scores and logits soft-capped
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "rope_theta": 10000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "llama-3.1-8b": {
        "config": "LlamaConfig",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    },
}
"""Published configs (sizes, heads, vocabulary, tying) by a short name."""


def real_config(name: str, *, layers: int | None = None) -> Any:
    """The `transformers` config of `name` (`REAL_SHAPES`), optionally cut to `layers` layers."""
    import transformers as tf

    if name not in REAL_SHAPES:
        raise ValueError(f"shape {name!r} is not allowed: one of {', '.join(REAL_SHAPES)}")
    fields = dict(REAL_SHAPES[name])
    config_class = getattr(tf, fields.pop("config"))
    if layers is not None:
        fields["num_hidden_layers"] = layers
    return config_class(**fields)


def make_checkpoint(
    name: str, out_dir: str | Path, *, layers: int | None = None, dtype: str = "bfloat16", seed: int = 0
) -> Path:
    """Write a random-weight checkpoint of shape `name` (and its tokenizer) to `out_dir`; returns it.

    Weights are saved in `dtype` (published checkpoints are bf16). Skips the work when
    `out_dir` already holds a checkpoint of the same config.
    """
    import torch
    import transformers as tf

    from workbench.data.corpus import embedded_corpus
    from workbench.data.tokenizer import train_tokenizer

    out = Path(out_dir)
    config = real_config(name, layers=layers)
    config.dtype = dtype
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        saved = tf.AutoConfig.from_pretrained(str(out))
        if all(
            getattr(saved, k) == getattr(config, k)
            for k in ("hidden_size", "num_hidden_layers", "vocab_size")
        ):
            return out
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = tf.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(str(out))
    del model
    train_tokenizer(embedded_corpus(), 4096).save_pretrained(str(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("shape", choices=sorted(REAL_SHAPES))
    parser.add_argument("out_dir")
    parser.add_argument("--layers", type=int, default=None, help="cut the depth (the width stays)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    path = make_checkpoint(args.shape, args.out_dir, layers=args.layers, dtype=args.dtype)
    print(f"{args.shape} ({args.layers or 'all'} layers, {args.dtype}) -> {path}")


if __name__ == "__main__":
    main()
