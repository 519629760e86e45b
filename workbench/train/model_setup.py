"""The run's model before it is placed: built or loaded, then prepared as the config says.

`run_model` gives the `Trainer` its model on the host: the one handed in, or built or loaded from
``model.pretrained_path`` (`workbench.train.start`), with the attention kernel chosen for the
hardware. `prepare_model` applies precision, quantization, LoRA, scan and gradient checkpointing
in the one order they compose in. `precision_notices` says what the precision becomes on this hardware.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from workbench.backend.hardware import HardwareInfo
from workbench.config import WorkbenchConfig
from workbench.models.attention_choice import choose_attention, use_attention
from workbench.models.build import enable_gradient_checkpointing, no_kv_cache
from workbench.models.checkpoint_offload import offload_choice
from workbench.models.mlp_tiles import MlpTiling, install_mlp_tiles
from workbench.models.scan import choose_scan, install_scan
from workbench.train.long_context import plan_long_context
from workbench.train.lora import apply_lora
from workbench.train.start import StartingModel, starting_model


def run_model(
    cfg: WorkbenchConfig,
    model: torch.nn.Module | None,
    tokenizer: Any,
    *,
    hw: HardwareInfo,
    notice: Callable[[str], None],
    mesh: Any = None,
) -> torch.nn.Module:
    """The run's model on the host: the one handed in, or built or loaded from ``model.pretrained_path``
    (any model directory: `workbench.train.start`), prepared (`prepare_model`) with the attention kernel
    ``model.attention`` resolves to on `hw` for rows of ``data.max_length``, the long-context settings
    decided for `hw` over `mesh` (`workbench.train.long_context`), with the adapters it continues
    copied in."""
    start = StartingModel(model) if model is not None else starting_model(cfg, tokenizer, notice)
    kernel = choose_attention(
        cfg.model.attention, hw, seq_len=cfg.data.max_length, notice=notice, model=start.model
    )
    plan = plan_long_context(cfg, start.model, hw, mesh=mesh, attention=kernel, notice=notice)
    prepared = prepare_model(
        start.model,
        cfg.train,
        cfg.model,
        xla=hw.via_xla,
        lora=cfg.lora,
        notice=notice,
        attention=kernel,
        offload=plan.offload,
        tiling=plan.tiling,
    )
    start.carry_into(prepared)
    return prepared


def prepare_model(
    model: torch.nn.Module,
    train: Any,
    model_cfg: Any,
    *,
    xla: bool,
    lora: Any = None,
    notice: Callable[[str], None] | None = None,
    attention: str | None = None,
    offload: bool | None = None,
    tiling: MlpTiling | None = None,
) -> torch.nn.Module:
    """Precision (fp32 weights for a full fine-tune under 'fp32'/'bf16-mixed', whatever the checkpoint's
    dtype; bf16 under 'bf16'), no KV cache (training never decodes), gradient checkpointing: as `train` says; then,
    with ``model_cfg.quantize`` ('int8', 'int4'), the base's linears as integers
    (`workbench.models.quantize`, layer by layer; `notice` hears what was quantized); then, with
    ``lora.rank > 0``, the LoRA model (frozen base, seeded adapters: `workbench.train.lora`); then,
    with ``model_cfg.scan_layers`` on XLA (true, or 'auto' where it pays off: `choose_scan`, whose
    notice `notice` hears), the decoder stack scanned over stacked weights (`workbench.models.scan`;
    true is checked on every backend, a no-op off XLA), whose rematerialisation is the gradient
    checkpointing; `attention` ('eager', 'sdpa', 'flash', 'chunked': `workbench.models.attention`) sets the
    attention kernel (None keeps the model's); `tiling` runs every layer's MLP in tiles
    (`workbench.models.mlp_tiles`); `offload` keeps the layers' checkpoints in host memory, under the
    scanned stack on XLA, through the checkpoint function elsewhere (None: as ``train.offload_activations``
    says when it says 'on'; `workbench.train.long_context` decides 'auto'). Runs on the host, before the
    model is placed on its device or mesh."""
    quantize = model_cfg.quantize
    if train.precision == "bf16":
        model.to(torch.bfloat16)
    elif lora is None or lora.rank == 0:
        # fp32 / bf16-mixed keep fp32 master weights: a bf16 checkpoint (most published ones) would
        # otherwise train in bf16, where AdamW's small updates round away. A LoRA base is frozen: it
        # keeps the checkpoint's dtype (the adapters are fp32 either way).
        model.to(torch.float32)
    no_kv_cache(model)  # a model handed in did not come through build_model
    if attention is not None:  # before LoRA and scan, which wrap the attention modules as they are
        use_attention(model, attention)
    if quantize != "none":  # before LoRA, so the adapters wrap the quantized layers
        from workbench.models.quantize import quantize_model

        summary = quantize_model(model, quantize)
        if notice is not None:
            notice(summary.notice())
    if tiling is not None:  # before LoRA and scan: every layer's MLP alike, its adapters found per call
        install_mlp_tiles(model, tiling)
    scan, why = choose_scan(model, model_cfg.scan_layers, xla=xla)
    if why is not None and notice is not None:
        notice(why)
    offload = offload_choice(train, offload, xla=xla, scan=scan, notice=notice)
    if train.gradient_checkpointing and not scan:
        enable_gradient_checkpointing(model, xla=xla, offload=offload)
    if lora is not None and lora.rank > 0:
        model = apply_lora(model, lora, seed=train.seed)
    if scan:  # after LoRA: the scanned layers hold the adapters
        install_scan(model, remat=train.gradient_checkpointing, offload=offload)
    return model


def precision_notices(train: Any, hw: HardwareInfo) -> list[str]:
    """What the run says about its precision on this hardware (bf16-mixed on a GPU without bf16)."""
    if train.precision == "bf16-mixed" and hw.backend == "cuda" and not torch.cuda.is_bf16_supported():
        return ["precision bf16-mixed: this GPU has no bf16; running fp32"]
    return []
