"""Decoder layer weights held stacked: one ``[layers, ...]`` parameter per per-layer weight, with
transformers' per-layer names wherever a weight leaves the model.

Why stacked for good (``model.scan_layers``): a scanned step that stacked the layers' weights
every step and sliced their gradients back still held per-layer work in its program (a stack
and a slice per weight and layer, an optimizer update per layer's tensor), so its compile time
grew with depth. Held stacked, the scan reads ``[layers, ...]`` weights directly, the backward
writes ``[layers, ...]`` gradients, and clipping and the optimizer update are one op per stacked
tensor: the whole step's program is the same size at 2 layers and at 32 (MaxText's layout).

The layout: `stack_layers` moves every parameter of the (identical) decoder layers into a
`LayerStack` registered as the child ``stacked`` of the layers' ``ModuleList``, at the same path
inside it (``model.layers.stacked.self_attn.q_proj.weight``, shape ``[layers, out, in]``). The
layer modules stay (their buffers, their Python state, their code) but hold no parameters; a
call that runs them one by one gets each layer's slice (`LayerStack.layer_weights`), and so does
their ``extra_repr`` (`_SliceRepr`: ``print(model)`` reads ``LlamaRMSNorm``'s ``self.weight``).

Per-layer names outside:
- ``state_dict()`` gives ``model.layers.{i}.<name>`` for every layer (a hook; views on XLA,
  copies elsewhere so safetensors never sees shared storage): transformers' ``save_pretrained``,
  peft's adapter files and checkpoints hold exactly what an unscanned model holds;
- ``load_state_dict`` takes per-layer keys (old checkpoints, unscanned ones) and stacks them,
  and reports missing, surplus and misshapen weights exactly as the unscanned model does (the
  same keys, order and message; a layer whose key is missing keeps its weight);
- `per_layer_parameters` and `expand_optimizer_state` / `collapse_optimizer_state` give a
  training checkpoint the unscanned model's parameter names and optimizer layout (a scalar
  such as Adam's ``step`` copied per layer, as an unscanned optimizer holds one per parameter),
  so a scanned run's checkpoint resumes an unscanned run and back, bitwise, sharded (DCP) too;
- `stacked_parameter_names` tells the sharding plan which parameters are stacked: a stacked
  weight is planned as its layer-0 weight, the layer axis unsharded.

`unstack_layers` puts per-layer parameters back (copies of the slices).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

STACK = "stacked"
"""The child name of the `LayerStack` inside the decoder layers' ``ModuleList``."""
LAYER_WILDCARD = "*"
"""The layer index a stacked weight shows in reports (``model.layers.*.mlp.up_proj.weight``)."""


class LayerStack(nn.Module):
    """Every decoder layer's parameters, stacked: ``stacked.<name>`` is ``[layers, *layer_shape]``
    for each of layer 0's parameter names ``<name>``. Holds no code: the scan and the layer-by-layer
    fallback read its tensors."""

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.names: list[str] = []
        """Per-layer parameter names, in the layers' own order."""

    def add(self, name: str, stacked: nn.Parameter) -> None:
        """Register `stacked` at the per-layer path `name` (``self_attn.q_proj.weight``)."""
        owner = self
        *path, leaf = name.split(".")
        for part in path:
            child = owner._modules.get(part)
            if child is None:
                child = nn.Module()
                owner.add_module(part, child)
            owner = child
        owner.register_parameter(leaf, stacked)
        self.names.append(name)

    def stacked(self) -> dict[str, nn.Parameter]:
        """Per-layer name -> its stacked parameter, in the layers' order."""
        return {name: self.get_parameter(name) for name in self.names}

    def layer_weights(self, index: int) -> dict[str, torch.Tensor]:
        """Layer `index`'s parameters as slices of the stacked ones (gradients flow back to them)."""
        return {name: stacked[index] for name, stacked in self.stacked().items()}


# ---- stacking and unstacking ----------------------------------------------------------------


def stack_layers(layers: nn.ModuleList) -> LayerStack:
    """Move the parameters of the identical modules in `layers` into one `LayerStack` (registered
    as ``layers.stacked``; returned). Weight by weight: each stacked tensor is built and the
    per-layer tensors dropped before the next, so memory peaks at one weight's extra copy."""
    existing = layer_stack(layers)
    if existing is not None:
        return existing
    modules = [m for key, m in layers._modules.items() if key != STACK and m is not None]
    stack = LayerStack(len(modules))
    for name, first in list(modules[0].named_parameters()):
        per_layer = [first] + [m.get_parameter(name) for m in modules[1:]]
        with torch.no_grad():
            stacked = torch.stack([p.detach() for p in per_layer])
        stack.add(name, nn.Parameter(stacked, requires_grad=first.requires_grad))
        del per_layer
        for index, module in enumerate(modules):
            owner, leaf = _owner(module, name)
            del owner._parameters[leaf]
            _SliceRepr.install(owner, stack, index, leaf, name)
    layers._modules[STACK] = stack
    return stack


def unstack_layers(layers: nn.ModuleList) -> None:
    """Give each layer its own parameters again (copies of its slices) and drop the `LayerStack`."""
    stack = layer_stack(layers)
    if stack is None:
        return
    modules = [m for key, m in layers._modules.items() if key != STACK and m is not None]
    for name, stacked in stack.stacked().items():
        for index, module in enumerate(modules):
            owner, leaf = _owner(module, name)
            with torch.no_grad():
                own = stacked[index].detach().clone()
            owner.register_parameter(leaf, nn.Parameter(own, requires_grad=stacked.requires_grad))
            owner.__dict__.pop("extra_repr", None)
    del layers._modules[STACK]


class _SliceRepr:
    """A stacked layer module's ``extra_repr`` (an instance attribute, so ``print(model)`` works):
    its class's own, run with the layer's slices attached, since many read their weights there
    (``LlamaRMSNorm``: ``self.weight.shape``), which now live in the `LayerStack`."""

    def __init__(self, owner: nn.Module, stack: LayerStack, index: int) -> None:
        self.owner, self.stack, self.index = owner, stack, index
        self.leaves: dict[str, str] = {}
        """Attribute -> the per-layer name of its stacked parameter."""

    @classmethod
    def install(cls, owner: nn.Module, stack: LayerStack, index: int, leaf: str, name: str) -> None:
        current = owner.__dict__.get("extra_repr")
        if not isinstance(current, cls):
            current = owner.__dict__["extra_repr"] = cls(owner, stack, index)
        current.leaves[leaf] = name

    def __call__(self) -> str:
        try:
            for leaf, name in self.leaves.items():
                object.__setattr__(self.owner, leaf, self.stack.get_parameter(name).detach()[self.index])
            return type(self.owner).extra_repr(self.owner)
        finally:
            for leaf in self.leaves:
                self.owner.__dict__.pop(leaf, None)


def layer_stack(layers: nn.Module | None) -> LayerStack | None:
    """The `LayerStack` of a layers ``ModuleList``, or None when its layers hold their own weights."""
    if layers is None:
        return None
    stack = layers._modules.get(STACK)
    return stack if isinstance(stack, LayerStack) else None


def _owner(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (module.get_submodule(path) if path else module), leaf


@contextlib.contextmanager
def layer_weights_attached(model: nn.Module) -> Iterator[None]:
    """Inside, every stacked layer's modules answer ``module.weight`` (and every other weight) with
    their layer's slice, for host-side code that reads weights off modules (peft's merge); the
    slices are plain attributes, removed on exit."""
    attached: list[tuple[nn.Module, str]] = []
    try:
        for layers_name, stack in model_stacks(model).items():
            layers = model.get_submodule(layers_name)
            modules = [m for key, m in layers._modules.items() if key != STACK and m is not None]
            for name, stacked in stack.stacked().items():
                for index, module in enumerate(modules):
                    owner, leaf = _owner(module, name)
                    object.__setattr__(owner, leaf, stacked[index])
                    attached.append((owner, leaf))
        yield
    finally:
        for owner, leaf in attached:
            owner.__dict__.pop(leaf, None)


# ---- per-layer names: state_dict, load_state_dict ----------------------------------------------


def per_layer_state_dict_hook(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any
) -> None:
    """``state_dict`` hook of a stacked layers ``ModuleList``: each ``stacked.<name>`` becomes
    ``{i}.<name>`` for every layer, in the unscanned model's order (layer by layer)."""
    stack = layer_stack(module)
    if stack is None:
        return
    stacked = {name: state_dict.pop(f"{prefix}{STACK}.{name}") for name in stack.names}
    own_keys = [key for key in state_dict if key.startswith(prefix)]
    others = {key: state_dict.pop(key) for key in own_keys}  # each layer's buffers
    for index in range(stack.num_layers):
        for name, value in stacked.items():
            state_dict[f"{prefix}{index}.{name}"] = _layer_slice(value, index)
        layer_prefix = f"{prefix}{index}."
        for key in [k for k in others if k.startswith(layer_prefix)]:
            state_dict[key] = others.pop(key)
    state_dict.update(others)


def _layer_slice(value: torch.Tensor, index: int) -> torch.Tensor:
    """A layer's slice, detached: on XLA a view (`_layer_view`), elsewhere a copy, since a view
    would share the stacked storage (safetensors and transformers' save refuse tensors that share
    memory)."""
    piece = _layer_view(value, index)
    return piece if hasattr(piece, LAYER_SLICE_OF) else piece.clone()


LAYER_SLICE_OF = "_workbench_layer_slice_of"
"""Attribute of an XLA layer view (`_layer_view`): ``(the stacked tensor, the layer index)``."""


def _layer_view(value: torch.Tensor, index: int) -> torch.Tensor:
    """``value[index]``, detached; on XLA tagged with where it comes from (`LAYER_SLICE_OF`).

    Why the tag: an XLA view is a pending slice, not data. Written to the host one by one (a
    sharded checkpoint writes each tensor on its own) every slice is a program compiled and run;
    fetched in one batch, all slices are computed at once, a second copy of the stacked weights
    and optimizer state on the device. `workbench.train.state_io.host_tensors` reads the tag and
    fetches the stacked tensor itself (device data: a transfer, nothing compiled, no copy on the
    device), then slices it on the host."""
    from workbench.backend.xla import runtime

    base = value.detach()
    piece = base[index]
    if runtime.is_xla_tensor(piece):
        setattr(piece, LAYER_SLICE_OF, (base, index))
    return piece


def layer_slice_origin(tensor: Any) -> tuple[torch.Tensor, int] | None:
    """``(stacked tensor, layer index)`` of an XLA layer view made here, else None."""
    return getattr(tensor, LAYER_SLICE_OF, None)


def stack_state_dict_pre_hook(
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: Any,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """``load_state_dict`` pre-hook: the per-layer keys (``{i}.<name>``) of a stacked weight are
    stacked into ``stacked.<name>``; a stacked key loads as it is.

    What the unscanned model would say, it says under the same names: a layer's missing key is
    reported missing (that layer keeps its weight, the others load), a layer's tensor of the wrong
    shape is a size mismatch naming that layer's key (torch's own message). A weight no layer has is
    left to the `LayerStack`, whose missing ``stacked.<name>`` the post-hook names per layer.
    """
    stack = layer_stack(module)
    if stack is None:
        return
    module.__dict__[_LOAD_START] = (prefix, len(missing_keys))
    for name, live in stack.stacked().items():
        keys = [f"{prefix}{index}.{name}" for index in range(stack.num_layers)]
        if not any(key in state_dict for key in keys):
            continue
        pieces: list[torch.Tensor | None] = []
        for key in keys:
            value = state_dict.pop(key, None)
            if value is None:
                missing_keys.append(key)
            elif not torch.overrides.is_tensor_like(value):
                error_msgs.append(
                    f'While copying the parameter named "{key}", expected torch.Tensor or Tensor-like '
                    f"object from checkpoint but received {type(value)}"
                )
                value = None
            elif value.shape != live.shape[1:]:
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {value.shape} from checkpoint, "
                    f"the shape in current model is {live.shape[1:]}."
                )
                value = None
            pieces.append(value)
        given = next((piece for piece in pieces if piece is not None), None)
        like = given if given is not None else live.detach()
        with torch.no_grad():  # a layer that loads nothing keeps its own weight
            state_dict[f"{prefix}{STACK}.{name}"] = torch.stack(
                [
                    (piece if piece is not None else live.detach()[index]).to(like.device, like.dtype)
                    for index, piece in enumerate(pieces)
                ]
            )


_LOAD_START = "_per_layer_load_start"
"""Set on the layers by the pre-hook for the post-hook: (their prefix, where their missing keys start)."""


def per_layer_missing_keys_hook(module: nn.Module, incompatible_keys: Any) -> None:
    """``load_state_dict`` post-hook: a stacked weight missing from the loaded dict is reported by
    its per-layer names (the keys a user's file would have needed), and the layers' missing keys
    are put in the unscanned model's order (layer by layer), so the message is the one an
    unscanned model gives."""
    stack = layer_stack(module)
    start = module.__dict__.pop(_LOAD_START, None)
    if stack is None or start is None:
        return
    prefix, begin = start
    missing = incompatible_keys.missing_keys
    renamed: list[str] = []
    for key in missing[begin:]:
        name = key[len(f"{prefix}{STACK}.") :] if key.startswith(f"{prefix}{STACK}.") else None
        if name in stack.names:
            renamed.extend(f"{prefix}{index}.{name}" for index in range(stack.num_layers))
        else:
            renamed.append(key)
    rank = {name: position for position, name in enumerate(stack.names)}

    def unscanned_order(item: tuple[int, str]) -> tuple[int, int, int]:
        position, key = item
        layer, _, name = key[len(prefix) :].partition(".") if key.startswith(prefix) else ("", "", "")
        if not layer.isdigit():
            return stack.num_layers, 0, position
        return int(layer), rank.get(name, len(rank)), position

    missing[begin:] = [key for _, key in sorted(enumerate(renamed), key=unscanned_order)]


_HOOKS = (per_layer_state_dict_hook, stack_state_dict_pre_hook, per_layer_missing_keys_hook)


def register_per_layer_names(layers: nn.ModuleList) -> None:
    """Install the three hooks above on `layers` (once; module-level functions, so a copy of the
    model keeps them)."""
    remove_per_layer_names(layers)
    layers._register_state_dict_hook(per_layer_state_dict_hook)
    layers._register_load_state_dict_pre_hook(stack_state_dict_pre_hook, with_module=True)
    layers.register_load_state_dict_post_hook(per_layer_missing_keys_hook)


def remove_per_layer_names(layers: nn.ModuleList) -> None:
    """Remove the hooks `register_per_layer_names` installed."""
    for hooks in (
        layers._state_dict_hooks,
        layers._load_state_dict_pre_hooks,
        layers._load_state_dict_post_hooks,
    ):
        for key, hook in list(hooks.items()):
            if getattr(hook, "hook", hook) in _HOOKS:
                del hooks[key]


# ---- per-layer names: parameters, optimizer state, sharding -------------------------------------


def model_stacks(model: nn.Module) -> dict[str, LayerStack]:
    """Every `LayerStack` in `model`, by the qualified name of its layers ``ModuleList``
    (``model.layers``); empty for a model whose layers hold their own weights."""
    return {
        name.rpartition(".")[0]: module
        for name, module in model.named_modules()
        if isinstance(module, LayerStack)
    }


def stacked_parameter_names(model: nn.Module) -> dict[str, tuple[str, int]]:
    """Stacked parameter name -> (the per-layer name of layer `{index}`'s weight as a format string,
    the number of layers): ``model.layers.stacked.mlp.up_proj.weight`` ->
    (``model.layers.{index}.mlp.up_proj.weight``, 30)."""
    out: dict[str, tuple[str, int]] = {}
    for layers_name, stack in model_stacks(model).items():
        for name in stack.names:
            out[f"{layers_name}.{STACK}.{name}"] = (f"{layers_name}.{{index}}.{name}", stack.num_layers)
    return out


def per_layer_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(name, tensor, requires_grad) of every parameter under its unscanned name, in the unscanned
    model's order: a stacked parameter yields each layer's slice (detached) at ``layers.{i}``."""
    stacked = stacked_parameter_names(model)
    pending: list[tuple[str, nn.Parameter]] = []

    def flush() -> Iterator[tuple[str, torch.Tensor, bool]]:
        if pending:
            layers = stacked[pending[0][0]][1]
            for index in range(layers):
                for name, param in pending:
                    yield stacked[name][0].format(index=index), _layer_view(param, index), param.requires_grad
            pending.clear()

    for name, param in model.named_parameters():
        if name in stacked:
            if pending and _stack_of(pending[0][0]) != _stack_of(name):
                yield from flush()
            pending.append((name, param))
            continue
        yield from flush()
        yield name, param.detach(), param.requires_grad
    yield from flush()


def _stack_of(stacked_name: str) -> str:
    return stacked_name.partition(f".{STACK}.")[0]


def _expansion(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[list[tuple[int, int | None]]]:
    """Per param group, the unscanned layout as (index of the live parameter, layer or None):
    consecutive stacked parameters of one group expand layer by layer, as the unscanned model's
    named_parameters would have listed them."""
    stacked = stacked_parameter_names(model)
    layers_of = {id(p): stacked[name][1] for name, p in model.named_parameters() if name in stacked}
    groups: list[list[tuple[int, int | None]]] = []
    position = 0
    for group in optimizer.param_groups:
        layout: list[tuple[int, int | None]] = []
        run: list[int] = []  # positions of consecutive stacked parameters
        layers = 0
        for param in group["params"]:
            if id(param) in layers_of:
                run.append(position)
                layers = layers_of[id(param)]
            else:
                layout.extend(_expand_run(run, layers))
                run = []
                layout.append((position, None))
            position += 1
        layout.extend(_expand_run(run, layers))
        groups.append(layout)
    return groups


def _expand_run(run: list[int], layers: int) -> list[tuple[int, int | None]]:
    """A run of stacked parameters' positions, layer by layer (the unscanned order)."""
    return [(position, index) for index in range(layers) for position in run]


def expand_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module) -> dict[str, Any]:
    """``optimizer.state_dict()`` in the unscanned model's layout: each stacked parameter's state
    becomes one entry per layer (slices; scalars such as Adam's step shared), so the checkpoint
    is the one an unscanned run writes."""
    saved = optimizer.state_dict()
    groups = _expansion(optimizer, model)
    if all(layer is None for layout in groups for _, layer in layout):
        return saved
    state: dict[int, dict[str, Any]] = {}
    param_groups = []
    index = 0
    for layout, group in zip(groups, saved["param_groups"]):
        indices = []
        for position, layer in layout:
            live = saved["state"].get(position)
            if live is not None:
                state[index] = {key: _state_slice(value, layer) for key, value in live.items()}
            indices.append(index)
            index += 1
        param_groups.append({**group, "params": indices})
    return {"state": state, "param_groups": param_groups}


def collapse_optimizer_state(
    optimizer: torch.optim.Optimizer, model: nn.Module, saved: Mapping[str, Any]
) -> dict[str, Any]:
    """Inverse of `expand_optimizer_state`: a checkpoint's per-layer optimizer state (from a scanned
    or an unscanned run) in this optimizer's own layout, each stacked parameter's entries stacked.
    A state already in this layout (same parameter count) is returned as it is."""
    groups = _expansion(optimizer, model)
    expanded_count = sum(len(layout) for layout in groups)
    saved_count = sum(len(g["params"]) for g in saved["param_groups"])
    if all(layer is None for layout in groups for _, layer in layout) or saved_count != expanded_count:
        return dict(saved)
    saved_state = {int(k): v for k, v in saved["state"].items()}
    per_position: dict[int, list[tuple[int | None, dict[str, Any]]]] = {}
    index = 0
    for layout in groups:
        for position, layer in layout:
            if index in saved_state:
                per_position.setdefault(position, []).append((layer, saved_state[index]))
            index += 1
    state: dict[int, dict[str, Any]] = {}
    for position, entries in per_position.items():
        if entries[0][0] is None:
            state[position] = entries[0][1]
            continue
        entries.sort(key=lambda entry: entry[0])
        state[position] = {key: _stack_state([entry[key] for _, entry in entries]) for key in entries[0][1]}
    param_groups = []
    position = 0
    for layout, group in zip(groups, saved["param_groups"]):
        count = len({p for p, _ in layout})
        param_groups.append({**group, "params": list(range(position, position + count))})
        position += count
    return {"state": state, "param_groups": param_groups}


def _state_slice(value: Any, layer: int | None) -> Any:
    """Layer `layer`'s part of a stacked parameter's optimizer state. A scalar (Adam's ``step``) is
    copied per layer, as an unscanned optimizer holds one per parameter: one shared tensor would be
    written once by a sharded (DCP) save, which deduplicates tensors by identity, and an unscanned
    run resuming that checkpoint would find the other layers' ``step`` missing."""
    if layer is None or not isinstance(value, torch.Tensor):
        return value
    if value.dim() == 0:
        return value.detach().clone()
    return _layer_slice(value, layer)


def _stack_state(values: Sequence[Any]) -> Any:
    first = values[0]
    if not isinstance(first, torch.Tensor) or first.dim() == 0:
        return first
    return torch.stack(list(values))


__all__ = [
    "LAYER_SLICE_OF",
    "LAYER_WILDCARD",
    "STACK",
    "LayerStack",
    "collapse_optimizer_state",
    "expand_optimizer_state",
    "layer_slice_origin",
    "layer_stack",
    "layer_weights_attached",
    "model_stacks",
    "per_layer_parameters",
    "register_per_layer_names",
    "remove_per_layer_names",
    "stack_layers",
    "stacked_parameter_names",
    "unstack_layers",
]
