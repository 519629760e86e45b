"""[from models] Build `transformers` causal LMs from the workbench's `ModelConfig`, or load one from a local directory.

No hub access: a model is either built from a config (random init, seeded) or loaded with
``from_pretrained(dir)`` from a directory on disk. The families map onto their
`transformers` config classes with the same size fields.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.config import ModelConfig


def hf_config(cfg: ModelConfig, vocab_size: int | None = None) -> Any:
    """The `transformers` config for `cfg` (dropout off, so losses compare across devices)."""
    import transformers as tf

    vocab = vocab_size or cfg.vocab_size
    common = dict(vocab_size=vocab, tie_word_embeddings=cfg.tie_word_embeddings)
    if cfg.family == "gpt2":
        return tf.GPT2Config(
            n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers,
            n_head=cfg.num_heads,
            n_inner=cfg.intermediate_size,
            n_positions=cfg.max_position_embeddings,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    classes = {
        "llama": tf.LlamaConfig,
        "qwen2": tf.Qwen2Config,
        "mistral": tf.MistralConfig,
        "gemma": tf.GemmaConfig,
    }
    extra: dict[str, Any] = {}
    if cfg.family == "gemma":
        extra["head_dim"] = cfg.hidden_size // cfg.num_heads
    return classes[cfg.family](
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        attention_dropout=0.0,
        **extra,
        **common,
    )


def build_model(
    cfg: ModelConfig,
    *,
    vocab_size: int | None = None,
    seed: int = 0,
    attn_implementation: str = "eager",
) -> Any:
    """A causal LM: loaded from `cfg.pretrained_path` when set, else built from the config with a seeded init.

    `attn_implementation` defaults to "eager", the implementation that lowers cleanly on XLA
    and honours 4-D attention masks (used by packing).
    """
    import transformers as tf

    if cfg.pretrained_path:
        return tf.AutoModelForCausalLM.from_pretrained(
            cfg.pretrained_path, attn_implementation=attn_implementation
        )
    config = hf_config(cfg, vocab_size)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


def enable_gradient_checkpointing(model: Any, *, xla: bool) -> None:
    """Recompute each decoder layer's activations in the backward pass (a `transformers` model).

    On XLA, torch's own checkpoint is undone by the compiler (its CSE merges the recomputation
    back into the forward), so torch_xla's checkpoint, which puts an optimization barrier
    around the recomputation, replaces it; that one only has the reentrant mode.
    """
    if not hasattr(model, "gradient_checkpointing_enable"):
        raise ValueError("gradient checkpointing needs a transformers model (gradient_checkpointing_enable)")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if xla:
        import functools

        from workbench.backend import runtime

        fn = functools.partial(runtime.gradient_checkpoint_function(), use_reentrant=True)
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=fn)


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
