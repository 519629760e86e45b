"""A live panel for tuning a `WorkbenchConfig` with its memory and bucketing consequences in view.

Controls: model size, batch size, sequence length, gradient accumulation, optimizer, precision,
gradient checkpointing, mesh axes (only the factorisations of the target's device count are
offered), bucket count, and the target hardware (the detected one or a named slice such as
v5e-8). Every change redraws, live:

- the per-device memory estimate (`workbench.memory.estimate`) as a stacked bar of its
  breakdown against the target's memory per device, with a fits / does-not-fit sign;
- the largest global batch that fits (`workbench.memory.max_batch_size`);
- the length histogram of the data with the planned bucket boundaries
  (`workbench.bucketing.plan_buckets`) and their padding efficiency;
- the resulting config object (`.config`) and its YAML (`.yaml`).

Redraws are cheap (the estimate is analytic, the bucket plan is cached per setting) and timed:
`.redraw_ms` holds the time of each of the last 100.

`config_for(hw)` is what to train with: the panel's config adapted to the machine at hand, or an
error when the controls describe an invalid config.
"""

from __future__ import annotations

import html
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_type_hints

import ipywidgets as ipw
import numpy as np
import plotly.graph_objects as go

from widgets.figures import sync_state
from workbench.analysis.batch import max_batch_size
from workbench.analysis.estimate import estimate as estimate_memory
from workbench.backend.hardware import CHIPS, HardwareInfo
from workbench.config import ConfigError, TrainConfig, WorkbenchConfig
from workbench.units import GiB, format_bytes


@dataclass(frozen=True)
class Target:
    """A hardware target: chip type and how many runtime devices the slice has."""

    name: str
    chip: str
    num_devices: int
    memory_per_device_bytes: int | None

    @property
    def label(self) -> str:
        mem = (
            "unknown"
            if self.memory_per_device_bytes is None
            else f"{self.memory_per_device_bytes / GiB:.0f} GiB"
        )
        return f"{self.name} ({self.num_devices} × {mem})"


def _named_target(name: str, chip: str, chips: int) -> Target:
    spec = CHIPS[chip]
    devices = chips * spec.devices_per_chip
    return Target(name, chip, devices, spec.hbm_bytes // spec.devices_per_chip)


# TPU slice names count TensorCores for v2-v4 (v4-8 = 4 megacore chips = 4 devices) and chips
# for v5e/v6e (v5e-8 = 8 chips). Colab's TPU runtime is one v5e chip, Kaggle's is a v5e-8.
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _named_target("v5e-1", "v5e", 1),
        _named_target("v5e-4", "v5e", 4),
        _named_target("v5e-8", "v5e", 8),
        _named_target("v6e-1", "v6e", 1),
        _named_target("v6e-8", "v6e", 8),
        _named_target("v4-8", "v4", 4),
        _named_target("T4", "t4", 1),
        _named_target("L4", "l4", 1),
        _named_target("A100-40GB", "a100-40gb", 1),
        _named_target("A100-80GB", "a100-80gb", 1),
        _named_target("H100", "h100", 1),
    )
}


# Model sizes offered besides the config's own model (shapes of well-known models). No vocabulary
# size: a model built from a config takes its vocabulary from the tokenizer the run uses
# (`Trainer` builds it with ``vocab_size=len(tokenizer)``), so the preset's own vocabulary would
# only make the logits estimate describe a model that never trains.
def _preset(
    family: str,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    mlp: int,
    positions: int,
    tie: bool,
) -> dict[str, Any]:
    return {
        "family": family,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "intermediate_size": mlp,
        "max_position_embeddings": positions,
        "tie_word_embeddings": tie,
    }


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "~125M (llama, 768×12)": _preset("llama", 768, 12, 12, 12, 3072, 4096, True),
    "~350M (llama, 1024×24)": _preset("llama", 1024, 24, 16, 16, 2816, 4096, True),
    "Qwen2.5-0.5B shape": _preset("qwen2", 896, 24, 14, 2, 4864, 32768, True),
    "Llama-3.2-1B shape": _preset("llama", 2048, 16, 32, 8, 8192, 8192, True),
    "Llama-3.2-3B shape": _preset("llama", 3072, 28, 24, 8, 8192, 8192, True),
    "Llama-2-7B shape": _preset("llama", 4096, 32, 32, 32, 11008, 4096, False),
}
OWN_MODEL = "as configured"

SEQ_LENS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
# One colour per breakdown part, stable when parts come and go (e.g. no optimizer state with SGD).
BREAKDOWN_COLORS = {
    "params": "#1f77b4",
    "grads": "#ff7f0e",
    "optimizer": "#2ca02c",
    "activations": "#d62728",
    "logits": "#9467bd",
    "inputs": "#8c564b",
    "gathered_params": "#e377c2",
    "param_casts": "#7f7f7f",
    "grad_accum_buffer": "#bcbd22",
}


def mesh_factorisations(num_devices: int) -> list[tuple[int, int, int]]:
    """Every (data, fsdp, model) with data * fsdp * model == num_devices, pure data parallel first."""
    if num_devices < 1:
        raise ValueError(f"num_devices={num_devices!r} is not allowed: must be >= 1")
    out = []
    for data in range(num_devices, 0, -1):
        if num_devices % data:
            continue
        rest = num_devices // data
        for fsdp in range(rest, 0, -1):
            if rest % fsdp == 0:
                out.append((data, fsdp, rest // fsdp))
    return out


def _mesh_label(axes: tuple[int, int, int]) -> str:
    data, fsdp, model = axes
    return f"data={data} × fsdp={fsdp} × model={model}"


def _literal_options(field: str) -> list[str]:
    return list(get_args(get_type_hints(TrainConfig)[field]))


def resolve_target(target: str | Target | HardwareInfo) -> Target:
    """A `Target` from a name in `TARGETS`, 'auto' (the detected hardware) or a `HardwareInfo`."""
    if isinstance(target, Target):
        return target
    if isinstance(target, HardwareInfo):
        return _target_from_hardware(target)
    if target == "auto":
        from workbench.backend.hardware import detect

        return _target_from_hardware(detect())
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is not allowed: expected 'auto' or one of {', '.join(TARGETS)}")
    return TARGETS[target]


def training_devices(hw: HardwareInfo) -> int:
    """How many devices a `Trainer` spreads a run over on `hw`.

    Only torch_xla SPMD applies a mesh: without XLA (CUDA, plain CPU) the trainer runs the
    whole batch on one device however many there are (a Kaggle T4 x2 trains on one T4).
    """
    return hw.num_devices if hw.via_xla else 1


def _target_from_hardware(hw: HardwareInfo) -> Target:
    devices = training_devices(hw)
    # Plain CPU has no device memory figure: the host's memory is what a CPU run can use.
    mem = hw.memory_per_device_bytes
    if mem is None and hw.backend == "cpu":
        mem = hw.host_memory_bytes // max(1, devices)
    name = f"detected {hw.chip}"
    if devices != hw.num_devices:
        name += f", 1 of {hw.num_devices} used (no XLA mesh)"
    return Target(name, hw.chip, devices, mem)


class ConfigPanel:
    """Tune a `WorkbenchConfig` with live memory and bucketing previews.

    Args:
        cfg: the starting config (defaults to `WorkbenchConfig()`).
        target: 'auto' (the detected hardware), a name in `TARGETS`, or a `HardwareInfo`.
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
            tooltip=f"fixed by model.pretrained_path={pretrained}" if pretrained else "",
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
        self.mesh = ipw.Dropdown(description="Mesh axes", style=style, layout=wide)
        self._set_mesh_options(target.num_devices, preferred=(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model))
        self.buckets = ipw.IntSlider(
            value=cfg.bucketing.max_buckets,
            min=1,
            max=max(16, cfg.bucketing.max_buckets),
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
        self.buckets_html = ipw.HTML().add_class("wb-bucket-efficiency")
        self.error_html = ipw.HTML().add_class("wb-error")
        self.yaml_html = ipw.HTML().add_class("wb-yaml")

        bars = go.Figure()
        bars.update_layout(
            barmode="stack",
            height=260,
            margin={"l": 60, "r": 20, "t": 40, "b": 30},
            title={"text": "Memory per device (GiB)", "x": 0.01},
            template="plotly_white",
            legend={"orientation": "h", "y": -0.15},
        )
        self.memory_figure = go.FigureWidget(bars)

        hist = go.Figure()
        hist.add_trace(go.Histogram(x=[], nbinsx=60, name="sequences", marker={"color": "#1f77b4"}))
        hist.update_layout(
            height=260,
            margin={"l": 60, "r": 20, "t": 40, "b": 40},
            title={"text": "Token lengths and bucket boundaries", "x": 0.01},
            xaxis_title="tokens",
            yaxis_title="sequences",
            template="plotly_white",
            showlegend=False,
        )
        self.length_figure = go.FigureWidget(hist)
        if self.lengths is not None:
            self.length_figure.data[0].x = self.lengths.tolist()

    def _wire(self) -> None:
        for w in (
            self.model_size,
            self.batch_size,
            self.seq_len,
            self.grad_accum,
            self.optimizer,
            self.precision,
            self.checkpointing,
            self.mesh,
            self.buckets,
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
            "data.max_length": self.seq_len.value,
            "bucketing.max_buckets": self.buckets.value,
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
            optimizer=cfg.train.optimizer,
            precision=cfg.train.precision,
            gradient_checkpointing=cfg.train.gradient_checkpointing,
            mesh=dict(zip(("data", "fsdp", "model"), self.mesh.value)),
            grad_accum=cfg.train.grad_accum,
        )

    def _bucket_plan(self, cfg: WorkbenchConfig) -> Any:
        if self.lengths is None:
            return None
        from workbench.data.buckets import STRATEGIES, plan_buckets

        b = cfg.bucketing
        # "none" (pad each batch to its longest) and packing have no boundaries to preview:
        # show what the planned buckets would be. (So not `plan_for_config`, which
        # returns None for those.)
        strategy = b.strategy if b.strategy in STRATEGIES else "optimal"
        key = (b.max_buckets, b.multiple_of, cfg.data.max_length, strategy)
        if key not in self._plan_cache:
            self._plan_cache[key] = plan_buckets(
                self.lengths,
                b.max_buckets,
                multiple_of=b.multiple_of,
                max_length=cfg.data.max_length,
                strategy=strategy,
            )
        return self._plan_cache[key]

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
            # ValueError: e.g. a batch that does not split over the mesh's data-parallel axes.
            estimate = estimate_memory(
                cfg.model, batch_size=cfg.train.batch_size, seq_len=cfg.data.max_length, **kwargs
            )
            limit = self.target.memory_per_device_bytes
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
            plan = self._bucket_plan(cfg)
            self._draw(cfg, limit, estimate, largest, plan)
        except Exception as err:  # shown in the panel, never raised out of a widget observer
            # A ConfigError (or ValueError) message already says what to change; others need their type.
            self.error = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            self.error_html.value = f"<span style='color:#d62728'>⚠ {html.escape(self.error)}</span>"
            self.fits_html.value = "<span style='color:#7f7f7f'>? fix the setting above</span>"
            self.redraw_ms.append(1000 * (time.perf_counter() - start))
            return
        self.error = None
        self._config = cfg
        self.estimate, self.largest_batch, self.plan = estimate, largest, plan
        self.redraw_ms.append(1000 * (time.perf_counter() - start))
        for callback in self._callbacks:
            callback(cfg)

    def _draw(
        self, cfg: WorkbenchConfig, limit: int | None, est: Any, largest: int | None, plan: Any
    ) -> None:
        total = est.total_bytes
        fits = None if limit is None else est.fits(limit, headroom=self.headroom)
        where = self.target.label
        self.estimate_html.value = (
            f"Estimated <b class='wb-estimate-value'>{format_bytes(total)}</b> per device"
            + (f" of {limit / GiB:.1f} GiB on {html.escape(where)}" if limit else f" on {html.escape(where)}")
        )
        if fits is None:
            self.fits_html.value = "<span style='color:#7f7f7f'>? device memory unknown</span>"
        elif fits:
            self.fits_html.value = "<span style='color:#2ca02c;font-weight:600'>✔ fits</span>"
        else:
            self.fits_html.value = "<span style='color:#d62728;font-weight:600'>✘ does not fit</span>"
        if largest is None:
            self.max_batch_html.value = "Largest batch: unknown (no memory figure)"
        elif largest == 0:
            self.max_batch_html.value = "Largest batch that fits: <b>none</b> (even batch 1 is too big)"
        else:
            self.max_batch_html.value = f"Largest batch that fits: <b>{largest}</b> (global)"
        self.error_html.value = ""
        self.yaml_html.value = (
            f"<pre style='font-size:11px;line-height:1.2'>{html.escape(cfg.to_yaml())}</pre>"
        )

        names = [k for k, v in est.breakdown.items() if v]
        with self.memory_figure.batch_update():
            fig = self.memory_figure
            # Reuse traces where possible: one bar per breakdown component.
            if [t.name for t in fig.data] != names:
                fig.data = []
                for name in names:
                    fig.add_bar(
                        y=["estimate"],
                        x=[0.0],
                        name=name,
                        orientation="h",
                        marker={"color": BREAKDOWN_COLORS.get(name, "#17becf")},
                    )
            for trace, name in zip(fig.data, names):
                trace.x = [est.breakdown[name] / GiB]
            shapes = []
            if limit:
                shapes = [
                    dict(type="line", x0=limit / GiB, x1=limit / GiB, yref="paper", y0=0, y1=1,
                         line={"color": "#d62728", "width": 2}),
                    dict(type="line", x0=limit * (1 - self.headroom) / GiB, x1=limit * (1 - self.headroom) / GiB,
                         yref="paper", y0=0, y1=1, line={"color": "#d62728", "width": 1, "dash": "dot"}),
                ]  # fmt: skip
            fig.layout.shapes = shapes
            top = max(total, limit or 0) / GiB * 1.08
            fig.layout.xaxis.range = [0, top]
            fig.layout.title.text = f"Memory per device: {format_bytes(total)}" + (
                f" of {limit / GiB:.1f} GiB" if limit else ""
            )

        # The figures live inside a VBox: keep their synced state current for pages that attach late.
        sync_state(self.memory_figure)
        if plan is None:
            self.buckets_html.value = html.escape(self._lengths_error or "")
            return
        self.buckets_html.value = (
            f"Buckets <b>{', '.join(map(str, plan.boundaries))}</b> · padding efficiency "
            f"<b class='wb-efficiency-value'>{100 * plan.efficiency:.1f}%</b> · {plan.num_shapes} compiled shapes"
        )
        with self.length_figure.batch_update():
            self.length_figure.layout.shapes = [
                dict(
                    type="line",
                    x0=b,
                    x1=b,
                    yref="paper",
                    y0=0,
                    y1=1,
                    line={"color": "#d62728", "dash": "dash"},
                )
                for b in plan.boundaries
            ]
            self.length_figure.layout.title.text = (
                f"Token lengths · {len(plan.boundaries)} buckets · efficiency {100 * plan.efficiency:.1f}%"
            )
        sync_state(self.length_figure)

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
                self.mesh,
                self.buckets,
            ]
        )

    @property
    def widget(self) -> ipw.Widget:
        """The whole panel: controls, readouts, the two figures and the YAML."""
        if not hasattr(self, "_widget"):
            readouts = ipw.VBox(
                [self.estimate_html, self.fits_html, self.max_batch_html, self.buckets_html, self.error_html]
            )
            yaml_box = ipw.Accordion(children=[self.yaml_html], titles=("Config YAML",))
            self._widget = ipw.VBox(
                [
                    ipw.HBox([self.controls, readouts]),
                    self.memory_figure,
                    self.length_figure,
                    yaml_box,
                ]
            )
        return self._widget

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def set(self, **values: Any) -> ConfigPanel:
        """Set controls by name in Python (batch_size=16, seq_len=512, buckets=6, ...); returns self."""
        names = {
            "target": self.target_choice,
            "model_size": self.model_size,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "grad_accum": self.grad_accum,
            "optimizer": self.optimizer,
            "precision": self.precision,
            "gradient_checkpointing": self.checkpointing,
            "mesh": self.mesh,
            "buckets": self.buckets,
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


def measure_redraw(panel: ConfigPanel, changes: Iterable[dict[str, Any]]) -> list[float]:
    """Milliseconds each change took to redraw (set the value -> every readout updated)."""
    out = []
    for change in changes:
        start = time.perf_counter()
        panel.set(**change)
        out.append(1000 * (time.perf_counter() - start))
    return out


__all__ = [
    "MODEL_PRESETS",
    "TARGETS",
    "ConfigPanel",
    "Target",
    "measure_redraw",
    "mesh_factorisations",
    "training_devices",
]
