"""Training FLOPs and MFU: how fast a run trains against the chip's peak.

`training_flops_per_token` counts the model FLOPs of one trained token (PaLM's
``6 N + 12 L H Q T``, from the family's shape); `mfu` turns a measured throughput into model
FLOPs utilisation against the peak of all the run's devices (`HardwareInfo`'s, from the chip
table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.backend.hardware import HardwareInfo


# ---- FLOPs and MFU ----------------------------------------------------------------------


def training_flops_per_token(model_config: Any, seq_len: int) -> float:
    """Training FLOPs per token: ``6 N + 12 L H Q T``.

    Source: PaLM (Chowdhery et al., 2022), appendix B, "Compute usage and MFU": a forward
    and backward pass costs 6 FLOPs per matmul parameter per token (2 forward, 4 backward),
    plus ``6 L H (2 Q T)`` = ``12 L H Q T`` for the attention score and value matmuls, with
    L layers, H heads, Q the head dimension and T the sequence length. (Chinchilla, Hoffmann
    et al. 2022, appendix F counts the same terms, plus the softmax and embeddings, in detail.)
    The causal mask is not discounted, as in PaLM.

    N counts the parameters that take part in matrix multiplies: every parameter except
    lookup-only embeddings (learned position embeddings, and the input embedding when it is
    not tied to the LM head; a tied one is the LM head's matmul). This is the convention of
    nanoGPT's ``estimate_mfu`` for GPT-2 (N = parameters minus ``wpe``).

    Recomputation from activation checkpointing is not counted (MFU counts model FLOPs only).
    """
    from workbench.analysis.estimate import model_shape

    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} is not allowed: an int >= 1")
    shape = model_shape(model_config)
    return 6.0 * shape.matmul_parameters + 12.0 * shape.layers * shape.heads * shape.head_dim * seq_len


def mfu(
    tokens_per_s: float | None,
    flops_per_token: float | None,
    hw: HardwareInfo | None,
    *,
    peak_flops: float | None = None,
) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the peak of all devices of the run.

    `peak_flops` (total over all devices) overrides the hardware's figure, e.g. on the CPU,
    whose peak the chip table does not know. None when any input is unknown.
    """
    if tokens_per_s is None or flops_per_token is None:
        return None
    peak = peak_flops
    if peak is None and hw is not None and hw.peak_bf16_flops_per_device:
        peak = hw.peak_bf16_flops_per_device * hw.num_devices
    if not peak:
        return None
    return tokens_per_s * flops_per_token / peak
