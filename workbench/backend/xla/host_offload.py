"""Layer checkpoints in host memory under the scanned layer stack (``train.offload_activations`` on XLA).

The scanned stack's ``remat`` saves only each iteration's inputs: the layer's input and what rides in
the carry beside it (the rotary cos and sin, the mask), ``[layers, ...]`` of each once scanned. With
offload, `offloaded_scan` partitions the body with `workbench.backend.xla.scan_support.offload_partition`: in
the forward body each saved carry goes through torch_xla's ``place_to_host`` (a custom call
``annotate_device_placement`` with ``_xla_buffer_placement="pinned_host"``), so the stacked buffer
the loop writes lives in pinned host memory; the backward body reads each layer's slice back
through ``place_to_device``. Everything else is recomputed, as under ``remat``. It is torchprime's
``remat_all_and_offload_these_inputs`` pattern (torch_xla's README calls these ops "best used in
combination with scan"), with the saved carries found by position instead of a name tag.

What XLA:CPU does with the placements (torch_xla 2.9, checked by tests/xla/offload_scan.py): its
HLO passes keep both custom calls through optimisation and its buffer assignment puts their results
in the one memory space it has (no host/device split in its memory analysis), and then its code
generator refuses the program: ``Unknown custom-call API version enum value: 0
(API_VERSION_UNSPECIFIED)``. So `placements` decides per device: the real ops where the device has
a host memory space of its own (TPU, GPU), none on XLA:CPU, where host memory is the device's
(the partition is then the plain ``remat`` one). Tests pick ``"xla"`` to lower the real ops on
XLA:CPU (the HLO only) or ``"scaled"``, stand-ins that multiply by 2 on the way out and by 0.5 on
the way back, so any saved value that left without coming back, or came back into the wrong input,
changes the gradients.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from workbench.backend.xla import runtime, scan_support

PLACEMENTS: tuple[str, ...] = ("auto", "xla", "scaled", "none")
"""How offloaded checkpoints are placed: 'auto' (`placements_for`), torch_xla's ops ('xla'),
exact stand-ins ('scaled'), or nothing ('none')."""
HOST_MEMORY_DEVICES = frozenset({"TPU", "GPU", "CUDA"})
"""XLA device types whose compiler places ``pinned_host`` buffers in host memory."""

Placements = str | tuple[Callable[..., Any], Callable[..., Any]]
_chosen: dict[str, Placements] = {"placements": "auto"}


def use_placements(kind: Placements) -> None:
    """Choose the placements every later offloaded scan traces: a name in `PLACEMENTS` (default
    'auto'), or a ``(to_host, to_device)`` pair of functions of a tensor."""
    if isinstance(kind, tuple) and len(kind) == 2 and all(callable(f) for f in kind):
        _chosen["placements"] = kind
        return
    if kind not in PLACEMENTS:
        raise ValueError(
            f"placements={kind!r} is not allowed: one of {', '.join(map(repr, PLACEMENTS))} or a "
            "(to_host, to_device) pair of functions"
        )
    _chosen["placements"] = kind


def host_memory_space() -> bool:
    """Whether this process's XLA device has host memory apart from its own (not XLA:CPU)."""
    return runtime.runtime_summary().device_type in HOST_MEMORY_DEVICES


def placements_for(kind: Placements) -> tuple[Callable[..., Any], Callable[..., Any]] | tuple[None, None]:
    """``(to_host, to_device)`` graph targets for `kind` ('auto': torch_xla's where `host_memory_space`,
    else none)."""
    if isinstance(kind, tuple):
        return kind
    if kind == "auto":
        kind = "xla" if host_memory_space() else "none"
    if kind == "xla":
        import torch
        import torch_xla.experimental.stablehlo_custom_call  # noqa: F401  (registers xla::place_to_*)

        return torch.ops.xla.place_to_host.default, torch.ops.xla.place_to_device.default
    if kind == "scaled":
        return _scaled_out, _scaled_back
    return None, None


def offloaded_scan(fn: Callable[..., Any], init: Any, xs: Any, *, pure: bool = False) -> Any:
    """`workbench.backend.xla.runtime.scan` with ``remat`` and every saved carry in host memory:
    ``fn(carry, x) -> (carry, y)`` over the leading axis of `xs` (see the module docstring)."""
    from torch.utils._pytree import tree_flatten
    from torch_xla.experimental.scan import scan as xla_scan

    runtime._scan_backward_without_jax_bridge()  # the same backward as every scan (runtime.scan)
    to_host, to_device = placements_for(_chosen["placements"])
    partition = scan_support.offload_partition(len(tree_flatten(init)[0]), to_host, to_device)
    return xla_scan(fn, init, xs, partition_fn=partition, is_fn_pure=pure)


def lowered_hlo(tensors: list[Any]) -> str:
    """The HLO text torch_xla hands XLA for `tensors` (before XLA's own passes; nothing compiles)."""
    import torch_xla

    return str(torch_xla._XLAC._get_xla_tensors_hlo(list(tensors)))


def _scaled_out(tensor: Any) -> Any:
    return tensor * 2


def _scaled_back(tensor: Any) -> Any:
    return tensor * 0.5


@functools.cache
def placement_notice() -> str | None:
    """What a run says once when it offloads where the device has no host memory of its own."""
    if _chosen["placements"] == "auto" and not host_memory_space():
        return (
            "train.offload_activations: on XLA:CPU host memory is the device's, so the layers' "
            "checkpoints stay where they are (the same program as checkpointing without offload; "
            "TPU and GPU place them in pinned host memory)"
        )
    return None
