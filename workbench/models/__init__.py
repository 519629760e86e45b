"""The model families the workbench knows and how their `transformers` models are built."""

from workbench.models.build import build_model, count_parameters, enable_gradient_checkpointing, hf_config

__all__ = ["build_model", "count_parameters", "enable_gradient_checkpointing", "hf_config"]
