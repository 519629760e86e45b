"""Tiny models and tokenizers of the families GGUF export writes, each with the tokenizer kind its family uses.

- byte-level BPE (llama, as Llama 3 and SmolLM; qwen2 and qwen3 with Qwen's split rule and ChatML tokens):
  the workbench's own tokenizer, trained on the embedded corpus;
- SentencePiece-style BPE with byte fallback (mistral as Llama 2 / Mistral, gemma and gemma2 as Gemma):
  trained here with ``tokenizers`` and handed to transformers' own ``LlamaTokenizer`` / ``GemmaTokenizer``.

Sizes the transformers GGUF reader does not take from the file are its config class's defaults here:
Qwen3's ``head_dim`` (128), Gemma 2's ``query_pre_attn_scalar`` (256, with Gemma-2-2B's head_dim of 256,
the scale llama.cpp takes) and softcaps; everything else is small (2 layers, hidden 64).
"""

from __future__ import annotations

import functools
from typing import Any

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else "
    "m['role']) + '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
TEXTS = (
    "the cat sat on the mat",
    "  Hello\nworld 12345, naïve café ☕",
    "def f(x):\n    return x ** 2  # square",
)
"""What the tokenizers encode in the round trip: spaces, newlines, digits, accents and a byte-fallback emoji."""


def _corpus() -> list[str]:
    from workbench.data.corpus import embedded_corpus

    return embedded_corpus()[:600]


@functools.cache
def byte_level_tokenizer(cache_dir: str) -> Any:
    from workbench.config import DataConfig
    from workbench.data import get_tokenizer

    return get_tokenizer(DataConfig(), cache_dir=cache_dir)


@functools.cache
def qwen_tokenizer(cache_dir: str) -> Any:
    """Qwen2's tokenizer class (its own split rule) on the byte-level vocabulary, with ChatML tokens."""
    import json

    from transformers import Qwen2Tokenizer

    spec = json.loads(byte_level_tokenizer(cache_dir).backend_tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    vocab = {t: i for t, i in spec["vocab"].items() if not t.startswith("<|")}
    vocab = {t: n for n, t in enumerate(sorted(vocab, key=vocab.get))}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None, pad_token=None)
    tokenizer.add_special_tokens(
        {
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "additional_special_tokens": ["<|im_start|>"],
        }
    )
    tokenizer.chat_template = CHATML
    return tokenizer


@functools.cache
def sentencepiece_tokenizer(kind: str) -> Any:
    """A SentencePiece-style BPE (``▁`` for spaces, ``<0xNN>`` byte fallback) as Llama 2's or Gemma's class."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GemmaTokenizer, LlamaTokenizer

    specials = ["<unk>", "<s>", "</s>"] if kind == "llama" else ["<pad>", "<eos>", "<bos>", "<unk>"]
    specials += [] if kind == "llama" else ["<start_of_turn>", "<end_of_turn>"]
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    core = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=len(specials) + 256 + 400, special_tokens=[*specials, *byte_pieces], show_progress=False
    )
    core.train_from_iterator(_corpus(), trainer=trainer)
    spec = json.loads(core.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    if kind == "llama":
        tokenizer = LlamaTokenizer(vocab=spec["vocab"], merges=merges)
        tokenizer.chat_template = CHATML.replace("<|im_start|>", "[INST]").replace("<|im_end|>", "[/INST]")
    else:
        tokenizer = GemmaTokenizer(vocab=spec["vocab"], merges=merges)
        tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
        tokenizer.chat_template = GEMMA_TEMPLATE
    return tokenizer


def tokenizer_for(family: str, cache_dir: str) -> Any:
    if family == "llama":
        return byte_level_tokenizer(cache_dir)
    if family in ("qwen2", "qwen3"):
        return qwen_tokenizer(cache_dir)
    return sentencepiece_tokenizer("llama" if family == "mistral" else "gemma")


def tiny_model(family: str, vocab_size: int, seed: int = 0) -> Any:
    """A 2-layer, 64-wide `family` causal LM with random weights (a tied embedding where the family ties)."""
    import torch
    import transformers as tf

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    configs = {
        "llama": lambda: tf.LlamaConfig(**common, tie_word_embeddings=False, rope_theta=50000.0),
        "qwen2": lambda: tf.Qwen2Config(**common, tie_word_embeddings=True),
        "qwen3": lambda: tf.Qwen3Config(**common, head_dim=128, tie_word_embeddings=True),
        "mistral": lambda: tf.MistralConfig(**common, tie_word_embeddings=False),
        "gemma": lambda: tf.GemmaConfig(**common, head_dim=16),
        # Gemma-2-2B's head_dim and query scale: llama.cpp scales queries by 1/sqrt(head_dim)
        "gemma2": lambda: tf.Gemma2Config(
            **common, head_dim=256, query_pre_attn_scalar=256, sliding_window=64
        ),
    }
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(configs[family](), attn_implementation="eager").eval()
    with torch.no_grad():  # norms and biases away from their initial ones, so a slip in writing them shows
        for parameter in model.parameters():
            scale = 0.1 if parameter.dim() == 1 else 0.02
            parameter.add_(torch.randn_like(parameter) * scale)
    return model
