"""A live panel for tuning a `WorkbenchConfig` with its memory and bucketing consequences in view.

Controls: model size, batch size, sequence length, gradient accumulation, optimizer, precision,
gradient checkpointing, LoRA rank (0 = full fine-tuning), a quantized base, the loss chunk and the
attention kernel (`widgets.config_controls`), mesh axes (only the factorisations of the target's device count are
offered), bucket count, and the target hardware (the detected one or a named slice such as
v5e-8). Every change redraws, live:

- the per-device memory estimate (`workbench.analysis.estimate.estimate`) as a stacked bar of
  its breakdown against the target's memory per device, with a fits / does-not-fit sign;
- the largest global batch that fits (`workbench.analysis.batch.max_batch_size`);
- the parameters that train (all of them, or the LoRA adapters), the base's weights (and what
  int8/int4 saves), the logits (and what chunking the loss saves) and the attention scores (what
  the kernel 'auto' picks for the target holds against eager's);
- the length histogram of the data with the planned bucket boundaries
  (`workbench.data.buckets.plan_buckets`, or `choose_buckets` when the count is 'auto') and their
  padding efficiency;
- the compile-time trade-off: predicted run time against the number of shapes, compiling and
  training stacked, the count 'auto' picks marked (`widgets.bucket_tradeoff`);
- the resulting config object (`.config`) and its YAML (`.yaml`).

This module assembles the panel: its three groups of controls (the run's, `widgets.run_controls`;
the memory-saving ones, `widgets.config_controls`; the 'auto' bucket count's, `widgets.bucket_tradeoff`)
and the config they compose, their wiring, the readouts and figures laid out beside them, and the
redraw cycle that commits a change only once it has been drawn. What a change recomputes is
`widgets.config_preview`'s; the figures and readouts are drawn by `widgets.config_figures`.

Redraws are cheap (the estimate is analytic, the bucket plan is cached per setting) and timed:
`.redraw_ms` holds the time of each of the last 100.

`config_for(hw)` is what to train with: the panel's config adapted to the machine at hand, or an
error when the controls describe an invalid config.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ipywidgets as ipw

from widgets.bucket_tradeoff import AutoBucketControls, draw_tradeoff, new_tradeoff_figure, tradeoff_readout
from widgets.config_controls import MemorySavingControls
from widgets.config_figures import (
    bucket_readout,
    draw_bucket_plan,
    draw_memory,
    error_readout,
    estimate_readout,
    fits_readout,
    largest_batch_readout,
    new_length_figure,
    new_memory_figure,
    trainable_readout,
    yaml_readout,
)
from widgets.config_preview import BucketPreview, ConfigPreview, load_lengths, preview_config
from widgets.run_controls import RunControls
from workbench.backend.hardware import HardwareInfo
from workbench.backend.targets import Target, resolve_target, training_devices
from workbench.config import ConfigError, WorkbenchConfig


class ConfigPanel:
    """Tune a `WorkbenchConfig` with live memory and bucketing previews.

    Args:
        cfg: the starting config (defaults to `WorkbenchConfig()`).
        target: 'auto' (the detected hardware), a name in `TARGETS` (workbench.backend.targets),
            a `Target` or a `HardwareInfo`.
        lengths: token lengths of the training data for the bucketing preview (a sequence of
            ints, or a `datasets.Dataset` with a 'length' column); None tokenises the config's
            data source with `workbench.data` (the tokenizer is cached on disk).
        headroom: fraction of device memory kept free when judging whether a config fits.
    """

    def __init__(
        self,
        cfg: WorkbenchConfig | None = None,
        target: str | Target | HardwareInfo = "auto",
        *,
        lengths: Sequence[int] | Any | None = None,
        headroom: float = 0.1,
    ) -> None:
        self._base = cfg or WorkbenchConfig()
        self.headroom = headroom
        # Bounded: a panel left open for a long session must not grow without limit.
        self.redraw_ms: deque[float] = deque(maxlen=100)
        self._callbacks: list[Callable[[WorkbenchConfig], None]] = []
        self._config: WorkbenchConfig = self._base
        self.error: str | None = None
        self.estimate: Any = None
        self.largest_batch: int | None = None
        self.plan: Any = None
        self.bucket_choice: Any = None
        """The 'auto' choice for the current settings (a `BucketChoice`), drawn as the trade-off."""
        self._suspended = False
        self.lengths, self._lengths_error = load_lengths(lengths, self._base)
        self._buckets = BucketPreview(self.lengths)
        self._build_controls(resolve_target(target))
        self._build_outputs()
        self._wire()
        self.refresh()

    # ---- controls and readouts ---------------------------------------------------
    def _build_controls(self, target: Target) -> None:
        style = {"description_width": "150px"}
        wide = ipw.Layout(width="420px")
        self.run_controls = run = RunControls(self._base, target, style=style, layout=wide)
        # The run's controls under the panel's own names: `panel.batch_size.value = 64` is a slider move.
        self.target_choice, self.model_size, self.batch_size = (
            run.target_choice,
            run.model_size,
            run.batch_size,
        )
        self.seq_len, self.grad_accum, self.optimizer = run.seq_len, run.grad_accum, run.optimizer
        self.precision, self.checkpointing, self.lora_rank = run.precision, run.checkpointing, run.lora_rank
        self.mesh, self.buckets = run.mesh, run.buckets
        self.memory_saving = MemorySavingControls(self._base, style=style, layout=wide)
        self.auto_buckets = AutoBucketControls(self._base.bucketing, style=style, layout=wide)

    def _build_outputs(self) -> None:
        self.estimate_html = ipw.HTML().add_class("wb-memory-estimate")
        self.fits_html = ipw.HTML().add_class("wb-fits")
        self.max_batch_html = ipw.HTML().add_class("wb-max-batch")
        self.trainable_html = ipw.HTML().add_class("wb-trainable")
        (
            self.quantize_html,
            self.loss_chunk_html,
            self.attention_html,
            self.rollout_html,
            self.long_context_html,
        ) = self.memory_saving.readouts
        self.buckets_html = ipw.HTML().add_class("wb-bucket-efficiency")
        self.tradeoff_html = ipw.HTML().add_class("wb-bucket-tradeoff")
        self.error_html = ipw.HTML().add_class("wb-error")
        self.yaml_html = ipw.HTML().add_class("wb-yaml")

        self.memory_figure = new_memory_figure()
        self.length_figure = new_length_figure(self.lengths)
        self.tradeoff_figure = new_tradeoff_figure()

    def _wire(self) -> None:
        for w in (
            self.model_size,
            self.batch_size,
            self.seq_len,
            self.grad_accum,
            self.optimizer,
            self.precision,
            self.checkpointing,
            self.lora_rank,
            *self.memory_saving.widgets,
            self.mesh,
            self.buckets,
            *self.auto_buckets.widgets,
        ):
            w.observe(self._on_change, names="value")
        self.target_choice.observe(self._on_target, names="value")

    def _on_target(self, change: dict[str, Any]) -> None:
        self._suspended = True  # the mesh options change with the device count: redraw once, after
        try:
            self.run_controls.set_mesh_options(change["new"].num_devices)
        finally:
            self._suspended = False
        self.refresh()

    def _on_change(self, _change: dict[str, Any]) -> None:
        if not self._suspended:
            self.refresh()

    def on_change(self, callback: Callable[[WorkbenchConfig], None]) -> None:
        """Call `callback(config)` after every change that yields a valid config."""
        self._callbacks.append(callback)

    # ---- state ---------------------------------------------------------------------
    @property
    def target(self) -> Target:
        return self.target_choice.value

    @property
    def config(self) -> WorkbenchConfig:
        """The config the controls describe (the last valid one if the current choice is invalid)."""
        return self._config

    @property
    def yaml(self) -> str:
        return self._config.to_yaml()

    def _compose(self) -> WorkbenchConfig:
        return self._base.with_overrides(
            {
                **self.run_controls.overrides(),
                **self.auto_buckets.overrides(self.buckets.value),
                **self.memory_saving.overrides(),
            }
        )

    def config_for(self, hw: HardwareInfo) -> WorkbenchConfig:
        """The config to train with on `hw`: the panel's, with the mesh re-planned for `hw`'s devices
        when the panel targeted other hardware (pure data parallel over all of them).

        Raises `ConfigError` with the panel's message while the controls describe an invalid
        config: `.config` then still holds the last valid one, which is not what the panel shows.
        """
        if self.error is not None:
            raise ConfigError(f"the panel's settings are not valid: {self.error}")
        cfg = self._config
        devices = training_devices(hw)
        if self.target.num_devices != devices:
            cfg = cfg.with_overrides(
                {"mesh.enabled": devices > 1, "mesh.data": -1, "mesh.fsdp": 1, "mesh.model": 1}
            )
        return cfg

    # ---- redraw --------------------------------------------------------------------
    def refresh(self) -> None:
        """Recompute the config, estimate, largest batch and bucket plan; redraw everything.

        Nothing is committed (`.config`, `.estimate`, ...) until the redraw has succeeded, so the
        readouts and `.config` never disagree. A failure of any kind (an invalid setting, a
        `pretrained_path` whose config cannot be read, ...) goes to the panel's error line instead
        of escaping the widget observer, where it would only reach a log.
        """
        start = time.perf_counter()
        try:
            cfg = self._compose()
            preview = preview_config(
                cfg,
                self.target,
                headroom=self.headroom,
                buckets=self._buckets,
                costs=self.auto_buckets.costs(),
            )
            self._draw(cfg, preview)
        except Exception as err:  # shown in the panel, never raised out of a widget observer
            # A ConfigError (or ValueError) message already says what to change; others need their type.
            self.error = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            self.error_html.value = error_readout(self.error)
            self.fits_html.value = fits_readout(None, unknown="fix the setting above")
            self.redraw_ms.append(1000 * (time.perf_counter() - start))
            return
        self.error = None
        self._config = cfg
        self.estimate, self.largest_batch = preview.estimate, preview.largest_batch
        self.plan, self.bucket_choice = preview.plan, preview.bucket_choice
        self.redraw_ms.append(1000 * (time.perf_counter() - start))
        for callback in self._callbacks:
            callback(cfg)

    def _draw(self, cfg: WorkbenchConfig, preview: ConfigPreview) -> None:
        est, plan, choice = preview.estimate, preview.plan, preview.bucket_choice
        limit = self.target.memory_per_device_bytes
        fits = None if limit is None else est.fits(limit, headroom=self.headroom)
        self.estimate_html.value = estimate_readout(est.total_bytes, limit, self.target.label)
        self.fits_html.value = fits_readout(fits)
        self.max_batch_html.value = largest_batch_readout(preview.largest_batch)
        self.trainable_html.value = trainable_readout(est)
        self.memory_saving.draw(est, cfg)
        self.error_html.value = error_readout(None)
        self.yaml_html.value = yaml_readout(cfg.to_yaml())
        draw_memory(self.memory_figure, est, limit, self.headroom)
        self.buckets_html.value = bucket_readout(plan, self._lengths_error)
        if plan is not None:
            draw_bucket_plan(self.length_figure, plan)
        auto = cfg.bucketing.max_buckets == "auto"
        self.buckets.disabled = auto  # 'auto' decides the count
        if choice is not None:
            draw_tradeoff(self.tradeoff_figure, choice, None if auto else cfg.bucketing.max_buckets)
            self.tradeoff_html.value = tradeoff_readout(
                choice, auto=auto, measured=self.auto_buckets.measure.value
            )

    # ---- layout --------------------------------------------------------------------
    @property
    def controls(self) -> ipw.Widget:
        return ipw.VBox(
            [
                self.target_choice,
                self.model_size,
                self.batch_size,
                self.seq_len,
                self.grad_accum,
                self.optimizer,
                self.precision,
                self.checkpointing,
                self.lora_rank,
                *self.memory_saving.widgets,
                self.mesh,
                self.buckets,
                *self.auto_buckets.widgets,
            ]
        )

    @property
    def widget(self) -> ipw.Widget:
        """The whole panel: controls, readouts, the two figures and the YAML."""
        if not hasattr(self, "_widget"):
            readouts = ipw.VBox(
                [
                    self.estimate_html,
                    self.fits_html,
                    self.max_batch_html,
                    self.trainable_html,
                    *self.memory_saving.readouts,
                    self.buckets_html,
                    self.tradeoff_html,
                    self.error_html,
                ]
            )
            self._widget = ipw.VBox(
                [
                    ipw.HBox([self.controls, readouts]),
                    self.memory_figure,
                    self.length_figure,
                    self.tradeoff_figure,
                    self.yaml_html,
                ]
            )
        return self._widget

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def set(self, **values: Any) -> ConfigPanel:
        """Set controls by name in Python (batch_size=16, seq_len=512, quantize="int8",
        loss_chunk_tokens="auto", buckets=6, buckets_auto=True, ...); returns self."""
        names = {
            "target": self.target_choice,
            "model_size": self.model_size,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "grad_accum": self.grad_accum,
            "optimizer": self.optimizer,
            "precision": self.precision,
            "gradient_checkpointing": self.checkpointing,
            "lora_rank": self.lora_rank,
            "quantize": self.memory_saving.quantize,
            "loss_chunk_tokens": self.memory_saving.loss_chunk,
            "attention": self.memory_saving.attention,
            "offload_activations": self.memory_saving.offload,
            "mlp_chunk_tokens": self.memory_saving.mlp_tiles,
            "mesh": self.mesh,
            "buckets": self.buckets,
            "buckets_auto": self.auto_buckets.auto,
            "measure_costs": self.auto_buckets.measure,
            "compile_seconds": self.auto_buckets.compile_seconds,
            "token_us": self.auto_buckets.token_us,
        }
        for key, value in values.items():
            if key not in names:
                raise ValueError(f"unknown control {key!r}; controls: {', '.join(names)}")
            names[key].value = self.run_controls.checked(key, value)
        return self


def measure_redraw(
    panel: ConfigPanel, changes: Iterable[dict[str, Any]], clock: Callable[[], float] = time.perf_counter
) -> list[float]:
    """Milliseconds each change took to redraw (set the value -> every readout updated), on `clock`:
    wall time by default; ``time.thread_time`` counts the redraw's own work, whatever else the machine
    is running."""
    out = []
    for change in changes:
        start = clock()
        panel.set(**change)
        out.append(1000 * (clock() - start))
    return out


__all__ = ["ConfigPanel", "measure_redraw"]
