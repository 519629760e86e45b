"""The MLP a tile of positions at a time (``model.mlp_chunk_tokens``): ``[tokens, intermediate]`` never whole.

A decoder layer's MLP widens every token to the intermediate size (gate, up, their activation
and product: ``4 x intermediate`` values a token in a gated MLP, 14336 wide in Llama-3.1-8B, 112
KiB a token in bf16), and autograd keeps them for the backward pass. At 64k tokens that is 7 GiB
for one layer. The MLP works on each position alone, so it can run along the sequence a tile of
positions at a time (Arctic Long Sequence Training's TiledMLP, Unsloth's tiled MLP):

- **forward**: tile by tile, nothing kept but the MLP's input; the tiles' outputs are joined;
- **backward**: each tile recomputed from its slice of the input, its gradients taken (the input's
  and every trainable weight's, LoRA adapters included: summed over the tiles) before the next.

At most one tile's intermediates exist. `TiledMLP` is one `torch.autograd.Function` used on every
device; on XLA the tiles are chained by data dependencies (`workbench.models.lm_head._after`), or
the compiler runs them side by side and merges each recompute back into the forward pass. The
trainable weights are found at call time as tensors (registered parameters, or the slices a
scanned stack swaps in: `workbench.models.scan`), so the same code runs unrolled and scanned.

How it hooks in: `install_mlp_tiles` swaps the class of every decoder layer's ``mlp`` module for a
subclass whose ``forward`` tiles and calls the family's own ``forward`` on each tile, so every family
the workbench trains (Llama, Qwen2/3, Mistral, Gemma 1/2/3 GeGLU, Phi-3's fused gate_up, GPT-2's
plain MLP) tiles with no per-family code; parameter names, state dicts, adapters and sharding are
untouched. A call that is not ``mlp(x)`` with ``x`` of shape ``[rows, positions, hidden]``, or whose
tile would cover the whole row (a decode step), runs the family's forward as it is.

`mlp_chunk_length` is the one rule for a tile's length, shared by the model and the memory
estimate (`workbench.analysis.long_context`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.config import ConfigError
from workbench.families import FAMILIES
from workbench.models.lm_head import REFERENCE_MEMORY, _after

AUTO_MLP_SHARE = 1 / 16
"""'auto' tiles when one layer's MLP intermediates would exceed this share of a device's memory."""
AUTO_TILE_SHARE = 1 / 32
"""... and then makes each tile's intermediates at most this share."""
TILE_MULTIPLE = 8
"""'auto' tiles are a multiple of this many positions where that leaves one."""


def mlp_values_per_position(intermediate: int, *, gated: bool, model_parallel: int = 1) -> float:
    """Intermediate values a position's MLP keeps on one device: gate, up, act(gate) and their product
    (``4 x intermediate``) in a gated MLP, fc and its activation (``2 x intermediate``) in a plain one;
    the intermediate splits over the mesh's model axis."""
    return (4 if gated else 2) * intermediate / max(1, model_parallel)


def mlp_chunk_length(
    setting: int | str | None,
    *,
    rows: int,
    length: int,
    intermediate: int,
    gated: bool = True,
    compute_bytes: int = 2,
    memory_bytes: int | None = None,
    model_parallel: int = 1,
) -> int | None:
    """Positions per MLP tile for `rows` rows (one device's) of `length` positions, or None: the
    MLP runs whole.

    `setting` is ``model.mlp_chunk_tokens``: None never tiles; N >= 1 tiles N tokens at a time
    (``N // rows`` positions, at least 1); ``"auto"`` tiles only when one layer's intermediates,
    ``rows x length x mlp_values_per_position x compute_bytes``, exceed `AUTO_MLP_SHARE` of
    `memory_bytes` (`workbench.models.lm_head.REFERENCE_MEMORY` when unknown), into tiles of at most
    `AUTO_TILE_SHARE` (a multiple of `TILE_MULTIPLE` positions where that leaves one). A tile as long
    as the row is None.
    """
    if setting is None:
        return None
    per_position = rows * mlp_values_per_position(intermediate, gated=gated, model_parallel=model_parallel)
    per_position *= compute_bytes
    if setting == "auto":
        memory = memory_bytes or REFERENCE_MEMORY
        if per_position * length <= AUTO_MLP_SHARE * memory:
            return None
        positions = int(AUTO_TILE_SHARE * memory // per_position)
        positions = positions - positions % TILE_MULTIPLE if positions >= TILE_MULTIPLE else max(1, positions)
    elif isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1:
        positions = max(1, setting // max(1, rows))
    else:
        raise ValueError(
            f"model.mlp_chunk_tokens={setting!r} is not allowed: an int >= 1 (tokens per tile), "
            "'auto' or null (never tile)"
        )
    return None if positions >= length else positions


@dataclass(frozen=True)
class MlpTiling:
    """``model.mlp_chunk_tokens`` and what its rule (`mlp_chunk_length`) needs to know about the run."""

    setting: int | str | None = "auto"
    """None never tiles, N >= 1 tokens per tile, 'auto' by the device's memory."""
    memory_bytes: int | None = None
    """One device's memory; None (CPU): the rule's reference."""
    data_parallel: int = 1
    """Ways the batch splits (the mesh's data x fsdp): a device holds ``rows / data_parallel`` rows."""
    model_parallel: int = 1
    """The mesh's model axis: the intermediate splits over it."""

    def positions(
        self, rows: int, length: int, intermediate: int, gated: bool, compute_bytes: int
    ) -> int | None:
        """Positions per tile for a global batch of `rows` x `length` (None: the whole MLP at once)."""
        return mlp_chunk_length(
            self.setting,
            rows=max(1, -(-rows // max(1, self.data_parallel))),
            length=length,
            intermediate=intermediate,
            gated=gated,
            compute_bytes=compute_bytes,
            memory_bytes=self.memory_bytes,
            model_parallel=self.model_parallel,
        )


class MlpTilingError(ConfigError):
    """``model.mlp_chunk_tokens`` asked of a model whose MLP cannot be tiled exactly."""


# ---- installing -------------------------------------------------------------------------------

_TILED_CLASSES: dict[type, type] = {}


def install_mlp_tiles(model: nn.Module, tiling: MlpTiling) -> int:
    """Tile every decoder layer's MLP of `model` (a transformers causal LM of a registered family, or
    a peft model around one) as `tiling` says; returns how many MLPs were patched. Installing again
    updates the setting. Raises `MlpTilingError` for an unregistered family, a model with no decoder
    MLPs, or an MLP with active dropout (a recompute would draw other masks: not exact)."""
    config = _config(model)
    family = str(getattr(config, "model_type", type(model).__name__))
    if family not in FAMILIES:
        raise _error(family, f"only the registered families' MLPs are known ({', '.join(FAMILIES)})")
    intermediate, gated = mlp_width(config)
    mlps = list(decoder_mlps(model))
    if not mlps:
        raise _error(family, f"{type(model).__name__} has no decoder layer with an `mlp` module")
    for mlp in mlps:
        dropout = [m.p for m in mlp.modules() if isinstance(m, nn.Dropout) and m.p > 0]
        if dropout:
            raise _error(
                family, f"its MLP has dropout p={dropout[0]}; a tile's recompute would draw other masks"
            )
    for mlp in mlps:
        if type(mlp) not in _TILED_CLASSES.values():
            mlp.__class__ = tiled_class(type(mlp))
        mlp.__dict__["_mlp_tiling"] = (tiling, intermediate, gated)
    return len(mlps)


def uninstall_mlp_tiles(model: nn.Module) -> None:
    """Undo `install_mlp_tiles` (no-op where nothing is tiled)."""
    for mlp in decoder_mlps(model):
        original = getattr(type(mlp), "_untiled_class", None)
        if original is not None:
            mlp.__class__ = original
            mlp.__dict__.pop("_mlp_tiling", None)


def installed_tiling(model: nn.Module) -> MlpTiling | None:
    """The `MlpTiling` `install_mlp_tiles` gave `model`'s MLPs, or None where they run whole."""
    for mlp in decoder_mlps(model):
        found = mlp.__dict__.get("_mlp_tiling")
        if found is not None:
            return found[0]
    return None


def decoder_mlps(model: nn.Module) -> Iterator[nn.Module]:
    """Every module held as ``.mlp`` by another module of `model` (the decoder layers' MLPs)."""
    for module in model.modules():
        mlp = module._modules.get("mlp")
        # a scanned stack's holder of the MLP's stacked weights is a plain Module: no forward of its own
        if isinstance(mlp, nn.Module) and type(mlp).forward is not nn.Module.forward:
            yield mlp


def mlp_width(config: Any) -> tuple[int, bool]:
    """``(intermediate size, gated)`` of a registered family's MLP, read through the family's fields
    (GPT-2's ``n_inner`` of None is 4 x the width)."""
    family = FAMILIES[str(config.model_type)]
    width = getattr(config, family.fields.intermediate_size, None)
    if width is None:
        width = 4 * int(getattr(config, family.fields.hidden_size))
    return int(width), family.gated_mlp


def tiled_class(cls: type) -> type:
    """The subclass of an MLP class whose ``forward`` tiles (one per class, made once)."""
    if cls not in _TILED_CLASSES:
        _TILED_CLASSES[cls] = type(
            f"Tiled{cls.__name__}", (cls,), {"forward": _tiled_forward, "_untiled_class": cls}
        )
    return _TILED_CLASSES[cls]


def _config(model: nn.Module) -> Any:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "config", None)


def _error(family: str, why: str) -> MlpTilingError:
    return MlpTilingError(
        f"model.mlp_chunk_tokens cannot tile the MLP of family {family!r}: {why}. "
        "Set model.mlp_chunk_tokens: null (the whole MLP at once)"
    )


# ---- running ----------------------------------------------------------------------------------


def _tiled_forward(self: nn.Module, x: Any, *args: Any, **kwargs: Any) -> Any:
    untiled = type(self)._untiled_class.forward  # type: ignore[attr-defined]
    tiling, intermediate, gated = self.__dict__["_mlp_tiling"]
    if args or kwargs or not isinstance(x, torch.Tensor) or x.dim() != 3:
        return untiled(self, x, *args, **kwargs)
    device = x.device.type
    compute_bytes = (
        torch.get_autocast_dtype(device).itemsize if torch.is_autocast_enabled(device) else x.element_size()
    )
    positions = tiling.positions(x.shape[0], x.shape[1], intermediate, gated, compute_bytes)
    if positions is None:
        return untiled(self, x)
    tensors = dict(_mlp_tensors(self))
    if torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in tensors.values())):
        return TiledMLP.apply(_Untiled(self), positions, tuple(tensors), x, *tensors.values())
    return _tiles(_Untiled(self), x, positions)


class _Untiled(nn.Module):
    """Calls an MLP's own (untiled) ``forward``: what `torch.func.functional_call` runs on a tile."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return type(self.mlp)._untiled_class.forward(self.mlp, x)  # type: ignore[attr-defined]


def _mlp_tensors(mlp: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name under the MLP, tensor)`` for every tensor the MLP reads: its parameters and buffers, or
    the plain tensors a scan's ``functional_call`` swaps in for them, which exist only during the
    forward call: the backward's recompute swaps them in again."""
    for prefix, module in mlp.named_modules():
        plain = (k for k, v in vars(module).items() if isinstance(v, torch.Tensor))
        for name in dict.fromkeys([*module._parameters, *module._buffers, *plain]):
            value = getattr(module, name, None)
            if isinstance(value, torch.Tensor):
                yield (f"{prefix}.{name}" if prefix else name), value


def _spans(length: int, positions: int) -> list[tuple[int, int]]:
    return [(start, min(start + positions, length)) for start in range(0, length, positions)]


def _tiles(untiled: _Untiled, x: torch.Tensor, positions: int) -> torch.Tensor:
    """The MLP on `x` a tile at a time, chained on XLA (each tile waits for the previous one's output)."""
    xla = x.device.type == "xla"
    outputs: list[torch.Tensor] = []
    for start, stop in _spans(x.shape[1], positions):
        tile = x[:, start:stop].contiguous()  # a view across rows: GPT-2's Conv1D views it flat
        outputs.append(untiled(_after(tile, outputs[-1]) if xla and outputs else tile))
    return torch.cat(outputs, dim=1)


class TiledMLP(torch.autograd.Function):
    """An MLP over ``[rows, positions, hidden]`` a tile of `positions` at a time: the forward keeps only
    the input; the backward recomputes each tile and takes its gradients before the next (see the
    module docstring). `names` are the MLP's tensors' names under it, `tensors` their values (every one
    the MLP reads, so a recompute outside a scan's ``functional_call`` finds them): the gradients of
    those that need one are the sums over the tiles. On XLA the backward's first recompute waits for
    the incoming gradient and each next one for the previous tile's gradients, so no recompute can be
    merged into the forward pass and no two tiles run side by side."""

    @staticmethod
    def forward(
        ctx: Any,
        untiled: _Untiled,
        positions: int,
        names: tuple[str, ...],
        x: torch.Tensor,
        *tensors: torch.Tensor,
    ) -> torch.Tensor:
        device = x.device.type
        ctx.untiled, ctx.positions, ctx.names = untiled, positions, names
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.save_for_backward(x, *tensors)
        return _tiles(untiled, x, positions)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, *tensors = ctx.saved_tensors
        xla = x.device.type == "xla"
        need_x, *needs = ctx.needs_input_grad[3:]
        device, enabled, dtype = ctx.autocast
        tie: torch.Tensor | None = grad if xla else None  # what the next recompute waits for
        input_grads: list[torch.Tensor] = []
        sums: list[torch.Tensor | None] = [None] * len(tensors)
        for start, stop in _spans(x.shape[1], ctx.positions):
            tile = x[:, start:stop].contiguous()
            tile = (_after(tile, tie) if tie is not None else tile).detach().requires_grad_(need_x)
            values = [t.detach().requires_grad_(need) for t, need in zip(tensors, needs)]
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=enabled):
                swapped = {f"mlp.{name}": value for name, value in zip(ctx.names, values)}
                out = torch.func.functional_call(ctx.untiled, swapped, (tile,), strict=False)
            wanted = [index for index, need in enumerate(needs) if need]
            inputs = ([tile] if need_x else []) + [values[index] for index in wanted]
            grads = list(torch.autograd.grad(out, inputs, grad[:, start:stop], allow_unused=True))
            if need_x:
                input_grads.append(grads.pop(0))
            for index, g in zip(wanted, grads):
                if g is not None:
                    sums[index] = g if sums[index] is None else sums[index] + g
            done = [g for g in (input_grads[-1:] if need_x else []) + grads if g is not None]
            tie = done[0] if xla and done else tie
        x_grad = torch.cat(input_grads, dim=1) if need_x else None
        return (None, None, None, x_grad, *sums)


__all__ = [
    "AUTO_MLP_SHARE",
    "AUTO_TILE_SHARE",
    "MlpTiling",
    "MlpTilingError",
    "TiledMLP",
    "decoder_mlps",
    "install_mlp_tiles",
    "installed_tiling",
    "mlp_chunk_length",
    "mlp_values_per_position",
    "mlp_width",
    "uninstall_mlp_tiles",
]
