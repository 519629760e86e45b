"""[from models] Build `transformers` causal LMs from the workbench's `ModelConfig`, or load one from a local directory.

A model is either built from a config (random init, seeded) or loaded with
``from_pretrained(dir)`` from a directory on disk; a Hub id there is its repo's local snapshot
(`workbench.hub.resolve.local_dir`, which fetches what the cache lacks). Each family's `transformers` config class
and how the `ModelConfig` fields map onto it come from the registry in
`workbench.families`.

Importing this module imports neither torch nor transformers (the functions do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.families import FAMILIES, FAMILY_NAMES
from workbench.hub.resolve import local_dir

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


def transformers_config_of(model_or_config: Any) -> Any:
    """The `transformers` config of a model (its ``.config``), of a workbench `ModelConfig` (the
    checkpoint's own config read from ``pretrained_path``, else `hf_config`), or a transformers
    config itself."""
    if hasattr(model_or_config, "parameters") and hasattr(model_or_config, "config"):  # a model
        return model_or_config.config
    if type(model_or_config).__name__ == "ModelConfig" and hasattr(model_or_config, "family"):
        if getattr(model_or_config, "pretrained_path", None):
            import transformers as tf

            # a Hub id: its config alone, so an estimate never downloads the weights
            config_dir = local_dir(model_or_config.pretrained_path, use="config")
            return tf.AutoConfig.from_pretrained(str(config_dir))
        return hf_config(model_or_config)
    return model_or_config


def build_model(
    cfg: ModelConfig,
    *,
    vocab_size: int | None = None,
    seed: int = 0,
    attn_implementation: str = "eager",
) -> Any:
    """A causal LM: loaded from `cfg.pretrained_path` when set (in the checkpoint's own dtype), else
    built from the config with a seeded init.

    `attn_implementation` defaults to "eager", the implementation that lowers cleanly on XLA
    and honours 4-D attention masks (used by packing). The model comes with its KV cache off
    (`no_kv_cache`): it is built for training. The fields that prepare a built model for a run
    (``cfg.attention``, ``cfg.quantize``, ``cfg.scan_layers``) are applied after it, in their one
    order, by `workbench.train.model_setup.prepare_model` (and `workbench.analysis.probe.step_model`).
    """
    import torch
    import transformers as tf

    if cfg.pretrained_path:
        # dtype="auto": the checkpoint's own dtype (transformers 5's default; 4.x loads fp32), so a
        # bf16 checkpoint is not doubled on the host before `model.quantize` or bf16 casts it
        return no_kv_cache(
            tf.AutoModelForCausalLM.from_pretrained(
                str(local_dir(cfg.pretrained_path)), attn_implementation=attn_implementation, dtype="auto"
            )
        )
    config = hf_config(cfg, vocab_size)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return no_kv_cache(
            tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
        )


def no_kv_cache(model: Any) -> Any:
    """Turn the model's KV cache off (``config.use_cache = False``) and return the model.

    The one place the training path decides this: every forward of training, eval, warm-up,
    the memory probes and the batch finder runs on a model from `build_model` (the trainer
    passes a model or teacher it is handed through here too). Training never decodes, and with
    the cache on a forward builds one per call: more memory than the estimate counts, and for
    sliding-window families (Mistral) transformers' dynamic sliding-window layer, which fails
    on XLA (``Value out of range`` slicing the window). Generation turns the cache on per call
    (`workbench.generate`, ``model.generate(use_cache=True)``).
    """
    config = getattr(model, "config", None)
    if config is not None:
        config.use_cache = False
    return model


def enable_gradient_checkpointing(model: Any, *, xla: bool, offload: bool = False) -> None:
    """Recompute each decoder layer's activations in the backward pass (a `transformers` model).

    On XLA, torch's own checkpoint is undone by the compiler (its CSE merges the recomputation
    back into the forward), so torch_xla's checkpoint, which puts an optimization barrier
    around the recomputation, replaces it; that one only has the reentrant mode. ``offload``
    (plain torch only: on XLA the scanned stack offloads, `workbench.models.scan`) keeps each
    layer's checkpointed input in host memory (`workbench.backend.native.offload`).
    """
    if not hasattr(model, "gradient_checkpointing_enable"):
        raise ValueError("gradient checkpointing needs a transformers model (gradient_checkpointing_enable)")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if offload:
        if xla:
            raise ValueError("offload on XLA runs under the scanned layer stack (install_scan(offload=True))")
        from workbench.backend.native.offload import offloaded_checkpoint_function

        model._set_gradient_checkpointing(
            enable=True, gradient_checkpointing_func=offloaded_checkpoint_function()
        )
    elif xla:
        import functools

        from workbench.backend.xla import runtime

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
