"""What a run makes of ``train.offload_activations`` and ``model.mlp_chunk_tokens`` on its hardware.

`plan_long_context` decides, before the model is prepared (`workbench.train.model_setup`):

- **MLP tiles**: N tiles N tokens at a time; 'auto' tiles where the rule
  (`workbench.models.mlp_tiles.mlp_chunk_length`) tiles the run's longest rows (the batch at
  ``data.max_length``, one device's share) on this device's memory; null never. The tiled MLP picks
  its tile length per call from the shape it sees.
- **offload**: 'on' (with gradient checkpointing), 'off', or 'auto': on where the memory estimate
  (`workbench.analysis.estimate.estimate`, with the run's settings, mesh, device memory and
  attention kernel, at the batch and ``data.max_length``) does not fit without it. Unknown memory
  (the CPU) never offloads under 'auto'. Each choice that changes something says so once.

Where the model runs decides the rest (`workbench.train.model_setup.prepare_model`): on XLA the
scanned stack offloads (an unrolled one cannot: 'on' is refused, 'auto' says why it stays off),
elsewhere the layers' checkpoint function does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.analysis.config_estimate import config_settings
from workbench.analysis.estimate import estimate, mesh_sizes
from workbench.models.mlp_tiles import MlpTiling, mlp_width
from workbench.units import format_bytes

HOST_SHARE = 0.8
"""The share of the machine's RAM the offloaded checkpoints may take before a run says so."""


@dataclass(frozen=True)
class LongContextPlan:
    """The run's two long-context decisions."""

    offload: bool
    """Keep the layers' checkpoints in host memory."""
    tiling: MlpTiling | None
    """Run the MLP in tiles (None: whole)."""


def plan_long_context(
    cfg: Any,
    model: Any,
    hw: Any,
    *,
    mesh: Any = None,
    attention: str | None = None,
    notice: Callable[[str], None] | None = None,
) -> LongContextPlan:
    """The run's `LongContextPlan` for `model` (a transformers model, before LoRA and scan) on `hw`
    (`HardwareInfo`) over `mesh` (a resolved `MeshSpec` or axis sizes, e.g. ``{"data": ranks}``; None:
    one device), `attention` the kernel the run resolved; `notice` hears each choice that changes the
    run (see the module docstring)."""
    say = notice or (lambda message: None)
    memory = hw.memory_per_device_bytes
    sizes = mesh_sizes(mesh)
    dp, mp = sizes["data"] * sizes["fsdp"], sizes["model"]
    tiling = _tiling(cfg, model, memory, dp, mp, say)
    train = cfg.train
    setting = train.offload_activations
    if setting == "off" or not train.gradient_checkpointing or (setting == "auto" and not memory):
        return LongContextPlan(False, tiling)
    try:
        kernel = attention if attention in ("eager", "sdpa", "flash", "chunked") else None
        est = estimate(
            model.config,
            batch_size=train.batch_size,
            seq_len=cfg.data.max_length,
            mesh=mesh,
            memory_bytes=memory,
            attention=kernel,
            **config_settings(cfg),
        )
    except Exception as err:  # no estimate: 'on' still offloads, 'auto' leaves the checkpoints put
        chosen = "on" if setting == "on" else "off"
        say(f"train.offload_activations={setting}: {chosen} (no memory estimate: {err})")
        return LongContextPlan(setting == "on", tiling)
    if not est.offload_activations:
        return LongContextPlan(False, tiling)
    host = format_bytes(est.host_bytes)
    if setting == "auto":
        say(
            f"train.offload_activations=auto: on, the layers' checkpoints ({host}) in host memory: without "
            f"it the step would not fit {format_bytes(memory)} per device; with it the estimate is "
            f"{format_bytes(est.total_bytes)} (train.offload_activations=off keeps them on the device)"
        )
    on_host = est.host_bytes * max(1, hw.local_devices)  # every device of this host offloads into its RAM
    if hw.host_memory_bytes and on_host > HOST_SHARE * hw.host_memory_bytes:
        say(
            f"train.offload_activations: the checkpoints take {format_bytes(on_host)} of host memory "
            f"({host} per device x {max(1, hw.local_devices)}), more than {HOST_SHARE:.0%} of this "
            f"machine's {format_bytes(hw.host_memory_bytes)}: shorten data.max_length or the batch"
        )
    if hw.device_string == "cpu":
        say("train.offload_activations: on the CPU host memory is the device's: offload saves nothing here")
    return LongContextPlan(True, tiling)


def _tiling(
    cfg: Any, model: Any, memory: int | None, dp: int, mp: int, say: Callable[[str], None]
) -> MlpTiling | None:
    setting = cfg.model.mlp_chunk_tokens
    if setting is None:
        return None
    tiling = MlpTiling(setting, memory_bytes=memory, data_parallel=dp, model_parallel=mp)
    try:
        intermediate, gated = mlp_width(model.config)
    except (KeyError, AttributeError):  # a family the registry does not know: its MLP is left whole
        if setting != "auto":
            say(f"model.mlp_chunk_tokens={setting!r}: not tiled, the model's family is not a registered one")
        return None
    compute_bytes = 4 if cfg.train.precision == "fp32" else 2
    positions = tiling.positions(
        cfg.train.batch_size, cfg.data.max_length, intermediate, gated, compute_bytes
    )
    if positions is None and setting == "auto":
        return None
    if positions is not None:
        say(
            f"model.mlp_chunk_tokens={setting!r}: the MLP runs in tiles of {positions} positions at "
            f"data.max_length={cfg.data.max_length} (each recomputed in the backward pass; "
            "model.mlp_chunk_tokens=null runs it whole)"
        )
    return tiling


__all__ = ["LongContextPlan", "plan_long_context"]
