"""The training dashboard: traces grow per metrics dict, updates are throttled and batched,
recompilations are marked, and the HTML export is self-contained."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
import pytest

from widgets.dashboard import Dashboard
from workbench.analysis.metrics import METRIC_KEYS

GiB = 1024**3


def metrics(step: int, **over):
    """A metrics dict shaped like the contract (`workbench.analysis.metrics.RunMetrics`), partly filled."""
    row = {
        "step": step,
        "loss": 6.0 / (1 + step),
        "lr": 1e-3,
        "step_time_s": 0.05,
        "tokens_per_s": 1000.0 + step,
        "mfu": None,
        "compiles": 0,
        "compile_time_s": 0.0,
        "total_compiles": 3,
        "recompiled": False,
        "transfers": 1,
        "host_rss_bytes": 2 * GiB,
        "device_memory_bytes": None,
        "device_memory_limit_bytes": None,
        "tokens_seen": 100 * step,
        "elapsed_s": 0.1 * step,
        "eval_loss": None,
    }
    row.update(over)
    assert set(row) <= set(METRIC_KEYS), set(row) - set(METRIC_KEYS)
    return row


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def lengths(dash: Dashboard) -> dict[str, int]:
    return {t.name: len(t.x) for t in dash.figure.data}


def test_traces_grow_with_each_metrics_dict():
    dash = Dashboard(min_interval_s=0)
    assert isinstance(dash.figure, go.FigureWidget)
    assert all(n == 0 for n in lengths(dash).values())
    for i, step in enumerate(range(5, 30, 5), start=1):
        dash(metrics(step))
        got = lengths(dash)
        assert got["tokens/s"] == got["train loss"] == got["step time"] == got["host RSS"] == i
    assert list(dash.trace("tokens/s").x) == [5, 10, 15, 20, 25]
    assert list(dash.trace("tokens/s").y) == [1005.0, 1010.0, 1015.0, 1020.0, 1025.0]
    assert dash.trace("host RSS").y[0] == pytest.approx(2.0)  # bytes are drawn in GiB
    # Unknown values (None) are gaps, not zeros.
    assert lengths(dash)["MFU %"] == 0 and lengths(dash)["device memory"] == 0


def test_updates_are_throttled_and_batched():
    clock = FakeClock()
    dash = Dashboard(min_interval_s=1.0, clock=clock)
    dash(metrics(1))  # the first point is drawn at once
    assert dash.flush_count == 1 and lengths(dash)["train loss"] == 1
    for step in range(2, 11):
        clock.now += 0.05
        dash(metrics(step))
    # Nine dicts arrived within the interval: none was drawn yet, all are kept.
    assert dash.flush_count == 1 and lengths(dash)["train loss"] == 1 and len(dash.history) == 10
    clock.now += 1.0
    dash(metrics(11))  # the interval has passed: one batched update draws all ten pending points
    assert dash.flush_count == 2 and lengths(dash)["train loss"] == 11
    clock.now += 0.01
    dash(metrics(12))
    assert lengths(dash)["train loss"] == 11
    dash.flush()
    assert dash.flush_count == 3 and lengths(dash)["train loss"] == 12
    # The synced widget state follows every flush: a page that attaches late draws all 12 points.
    synced = {t["name"]: len(t["x"]) for t in dash.figure._widget_data}
    assert synced["train loss"] == 12 and synced["tokens/s"] == 12
    dash.flush()  # nothing pending: no update sent
    assert dash.flush_count == 3


def test_last_step_of_a_run_is_always_drawn():
    clock = FakeClock()
    dash = Dashboard(min_interval_s=60, total_steps=30, clock=clock)
    for step in range(5, 31, 5):
        dash(metrics(step))
    assert dash.flush_count == 2  # first point, then the final step forces a flush
    assert list(dash.trace("train loss").x) == [5, 10, 15, 20, 25, 30]


def test_recompilations_get_markers_that_survive_striding():
    dash = Dashboard(min_interval_s=0, max_points=10)
    for step in range(1, 101):
        warm = step <= 2
        compiled_now = step in (37, 81)
        # The trainer's flag stays set once the run has recompiled; only intervals that compiled get a marker.
        dash(metrics(step, compiles=4 if warm else int(compiled_now), recompiled=step >= 37))
    # The regular traces are strided down to max_points (plus the latest point) ...
    assert len(dash.trace("tokens/s").x) <= 11 and dash.trace("tokens/s").x[-1] == 100
    # ... but every recompilation keeps its marker.
    assert list(dash.trace("recompilation").x) == [37, 81]
    assert list(dash.trace("recompilation").y) == [1, 1]
    assert dash.summary()["recompilations"] == 2


def test_eval_loss_memory_and_mfu_panels():
    dash = Dashboard(min_interval_s=0)
    for step in (10, 20, 30):
        dash(
            metrics(
                step,
                mfu=0.42,
                device_memory_bytes=3 * GiB,
                device_memory_limit_bytes=16 * GiB,
                eval_loss=2.5 if step == 20 else None,
            )
        )
    assert list(dash.trace("eval loss").x) == [20]
    assert list(dash.trace("MFU %").y) == pytest.approx([42.0, 42.0, 42.0])
    assert list(dash.trace("device limit").y) == pytest.approx([16.0] * 3)
    assert not [a for a in dash.figure.layout.annotations if "MFU unknown" in (a.text or "")]


def test_unknown_mfu_is_said_not_left_blank():
    dash = Dashboard(min_interval_s=0)
    dash(metrics(1))
    assert [a for a in dash.figure.layout.annotations if "MFU unknown" in (a.text or "")]


def test_bad_input_is_rejected_with_a_clear_error():
    dash = Dashboard()
    with pytest.raises(TypeError, match="metrics dict"):
        dash([1, 2, 3])
    with pytest.raises(ValueError, match="min_interval_s"):
        Dashboard(min_interval_s=-1)


def test_export_html_is_self_contained(tmp_path):
    dash = Dashboard(min_interval_s=60)
    for step in range(1, 8):
        dash(metrics(step, recompiled=step == 5, compiles=int(step == 5)))
    out = dash.export_html(tmp_path / "report" / "run.html", appendix="train:\n  steps: 7\n")
    text = out.read_text()
    assert len(text) > 1_000_000  # the plotly.js bundle itself is embedded ...
    assert not re.search(r"<script[^>]+src=", text)  # ... and nothing is fetched from a CDN
    assert "steps: 7" in text
    # The export flushed the pending points: all seven steps are in the embedded figure data.
    match = re.search(r'Plotly\.newPlot\(\s*"workbench-dashboard",\s*(\[.*?\]),\s*\{', text, re.S)
    assert match, "figure data not found in the export"
    data = json.loads(match.group(1))
    by_name = {trace["name"]: trace for trace in data}
    assert by_name["train loss"]["x"] == [1, 2, 3, 4, 5, 6, 7]
    assert by_name["recompilation"]["x"] == [5]


def test_warmup_compiles_are_drawn_at_step_zero():
    dash = Dashboard(min_interval_s=0)
    dash(metrics(5, compiles=0, total_compiles=6))  # the trainer compiled 6 programs before step 1
    dash(metrics(10, compiles=0, total_compiles=6))
    assert list(dash.trace("compiles").x) == [0, 5, 10]
    assert list(dash.trace("compiles").y) == [6, 0, 0]
    assert dash.summary()["warmup_compiles"] == 6


def test_warmup_compiles_come_from_the_run_not_the_process():
    # A second run in the same kernel: the process has compiled 40 programs, this run's prewarm 5.
    dash = Dashboard(min_interval_s=0)
    dash(metrics(5, compiles=0, total_compiles=40, warmup_compiles=5))
    dash(metrics(10, compiles=0, total_compiles=40, warmup_compiles=5))
    assert list(dash.trace("compiles").y) == [5, 0, 0]
    assert dash.summary()["warmup_compiles"] == 5
    # A run that compiled nothing up front draws no step-0 point, whatever the process did before.
    cold = Dashboard(min_interval_s=0)
    cold(metrics(5, compiles=0, total_compiles=40, warmup_compiles=0))
    assert list(cold.trace("compiles").x) == [5] and cold.summary()["warmup_compiles"] == 0


def test_every_key_read_is_a_run_metrics_key():
    read: set[str] = set()

    class ContractRow(dict):
        """A metrics dict that refuses (and records) reads of keys outside `RunMetrics`."""

        def _check(self, key):
            assert key in METRIC_KEYS, f"the dashboard reads {key!r}, which is not a RunMetrics key"
            read.add(key)

        def __getitem__(self, key):
            self._check(key)
            return super().__getitem__(key)

        def get(self, key, default=None):
            self._check(key)
            return super().get(key, default)

    for rows in (
        [metrics(5, warmup_compiles=2), metrics(10, recompiled=True, compiles=1, eval_loss=2.0)],
        [metrics(5, compiles=1, mfu=0.3, device_memory_bytes=GiB, device_memory_limit_bytes=16 * GiB)],
    ):
        dash = Dashboard(min_interval_s=60)
        dash(ContractRow(rows[0]))
        dash.history = [ContractRow(r) for r in rows]
        dash(ContractRow(metrics(15)))  # reads the previous row's step
        dash.history = [ContractRow(r) for r in dash.history]
        dash._pending = True
        dash.flush()  # every trace, the warm-up count, the MFU note and the status line
        dash.summary()
    drawn = {"tokens_per_s", "mfu", "step_time_s", "loss", "eval_loss", "compiles", "recompiled"}
    memory = {"device_memory_bytes", "device_memory_limit_bytes", "host_rss_bytes"}
    assert drawn | memory | {"step", "warmup_compiles", "total_compiles", "tokens_seen"} <= read
