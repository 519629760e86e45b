"""Quantized frozen base weights (``model.quantize``): int8 or int4 linears under LoRA (the QLoRA recipe).

A frozen base needs no gradient of its own, so its linears can hold integers: a quarter (int8)
or an eighth (int4) of fp32's bytes on the device, while the LoRA adapters train in fp32 on top.

Storage layout (what the memory estimate, the sharding plan and the modules below share):

- ``int8``: symmetric, per output channel. ``weight`` int8 ``[out, in]``, ``weight_scale``
  fp32 ``[out]``; ``W ≈ weight * weight_scale[:, None]``.
- ``int4``: symmetric, blockwise along the input dimension (`int4_block_size`), two values a
  byte. ``weight`` uint8 ``[out, in / 2]`` (element ``2j`` in the low nibble, ``2j + 1`` in the
  high one, so a shard of the packed dimension unpacks on its own), ``weight_scale`` fp32
  ``[out, in / block]``.

Which layers: every frozen ``nn.Linear`` of the base model (the LoRA targets' base layers and the
other projections), and the LM head when it is not tied to the input embedding (a tied head is
the embedding table, a lookup, and stays in the training precision). GPT-2's projections are
`transformers` Conv1D modules (``[in, out]``), not ``nn.Linear``: they stay as they are.

How it computes (`QuantizedLinear`): the matmul runs in the activations' dtype (the autocast
dtype under autocast) inside the step's graph, on every backend. int8 multiplies by the integer
weight and scales the output (on XLA through torch_xla's ``quantized_matmul`` op, behind
`workbench.backend.xla.runtime`); int4 unpacks and dequantizes a layer's weight with plain torch ops
(torch_xla's own int4 path reads the weight back to the host on every call). The backward pass
(`QuantizedMatmul`) computes only the input's gradient and saves only the integer weight and
its scales: never a full-precision copy of the weight, which would keep one per layer alive from
the forward to the backward pass and give back what the integers saved. For the same reason the
backward converts the weight along another route than the forward (through int32), so XLA's
common-subexpression elimination cannot merge the two conversions into one held in between
(measured on XLA:CPU, tests/xla/quantize_memory.py: without it the step's temporaries held a
full-precision copy of the whole base).

`quantize_model` swaps the layers in place on the host, one at a time (each full-precision
weight is freed before the next layer is quantized), before the model is placed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.units import format_bytes

QUANTIZE_MODES: tuple[str, ...] = ("none", "int8", "int4")
"""The values of ``model.quantize``."""
INT4_BLOCK = 128
"""Input features sharing one int4 scale (the block), where the layer's input size allows."""
SCALE_BYTES = 4
"""Scales are fp32."""
_INT_MAX = {"int8": 127, "int4": 7}
"""The symmetric range: ±127 and ±7 (-128 and -8 unused, so zero sits exactly in the middle)."""


def int4_block_size(in_features: int) -> int:
    """The int4 block for a layer with `in_features` inputs: the largest power of two up to
    `INT4_BLOCK` that divides it (at least 2, so values pack in pairs)."""
    if in_features < 2 or in_features % 2:
        raise ValueError(
            f"in_features={in_features} is not allowed for int4: an even number of input features "
            "(two 4-bit values share a byte)"
        )
    block = INT4_BLOCK
    while in_features % block:
        block //= 2
    return block


def quantized_weight_bytes(out_features: int, in_features: int, mode: str) -> int:
    """Bytes a quantized ``[out, in]`` weight holds on the device: integers plus scales."""
    if mode == "int8":
        return out_features * in_features + out_features * SCALE_BYTES
    if mode == "int4":
        blocks = in_features // int4_block_size(in_features)
        return out_features * in_features // 2 + out_features * blocks * SCALE_BYTES
    raise ValueError(f"quantize={mode!r} is not allowed here: one of 'int8', 'int4'")


# ---- the numbers: quantize on the host, dequantize anywhere ------------------------------------


def quantize_weight(weight: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(integers, scales)`` of a float ``[out, in]`` weight in `mode`'s layout (module docstring).

    Scales are each row's (int8) or block's (int4) largest magnitude over the top of the integer
    range, so that value maps exactly onto it; an all-zero row or block gets scale 1 (not 0: a
    dequantized zero stays zero and nothing divides by zero). Computes in fp32, one layer at a time.
    """
    if weight.dim() != 2:
        raise ValueError(f"quantize_weight expects a 2-D [out, in] weight, got shape {list(weight.shape)}")
    top = _INT_MAX.get(mode)
    if top is None:
        raise ValueError(f"quantize={mode!r} is not allowed here: one of 'int8', 'int4'")
    out_features, in_features = weight.shape
    w = weight.detach().float()
    if mode == "int4":
        w = w.reshape(out_features, in_features // int4_block_size(in_features), -1)
    scale = w.abs().amax(dim=-1) / top
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale.unsqueeze(-1)).clamp_(-top, top).to(torch.int8)
    if mode == "int8":
        return q, scale
    return pack_int4(q.reshape(out_features, in_features)), scale


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7], ``[out, in]`` -> uint8 ``[out, in / 2]``: element ``2j`` in the low
    nibble, ``2j + 1`` in the high one (two's complement nibbles)."""
    nibbles = values.to(torch.int16) & 0xF
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[out, in / 2]`` -> int8 ``[out, in]`` in [-8, 7] (`pack_int4` undone). Plain torch ops
    along the last dimension only, so a shard of the packed dimension unpacks on its own (SPMD)."""
    low = (packed & 0xF).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    pairs = torch.stack([low, high], dim=-1)  # [out, in/2, 2]: element 2j, then 2j + 1
    values = pairs.reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return values - ((values >= 8).to(torch.int8) << 4)  # nibble 8..15 -> -8..-1


def dequantize_weight(
    weight: torch.Tensor, scale: torch.Tensor, mode: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The ``[out, in]`` weight in `dtype` from its integers and scales (`quantize_weight` undone,
    up to rounding). Scaled in fp32 and rounded to `dtype` once (fused by XLA into one pass)."""
    if mode == "int8":
        return (weight.float() * scale.float().unsqueeze(-1)).to(dtype)
    if mode == "int4":
        values = unpack_int4(weight)
        out_features, in_features = values.shape
        blocks = scale.shape[-1]
        scaled = values.float().reshape(
            out_features, blocks, in_features // blocks
        ) * scale.float().unsqueeze(-1)
        return scaled.reshape(out_features, in_features).to(dtype)
    raise ValueError(f"quantize={mode!r} is not allowed here: one of 'int8', 'int4'")


# ---- the matmul and its backward ---------------------------------------------------------------


def _int8_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` for int8 per-channel `weight`: multiply by the integers, then scale the output."""
    if x.device.type == "xla":
        from workbench.backend.xla import runtime

        return runtime.quantized_matmul(x, weight, scale.float()).to(x.dtype)
    return (F.linear(x, weight.to(x.dtype)) * scale.float()).to(x.dtype)


class QuantizedMatmul(torch.autograd.Function):
    """``y = x @ W.T`` with `W` held as integers and scales; the backward gives ``dL/dx`` only.

    Saved for backward: the integer weight and its scales (the module's own parameters, no copy).
    The backward rebuilds what it needs from them: int8 ``(dy * scale) @ W_int`` (the integers as
    the activations' dtype), int4 ``dy @ dequantize(W)``. The weight gets no gradient: it is frozen.
    Under torch_xla's scan (``model.scan_layers``) both passes are traced into the scanned layer.
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, mode: str
    ) -> torch.Tensor:
        ctx.save_for_backward(weight, scale)
        ctx.mode = mode
        if mode == "int8":
            return _int8_matmul(x, weight, scale)
        return F.linear(x, dequantize_weight(weight, scale, mode, x.dtype))

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        weight, scale = ctx.saved_tensors
        dtype = grad_y.dtype
        if weight.device.type == "xla":
            # Through int32 first: the backward's conversion of the weight is then not the forward's
            # expression, which XLA would merge with it (CSE) and keep, converted, from the forward
            # pass to this one for every layer at once: a full-precision copy of the base. (Eager
            # backends convert each time anyway: no int32 copy there.)
            weight = weight.to(torch.int32)
        if ctx.mode == "int8":
            grad_x = (grad_y * scale.float()).to(dtype) @ weight.to(dtype)
        else:
            grad_x = grad_y @ dequantize_weight(weight, scale, ctx.mode, dtype)
        return grad_x, None, None, None


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The matmul's dtype: the autocast dtype where autocast is on for `x`'s device, else `x`'s own."""
    device_type = x.device.type
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except (RuntimeError, ValueError):  # a device type autocast does not know
        pass
    return x.dtype


class QuantizedLinear(nn.Module):
    """A frozen linear layer whose weight is stored as int8 or packed int4 with fp32 scales.

    `weight` and `weight_scale` are parameters with ``requires_grad=False`` (not buffers), so the
    sharding planner and the reports see them under the layer's own names (``...q_proj.weight``
    matches the same sharding rule as before). A bias stays in the training precision.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        mode: str,
        *,
        bias: torch.Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if mode not in _INT_MAX:
            raise ValueError(f"quantize={mode!r} is not allowed here: one of 'int8', 'int4'")
        self.in_features, self.out_features, self.mode = in_features, out_features, mode
        self.block_size = int4_block_size(in_features) if mode == "int4" else in_features
        if mode == "int8":
            weight = torch.zeros(out_features, in_features, dtype=torch.int8, device=device)
            scale = torch.ones(out_features, dtype=torch.float32, device=device)
        else:
            weight = torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device)
            scale = torch.ones(
                out_features, in_features // self.block_size, dtype=torch.float32, device=device
            )
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale = nn.Parameter(scale, requires_grad=False)
        self.bias = bias if bias is None or isinstance(bias, nn.Parameter) else nn.Parameter(bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: str) -> QuantizedLinear:
        """`linear` quantized (on its own device); its bias parameter is carried over as it is."""
        if mode == "int4" and linear.in_features % 2:
            raise ValueError(
                f"model.quantize='int4' cannot store a layer with in_features={linear.in_features} "
                f"({linear.in_features} in -> {linear.out_features} out): int4 packs two input "
                "features a byte, so it needs an even number; use model.quantize=int8"
            )
        module = cls(linear.in_features, linear.out_features, mode, bias=linear.bias, device="meta")
        weight, scale = quantize_weight(linear.weight, mode)
        module.weight = nn.Parameter(weight, requires_grad=False)
        module.weight_scale = nn.Parameter(scale, requires_grad=False)
        return module

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The weight ``[out, in]`` in `dtype`, on the weight's device."""
        return dequantize_weight(self.weight, self.weight_scale, self.mode, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(_compute_dtype(x))
        y = QuantizedMatmul.apply(x, self.weight, self.weight_scale, self.mode)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        block = f", block_size={self.block_size}" if self.mode == "int4" else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}{block}, "
            f"bias={self.bias is not None}"
        )


# ---- a whole model ------------------------------------------------------------------------------


@dataclass
class QuantizeSummary:
    """What `quantize_model` did: layers, their parameters and bytes before and after, what it kept."""

    mode: str
    layers: int = 0
    parameters: int = 0
    """Weight elements of the quantized layers (logical, not packed bytes)."""
    bytes_before: int = 0
    """Their weights' bytes in the dtype they had."""
    bytes_after: int = 0
    """Their integers and scales (`quantized_weight_bytes`)."""
    kept: list[str] = field(default_factory=list)
    """Linears left in the training precision, with why."""

    def notice(self) -> str:
        """One line for the run's notices."""
        count = f"{self.parameters / 1e6:.1f}M" if self.parameters >= 1e6 else f"{self.parameters:,}"
        text = (
            f"model.quantize={self.mode}: {self.layers} linear layers ({count} parameters) stored as "
            f"{self.mode} with fp32 scales, {format_bytes(self.bytes_before)} -> {format_bytes(self.bytes_after)}"
        )
        return text + (f"; kept: {', '.join(self.kept)}" if self.kept else "")


def quantize_model(model: nn.Module, mode: str) -> QuantizeSummary:
    """Replace every ``nn.Linear`` of `model` by a `QuantizedLinear` in `mode`, in place, on the host.

    Layer by layer: each layer's full-precision weight is dropped before the next is quantized, so
    host memory peaks at the model plus one layer (no copy of the model or of its state dict). An
    LM head tied to the input embedding is left alone (it is the embedding table). Call it before
    LoRA is applied (the adapters then wrap the quantized layers) and before the model is placed.
    """
    if mode not in _INT_MAX:
        raise ValueError(f"model.quantize={mode!r} is not allowed here: one of 'int8', 'int4'")
    if hasattr(model, "peft_config"):
        raise ValueError("quantize the base model before LoRA is applied (this is already a peft model)")
    summary = QuantizeSummary(mode)
    tied = _tied_head(model)
    # transformers' Conv1D (GPT-2's projections) stores [in, out] under other sharding rules: kept
    conv1d = [name for name, m in model.named_modules() if type(m).__name__ == "Conv1D"]
    if conv1d:
        summary.kept.append(f"{len(conv1d)} Conv1D layers ({conv1d[0]}, ...: only nn.Linear is quantized)")
    # names only: a list of modules would keep every replaced layer (and its weight) alive to the end
    names = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, child)
        if linear is tied:
            summary.kept.append(f"{name} (tied to the input embedding)")
            continue
        try:
            with torch.no_grad():
                quantized = QuantizedLinear.from_linear(linear, mode)
        except ValueError as err:
            raise ValueError(f"layer {name}: {err}") from None
        summary.layers += 1
        summary.parameters += linear.weight.numel()
        summary.bytes_before += linear.weight.numel() * linear.weight.element_size()
        summary.bytes_after += quantized_weight_bytes(linear.out_features, linear.in_features, mode)
        setattr(parent, child, quantized)
        del linear, quantized  # the last references: the full-precision weight is freed here
    return summary


def _tied_head(model: nn.Module) -> nn.Module | None:
    """The output projection when it shares its weight with the input embedding, else None."""
    get_out = getattr(model, "get_output_embeddings", None)
    get_in = getattr(model, "get_input_embeddings", None)
    head = get_out() if callable(get_out) else None
    embedding = get_in() if callable(get_in) else None
    if head is not None and embedding is not None and head.weight is embedding.weight:
        return head
    return None


def quantized_layers(model: nn.Module) -> dict[str, QuantizedLinear]:
    """Name -> `QuantizedLinear` for every quantized layer of `model` (empty when none is)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}


def logical_parameter_count(model: nn.Module) -> int:
    """Parameters as the unquantized model has them: a quantized weight counts ``out x in`` (not its
    packed bytes), its scales not at all; tied weights once. A stacked layer weight
    (``model.scan_layers``) counts every layer's."""
    from workbench.models.layer_stack import stacked_parameter_names

    layers = quantized_layers(model)
    stacked = stacked_parameter_names(model)
    seen: set[int] = set()
    total = 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        template, count = stacked.get(name, (name, 1))
        owner, _, leaf = template.format(index=0).rpartition(".")
        layer = layers.get(owner)
        if layer is None or leaf not in (
            "weight",
            "weight_scale",
        ):  # a quantized layer's bias counts as it is
            total += p.numel()
        elif leaf == "weight":
            total += layer.in_features * layer.out_features * count
    return total
