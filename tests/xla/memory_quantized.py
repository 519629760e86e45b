"""The estimate against the compiler's memory analysis of the trainer's own LoRA step, with the base
int8 or int4 and the loss plain or in chunks (tests/test_memory_quantized.py).

`trainer_step_memory` builds the real `Trainer` (``model.quantize``, LoRA rank 16 on every
projection, ``train.loss_chunk_tokens``, AdamW over the adapters, clipping) on one XLA device,
traces one `StepEngine.train_step` on a synthetic batch and compiles it without running it
(`workbench.analysis.probe.compiled_program_memory`): the program of the training loop's sync
(inputs, the loss and grad norm, the updated adapters, AdamW moments and running sums).
``bench/memory.py`` and ``bench/memory_real.py`` call it too.

Run with XLA:CPU's memory-minimising scheduler (``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_
scheduler=false``; the test sets it): the default one computes every weight-only value (each
layer's converted weight) at the start of the program and holds them all
(tests/xla/quantize_memory.py). The test's rows are fp32, XLA:CPU's native precision: XLA:CPU
computes a bf16 program's intermediates in fp32 (no bf16 buffer is live at the peak of a bf16
step), so the bf16 sizes the estimate counts cannot be checked here (``bench/memory.py`` prints
bf16 rows beside). Needs the compile memory log (PT_XLA_DEBUG_LEVEL=1, PT_XLA_DEBUG_FILE).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.analysis.estimate import estimate
from workbench.analysis.probe import compiled_program_memory

SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1792,
    "num_layers": 3,
    "num_heads": 8,
    "num_kv_heads": 2,
    "vocab_size": 16384,
    "tie_word_embeddings": False,
}
"""Llama 3.1 8B's proportions at an eighth of its width (vocabulary 32 x hidden, MLP 3.5 x hidden,
4 query heads per KV head, untied head), 3 layers: the logits and the head weigh as at 8B."""
ROWS, LENGTH, CHUNK_TOKENS = 2, 256, 128
PRECISION = "fp32"


def xla_cpu_int8_head_copies(shape: dict) -> int:
    """What XLA:CPU holds beyond the estimate in a chunked loss over an int8 head: the head's
    integers converted to fp32 for the chunks' forward passes and again for their backward passes,
    each computed once and live through the loss. XLA:CPU's dot takes no converted operand (and
    runs bf16 in fp32); XLA on TPU fuses the convert into the matmul, the estimate's int8 model,
    so this is counted on XLA:CPU only (int4's dequantized copies are in the estimate)."""
    return 2 * shape["vocab_size"] * shape["hidden_size"] * 4


def trainer_config(
    shape: dict[str, Any],
    *,
    quantize: str,
    rows: int,
    length: int,
    loss_chunk_tokens: int | str,
    gradient_checkpointing: bool,
    lora_rank: int = 16,
    precision: str = "bf16",
    overrides: dict[str, Any] | None = None,
) -> Any:
    """The workbench config of the run: `shape` (``ModelConfig`` fields), LoRA, AdamW, on XLA;
    `overrides`: more dotted settings."""
    from workbench.config import WorkbenchConfig

    return WorkbenchConfig().with_overrides(
        {
            "model.family": "llama",
            **{f"model.{k}": v for k, v in shape.items()},
            "model.max_position_embeddings": max(length, 128),
            "model.quantize": quantize,
            "lora.rank": lora_rank,
            "data.max_length": length,
            "bucketing.strategy": "max",
            "train.device_type": "xla",
            "train.precision": precision,
            "train.optimizer": "adamw",
            "train.gradient_checkpointing": gradient_checkpointing,
            "train.batch_size": rows,
            "train.loss_chunk_tokens": loss_chunk_tokens,
            "train.progress_bar": False,
            "train.compile_cache_dir": None,
            **(overrides or {}),
        }
    )


def _dataset(rows: int, length: int, vocab: int) -> Any:
    import datasets

    ids = [[(7 * r + i) % (vocab - 1) + 1 for i in range(length)] for r in range(rows)]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids, "length": [length] * rows})


def trainer_step_memory(
    shape: dict[str, Any],
    *,
    quantize: str,
    rows: int,
    length: int,
    loss_chunk_tokens: int | str = 0,
    gradient_checkpointing: bool = False,
    lora_rank: int = 16,
    precision: str = "bf16",
    overrides: dict[str, Any] | None = None,
    model: torch.nn.Module | None = None,
    execute: bool = False,
) -> dict[str, Any]:
    """The compiler's analysis of the trainer's step for this run beside `estimate`'s figure.

    `model`: a model of `shape` built by the caller (on the host, any precision); default:
    `build_model` of the config. `execute` runs the step (a sync) instead of compiling it only.
    Returns bytes: ``compiler`` (the peak), its ``arguments``, ``outputs``, ``aliased`` and
    ``temporaries``; ``estimate`` and its ``breakdown``; ``base_bytes``, the frozen base as held
    (from the model's own parameters), beside ``base_estimate_bytes``; ``base_parameters`` (their
    logical count); ``quantized_parameters`` and ``quantized_bytes`` (integers and scales);
    ``step_executions``: programs run while tracing and compiling the step (0 when compile-only).
    """
    from workbench.backend.xla import runtime
    from workbench.data.loader import synthetic_batch
    from workbench.models.build import build_model
    from workbench.models.quantize import logical_parameter_count, quantized_layers
    from workbench.train import Trainer

    cfg = trainer_config(
        shape,
        quantize=quantize,
        rows=rows,
        length=length,
        loss_chunk_tokens=loss_chunk_tokens,
        gradient_checkpointing=gradient_checkpointing,
        lora_rank=lora_rank,
        precision=precision,
        overrides=overrides,
    )
    if model is None:
        model = build_model(cfg.model, seed=0)
    trainer = Trainer(cfg, model=model, train_dataset=_dataset(rows, length, cfg.model.vocab_size))
    del model
    engine = trainer.engine
    engine.init_state()  # the AdamW moments and running sums exist: the steady-state step
    batch = trainer.data.to_device(synthetic_batch((rows, length), vocab_size=cfg.model.vocab_size))
    # the setup's programs run asynchronously: on a busy CPU one may be counted after this read
    runtime.wait_device_ops()
    executed = runtime.execute_count()

    def trace() -> list[torch.Tensor]:
        out = engine.train_step([batch])
        state = [
            t for s in engine.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
        ]
        return [
            *out.values(),
            *engine.params,
            *(t for t in state if t.device.type == "xla"),
            engine._loss_acc,
            engine._tokens_acc,
        ]

    measured = compiled_program_memory(trace, execute=execute)
    executions = runtime.execute_count() - executed
    est = estimate(
        trainer.model,
        batch_size=rows,
        seq_len=length,
        precision=precision,
        gradient_checkpointing=gradient_checkpointing,
        lora_rank=lora_rank,
        lora_targets=cfg.lora.target_modules,
        quantize=quantize,
        loss_chunk_tokens=loss_chunk_tokens,
    )
    frozen = {id(p): p for p in trainer.model.parameters() if not p.requires_grad}
    layers = quantized_layers(trainer.model).values()
    return {
        "compiler": measured.peak_bytes,
        "arguments": measured.argument_bytes,
        "outputs": measured.output_bytes,
        "aliased": measured.alias_bytes,
        "temporaries": measured.temp_bytes,
        "programs": measured.programs,
        "step_executions": executions,
        "estimate": est.total_bytes,
        "breakdown": est.breakdown,
        "chunk_positions": est.loss_chunk_positions,
        "base_bytes": sum(p.numel() * p.element_size() for p in frozen.values()),
        "base_estimate_bytes": est.base_weight_bytes,
        "base_parameters": logical_parameter_count(trainer.model) - est.trainable_parameters,
        "quantized_parameters": sum(m.in_features * m.out_features for m in layers),
        "quantized_bytes": sum(
            p.numel() * p.element_size() for m in layers for p in (m.weight, m.weight_scale)
        ),
        "trainable_parameters": est.trainable_parameters,
    }


def main(rows: list[list[Any]] | None = None, precision: str = PRECISION) -> dict[str, Any]:
    """`rows`: ``[quantize, chunked, checkpointing]`` each (default: int8/int4 x plain/chunked,
    no checkpointing), at `SHAPE`, ``ROWS x LENGTH``, chunks of ``CHUNK_TOKENS`` tokens."""
    rows = rows or [[q, c, False] for q in ("int8", "int4") for c in (False, True)]
    out = {}
    for quantize, chunked, ckpt in rows:
        key = f"{quantize}/{'chunked' if chunked else 'plain'}" + ("/ckpt" if ckpt else "")
        out[key] = trainer_step_memory(
            SHAPE,
            quantize=quantize,
            rows=ROWS,
            length=LENGTH,
            loss_chunk_tokens=CHUNK_TOKENS if chunked else 0,
            gradient_checkpointing=ckpt,
            precision=precision,
        )
    return out


if __name__ == "__main__":
    run(main)
