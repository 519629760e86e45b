"""What the config panel shows: its two figures and its text readouts, drawn from an estimate and a plan.

Drawing only, no controls and no computing: `ConfigPanel` (widgets.config_panel) composes the
config, `widgets.config_preview` computes the memory estimate, the largest batch and the bucket
plan; the functions here turn those into

- the per-device memory bar: one stacked segment per breakdown part, against the device's memory
  (the limit) and the headroom kept free; zoomed to the estimate, with an arrow to the limit,
  while the estimate is far below it, so a small model stays readable on a big chip
  (`new_memory_figure`, `draw_memory`, `memory_axis_top`);
- the token-length histogram with the planned bucket boundaries (`new_length_figure`,
  `draw_bucket_plan`);
- the HTML of the readouts: estimate, fits sign, largest batch, trainable parameters (all, or
  the LoRA adapters), what a quantized base and a chunked loss save, bucket efficiency, error,
  YAML (the ``*_readout`` functions).

The figures are `widgets.live_plot.FigureView`s (a `go.Figure` held in Python, sent whole on
each redraw, so every page draws the latest one whatever its load timing); the draw functions
edit the figure in one batched update, then send it (`widgets.figures`), and draw a plain
`go.Figure` just as well.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from widgets.figures import Drawable, figure_of, publish
from widgets.live_plot import FigureView
from workbench.units import GiB, KiB, MiB, format_bytes

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
    "dequant": "#17becf",
    "reference": "#aec7e8",
    "rollout": "#98df8a",
    "old_logps": "#ffbb78",
}


# ---- figures -----------------------------------------------------------------------
def new_memory_figure() -> FigureView:
    """An empty stacked bar for the memory per device (filled by `draw_memory`)."""
    bars = go.Figure()
    bars.update_layout(
        barmode="stack",
        height=260,
        margin={"l": 60, "r": 20, "t": 40, "b": 30},
        title={"text": "Memory per device (GiB)", "x": 0.01},
        template="plotly_white",
        legend={"orientation": "h", "y": -0.15},
    )
    return FigureView(bars, name="memory per device")


def new_length_figure(lengths: np.ndarray | None) -> FigureView:
    """The histogram of `lengths` (empty when None); `draw_bucket_plan` marks the boundaries.

    Binned here (60 bins) rather than by plotly: each redraw re-sends the whole figure, and 60
    bars stay small where a dataset's raw lengths would not."""
    hist = go.Figure()
    hist.add_trace(go.Bar(x=[], y=[], name="sequences", marker={"color": "#1f77b4"}))
    hist.update_layout(
        height=260,
        margin={"l": 60, "r": 20, "t": 40, "b": 40},
        title={"text": "Token lengths and bucket boundaries", "x": 0.01},
        xaxis_title="tokens",
        yaxis_title="sequences",
        template="plotly_white",
        showlegend=False,
    )
    if lengths is not None and len(lengths):
        counts, edges = np.histogram(np.asarray(lengths), bins=60)
        hist.data[0].update(
            x=((edges[:-1] + edges[1:]) / 2).tolist(), y=counts.tolist(), width=float(edges[1] - edges[0])
        )
        hist.update_layout(bargap=0)
    return FigureView(hist, name="token lengths")


def draw_memory(target: Drawable, est: Any, limit: int | None, headroom: float) -> None:
    """Draw the estimate's breakdown (a `MemoryEstimate`) against `limit` bytes per device.

    The scale keeps the estimate readable at any size: the estimate always spans at least
    ``ZOOM_FILL / FULL_MARGIN`` (74%) of the axis, so its segments are never slivers.

    - Far from the limit (the estimate under ``ZOOM_FILL`` of it), the axis is zoomed: it ends at
      ``estimate / ZOOM_FILL`` and the limit, beyond it, is marked by an arrow annotation at the
      right edge, "axis zoomed · limit 16.00 GiB →"; the usable memory (``limit`` less
      `headroom`, dotted line) is drawn when it falls inside the axis. A 100 MiB model on a
      16 GiB chip fills 80% of the axis instead of 0.6%.
    - Near or over the limit, the axis is the full scale, 0 to ``FULL_MARGIN`` times the larger
      of estimate and limit: the limit is a solid line labelled with its size, the usable memory
      a dotted line, the memory beyond the limit shaded red, and an estimate over the limit says
      by how much ("✘ 4.00 GiB over").

    A linear axis either way: on a log axis stacked segments would not be to scale. Ticks are
    labelled in the unit that suits the axis (KiB, MiB or GiB); hovering a segment shows its size.
    The limit's shapes and annotation are named "limit" (the usable line "usable", the shaded
    zone "over the limit"). With no `limit` (memory unknown) the axis fits the estimate.
    """
    fig = figure_of(target)
    total = est.total_bytes
    host = est.host_parts() if hasattr(est, "host_parts") else []  # host memory: not the device's bar
    names = [k for k, v in est.breakdown.items() if v and k not in host]
    with fig.batch_update():
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
            trace.hovertemplate = f"{name}: {format_bytes(est.breakdown[name])}<extra></extra>"
        top, zoomed = memory_axis_top(total, limit)
        shapes, annotations = _limit_marks(total, limit, headroom, top, zoomed)
        fig.layout.shapes = shapes
        fig.layout.annotations = annotations
        tickvals, ticktext = _byte_ticks(top)
        fig.layout.xaxis.update(range=[0, top / GiB], tickvals=tickvals, ticktext=ticktext)
        fig.layout.title.text = f"Memory per device: {format_bytes(total)}" + (
            f" of {limit / GiB:.1f} GiB" if limit else ""
        )
    publish(target)


# The memory bar's scale (see `draw_memory`): a zoomed axis ends where the estimate fills
# ZOOM_FILL of it; a full-scale axis runs FULL_MARGIN past the larger of estimate and limit.
ZOOM_FILL = 0.8
FULL_MARGIN = 1.08
_LIMIT_COLOR = "#d62728"


def memory_axis_top(total: int, limit: int | None) -> tuple[float, bool]:
    """The memory bar's axis end in bytes, and whether the axis is zoomed to the estimate (the
    limit lies beyond it): zoomed while `total` is under `ZOOM_FILL` of `limit`."""
    if not limit:
        return (total * FULL_MARGIN if total else GiB), False
    if 0 < total < ZOOM_FILL * limit:
        return total / ZOOM_FILL, True
    return max(total, limit) * FULL_MARGIN, False


def _limit_marks(
    total: int, limit: int | None, headroom: float, top: float, zoomed: bool
) -> tuple[list[dict], list[dict]]:
    """The shapes and annotations that mark `limit` on an axis ending at `top` bytes."""
    if not limit:
        return [], []
    label = {"font": {"color": _LIMIT_COLOR, "size": 12}, "showarrow": False, "yref": "paper", "y": 1,
             "yanchor": "bottom", "name": "limit"}  # fmt: skip
    usable = limit * (1 - headroom)
    usable_line = dict(type="line", name="usable", x0=usable / GiB, x1=usable / GiB, yref="paper", y0=0,
                       y1=1, line={"color": _LIMIT_COLOR, "width": 1, "dash": "dot"})  # fmt: skip
    if zoomed:
        arrow = dict(
            label, xref="paper", x=1, xanchor="right", text=f"axis zoomed · limit {format_bytes(limit)} →"
        )
        return ([usable_line] if usable < top else []), [arrow]
    over = total - limit
    shapes = [
        dict(type="rect", name="over the limit", x0=limit / GiB, x1=top / GiB, yref="paper", y0=0, y1=1,
             fillcolor=_LIMIT_COLOR, opacity=0.1, line={"width": 0}, layer="below"),
        dict(type="line", name="limit", x0=limit / GiB, x1=limit / GiB, yref="paper", y0=0, y1=1,
             line={"color": _LIMIT_COLOR, "width": 2}),
    ]  # fmt: skip
    if headroom > 0:
        shapes.append(usable_line)
    text = f"limit {format_bytes(limit)}" + (f" · ✘ {format_bytes(over)} over" if over > 0 else "")
    return shapes, [dict(label, xref="x", x=limit / GiB, xanchor="right", text=text)]


def _byte_ticks(top: float) -> tuple[list[float], list[str]]:
    """About five round ticks from 0 to `top` bytes: positions in GiB (the bar's data unit) and
    labels in the largest unit below `top` ("0", "20 MiB", "40 MiB", ...)."""
    unit_name, unit = next(
        ((n, s) for n, s in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)) if top >= s), ("B", 1)
    )
    span = top / unit
    magnitude = 10 ** math.floor(math.log10(span / 5)) if span > 0 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= span / 5)
    values = [round(k * step, 9) for k in range(int(span / step) + 1)]
    return [v * unit / GiB for v in values], [f"{v:g} {unit_name}" if v else "0" for v in values]


def draw_bucket_plan(target: Drawable, plan: Any) -> None:
    """Mark a `BucketPlan`'s boundaries on the length histogram and title it with its efficiency."""
    fig = figure_of(target)
    with fig.batch_update():
        fig.layout.shapes = [
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
        fig.layout.title.text = (
            f"Token lengths · {len(plan.boundaries)} buckets · efficiency {100 * plan.efficiency:.1f}%"
        )
    publish(target)


# ---- readouts (HTML) ---------------------------------------------------------------
def estimate_readout(total: int, limit: int | None, where: str) -> str:
    """'Estimated X per device of Y GiB on <target>'."""
    return f"Estimated <b class='wb-estimate-value'>{format_bytes(total)}</b> per device" + (
        f" of {limit / GiB:.1f} GiB on {html.escape(where)}" if limit else f" on {html.escape(where)}"
    )


def fits_readout(fits: bool | None, *, unknown: str = "device memory unknown") -> str:
    """The fits / does-not-fit sign; `unknown` says why there is none when `fits` is None."""
    if fits is None:
        return f"<span style='color:#7f7f7f'>? {html.escape(unknown)}</span>"
    if fits:
        return "<span style='color:#2ca02c;font-weight:600'>✔ fits</span>"
    return "<span style='color:#d62728;font-weight:600'>✘ does not fit</span>"


def largest_batch_readout(largest: int | None) -> str:
    """The largest global batch that fits (None: the target has no memory figure)."""
    if largest is None:
        return "Largest batch: unknown (no memory figure)"
    if largest == 0:
        return "Largest batch that fits: <b>none</b> (even batch 1 is too big)"
    return f"Largest batch that fits: <b>{largest}</b> (global)"


def trainable_readout(est: Any) -> str:
    """What trains: every parameter, or (LoRA) the adapters and their share of the model."""
    total = est.num_parameters
    if not est.lora_rank:
        return f"Full fine-tuning: <b>{_count(total)}</b> parameters train"
    share = 100 * est.trainable_parameters / max(total, 1)
    return (
        f"LoRA rank {est.lora_rank}: <b class='wb-trainable-value'>{_count(est.trainable_parameters)}</b> "
        f"adapter parameters train ({share:.2f}% of {_count(total)}); the base is frozen"
    )


def quantize_readout(est: Any) -> str:
    """The model's weights per device as held, and what a quantized base saves against the
    training precision ("int8 base: 14.96 GiB → 7.98 GiB of weights per device")."""
    held, plain = est.base_weight_bytes, est.unquantized_weight_bytes
    if est.quantize == "none":
        hint = " · an int8/int4 base would hold less (LoRA only)" if est.lora_rank else ""
        return f"Base weights: <b>{format_bytes(plain)}</b> per device in {html.escape(est.precision)}{hint}"
    return (
        f"<b>{html.escape(est.quantize)}</b> base: {format_bytes(plain)} → "
        f"<b class='wb-quantized-value'>{format_bytes(held)}</b> of weights per device "
        f"(saves {format_bytes(plain - held)})"
    )


def loss_chunk_readout(est: Any, setting: int | str) -> str:
    """How the loss runs: the whole batch's logits at once, or one chunk of positions at a time
    and the logits memory that saves."""
    logits = est.breakdown["logits"]
    chunk = est.loss_chunk_positions
    if chunk is None:
        why = " ('auto': small enough not to chunk)" if setting == "auto" else ""
        return f"Loss over the whole batch: logits <b>{format_bytes(logits)}</b>{why}"
    whole = logits * est.seq_len / chunk
    rows = est.per_device_batch
    return (
        f"Loss in chunks of <b>{chunk}</b> positions × {rows} row{'s' if rows != 1 else ''}: logits "
        f"<b class='wb-logits-value'>{format_bytes(logits)}</b> instead of {format_bytes(whole)}"
    )


def long_context_readout(est: Any) -> str:
    """The layers' checkpoints in host memory and the MLP's tiles, where either is on (else nothing)."""
    parts = []
    if getattr(est, "offload_activations", False):
        parts.append(
            f"Checkpoints in host memory: <b class='wb-host-value'>{format_bytes(est.host_bytes)}</b> per "
            "device (each layer's input, brought back for its backward pass)"
        )
    if getattr(est, "mlp_chunk_positions", None):
        parts.append(
            f"MLP in tiles of <b>{est.mlp_chunk_positions}</b> positions, each recomputed in the backward pass"
        )
    return "<br>".join(parts)


def attention_readout(est: Any, eager_scores_bytes: int, setting: str) -> str:
    """The attention kernel the step runs and what its scores hold against eager's, which saves
    every layer's ``T x T`` scores (`eager_scores_bytes`)."""
    kernel = html.escape(est.attention)
    why = " (auto)" if setting == "auto" else ""
    if est.attention == "eager":
        return f"Attention <b>eager</b>{why}: scores <b>{format_bytes(est.scores_bytes)}</b> saved for the backward pass"
    held = (
        f"one query block's scores, <b class='wb-scores-value'>{format_bytes(est.scores_bytes)}</b>,"
        if est.scores_bytes
        else "no scores"
    )
    return f"Attention <b>{kernel}</b>{why}: {held} instead of {format_bytes(eager_scores_bytes)} (eager)"


def rollout_readout(est: Any) -> str:
    """A GRPO step (``train.objective: grpo``): its rows of prompt + completion per device, and the
    rollout's KV cache against the training step's activations and logits (the peak holds the larger);
    empty for any other objective."""
    grpo = est.objective_report
    if grpo is None:
        return ""
    prompts = est.per_device_batch
    rows = (
        f"GRPO: {prompts} prompt{'s' if prompts != 1 else ''} × {grpo.rows // max(prompts, 1)} completions = "
        f"<b class='wb-rollout-rows'>{grpo.rows}</b> rows of {est.seq_len} tokens per device "
        f"(prompt {grpo.prompt_length} + completion {grpo.completion_positions})"
    )
    held = f"{format_bytes(grpo.kv_cache_bytes)} + sampler {format_bytes(grpo.sampler_bytes)}"
    if grpo.excess_bytes:
        where = f"adds <b>{format_bytes(grpo.excess_bytes)}</b> over the step's activations and logits"
    else:
        where = f"within the step's {format_bytes(grpo.training_transient_bytes)} of activations and logits"
    return f"{rows}; rollout KV cache <b class='wb-kv-cache'>{held}</b>, {where}"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def bucket_readout(plan: Any, missing: str | None = None) -> str:
    """The plan's boundaries, padding efficiency and shape count; `missing` says why there is no plan."""
    if plan is None:
        return html.escape(missing or "")
    return (
        f"Buckets <b>{', '.join(map(str, plan.boundaries))}</b> · padding efficiency "
        f"<b class='wb-efficiency-value'>{100 * plan.efficiency:.1f}%</b> · {plan.num_shapes} compiled shapes"
    )


def error_readout(error: str | None) -> str:
    """The error line: empty while the settings are valid."""
    return "" if error is None else f"<span style='color:#d62728'>⚠ {html.escape(error)}</span>"


def yaml_readout(text: str) -> str:
    """The config's YAML, preformatted, folded under a "Config YAML" summary (an HTML ``<details>``:
    an ``Accordion`` widget is not drawn by Colab's custom widget manager, googlecolab/colabtools#3571)."""
    return (
        "<details><summary>Config YAML</summary>"
        f"<pre style='font-size:11px;line-height:1.2'>{html.escape(text)}</pre></details>"
    )


__all__ = [
    "BREAKDOWN_COLORS",
    "FULL_MARGIN",
    "ZOOM_FILL",
    "attention_readout",
    "bucket_readout",
    "draw_bucket_plan",
    "draw_memory",
    "error_readout",
    "estimate_readout",
    "fits_readout",
    "largest_batch_readout",
    "long_context_readout",
    "loss_chunk_readout",
    "memory_axis_top",
    "new_length_figure",
    "new_memory_figure",
    "quantize_readout",
    "trainable_readout",
    "yaml_readout",
]
