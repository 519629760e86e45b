"""Layer checkpoints in host memory on plain torch (``train.offload_activations`` on CUDA, the CPU, TorchTPU).

Gradient checkpointing (transformers' per-layer ``torch.utils.checkpoint``, non-reentrant) keeps
each decoder layer's input and recomputes the rest in the backward pass. `offloaded_checkpoint` is
that checkpoint with the inputs it keeps packed through `HostOffload`'s saved-tensor hooks: the
checkpoint saves its inputs (``_NoopSaveInputs``) before it enters its own hooks, so those, and only
those, pass through ours; every tensor the layer saves inside stays the checkpoint's to drop.

`HostOffload` on CUDA (Unsloth's offloaded gradient checkpointing, with the copies overlapped):

- **pack** (forward): a pinned host buffer, the device-to-host copy issued on a side stream after
  the compute stream's work so far, and the device tensor recorded on that stream so the caching
  allocator reuses its memory only once the copy is done. The forward never waits for it.
- **unpack** (backward, layers in reverse): the host-to-device copy on the side stream (or the one
  already under way), the compute stream waiting for it alone; then the copy of the previous
  layer's input is started, so it arrives while this layer recomputes.

Elsewhere the copies are synchronous ``.to("cpu")`` and back (TorchTPU's device ``tpu``); on the
CPU the "host copy" is a copy in the same memory, which saves nothing and exists so the path can be
checked there (tests/test_offload.py: equal losses and gradients). A tensor packed twice while alive
(the same object saved by two checkpoints) is copied once.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch


class _Packed:
    """One offloaded tensor: its host copy, and its way back."""

    __slots__ = ("__weakref__", "device", "done", "fetched", "host", "version")

    def __init__(self, host: torch.Tensor, device: torch.device, done: Any, version: int) -> None:
        self.host, self.device, self.done, self.version = host, device, done, version
        self.fetched: tuple[torch.Tensor, Any] | None = None
        """The device copy on its way back and the event that says it arrived (CUDA)."""


class HostOffload:
    """Saved-tensor hooks that keep tensors in host memory between the forward and backward passes
    (see the module docstring). One per model; `min_bytes` leaves small tensors where they are."""

    def __init__(self, min_bytes: int = 1024) -> None:
        self.min_bytes = min_bytes
        self._stream: Any = None
        self._order: list[weakref.ref[_Packed]] = []
        """Packed tensors in the order the forward packed them: the backward unpacks them in reverse."""
        self._alive: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[_Packed]]] = {}

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The saved-tensor hooks context that packs through this object."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor) -> Any:
        if tensor.device.type == "meta" or tensor.numel() * tensor.element_size() < self.min_bytes:
            return tensor
        seen = self._alive.get(id(tensor))
        if seen is not None and seen[0]() is tensor and seen[1]() is not None:
            packed = seen[1]()
            if packed is not None and packed.version == tensor._version:
                return packed
        packed = self._copy_out(tensor)
        self._order = [ref for ref in self._order if ref() is not None]
        self._order.append(weakref.ref(packed))
        self._alive = {k: v for k, v in self._alive.items() if v[0]() is not None and v[1]() is not None}
        self._alive[id(tensor)] = (weakref.ref(tensor), weakref.ref(packed))
        return packed

    def unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Packed):
            return packed
        tensor = self._fetch(packed)
        refs = [ref() for ref in self._order]
        if packed in refs:  # start bringing back the tensor packed before this one
            index = refs.index(packed)
            previous = refs[index - 1] if index > 0 else None
            if previous is not None and previous.fetched is None and previous.device.type == "cuda":
                previous.fetched = self._start_fetch(previous)
        return tensor

    # ---- the copies ----

    def _copy_out(self, tensor: torch.Tensor) -> _Packed:
        version = tensor._version
        if tensor.device.type != "cuda":
            host = tensor.detach().to("cpu", copy=True)
            return _Packed(host, tensor.device, None, version)
        stream = self._side_stream()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, layout=tensor.layout, pin_memory=True)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            host.copy_(tensor.detach(), non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        tensor.record_stream(stream)  # its memory is not reused before the copy has read it
        return _Packed(host, tensor.device, done, version)

    def _start_fetch(self, packed: _Packed) -> tuple[torch.Tensor, Any]:
        stream = self._side_stream()
        with torch.cuda.stream(stream):
            if packed.done is not None:
                stream.wait_event(packed.done)
            on_device = packed.host.to(packed.device, non_blocking=True)
            arrived = torch.cuda.Event()
            arrived.record(stream)
        return on_device, arrived

    def _fetch(self, packed: _Packed) -> torch.Tensor:
        if packed.device.type != "cuda":
            return packed.host.to(packed.device)  # on the CPU the host copy itself
        fetched = packed.fetched or self._start_fetch(packed)
        packed.fetched = None  # a second unpack fetches again rather than keep a device copy alive
        on_device, arrived = fetched
        current = torch.cuda.current_stream(packed.device)
        current.wait_event(arrived)
        on_device.record_stream(current)
        return on_device

    def _side_stream(self) -> Any:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream


def offloaded_checkpoint_function(offload: HostOffload | None = None) -> Callable[..., Any]:
    """A ``gradient_checkpointing_func`` for transformers (`workbench.models.build`): torch's
    non-reentrant checkpoint whose kept inputs live in host memory through `offload`."""
    offload = offload or HostOffload()

    def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("use_reentrant", None)
        with offload.hooks():
            return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)

    checkpoint.offload = offload  # type: ignore[attr-defined]
    return checkpoint


__all__ = ["HostOffload", "offloaded_checkpoint_function"]
