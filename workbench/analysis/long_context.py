"""The memory estimate's long-context terms: layer checkpoints in host memory and the MLP in tiles.

Two settings change what a long row costs (`workbench.analysis.estimate.estimate` takes both; a
config's through `workbench.analysis.config_estimate.config_settings`):

- **``model.mlp_chunk_tokens``** (`workbench.models.mlp_tiles`): the MLP's intermediates (``4 x
  intermediate`` values a position in a gated MLP, `mlp_values_per_position`) are no longer saved,
  for the one layer being recomputed under checkpointing or for every layer without; one tile's
  intermediates are held instead while its backward runs, a temporary of the layer's backward pass
  like the attention's (the larger of the two counts, `layer_transient_bytes`). The tile's length
  is `workbench.models.mlp_tiles.mlp_chunk_length`, the rule the model runs.
- **``train.offload_activations``** (checkpointing on): each layer's input (its checkpoint, with the
  rotary cos and sin the scan carries beside it) goes to host memory in the forward pass and comes
  back for that layer's backward pass (`host_checkpoint_bytes`, the breakdown's host line
  ``offloaded_checkpoints``). On the device stay `IN_FLIGHT_CHECKPOINTS` layers' inputs (the one in
  use and the one being copied). The step then has two peaks that never overlap: the loss's (its
  logits, the dequantized head, the final norm's tensors) and one layer's backward (the checkpoints
  in flight, the layer recomputed, its temporaries and its dequantized weight). The device holds the
  larger: in the breakdown the loss's terms keep their face value and ``activations`` is the final
  norm's tensors plus whatever the layer's peak holds beyond the loss's (`offloaded_activations`;
  the same rule the estimate already applies to the attention's temporaries and the logits).

'auto' offload (`resolve_offload`) is on only where checkpointing is on and the run does not fit
the device without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.analysis.shape import ModelShape, quantized_matrices
from workbench.models.mlp_tiles import mlp_chunk_length, mlp_values_per_position

OFFLOAD_SETTINGS: tuple[str, ...] = ("auto", "on", "off")
"""``train.offload_activations``'s values."""
IN_FLIGHT_CHECKPOINTS = 2
"""Layer inputs on the device at once under offload: the one in use and the one on its way."""
HOST_KEYS: tuple[str, ...] = ("offloaded_checkpoints",)
"""Breakdown parts held in host memory: left out of the device's total (`MemoryEstimate.host_bytes`)."""
LONG_CONTEXT_MEANINGS: dict[str, str] = {
    "offloaded_checkpoints": "host memory, not the device's: each layer's checkpointed input (and its "
    "rotary cos/sin) offloaded by train.offload_activations",
}


@dataclass(frozen=True)
class LongContextTerms:
    """What the two settings make of a step: the breakdown parts they decide, and the settings resolved."""

    parts: dict[str, int]
    """``activations`` (device) and ``offloaded_checkpoints`` (host)."""
    offload: bool
    tile_positions: int | None


def long_context_terms(
    shape: ModelShape,
    act: dict[str, float],
    *,
    rows: int,
    seq_len: int,
    compute_bytes: int,
    score_bytes: int,
    gradient_checkpointing: bool,
    model_parallel: int,
    quantize: str,
    logits: int,
    dequant: int,
    memory_bytes: int | None,
    mlp_chunk_tokens: int | str | None,
    offload_activations: str,
    fits_without: Callable[[], bool],
) -> LongContextTerms:
    """The estimate's ``activations`` and host parts for ``model.mlp_chunk_tokens`` (tiles by
    `mlp_chunk_length`) and ``train.offload_activations`` (`resolve_offload`; `fits_without()`: whether
    the run fits the device without offload), from the per-token elements `act`
    (`workbench.analysis.estimate.activation_elements_per_token`) and the loss's `logits` and `dequant`."""
    tile = mlp_chunk_length(
        mlp_chunk_tokens,
        rows=rows,
        length=seq_len,
        intermediate=shape.intermediate,
        gated=shape.gated_mlp,
        compute_bytes=compute_bytes,
        memory_bytes=memory_bytes,
        model_parallel=model_parallel,
    )
    offload = resolve_offload(
        offload_activations, gradient_checkpointing=gradient_checkpointing, fits_without=fits_without
    )
    activations = activation_bytes(
        shape,
        act,
        rows=rows,
        seq_len=seq_len,
        compute_bytes=compute_bytes,
        score_bytes=score_bytes,
        gradient_checkpointing=gradient_checkpointing,
        tile_positions=tile,
        offload=offload,
        logits=logits,
        dequant=dequant,
        layer_dequant=layer_dequant_bytes(
            shape, quantize, compute_bytes=compute_bytes, model_parallel=model_parallel
        ),
        model_parallel=model_parallel,
    )
    host = host_checkpoint_bytes(shape, rows=rows, seq_len=seq_len, compute_bytes=compute_bytes)
    parts = {"activations": activations, "offloaded_checkpoints": host if offload else 0}
    return LongContextTerms(parts, offload, tile)


def resolve_offload(setting: Any, *, gradient_checkpointing: bool, fits_without: Callable[[], bool]) -> bool:
    """Whether ``train.offload_activations=setting`` offloads: 'on' (checkpointing required), 'off',
    or 'auto': on only with checkpointing and where `fits_without()` says the run does not fit
    without it."""
    if setting not in OFFLOAD_SETTINGS:
        raise ValueError(
            f"offload_activations={setting!r} is not allowed: one of {', '.join(map(repr, OFFLOAD_SETTINGS))}"
        )
    if setting == "on" and not gradient_checkpointing:
        raise ValueError(
            "offload_activations='on' needs gradient_checkpointing=True: it moves the layers' "
            "checkpoints to host memory, and without checkpointing there are none"
        )
    if setting == "auto":
        return gradient_checkpointing and not fits_without()
    return setting == "on"


def host_checkpoint_bytes(shape: ModelShape, *, rows: int, seq_len: int, compute_bytes: int) -> int:
    """Host bytes of every layer's checkpoint under offload: its input ``[rows, T, hidden]`` and what
    travels with it. Under XLA's scanned stack (tests/xla/offload_scan.py counts it in the HLO) the
    carry holds, saved per layer: for rotary families the ``[1, T, head_dim]`` cos and sin (rows of
    one unpacked batch share them), and the mask as float32: the ``[rows, 1, 1, T]`` segment ids of
    'chunked' and 'flash', transformers' ``[rows, 1, T, T]`` mask under 'eager'. Under 'sdpa' (CUDA:
    the layers' checkpoint function, `workbench.backend.native.offload`) only the input is kept."""
    hidden = rows * seq_len * shape.hidden * compute_bytes
    if shape.attention == "sdpa":
        return shape.layers * hidden
    rotary = 0 if shape.gpt2_style else 2 * seq_len * shape.head_dim * compute_bytes
    mask = rows * seq_len * 4 * (1 if shape.attention in ("chunked", "flash") else seq_len)
    return shape.layers * (hidden + rotary + mask)


def mlp_tile_bytes(
    shape: ModelShape, *, rows: int, positions: int | None, compute_bytes: int, model_parallel: int = 1
) -> int:
    """One MLP tile's intermediates on a device (0 untiled)."""
    if not positions:
        return 0
    per_position = mlp_values_per_position(
        shape.intermediate, gated=shape.gated_mlp, model_parallel=model_parallel
    )
    return math.ceil(rows * positions * per_position * compute_bytes)


def activation_bytes(
    shape: ModelShape,
    act: dict[str, float],
    *,
    rows: int,
    seq_len: int,
    compute_bytes: int,
    score_bytes: int,
    gradient_checkpointing: bool,
    tile_positions: int | None,
    offload: bool,
    logits: int,
    dequant: int = 0,
    layer_dequant: int = 0,
    model_parallel: int = 1,
) -> int:
    """The breakdown's ``activations`` (device bytes) from `act` (`activation_elements_per_token`),
    with the MLP in tiles of `tile_positions` and, with `offload`, the checkpoints in host memory.

    The layer's temporaries live after the loss's `logits` are freed: only their excess counts. Under
    offload the whole layer peak (with `layer_dequant`, its dequantized weight) counts only beyond the
    loss's (`logits`, `dequant` and the final norm's tensors)."""
    tokens = rows * seq_len
    fp32, scores = act["fp32_part"], act["scores"]
    rest = act["all_layers"] - fp32 - scores
    if tile_positions:  # the saved intermediates go: every layer's, or the recomputed one's
        mlp = mlp_values_per_position(
            shape.intermediate, gated=shape.gated_mlp, model_parallel=model_parallel
        )
        rest -= mlp * (1 if gradient_checkpointing else shape.layers)
    transient = layer_transient_bytes(
        shape, act, rows=rows, seq_len=seq_len, tile_positions=tile_positions,
        compute_bytes=compute_bytes, model_parallel=model_parallel,
    )  # fmt: skip
    if not offload:
        saved = math.ceil(tokens * (rest * compute_bytes + fp32 * 4 + scores * score_bytes))
        return saved + max(0, transient - logits)
    H = shape.hidden
    final = math.ceil(
        tokens * (2 * H * 4 + H * compute_bytes)
    )  # final norm's input and output (fp32), embedding out
    # the recomputed layer: everything but the checkpoints and the final tensors
    layer = tokens * (
        (rest - shape.layers * H - H) * compute_bytes + (fp32 - 2 * H) * 4 + scores * score_bytes
    )
    in_flight = tokens * IN_FLIGHT_CHECKPOINTS * H * compute_bytes
    layer_peak = math.ceil(in_flight + layer) + transient + layer_dequant
    return final + max(0, layer_peak - (logits + dequant + final))


def layer_transient_bytes(
    shape: ModelShape,
    act: dict[str, float],
    *,
    rows: int,
    seq_len: int,
    tile_positions: int | None,
    compute_bytes: int,
    model_parallel: int = 1,
) -> int:
    """A layer's largest temporary inside its backward pass: the attention's (fp32, `act`'s
    ``attention_transient``) or one MLP tile's intermediates, which never live at once."""
    attention = math.ceil(rows * seq_len * act["attention_transient"] * 4)
    tile = mlp_tile_bytes(
        shape, rows=rows, positions=tile_positions, compute_bytes=compute_bytes, model_parallel=model_parallel
    )
    return max(attention, tile)


def layer_dequant_bytes(
    shape: ModelShape, quantize: str, *, compute_bytes: int, model_parallel: int = 1
) -> int:
    """The largest int4 layer weight dequantized for its matmul (the LM head's copies belong to the
    loss's peak); 0 for int8 and unquantized bases."""
    if quantize != "int4":
        return 0
    layer = [o * i for name, o, i in quantized_matrices(shape) if name.startswith("layers.")]
    return math.ceil(max(layer, default=0) * compute_bytes / model_parallel)


__all__ = [
    "HOST_KEYS",
    "IN_FLIGHT_CHECKPOINTS",
    "LONG_CONTEXT_MEANINGS",
    "OFFLOAD_SETTINGS",
    "LongContextTerms",
    "activation_bytes",
    "host_checkpoint_bytes",
    "layer_dequant_bytes",
    "layer_transient_bytes",
    "long_context_terms",
    "mlp_tile_bytes",
    "resolve_offload",
]
