"""The compiler's memory analysis of the real LoRA training step with the base unquantized, int8 and
int4 (tests/test_quantize.py): argument bytes (the base weights among them) and temporaries of the
largest compiled program of each run, beside the base's logical parameter count.

Run with XLA:CPU's memory-minimising scheduler (``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_
scheduler=false``; the test sets it): XLA:CPU's default breadth-first scheduler, tuned for
concurrency, computes every value that depends on parameters alone at the start of the program,
so it holds each layer's converted weight at once whatever the model does (an unquantized bf16
model on XLA:CPU shows the same, for its bf16 -> fp32 dot upcasts)."""

from __future__ import annotations

from typing import Any

from tests.xla import run
from workbench.backend.xla import compile_log
from workbench.models.quantize import quantized_layers
from workbench.train import Trainer

SHAPE = {
    "model.hidden_size": 256,
    "model.intermediate_size": 1024,
    "model.num_layers": 4,
    "model.num_heads": 4,
    "model.num_kv_heads": 4,
    "model.vocab_size": 128,
}


def step_memory(mode: str, precision: str) -> dict[str, Any]:
    from tests.test_train import tiny_cfg, token_dataset

    before = len(compile_log.compiled_memory_records())
    cfg = tiny_cfg(
        **SHAPE,
        **{
            "model.quantize": mode,
            "lora.rank": 8,
            "train.precision": precision,
            "train.device_type": "xla",
            "train.batch_size": 2,
            "train.steps": 2,
            "data.max_length": 64,
            "bucketing.max_buckets": 1,
        },
    )
    trainer = Trainer(cfg, train_dataset=token_dataset(8, lo=64, hi=64))
    trainer.fit()
    biggest = max(compile_log.compiled_memory_records()[before:], key=lambda r: r.peak_bytes)
    layers = quantized_layers(trainer.model)
    return {
        "argument_bytes": biggest.argument_bytes,
        "temp_bytes": biggest.temp_bytes,
        "quantized_params": sum(m.in_features * m.out_features for m in layers.values()),
        "scale_bytes": sum(m.weight_scale.numel() * 4 for m in layers.values()),
    }


def main(precision: str = "fp32") -> dict[str, Any]:
    return {mode: step_memory(mode, precision) for mode in ("none", "int8", "int4")}


if __name__ == "__main__":
    run(main)
