"""The training dashboard: traces grow per metrics dict, updates are throttled and batched,
recompilations are marked, and the HTML export is self-contained."""

from __future__ import annotations

import json
import re

import ipywidgets as ipw
import pytest

from widgets.dashboard import _TRACES, Dashboard
from widgets.live_plot import LivePlot, TraceData, message_bytes
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


def full_metrics(step: int, **over):
    """A metrics dict with every key of the contract: the ones `metrics` leaves out read None."""
    row = dict.fromkeys(METRIC_KEYS)
    row.update(metrics(step), **over)
    return row


def dpo_metrics(step: int, **over):
    """A DPO run's metrics dict: the loss is the DPO loss, the preference figures are filled."""
    row = full_metrics(
        step,
        loss=0.69 - 0.01 * step,
        reward_accuracy=0.5 + 0.01 * step,
        reward_margin=0.02 * step,
        chosen_logp=-40.0 + 0.1 * step,
        rejected_logp=-40.0 - 0.2 * step,
    )
    row.update(over)
    return row


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def lengths(dash: Dashboard) -> dict[str, int]:
    return {name: len(dash.trace(name).x) for name in _TRACES}


def notes(dash: Dashboard) -> list[str]:
    return [a["text"] for a in dash.figure.look["layout"]["annotations"]]


def test_traces_grow_with_each_metrics_dict():
    dash = Dashboard(min_interval_s=0)
    assert isinstance(dash.figure, LivePlot)
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
    synced = dash.figure.channel.get_state()["state"]
    by_name = {name: len(trace["x"]) for name, trace in zip(_TRACES, synced["traces"])}
    assert synced["seq"] == dash.figure.seq and by_name["train loss"] == 12 and by_name["tokens/s"] == 12
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
    assert not [n for n in notes(dash) if "MFU unknown" in n]


def test_unknown_mfu_is_said_not_left_blank():
    dash = Dashboard(min_interval_s=0)
    dash(metrics(1))
    assert [n for n in notes(dash) if "MFU unknown" in n]


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
        dash(ContractRow(metrics(15, time_left_s=60.0, planned_stop_step=20, checkpoint_stall_s=0.5)))
        dash.history = [ContractRow(r) for r in dash.history]
        dash._pending = True
        dash.flush()  # every trace, the warm-up count, the MFU note and the status line
        dash.summary()
    dpo = Dashboard(min_interval_s=0)
    dpo(ContractRow(dpo_metrics(5, eval_reward_accuracy=0.75, eval_reward_margin=0.5)))
    dpo.summary()
    grpo = Dashboard(min_interval_s=0)
    grpo(ContractRow(grpo_metrics(5, eval_reward_mean=0.5, kl=0.01)))
    drawn = {"tokens_per_s", "mfu", "step_time_s", "loss", "eval_loss", "compiles", "recompiled"}
    drawn |= {"reward_accuracy", "reward_margin", "chosen_logp", "rejected_logp"}
    drawn |= {"eval_reward_accuracy", "eval_reward_margin"}
    drawn |= {
        "reward_mean",
        "reward_std",
        "rewards",
        "completion_length",
        "clip_ratio",
        "kl",
        "zero_std_groups",
    }
    drawn |= {"rollout_s", "train_s", "rollout_tokens_per_s", "eval_reward_mean"}
    memory = {"device_memory_bytes", "device_memory_limit_bytes", "host_rss_bytes"}
    time_limit = {"time_left_s", "planned_stop_step", "checkpoint_stall_s"}
    assert drawn | memory | time_limit | {"step", "warmup_compiles", "total_compiles", "tokens_seen"} <= read


class PageModel:
    """What live_plot.js does with the synced traits, in Python: apply numbered deltas in order
    (truncate to `keep`, then append), ask for the state on a gap."""

    def __init__(self):
        self.seq = 0
        self.traces: list[dict[str, list]] = [{"x": [], "y": [], "text": []} for _ in _TRACES]
        self.snapshots = 0

    def receive(self, delta: dict, plot: LivePlot) -> None:
        if delta["base"] != self.seq:  # a gap: the page asks for the whole state
            state = plot.channel.get_state("state")["state"]
            self.traces, self.seq = [dict(t) for t in state["traces"]], state["seq"]
            self.snapshots += 1
            return
        for index, keep, x, y, text in delta["traces"]:
            trace = self.traces[index]
            for key, new in (("x", x), ("y", y), ("text", text)):
                trace[key] = trace[key][:keep] + new
        self.seq = delta["seq"]


def test_every_flush_is_a_numbered_append_only_delta_that_rebuilds_the_figure():
    dash = Dashboard(min_interval_s=0, max_points=40)  # small, so the stride doubles several times
    page = PageModel()
    seen = dash.figure.seq
    resends = 0
    for step in range(1, 1500):
        spike = step == 700
        dash(
            metrics(
                step,
                tokens_per_s=50_000.0 if spike else 1000.0 + step % 7,
                recompiled=step >= 900,
                compiles=int(step in (900, 1200)),
            )
        )
        delta = dash.figure.delta
        if dash.figure.seq != seen:  # a flush that changed something sent exactly one delta
            assert delta["seq"] == seen + 1 and delta["base"] == seen
            page.receive(delta, dash.figure)
            seen = dash.figure.seq
            # Only the changed tail travels, except when the decimation stride doubles.
            if any(len(x) > 4 for _, _, x, _, _ in delta["traces"]):
                resends += 1
    for name, trace in zip(_TRACES, page.traces):
        drawn = dash.trace(name)
        assert trace["x"] == drawn.x and trace["y"] == drawn.y, name
    assert page.snapshots == 0
    # Strides 1 -> 64 (six doublings) for the traces, at two lengths (compiles has a step-0 point).
    assert resends <= 16, resends
    # Decimated to the bound, with the spike, the last point and both recompilations kept.
    tps = dash.trace("tokens/s")
    assert len(tps.x) <= 40 and tps.x[-1] == 1499 and max(tps.y) == 50_000.0
    assert dash.trace("recompilation").x == [900, 1200]


def test_a_page_that_missed_a_delta_catches_up_from_the_state():
    dash = Dashboard(min_interval_s=0)
    page = PageModel()
    dash(metrics(1))
    page.receive(dash.figure.delta, dash.figure)
    dash(metrics(2))  # this delta never reaches the page
    dash(metrics(3))
    page.receive(dash.figure.delta, dash.figure)  # base 2 != page's 1: a gap, so it takes the state
    assert page.snapshots == 1 and page.seq == dash.figure.seq
    assert page.traces[list(_TRACES).index("train loss")]["x"] == [1, 2, 3]
    # The page's request (a comm message) makes the kernel send the state again.
    dash.figure.channel._on_frontend_message(dash.figure.channel, {"type": "snapshot", "have": 1}, [])
    assert dash.figure.channel.snapshot_requests == 1


def test_ten_thousand_intervals_stay_bounded_for_the_browser(tmp_path):
    dash = Dashboard(min_interval_s=0.5)  # the default throttle, on the real clock
    for step in range(1, 10_001):
        dash(
            metrics(
                step, tokens_per_s=1000.0 + (step % 113), compiles=int(step == 4321), recompiled=step >= 4321
            )
        )
    dash.flush()
    assert all(len(dash.trace(name).x) <= dash.max_points for name in _TRACES)
    state = dash.figure.channel.get_state()
    assert message_bytes(state["state"]) < 400_000, message_bytes(state["state"])
    assert message_bytes(state["look"]) < 20_000
    dash(metrics(10_001))
    dash.flush()
    assert message_bytes(dash.figure.delta) < 2_000, dash.figure.delta
    assert dash.trace("recompilation").x == [4321]
    # The history and the export keep every point.
    full = {trace.name: trace for trace in dash.to_figure().data}
    assert len(full["tokens/s"].x) == 10_001 and len(dash.history) == 10_001


def test_recompilation_hover_text_says_why_and_the_export_lists_it(tmp_path):
    dash = Dashboard(min_interval_s=0)
    cause = "input 0: (8, 64) -> (8, 128); workbench/train/step.py:88 in train_step"
    dash(metrics(5, compiles=2, warmup_compiles=2))
    dash(metrics(10, compiles=1, recompiled=True, recompile_steps=[8], recompile_causes=[cause]))
    dash(metrics(15, compiles=2, recompiled=True, recompile_steps=[11, 14], recompile_causes=[cause]))
    marker = dash.trace("recompilation")
    assert marker.x == [10, 15]
    assert (
        marker.text[0] == "step 8: input 0: (8, 64) -&gt; (8, 128); workbench/train/step.py:88 in train_step"
    )
    assert "step 14: cause not recorded" in marker.text[1]  # fewer causes than steps: said, not invented
    style = dash.figure.look["styles"][list(_TRACES).index("recompilation")]
    assert style["hovertemplate"].startswith("%{text}")
    assert dash.recompilations() == [(8, cause), (11, cause), (14, "cause not recorded")]
    text = dash.export_html(tmp_path / "run.html").read_text()
    assert "<h2>Recompilations</h2>" in text and "step 8: <code>input 0: (8, 64) -&gt; (8, 128)" in text


def test_panels_without_data_give_their_space_to_a_note():
    dash = Dashboard(min_interval_s=0)
    layout = dash.figure.look["layout"]
    assert notes(dash).count("waiting for the first log interval") == 6
    assert layout["xaxis"]["visible"] is False and layout["yaxis6"]["visible"] is False
    dash(metrics(1))  # a CPU run: no MFU, no device memory, host RSS only
    layout, styles = dash.figure.look["layout"], dash.figure.look["styles"]
    assert "waiting for the first log interval" not in notes(dash)
    assert layout["xaxis2"]["visible"] is False and layout["yaxis2"]["visible"] is False  # MFU: a note
    assert "visible" not in layout["xaxis6"] and "visible" not in layout["xaxis"]  # memory, throughput drawn
    legend = {style["name"]: style["showlegend"] for style in styles}
    assert legend["host RSS"] and not legend["device memory"] and not legend["device limit"]
    assert not legend["MFU %"] and legend["tokens/s"]


def test_export_uses_the_same_figure_description_as_the_page():
    dash = Dashboard(min_interval_s=0)
    for step in range(1, 4):
        dash(metrics(step))
    exported = dash.to_figure().to_plotly_json()
    look = dash.figure.look
    assert [t["name"] for t in exported["data"]] == [s["name"] for s in look["styles"]]
    assert exported["layout"]["annotations"] == look["layout"]["annotations"]
    assert [t["x"] for t in exported["data"]] == [t.x for t in dash.figure.data]  # no decimation yet


def test_max_points_is_validated():
    with pytest.raises(ValueError, match=r"max_points=3 .* must be >= 10"):
        Dashboard(max_points=3)
    assert isinstance(Dashboard().trace("loss" if False else "train loss"), TraceData)
    with pytest.raises(KeyError, match="no trace named 'nope'"):
        Dashboard().trace("nope")


def test_status_line_shows_time_left_the_planned_stop_and_the_save_stall():
    dash = Dashboard(min_interval_s=0, total_steps=1000)
    assert isinstance(dash.status, ipw.HTML)
    dash(metrics(100, time_left_s=7500.0, planned_stop_step=830, checkpoint_stall_s=1.25))
    status = dash.status.value
    assert "time left <b>2h05m</b>" in status
    assert "stops at step <b>830</b> of 1000 (time limit)" in status
    assert "last save held the loop <b>1.25s</b>" in status
    # Enough time for every step; no save yet: the stall is left out.
    dash(metrics(200, time_left_s=600.0, planned_stop_step=1000, checkpoint_stall_s=None))
    status = dash.status.value
    assert "time left <b>10m00s</b>" in status and "finishes all 1000 steps in time" in status
    assert "stops at" not in status and "last save" not in status
    dash(metrics(300, time_left_s=0.0, planned_stop_step=300))
    assert "<b>time limit reached</b>" in dash.status.value
    # A dashboard that was not told the run's length names the stop step alone.
    bare = Dashboard(min_interval_s=0)
    bare(metrics(5, time_left_s=42.0, planned_stop_step=830))
    assert bare.status.value.endswith("time left <b>42.0s</b> · stops at step <b>830</b>")


@pytest.mark.parametrize(
    "extra",
    [{}, {"time_left_s": None, "planned_stop_step": None, "checkpoint_stall_s": None}],
    ids=["keys-absent", "keys-none"],
)
def test_status_line_without_a_time_limit_says_nothing_of_one(extra):
    dash = Dashboard(min_interval_s=0, total_steps=1000)
    dash(metrics(10, **extra))
    status = dash.status.value
    assert status.startswith("step <b>10</b>")
    for absent in ("time left", "time limit", "stops at", "in time", "last save"):
        assert absent not in status, status


def test_the_step_a_time_limit_stops_at_is_drawn_at_once():
    clock = FakeClock()
    dash = Dashboard(min_interval_s=60, total_steps=1000, clock=clock)
    dash(metrics(10, planned_stop_step=30))
    dash(metrics(20, planned_stop_step=30))
    assert dash.flush_count == 1  # throttled
    dash(metrics(30, planned_stop_step=30))  # the run's last interval: flushed without waiting
    assert dash.flush_count == 2 and list(dash.trace("train loss").x) == [10, 20, 30]
    assert "stops at step <b>30</b> of 1000 (time limit)" in dash.status.value


PREFERENCE_TRACES = (
    "reward accuracy",
    "eval reward accuracy",
    "reward margin",
    "eval reward margin",
    "chosen log-prob",
    "rejected log-prob",
)


def test_an_sft_run_has_no_preference_panels():
    dash = Dashboard(min_interval_s=0)
    for step in (10, 20, 30):
        dash(
            full_metrics(step, eval_loss=2.0 if step == 20 else None)
        )  # every contract key, preference ones None
    assert not dash.shows_preference
    layout, styles = dash.figure.look["layout"], dash.figure.look["styles"]
    # The six-panel grid: no axes, titles or notes of the preference panels, nothing taller.
    assert layout["height"] == 780 and "xaxis7" not in layout and "yaxis9" not in layout
    titles = {a["text"] for a in layout["annotations"]}
    assert not [t for t in titles if "Reward" in t or "Log-prob" in t]
    assert notes(dash).count("not reported by this run") == 0  # memory shows host RSS, MFU has its note
    # The preference traces exist (a plot's traces are fixed) but stay empty, hidden and out of the legend.
    by_name = {style["name"]: style for style in styles}
    for name in PREFERENCE_TRACES:
        assert dash.trace(name).x == [] and by_name[name]["visible"] is False
        assert by_name[name]["showlegend"] is False
    assert "final_reward_accuracy" not in dash.summary() and "reward accuracy" not in dash.status.value
    exported = {trace.name: trace for trace in dash.to_figure().data}
    assert exported["reward accuracy"].visible is False and list(exported["train loss"].x) == [10, 20, 30]


def test_a_dpo_run_draws_rewards_margins_and_log_probs():
    dash = Dashboard(min_interval_s=0, total_steps=30)
    assert not dash.shows_preference and notes(dash).count("waiting for the first log interval") == 6
    rev = dash.figure.look["rev"]
    for step in (10, 20, 30):
        evals = (
            {"eval_loss": 0.6, "eval_reward_accuracy": 0.7, "eval_reward_margin": 0.3} if step == 20 else {}
        )
        dash(dpo_metrics(step, **evals))
    assert dash.shows_preference and dash.figure.look["rev"] > rev  # the grid grew with the first DPO dict
    assert dash.trace("reward accuracy").x == [10, 20, 30]
    assert dash.trace("reward accuracy").y == pytest.approx([0.6, 0.7, 0.8])
    assert dash.trace("reward margin").y == pytest.approx([0.2, 0.4, 0.6])
    assert dash.trace("chosen log-prob").y == pytest.approx([-39.0, -38.0, -37.0])
    assert dash.trace("rejected log-prob").y == pytest.approx([-42.0, -44.0, -46.0])
    assert dash.trace("eval reward accuracy").x == [20] and dash.trace("eval reward accuracy").y == [0.7]
    assert dash.trace("eval reward margin").x == [20] and dash.trace("eval reward margin").y == [0.3]
    assert dash.trace("train loss").y == pytest.approx([0.59, 0.49, 0.39])  # the DPO loss, on the loss panel
    layout, styles = dash.figure.look["layout"], dash.figure.look["styles"]
    # Nine panels: reward accuracy and margin side by side, the log-probs across the bottom row.
    assert layout["height"] > 780 and layout["xaxis9"]["domain"] == [0.0, 1.0]
    assert layout["yaxis7"]["tickformat"] == ".0%" and layout["xaxis9"]["title"]["text"] == "step"
    by_name = {style["name"]: style for style in styles}
    assert by_name["reward accuracy"]["yaxis"] == "y7" and by_name["eval reward margin"]["yaxis"] == "y8"
    assert by_name["chosen log-prob"]["xaxis"] == by_name["rejected log-prob"]["xaxis"] == "x9"
    assert by_name["train loss"]["yaxis"] == "y4"  # the first six panels keep their axes
    for name in PREFERENCE_TRACES:
        assert by_name[name].get("visible", True) is not False and by_name[name]["showlegend"], name
    assert not [n for n in notes(dash) if n == "not reported by this run"]
    summary = dash.summary()
    assert (
        summary["final_reward_accuracy"] == pytest.approx(0.8)
        and summary["final_eval_reward_accuracy"] == 0.7
    )
    assert summary["final_reward_margin"] == pytest.approx(0.6) and summary["final_eval_reward_margin"] == 0.3
    assert "reward accuracy <b>80%</b> · margin <b>0.600</b>" in dash.status.value


def test_the_page_follows_the_grid_growing_mid_run():
    dash = Dashboard(min_interval_s=0)
    page = PageModel()
    dash(full_metrics(1))  # a first dict without preference figures (e.g. a hand-written loop)
    page.receive(dash.figure.delta, dash.figure)
    dash(dpo_metrics(2))
    page.receive(dash.figure.delta, dash.figure)  # the new look and the points travel together
    assert page.snapshots == 0 and dash.shows_preference
    index = list(_TRACES).index("reward accuracy")
    assert page.traces[index]["x"] == [2] and page.traces[list(_TRACES).index("train loss")]["x"] == [1, 2]
    dash(full_metrics(3))  # a later dict without them: the panels stay
    assert dash.shows_preference and dash.trace("reward accuracy").x == [2]


def test_preference_panels_can_be_asked_for_or_left_out():
    asked = Dashboard(min_interval_s=0, preference=True)
    assert asked.shows_preference
    assert notes(asked).count("waiting for the first log interval") == 9
    asked(full_metrics(1))  # an SFT dict: the panels say so instead of showing empty axes
    assert notes(asked).count("not reported by this run") == 3
    never = Dashboard(min_interval_s=0, preference=False)
    never(dpo_metrics(1))
    assert not never.shows_preference and "xaxis7" not in never.figure.look["layout"]
    assert never.trace("reward accuracy").x == [1]  # kept (and exported), not drawn
    style = never.figure.look["styles"][list(_TRACES).index("reward accuracy")]
    assert style["visible"] is False and style["showlegend"] is False


def grpo_metrics(step: int, **over):
    """A GRPO run's metrics dict: rewards, completion lengths, the policy terms and the time split filled."""
    row = full_metrics(
        step,
        loss=0.01 * step,
        reward_mean=0.1 * step,
        reward_std=0.05,
        rewards={"math_answer": 0.1 * step, "format": 0.5},
        completion_length=100.0 + step,
        clip_ratio=0.01,
        kl=None,  # beta = 0
        zero_std_groups=0.25,
        rollout_s=0.8,
        train_s=0.2,
        rollout_tokens_per_s=500.0,
    )
    row.update(over)
    return row


def test_a_grpo_run_draws_rewards_lengths_and_the_policy_terms():
    dash = Dashboard(min_interval_s=0, total_steps=3)
    assert not dash.shows_grpo
    rev = dash.figure.look["rev"]
    for step in (1, 2, 3):
        dash(grpo_metrics(step, **({"eval_reward_mean": 0.4} if step == 2 else {})))
    assert dash.shows_grpo and not dash.shows_preference and dash.figure.look["rev"] > rev
    assert dash.trace("reward mean").y == pytest.approx([0.1, 0.2, 0.3])
    # the band: mean - std below, mean + std above, filled between them
    assert dash.trace("reward - std").y == pytest.approx([0.05, 0.15, 0.25])
    assert dash.trace("reward ± std").y == pytest.approx([0.15, 0.25, 0.35])
    assert dash.trace("eval reward mean").x == [2] and dash.trace("eval reward mean").y == [0.4]
    assert dash.reward_names == ["math_answer", "format"]
    assert dash.trace("reward/math_answer").y == pytest.approx([0.1, 0.2, 0.3])
    assert dash.trace("reward/format").y == [0.5, 0.5, 0.5]
    assert dash.trace("completion length").y == [101.0, 102.0, 103.0]
    assert dash.trace("clip ratio").x == [1, 2, 3] and dash.trace("KL").x == []  # beta = 0: no KL drawn
    assert dash.trace("zero-std groups").y == [0.25] * 3
    assert dash.trace("rollout").y == [0.8] * 3 and dash.trace("training").y == [0.2] * 3
    assert dash.trace("rollout tokens/s").y == [500.0] * 3
    layout, styles = dash.figure.look["layout"], dash.figure.look["styles"]
    # Ten panels: two rows of two below the six, each with its own axes
    assert layout["height"] > 780 and "xaxis10" in layout and "xaxis11" not in layout
    by_name = {style["name"]: style for style in styles}
    assert by_name["reward mean"]["yaxis"] == "y7" and by_name["reward ± std"]["fill"] == "tonexty"
    assert by_name["reward/math_answer"]["yaxis"] == by_name["reward/format"]["yaxis"] == "y8"
    assert by_name["completion length"]["yaxis"] == "y9" and by_name["clip ratio"]["yaxis"] == "y10"
    assert by_name["rollout"]["yaxis"] == "y3" and by_name["rollout tokens/s"]["yaxis"] == "y"
    assert by_name["reward ± std"]["showlegend"] and not by_name["reward - std"]["showlegend"]
    assert not by_name["KL"]["showlegend"] and not by_name["reward function 3"]["showlegend"]
    titles = {a["text"] for a in layout["annotations"]}
    assert "Completion length (mean tokens)" in titles and not [t for t in titles if "Reward accuracy" in t]
    summary = dash.summary()
    assert summary["final_reward_mean"] == pytest.approx(0.3) and summary["final_eval_reward_mean"] == 0.4
    assert (
        "reward <b>0.300</b> · eval reward <b>0.400</b> · completions <b>103</b> tokens" in dash.status.value
    )
    exported = {trace.name: trace for trace in dash.to_figure().data}
    assert list(exported["reward/format"].x) == [1, 2, 3]


def test_an_sft_run_has_no_grpo_panels_and_both_objectives_cannot_be_asked_for():
    dash = Dashboard(min_interval_s=0)
    dash(full_metrics(1))
    assert not dash.shows_grpo and dash.figure.look["layout"]["height"] == 780
    by_name = {style["name"]: style for style in dash.figure.look["styles"]}
    assert by_name["reward mean"]["visible"] is False and not by_name["rollout"]["showlegend"]
    asked = Dashboard(min_interval_s=0, grpo=True)
    assert asked.shows_grpo and notes(asked).count("waiting for the first log interval") == 10
    never = Dashboard(min_interval_s=0, grpo=False)
    never(grpo_metrics(1))
    assert not never.shows_grpo and never.trace("reward mean").x == [1]  # kept, not drawn
    with pytest.raises(ValueError, match="one objective's panels"):
        Dashboard(preference=True, grpo=True)


def test_a_grpo_run_shows_the_share_cut_and_its_latest_completions_as_a_table(tmp_path):
    dash = Dashboard(min_interval_s=0)
    assert dash.completions.value == ""  # nothing logged: the table takes no space
    rows = [
        {
            "step": 2,
            "group": 0,
            "prompt": [{"role": "user", "content": "What is 2 < 3?"}],
            "completion": "#### 4",
            "rewards": {"math_answer": 1.0, "format": None},
            "reward": 1.0,
            "advantage": 0.71,
            "clipped": False,
        },
        {
            "step": 2,
            "group": 0,
            "prompt": [{"role": "user", "content": "What is 2 < 3?"}],
            "completion": "<b>cut",
            "rewards": {"math_answer": None, "format": None},
            "reward": None,
            "advantage": 0.0,
            "clipped": True,
        },
    ]
    dash(grpo_metrics(1, clipped_ratio=0.75, completions=[{**rows[0], "step": 1}]))
    dash(grpo_metrics(2, clipped_ratio=0.5, completions=rows))
    dash(grpo_metrics(3, clipped_ratio=0.25))  # no completions this interval: the last ones stay
    assert dash.trace("clipped completions").y == [0.75, 0.5, 0.25]
    table = dash.completions.value
    assert "Completions at step 2 (2 of the latest rollout" in table
    assert table.count("What is 2 &lt; 3?") == 1  # a group's prompt once, escaped
    assert "&lt;b&gt;cut" in table and "<b>cut" not in table and "✂" in table
    assert "<th>math_answer</th><th>format</th><th>reward</th><th>advantage</th>" in table
    assert table.count("n/a") == 4 and "0.710" in table
    exported = dash.export_html(tmp_path / "report.html").read_text()
    assert "Latest completions" in exported and "&lt;b&gt;cut" in exported
