"""What the config panel recomputes on each change, with no widget in sight: for a config on a target,
the memory estimate of one step per device, the largest global batch that fits, and the bucket plan
of the data's token lengths beside the count 'auto' would pick.

- `load_lengths`: the token lengths the bucketing preview plans over (given, a `datasets.Dataset`'s
  'length' column, or the config's own data tokenised by `workbench.data`), and why there are none.
- `estimate_settings`: the config as `workbench.analysis.estimate.estimate`'s arguments on the
  target (`workbench.analysis.config_estimate.config_settings_on`): the config's own settings, its
  mesh, and the attention kernel the target runs for ``model.attention`` (flash on a TPU for 'auto',
  sdpa on a GPU) at a training row's length.
- `BucketPreview`: the planned buckets (`workbench.data.buckets.plan_buckets`, or the 'auto'
  choice, `workbench.data.bucket_choice.choose_buckets`) for a config and the two costs the choice
  weighs, cached per setting, so a change of a memory setting replans nothing.
- `preview_config`: all of it at once, as a `ConfigPreview`.

The estimate is analytic and the plans are cached, which keeps a redraw within a slider's pace
(`widgets.config_panel.measure_redraw` times it). `widgets.config_panel.ConfigPanel` shows the
result; `widgets.config_figures` draws it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.analysis.batch import max_batch_size
from workbench.analysis.config_estimate import config_settings_on
from workbench.analysis.estimate import estimate as estimate_memory
from workbench.backend.targets import Target
from workbench.config import WorkbenchConfig


def load_lengths(
    lengths: Sequence[int] | Any | None, cfg: WorkbenchConfig
) -> tuple[np.ndarray | None, str | None]:
    """(token lengths, None), or (None, why there are none) when `lengths` is None and `cfg`'s data
    cannot be tokenised: the preview is optional, the panel says why it is missing.

    `lengths` is a sequence of ints or a `datasets.Dataset` with a 'length' column; None tokenises
    `cfg`'s data source with `workbench.data` (the tokenizer is cached on disk). A ValueError when
    they are not a non-empty sequence of positive token counts.
    """
    if lengths is None:
        try:
            from workbench import data

            train_ds, _, _ = data.build_datasets(cfg)
            lengths = train_ds["length"]
        except Exception as err:  # the preview is optional: say why it is missing
            return None, f"no length sample ({type(err).__name__}: {err})"
    elif hasattr(lengths, "column_names"):
        lengths = lengths["length"]
    arr = np.asarray(list(lengths), dtype=np.int64)
    if arr.ndim != 1 or arr.size == 0 or (arr < 1).any():
        raise ValueError("lengths must be a non-empty sequence of positive token counts")
    return arr, None


def mesh_axes(cfg: WorkbenchConfig) -> tuple[int, int, int]:
    """The config's (data, fsdp, model) axes, as the panel's mesh control sets them."""
    return cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model


def estimate_settings(cfg: WorkbenchConfig, target: Target) -> dict[str, Any]:
    """`estimate`'s (and `max_batch_size`'s) keyword arguments for `cfg` on `target`, beside the
    model, batch, sequence length and memory."""
    return config_settings_on(cfg, target, mesh=dict(zip(("data", "fsdp", "model"), mesh_axes(cfg))))


class BucketPreview:
    """The bucket plans of one set of token lengths, computed once per setting."""

    def __init__(self, lengths: np.ndarray | None) -> None:
        self.lengths = lengths
        self._plans: dict[tuple[Any, ...], Any] = {}

    def plan(self, cfg: WorkbenchConfig, costs: tuple[float, float]) -> tuple[Any, Any]:
        """(the plan to preview, the 'auto' choice: a `BucketChoice`, drawn whatever the count) for
        `cfg` and `costs` = (compile seconds per shape, seconds per padded token); (None, None)
        without lengths."""
        if self.lengths is None:
            return None, None
        from workbench.data.bucket_choice import choose_buckets
        from workbench.data.buckets import STRATEGIES, plan_buckets
        from workbench.data.loader import training_epochs

        b = cfg.bucketing
        # "none" (pad each batch to its longest) and packing have no boundaries to preview:
        # show what the planned buckets would be. (So not `plan_for_config`, which
        # returns None for those.)
        strategy = b.strategy if b.strategy in STRATEGIES else "optimal"
        compile_s, token_s = costs
        epochs = training_epochs(self.lengths, cfg)
        auto_key = ("auto", b.multiple_of, cfg.data.max_length, compile_s, token_s, epochs)
        if auto_key not in self._plans:
            self._plans[auto_key] = choose_buckets(
                self.lengths,
                compile_seconds=compile_s,
                seconds_per_padded_token=token_s,
                epochs=epochs,
                multiple_of=b.multiple_of,
                max_length=cfg.data.max_length,
            )
        chosen = self._plans[auto_key]
        if b.max_buckets == "auto":
            return chosen, chosen.choice
        key = (b.max_buckets, b.multiple_of, cfg.data.max_length, strategy)
        if key not in self._plans:
            self._plans[key] = plan_buckets(
                self.lengths,
                b.max_buckets,
                multiple_of=b.multiple_of,
                max_length=cfg.data.max_length,
                strategy=strategy,
            )
        return self._plans[key], chosen.choice


@dataclass(frozen=True)
class ConfigPreview:
    """What the panel shows for one config on one target."""

    estimate: Any
    """The memory of one step per device (a `MemoryEstimate`)."""
    largest_batch: int | None
    """The largest global batch that fits; None when the target's memory is unknown."""
    plan: Any
    """The bucket plan previewed (None without lengths)."""
    bucket_choice: Any
    """The 'auto' choice for the current settings (a `BucketChoice`; None without lengths)."""


def preview_config(
    cfg: WorkbenchConfig,
    target: Target,
    *,
    headroom: float,
    buckets: BucketPreview,
    costs: tuple[float, float],
) -> ConfigPreview:
    """`cfg`'s estimate, largest batch and bucket plan on `target`, keeping `headroom` of each
    device's memory free; raises what the estimate raises (a ValueError for a batch that does not
    split over the mesh's data-parallel axes, an OSError for an unreadable ``pretrained_path``, ...)."""
    settings = estimate_settings(cfg, target)
    limit = target.memory_per_device_bytes
    # The target's memory plans the 'auto' loss chunks (max_batch_size passes it too).
    estimate = estimate_memory(
        cfg.model,
        batch_size=cfg.train.batch_size,
        seq_len=cfg.data.max_length,
        memory_bytes=limit,
        **settings,
    )
    data, fsdp, _ = mesh_axes(cfg)
    largest = (
        None
        if limit is None
        else max_batch_size(
            cfg.model,
            seq_len=cfg.data.max_length,
            memory_bytes=limit,
            headroom=headroom,
            multiple_of=data * fsdp,
            **settings,
        )
    )
    plan, choice = buckets.plan(cfg, costs)
    return ConfigPreview(estimate, largest, plan, choice)


__all__ = [
    "BucketPreview",
    "ConfigPreview",
    "estimate_settings",
    "load_lengths",
    "mesh_axes",
    "preview_config",
]
