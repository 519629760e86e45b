"""The model families the workbench knows, how their `transformers` models are built, and their
quantized base weights (``model.quantize``: `QuantizedLinear`, `quantize_model`)."""

from typing import Any

from workbench.models.build import build_model, count_parameters, enable_gradient_checkpointing, hf_config

__all__ = [
    "QuantizedLinear",
    "build_model",
    "count_parameters",
    "enable_gradient_checkpointing",
    "hf_config",
    "quantize_model",
]

_QUANTIZE_NAMES = ("QuantizedLinear", "quantize_model")


def __getattr__(name: str) -> Any:
    # The quantize names on first use: that module imports torch, and importing this package (which
    # workbench.config does, for the families registry) must not.
    if name in _QUANTIZE_NAMES:
        from workbench.models import quantize

        return getattr(quantize, name)
    raise AttributeError(f"module 'workbench.models' has no attribute {name!r}")
