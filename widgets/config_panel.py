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

This module holds the controls, their wiring and the panel's state; the figures and readouts
are drawn by `widgets.config_figures`. The hardware targets come from
`workbench.backend.targets`, the model sizes from `workbench.models.presets`.

Redraws are cheap (the estimate is analytic, the bucket plan is cached per setting) and timed:
`.redraw_ms` holds the time of each of the last 100.

`config_for(hw)` is what to train with: the panel's config adapted to the machine at hand, or an
error when the controls describe an invalid config.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, get_args, get_type_hints

import ipywidgets as ipw
import numpy as np

from widgets.bucket_tradeoff import AutoBucketControls, draw_tradeoff, new_tradeoff_figure, tradeoff_readout
from widgets.config_controls import TOOLTIP, MemorySavingControls
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
from workbench.analysis.batch import max_batch_size
from workbench.analysis.estimate import config_settings, estimate_attention
from workbench.analysis.estimate import estimate as estimate_memory
from workbench.backend.hardware import HardwareInfo
from workbench.backend.targets import TARGETS, Target, mesh_factorisations, resolve_target, training_devices
from workbench.config import ConfigError, TrainConfig, WorkbenchConfig
from workbench.models.presets import MODEL_PRESETS

# The model-size choice that keeps the config's own model (the others are `MODEL_PRESETS`).
OWN_MODEL = "as configured"

SEQ_LENS = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
LORA_RANKS = [0, 4, 8, 16, 32, 64, 128]
"""The LoRA ranks offered (0: off, full fine-tuning), plus the config's own."""


def _mesh_label(axes: tuple[int, int, int]) -> str:
    data, fsdp, model = axes
    return f"data={data} × fsdp={fsdp} × model={model}"


def _literal_options(field: str) -> list[str]:
    return list(get_args(get_type_hints(TrainConfig)[field]))


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
        self._plan_cache: dict[tuple[Any, ...], Any] = {}
        self._config: WorkbenchConfig = self._base
        self.error: str | None = None
        self.estimate: Any = None
        self.largest_batch: int | None = None
        self.plan: Any = None
        self.bucket_choice: Any = None
        """The 'auto' choice for the current settings (a `BucketChoice`), drawn as the trade-off."""
        self._suspended = False
        self.lengths = self._load_lengths(lengths)
        self._build_controls(resolve_target(target))
        self._build_outputs()
        self._wire()
        self.refresh()

    # ---- inputs --------------------------------------------------------------------
    def _load_lengths(self, lengths: Any) -> np.ndarray | None:
        if lengths is None:
            try:
                from workbench import data

                train_ds, _, _ = data.build_datasets(self._base)
                lengths = train_ds["length"]
            except Exception as err:  # the preview is optional: say why it is missing
                self._lengths_error = f"no length sample ({type(err).__name__}: {err})"
                return None
        elif hasattr(lengths, "column_names"):
            lengths = lengths["length"]
        arr = np.asarray(list(lengths), dtype=np.int64)
        if arr.ndim != 1 or arr.size == 0 or (arr < 1).any():
            raise ValueError("lengths must be a non-empty sequence of positive token counts")
        self._lengths_error = None
        return arr

    def _build_controls(self, target: Target) -> None:
        cfg = self._base
        style = {"description_width": "150px"}
        wide = ipw.Layout(width="420px")
        self.target_choice = ipw.Dropdown(
            options=[(target.label, target), *((t.label, t) for t in TARGETS.values() if t != target)],
            value=target,
            description="Target",
            style=style,
            layout=wide,
        )
        pretrained = cfg.model.pretrained_path
        self.model_size = ipw.Dropdown(
            options=[OWN_MODEL, *MODEL_PRESETS],
            value=OWN_MODEL,
            description="Model size",
            style=style,
            layout=wide,
            # A checkpoint's own config decides its shape: a preset would change the YAML, not the run.
            disabled=bool(pretrained),
            **{TOOLTIP: f"fixed by model.pretrained_path={pretrained}" if pretrained else ""},
        )
        self.batch_size = ipw.IntSlider(
            value=cfg.train.batch_size,
            min=1,
            max=max(256, cfg.train.batch_size),
            description="Batch size (global)",
            style=style,
            layout=wide,
            continuous_update=False,
        )
        seq_options = sorted({*SEQ_LENS, cfg.data.max_length})
        self.seq_len = ipw.SelectionSlider(
            options=seq_options,
            value=cfg.data.max_length,
            description="Sequence length",
            style=style,
            layout=wide,
            continuous_update=False,
        )
        self.grad_accum = ipw.IntSlider(
            value=cfg.train.grad_accum,
            min=1,
            max=max(64, cfg.train.grad_accum),
            description="Grad accumulation",
            style=style,
            layout=wide,
            continuous_update=False,
        )
        self.optimizer = ipw.Dropdown(
            options=_literal_options("optimizer"),
            value=cfg.train.optimizer,
            description="Optimizer",
            style=style,
            layout=wide,
        )
        self.precision = ipw.Dropdown(
            options=_literal_options("precision"),
            value=cfg.train.precision,
            description="Precision",
            style=style,
            layout=wide,
        )
        self.checkpointing = ipw.Checkbox(
            value=cfg.train.gradient_checkpointing, description="Gradient checkpointing", indent=False
        )
        self.lora_rank = ipw.Dropdown(
            options=[
                (f"{r} (off: full fine-tuning)" if r == 0 else str(r), r)
                for r in sorted({*LORA_RANKS, cfg.lora.rank})
            ],
            value=cfg.lora.rank,
            description="LoRA rank",
            style=style,
            layout=wide,
        )
        self.memory_saving = MemorySavingControls(cfg, style=style, layout=wide)
        self.mesh = ipw.Dropdown(description="Mesh axes", style=style, layout=wide)
        self._set_mesh_options(target.num_devices, preferred=(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model))
        fixed = cfg.bucketing.max_buckets if cfg.bucketing.max_buckets != "auto" else 4
        self.auto_buckets = AutoBucketControls(cfg.bucketing, style=style, layout=wide)
        self.buckets = ipw.IntSlider(
            value=fixed,
            min=1,
            max=max(16, fixed),
            description="Buckets",
            style=style,
            layout=wide,
            continuous_update=False,
        )
        for w, name in (
            (self.batch_size, "wb-batch-size"),
            (self.seq_len, "wb-seq-len"),
            (self.buckets, "wb-buckets"),
            (self.mesh, "wb-mesh"),
            (self.target_choice, "wb-target"),
            (self.lora_rank, "wb-lora-rank"),
        ):
            w.add_class(name)

    def _set_mesh_options(self, num_devices: int, preferred: tuple[int, int, int] | None = None) -> None:
        options = mesh_factorisations(num_devices)
        current = (
            preferred if preferred in options else self.mesh.value if self.mesh.value in options else None
        )
        self.mesh.options = [(_mesh_label(axes), axes) for axes in options]
        self.mesh.value = current or options[0]

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
            self._set_mesh_options(change["new"].num_devices)
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
        data, fsdp, model = self.mesh.value
        overrides: dict[str, Any] = {
            "train.batch_size": self.batch_size.value,
            "train.grad_accum": self.grad_accum.value,
            "train.optimizer": self.optimizer.value,
            "train.precision": self.precision.value,
            "train.gradient_checkpointing": self.checkpointing.value,
            "lora.rank": self.lora_rank.value,
            "data.max_length": self.seq_len.value,
            **self.auto_buckets.overrides(self.buckets.value),
            **self.memory_saving.overrides(),
            "mesh.data": data,
            "mesh.fsdp": fsdp,
            "mesh.model": model,
            "mesh.enabled": self.target.num_devices > 1,
        }
        if self.model_size.value != OWN_MODEL:
            for key, value in MODEL_PRESETS[self.model_size.value].items():
                overrides[f"model.{key}"] = value
        if (
            self.seq_len.value > self._base.model.max_position_embeddings
            and self.model_size.value == OWN_MODEL
        ):
            overrides["model.max_position_embeddings"] = self.seq_len.value
        return self._base.with_overrides(overrides)

    def _estimate_kwargs(self, cfg: WorkbenchConfig) -> dict[str, Any]:
        return dict(
            config_settings(cfg),
            mesh=dict(zip(("data", "fsdp", "model"), self.mesh.value)),
            attention=estimate_attention(
                cfg.model.attention, self.target, seq_len=cfg.data.max_length, model_config=cfg.model
            ),
        )

    def _bucket_plan(self, cfg: WorkbenchConfig) -> tuple[Any, Any]:
        """The plan to preview and the 'auto' choice (a `BucketChoice`, drawn whatever the count)."""
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
        compile_s, token_s = self.auto_buckets.costs()
        epochs = training_epochs(self.lengths, cfg)
        auto_key = ("auto", b.multiple_of, cfg.data.max_length, compile_s, token_s, epochs)
        if auto_key not in self._plan_cache:
            self._plan_cache[auto_key] = choose_buckets(
                self.lengths,
                compile_seconds=compile_s,
                seconds_per_padded_token=token_s,
                epochs=epochs,
                multiple_of=b.multiple_of,
                max_length=cfg.data.max_length,
            )
        chosen = self._plan_cache[auto_key]
        if b.max_buckets == "auto":
            return chosen, chosen.choice
        key = (b.max_buckets, b.multiple_of, cfg.data.max_length, strategy)
        if key not in self._plan_cache:
            self._plan_cache[key] = plan_buckets(
                self.lengths,
                b.max_buckets,
                multiple_of=b.multiple_of,
                max_length=cfg.data.max_length,
                strategy=strategy,
            )
        return self._plan_cache[key], chosen.choice

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
            kwargs = self._estimate_kwargs(cfg)
            limit = self.target.memory_per_device_bytes
            # ValueError: e.g. a batch that does not split over the mesh's data-parallel axes.
            # The target's memory plans the 'auto' loss chunks (max_batch_size passes it too).
            estimate = estimate_memory(
                cfg.model,
                batch_size=cfg.train.batch_size,
                seq_len=cfg.data.max_length,
                memory_bytes=limit,
                **kwargs,
            )
            largest = (
                None
                if limit is None
                else max_batch_size(
                    cfg.model,
                    seq_len=cfg.data.max_length,
                    memory_bytes=limit,
                    headroom=self.headroom,
                    multiple_of=self.mesh.value[0] * self.mesh.value[1],
                    **kwargs,
                )
            )
            plan, choice = self._bucket_plan(cfg)
            self._draw(cfg, limit, estimate, largest, plan, choice)
        except Exception as err:  # shown in the panel, never raised out of a widget observer
            # A ConfigError (or ValueError) message already says what to change; others need their type.
            self.error = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            self.error_html.value = error_readout(self.error)
            self.fits_html.value = fits_readout(None, unknown="fix the setting above")
            self.redraw_ms.append(1000 * (time.perf_counter() - start))
            return
        self.error = None
        self._config = cfg
        self.estimate, self.largest_batch, self.plan, self.bucket_choice = estimate, largest, plan, choice
        self.redraw_ms.append(1000 * (time.perf_counter() - start))
        for callback in self._callbacks:
            callback(cfg)

    def _draw(
        self, cfg: WorkbenchConfig, limit: int | None, est: Any, largest: int | None, plan: Any, choice: Any
    ) -> None:
        fits = None if limit is None else est.fits(limit, headroom=self.headroom)
        self.estimate_html.value = estimate_readout(est.total_bytes, limit, self.target.label)
        self.fits_html.value = fits_readout(fits)
        self.max_batch_html.value = largest_batch_readout(largest)
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
            if key == "target":
                value = resolve_target(value)
            if key == "model_size" and self.model_size.disabled and value != OWN_MODEL:
                raise ValueError(
                    f"model_size={value!r} is not allowed: the shape comes from "
                    f"model.pretrained_path={self._base.model.pretrained_path!r}"
                )
            if key == "mesh":
                value = tuple(value)
                allowed = [v for _, v in self.mesh.options]
                if value not in allowed:
                    raise ValueError(
                        f"mesh={value!r} is not allowed on {self.target.num_devices} devices: "
                        f"expected one of {allowed}"
                    )
            names[key].value = value
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


__all__ = ["LORA_RANKS", "OWN_MODEL", "SEQ_LENS", "ConfigPanel", "measure_redraw"]
