"""Scan over layers: run a causal LM's decoder stack as one compiled layer on XLA (``model.scan_layers``).

Unrolled, an XLA training step holds a copy of the decoder layer's forward and backward for
every layer, so compile time grows with depth. Scanned, the step holds one copy inside an XLA
``While`` loop (torch_xla's ``scan``, through the runtime seam) over the layers' weights, which
live stacked for good (`workbench.models.layer_stack`: one ``[layers, ...]`` parameter per
weight, LoRA adapters and quantized weights included). The backward writes ``[layers, ...]``
gradients, and clipping and the optimizer update are one op per stacked tensor, so the whole
training step, not only forward and backward, compiles in about flat time over depth
(bench/compile.py). Names stay transformers' per-layer ones wherever a weight leaves the model
(state_dict, ``save_pretrained``, peft adapter files, checkpoints, the sharding report).

How it hooks in: the decoder families' forward loops over ``self.layers[: self.config.num_hidden_layers]``
(Llama, Qwen2/3, Mistral, Gemma 1/2/3, Phi-3 in transformers 5). `install_scan` stacks the
layers' parameters and swaps that ``ModuleList``'s class for `ScannedLayers`, whose full slice
yields a single callable (`_ScanRun`) that runs every layer. The layer modules, their code and
buffers stay; `uninstall_scan` gives them their own parameters back.

One scanned layer call: the layer's keyword tensors (the attention mask, the rotary
``(cos, sin)``, the position ids) ride in the scan's carry next to the hidden states and come
out unchanged (a carry must be floating point, so integer and boolean tensors travel as float32
and are cast back inside the layer); the non-tensor keywords (``use_cache=False``, ``None``)
are baked into the traced layer. The stacked parameters are scanned over as they are (no copy).
The layer is called through ``forward`` (not ``__call__``), so transformers' per-layer gradient
checkpointing never wraps it inside the scan; gradient checkpointing is the scan's own
rematerialisation instead (``remat=True``: each layer is recomputed from its saved input in the
backward pass). Measured by the compiler on an 8-layer forward + backward
(tests/xla/scan_memory.py): scanned without remat a little more temporary memory than unrolled,
with remat about a quarter of it and a third of transformers' checkpointing.

The traced layer is cached per `ScannedLayers` (torch_xla's ``is_fn_pure``), keyed on the
keyword structure, the static keyword values, ``remat`` and the layers' Python state (training
mode, peft adapters active/merged/disabled), so a step re-traces nothing in Python and a change
of mode or adapter state traces afresh. The cache dies with the model.

A call the scan cannot take runs the layers one by one, each on its slices of the stacked
weights: a call on non-XLA tensors (the model moved to the CPU), a KV cache or another
non-tensor object among the keywords (generation), or transformers capturing per-layer outputs
(``output_hidden_states``).

What cannot be scanned raises `ScanLayersError` at install, naming ``model.scan_layers``, the
family and the reason: a family whose forward does not loop over that slice (GPT-2 iterates
``self.h``), or layers that are not identical: different parameter shapes, or different Python
attributes such as Gemma 2/3's and Qwen's mix of sliding-window and full attention layers
(``config.layer_types``). ``model.scan_layers=auto`` (the default, `choose_scan`) scans where
that check passes and the stack is deep enough, and says which in one notice.

Off XLA (plain CPU or CUDA) ``model.scan_layers`` is a no-op: the math is the same unrolled,
and `scan_notices` says so once, so one config runs everywhere.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from workbench.config import ConfigError
from workbench.models.layer_stack import (
    STACK,
    LayerStack,
    layer_stack,
    register_per_layer_names,
    remove_per_layer_names,
    stack_layers,
    unstack_layers,
)

LOOP_SOURCE = "self.layers[: self.config.num_hidden_layers]"
"""The slice the decoder families' forward loops over; `ScannedLayers` answers it with one scanned call."""
_LAYER_INDEX_ATTRIBUTES = frozenset({"layer_idx", "layer_index"})
"""Per-layer attributes that only index a KV cache: training (no cache) never reads them."""
_STATIC_TYPES = (type(None), bool, int, float, str)
"""Keyword values baked into the traced layer; any other non-tensor object means no scan."""
AUTO_SCAN_MIN_LAYERS = 8
"""``model.scan_layers=auto`` scans stacks at least this deep (bench/compile.py: from here a scanned
step compiles faster than an unrolled one and runs as fast)."""


class ScanLayersError(ConfigError):
    """``model.scan_layers`` asked of a model whose decoder stack cannot be scanned."""


# ---- installing ---------------------------------------------------------------------------------


def install_scan(model: nn.Module, *, remat: bool = False, offload: bool = False) -> ScannedLayers:
    """Make `model`'s decoder stack run as one scanned layer on XLA; returns its `ScannedLayers`.

    `model` is a `transformers` causal LM or a peft model around one (LoRA applied first: the
    adapters are stacked with the base). The layers' parameters move into one stacked parameter
    per weight (`workbench.models.layer_stack`; build the optimizer afterwards). ``remat``
    recomputes each layer's activations in the backward pass (the scanned gradient
    checkpointing); ``offload`` (with ``remat``) keeps each layer's saved input in host memory
    (`workbench.backend.xla.host_offload`: ``train.offload_activations``). Installing twice updates
    both. Raises `ScanLayersError` when the stack cannot be scanned.
    """
    layers = check_scannable(model)
    if not isinstance(layers, ScannedLayers):
        layers.__class__ = ScannedLayers
    assert isinstance(layers, ScannedLayers)
    if offload and not remat:
        raise ValueError(
            "install_scan(offload=True) needs remat=True: only the layers' inputs are saved to offload"
        )
    layers.__dict__["_scan_remat"] = bool(remat)
    layers.__dict__["_scan_offload"] = bool(offload)
    layers.__dict__["_scan_traces"] = {}
    if layer_stack(layers) is None:
        stack_layers(layers)
    register_per_layer_names(layers)
    return layers


def check_scannable(model: nn.Module) -> nn.ModuleList:
    """The decoder ``ModuleList`` `install_scan` would scan; raises `ScanLayersError` naming the
    family and the reason when the stack cannot be scanned (on any backend, so a config that
    will fail on a TPU fails on a laptop too)."""
    family = _family(model)
    decoder = _decoder(model)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not isinstance(layers, nn.Module) or len(layers) == 0:
        raise _error(family, f"{type(decoder).__name__} has no decoder ModuleList at `.layers`")
    if layer_stack(layers) is not None:  # already stacked: the layers were checked then
        return layers
    if LOOP_SOURCE not in _forward_source(type(decoder)):
        raise _error(
            family,
            f"{type(decoder).__name__}.forward does not loop over `{LOOP_SOURCE}`, the call the scan replaces",
        )
    check_identical_layers(list(layers), family)
    check_uniform_layer_types(getattr(decoder, "config", None), family)
    return layers


def uninstall_scan(model: nn.Module) -> None:
    """Undo `install_scan`: the decoder stack runs unrolled again (no-op when not installed)."""
    layers = getattr(_decoder(model), "layers", None)
    if isinstance(layers, ScannedLayers):
        unstack_layers(layers)
        remove_per_layer_names(layers)
        layers.__class__ = nn.ModuleList
        for key in ("_scan_remat", "_scan_offload", "_scan_traces"):
            layers.__dict__.pop(key, None)


def scanned_layers(model: nn.Module) -> ScannedLayers | None:
    """The model's installed `ScannedLayers`, or None when its stack runs unrolled."""
    layers = getattr(_decoder(model), "layers", None)
    return layers if isinstance(layers, ScannedLayers) else None


def scan_notices(model_cfg: Any, *, xla: bool) -> list[str]:
    """What a run says about ``model.scan_layers=true`` on its backend: off XLA it is a no-op
    (``auto`` says its choice through `choose_scan`)."""
    if getattr(model_cfg, "scan_layers", False) is True and not xla:
        return ["model.scan_layers=true is a no-op off XLA: the layers run unrolled (same math)"]
    return []


def choose_scan(model: nn.Module, setting: bool | str, *, xla: bool) -> tuple[bool, str | None]:
    """Whether to scan `model`'s decoder stack for ``model.scan_layers=setting`` and, for 'auto',
    the one notice saying which and why. ``True`` checks the stack on every backend (raising
    `ScanLayersError`, so a config that fails on a TPU fails on a laptop too) and scans on XLA.

    The 'auto' rule: on XLA, scan a stack the family allows with at least `AUTO_SCAN_MIN_LAYERS`
    layers. Scanned over stacked weights a whole training step compiles in about flat time in
    depth and steps as fast as unrolled (bench/compile.py); below that depth the unrolled step's
    compile is short anyway.
    """
    if setting is not True and setting != "auto":
        return False, None
    if setting is True:
        check_scannable(model)
        return xla, None
    prefix = "model.scan_layers=auto:"
    if not xla:
        return False, f"{prefix} unrolled (off XLA the layers always run unrolled; nothing to compile)"
    try:
        layers = check_scannable(model)
    except ScanLayersError as err:
        return False, f"{prefix} unrolled, {str(err).partition(': ')[2].rpartition('. Set')[0]}"
    depth = len(layers)
    if depth < AUTO_SCAN_MIN_LAYERS:
        return False, (
            f"{prefix} unrolled: {depth} layers < {AUTO_SCAN_MIN_LAYERS}, where an unrolled step compiles "
            "quickly (set model.scan_layers=true to scan anyway)"
        )
    return True, (
        f"{prefix} scanned: {depth} identical {_family(model)} layers compile as one, over stacked weights "
        f"(>= {AUTO_SCAN_MIN_LAYERS} layers: compile time flat in depth, same step time; "
        "model.scan_layers=false unrolls)"
    )


def check_identical_layers(layers: list[nn.Module], family: str) -> None:
    """Raise `ScanLayersError` unless every layer has layer 0's parameter names and shapes and
    the same Python attributes (apart from its index), module by module."""
    reference = _layer_signature(layers[0])
    for index, layer in enumerate(layers[1:], start=1):
        signature = _layer_signature(layer)
        for key in sorted(set(reference) | set(signature), key=str):
            if reference.get(key) != signature.get(key):
                where, what = key
                name = f"{where}.{what}" if where else what
                raise _error(
                    family,
                    f"layer {index} differs from layer 0 at {name}: {signature.get(key)!r} vs "
                    f"{reference.get(key)!r}; a scan runs one traced layer for all, so they must be identical",
                )


def check_uniform_layer_types(config: Any, family: str) -> None:
    """Raise `ScanLayersError` when ``config.layer_types`` mixes attention types (sliding and full):
    the forward picks layer 0's mask for the one scanned call."""
    layer_types = list(getattr(config, "layer_types", None) or [])
    if len(set(layer_types)) > 1:
        counts = {kind: layer_types.count(kind) for kind in dict.fromkeys(layer_types)}
        raise _error(
            family,
            f"config.layer_types mixes attention types {counts}; every scanned layer gets one mask",
        )


def _layer_signature(layer: nn.Module) -> dict[tuple[str, str], Any]:
    signature: dict[tuple[str, str], Any] = {}
    for where, module in layer.named_modules():
        signature[(where, "<class>")] = type(module).__name__
        for name, value in vars(module).items():
            if name.startswith("_") or name in _LAYER_INDEX_ATTRIBUTES or name == "training":
                continue
            if isinstance(value, (*_STATIC_TYPES, tuple)):
                signature[(where, name)] = value
        for name, param in module.named_parameters(recurse=False):
            signature[(where, name)] = (tuple(param.shape), param.dtype, param.requires_grad)
        for name, buffer in module.named_buffers(recurse=False):
            signature[(where, name)] = (tuple(buffer.shape), buffer.dtype)
    return signature


def _family(model: nn.Module) -> str:
    config = getattr(_unwrap(model), "config", None)
    return str(getattr(config, "model_type", type(model).__name__))


def _unwrap(model: nn.Module) -> nn.Module:
    get_base = getattr(model, "get_base_model", None)  # a peft model
    return get_base() if callable(get_base) else model


def _decoder(model: nn.Module) -> nn.Module:
    base = _unwrap(model)
    get_decoder = getattr(base, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    return decoder if isinstance(decoder, nn.Module) else getattr(base, "model", base)


def _forward_source(cls: type) -> str:
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return ""


def _error(family: str, why: str) -> ScanLayersError:
    return ScanLayersError(
        f"model.scan_layers=True is not allowed for family {family!r}: {why}. Set model.scan_layers: false"
    )


# ---- running ----------------------------------------------------------------------------------


class ScannedLayers(nn.ModuleList):
    """A decoder ``ModuleList`` whose full slice is one scanned call (see the module docstring).

    Indexing, iteration, ``len``, names and the state_dict are the ``ModuleList``'s own; only
    ``layers[:n]`` with ``n >= len(layers)`` (the forward's loop) returns ``[_ScanRun]``.
    """

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if (start, stop, step) == (0, len(self), 1):
                return [_ScanRun(self)]
            return nn.ModuleList(self.layer_modules()[index])
        return super().__getitem__(index)

    def __len__(self) -> int:
        return len(self._modules) - (STACK in self._modules)

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self.layer_modules())

    def layer_modules(self) -> list[nn.Module]:
        """The decoder layers (without the `LayerStack` that holds their weights)."""
        return [module for key, module in self._modules.items() if key != STACK]

    @property
    def stack(self) -> LayerStack:
        """The layers' stacked parameters."""
        stack = layer_stack(self)
        assert stack is not None, "install_scan stacks the layers"
        return stack

    @property
    def remat(self) -> bool:
        """Whether the scan recomputes activations in the backward pass (gradient checkpointing)."""
        return bool(self.__dict__.get("_scan_remat", False))

    @property
    def offload(self) -> bool:
        """Whether each layer's saved input lives in host memory between the forward and backward passes."""
        return bool(self.__dict__.get("_scan_offload", False))

    def __getstate__(self) -> dict[str, Any]:
        # a copy (deepcopy, pickle) traces afresh: the cached functions call this object's layer 0
        state = dict(self.__dict__)
        state["_scan_traces"] = {}
        return state

    def traced_layer(
        self, key: tuple[Any, ...], build: Callable[[], Callable[..., Any]]
    ) -> Callable[..., Any]:
        """The cached per-layer function for `key` (built once): the same object each call, so
        torch_xla's scan reuses its trace."""
        traces: dict[tuple[Any, ...], Callable[..., Any]] = self.__dict__.setdefault("_scan_traces", {})
        if key not in traces:
            traces[key] = build()
        return traces[key]


class _LayerForward(nn.Module):
    """Calls a decoder layer's ``forward`` (never its ``__call__``: no hooks, no HF checkpointing)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out = self.layer.forward(hidden_states, **kwargs)
        return out[0] if isinstance(out, tuple) else out


class _ScanRun:
    """The one "layer" the forward's loop sees: runs every layer, scanned when it can."""

    def __init__(self, layers: ScannedLayers) -> None:
        self.layers = layers

    def __call__(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or not _scannable(hidden_states, kwargs):
            stack = self.layers.stack
            for index, layer in enumerate(self.layers.layer_modules()):
                weights = stack.layer_weights(index)
                out = torch.func.functional_call(layer, weights, (hidden_states, *args), kwargs, strict=False)
                hidden_states = out[0] if isinstance(out, tuple) else out
            return hidden_states
        return _run_scanned(self.layers, hidden_states, kwargs)


def _scannable(hidden_states: torch.Tensor, kwargs: dict[str, Any]) -> bool:
    from workbench.backend.xla import runtime

    if not runtime.is_xla_tensor(hidden_states) or _capturing_outputs():
        return False
    for value in kwargs.values():
        if isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
            continue
        if not isinstance(value, (torch.Tensor, *_STATIC_TYPES)):
            return False
    return True


def _capturing_outputs() -> bool:
    """Whether transformers is collecting per-layer outputs (``output_hidden_states`` and the
    like) through hooks on the layers, which a scanned call would never fire."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return False
    return bool(_active_collector.get())


def _run_scanned(layers: ScannedLayers, hidden_states: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    from workbench.backend.xla import runtime

    static = tuple(sorted((k, v) for k, v in kwargs.items() if isinstance(v, _STATIC_TYPES)))
    tensor_names = tuple(k for k in kwargs if not isinstance(kwargs[k], _STATIC_TYPES))
    carried: list[torch.Tensor] = []
    layout: list[tuple[str, int, tuple[torch.dtype, ...]]] = []
    for name in tensor_names:
        value = kwargs[name]
        tensors = list(value) if isinstance(value, tuple) else [value]
        layout.append(
            (name, len(tensors) if isinstance(value, tuple) else -1, tuple(t.dtype for t in tensors))
        )
        carried.extend(t if t.is_floating_point() else t.to(torch.float32) for t in tensors)

    modules = layers.layer_modules()
    stacked = {f"layer.{name}": param for name, param in layers.stack.stacked().items()}
    # grad mode and which weights train decide the traced backward (torch_xla keys only on shapes)
    trainable = tuple(p.requires_grad for p in stacked.values())
    key = (
        tuple(layout),
        static,
        layers.remat,
        layers.offload,
        _python_state(modules[0]),
        torch.is_grad_enabled(),
        trainable,
    )
    template = _LayerForward(modules[0])
    step = layers.traced_layer(key, lambda: _layer_step(template, tuple(layout), dict(static)))

    buffers = (
        _stack([dict(_LayerForward(m).named_buffers()) for m in modules]) if _has_buffers(modules[0]) else {}
    )
    carry = (hidden_states, *carried)
    if layers.offload:
        from workbench.backend.xla import host_offload

        final, _ = host_offload.offloaded_scan(step, carry, (stacked, buffers), pure=True)
    else:
        final, _ = runtime.scan(step, carry, (stacked, buffers), remat=layers.remat, pure=True)
    return final[0]


def _layer_step(
    template: _LayerForward,
    layout: tuple[tuple[str, int, tuple[torch.dtype, ...]], ...],
    static: dict[str, Any],
) -> Callable[..., Any]:
    """The function scanned over the layers: ``(carry, (params, buffers)) -> (carry, None)``."""

    def step(carry: tuple[torch.Tensor, ...], weights: tuple[dict[str, Any], dict[str, Any]]) -> Any:
        hidden_states, *carried = carry
        kwargs = dict(static)
        it: Iterator[torch.Tensor] = iter(carried)
        for name, count, dtypes in layout:
            tensors = [next(it).to(dtype) for dtype in dtypes]
            kwargs[name] = tuple(tensors) if count >= 0 else tensors[0]
        params, buffers = weights
        out = torch.func.functional_call(
            template, {**params, **buffers}, (hidden_states,), kwargs, strict=False
        )
        return (out, *carried), None

    return step


def _has_buffers(layer: nn.Module) -> bool:
    return any(True for _ in layer.buffers())


def _stack(per_layer: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: torch.stack([weights[name] for weights in per_layer]) for name in per_layer[0]}


def _python_state(layer: nn.Module) -> tuple[Any, ...]:
    """What in a layer changes its computation without changing its tensors: training mode and
    peft adapter switches (active, merged, disabled)."""
    state: list[Any] = []
    for module in layer.modules():
        state.append(module.training)
        for name in ("active_adapters", "merged_adapters", "disable_adapters"):
            value = getattr(module, name, None)
            if value is not None and not callable(value):
                state.append((name, tuple(value) if isinstance(value, (list, tuple)) else value))
    return tuple(state)


__all__ = [
    "AUTO_SCAN_MIN_LAYERS",
    "LOOP_SOURCE",
    "ScanLayersError",
    "ScannedLayers",
    "check_identical_layers",
    "check_scannable",
    "check_uniform_layer_types",
    "choose_scan",
    "install_scan",
    "scan_notices",
    "scanned_layers",
    "uninstall_scan",
]
