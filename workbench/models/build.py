"""[from models] Build `transformers` causal LMs from the workbench's `ModelConfig`, or load one from a local directory.

No hub access: a model is either built from a config (random init, seeded) or loaded with
``from_pretrained(dir)`` from a directory on disk. Each family's `transformers` config class
and how the `ModelConfig` fields map onto it come from the registry in
`workbench.models.families`.

Importing this module imports neither torch nor transformers (the functions do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.models.families import FAMILIES, FAMILY_NAMES

if TYPE_CHECKING:  # annotations only: workbench.config imports the families registry from this package
    import torch

    from workbench.config import ModelConfig


def hf_config(cfg: ModelConfig, vocab_size: int | None = None) -> Any:
    """The `transformers` config for `cfg` (dropout off, so losses compare across devices)."""
    import transformers as tf

    family = FAMILIES.get(cfg.family)
    if family is None:
        raise ValueError(
            f"model.family={cfg.family!r} is not allowed: expected one of "
            + ", ".join(repr(name) for name in FAMILY_NAMES)
        )
    config_class = getattr(tf, family.config_class, None)
    if config_class is None:
        raise ValueError(
            f"model.family={cfg.family!r} needs transformers.{family.config_class}, which "
            f"transformers {tf.__version__} does not have: upgrade transformers"
        )
    return config_class(**family.config_kwargs(cfg, vocab_size))


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
    import torch
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
