"""Real-browser tests: the live dashboard in Voilà and in JupyterLab, driven by Debian's Chromium
(Playwright, headless), with hard checks that every update the kernel sent is drawn.

What Python-side widget tests cannot catch: a figure that shows its axes but no trace, live
updates that never reach a page (plotly's FigureWidget under Voilà kept 12 of 16 intervals on
about one page in five), a readout that never updates, widgets that fail to render. Each test
compares the page's plotly data with the same Dashboard built in this process from the same
metrics. Screenshots go to tests/artifacts/ (git-ignored; CI uploads them).

Skipped only when no Chromium binary is installed (`make test` installs it with apt).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.browser_pages import (
    CHROMIUM,
    REPO,
    chromium,
    jupyterlab,
    open_lab_notebook_and_run_all,
    voila,
    wait_for_lab_output,
    wait_until_drawn,
    write_notebook,
)
from widgets.dashboard import _TRACES, Dashboard

ARTIFACTS = REPO / "tests" / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it with apt)"),
]

TITLE = "XLA Workbench — training"
CAUSE = "input 0: (8, 64) -> (8, 128) at workbench/train/step.py:88"

# One interval of a run, as the trainer reports it; the kernel and this process both run it.
INTERVAL = f"""\
def interval(i):
    recompiled_now = i == 8
    return {{"step": 5 * i, "loss": 6.0 / i, "tokens_per_s": 900.0 + 10 * i, "step_time_s": 0.05,
            "mfu": None, "compiles": 3 if i == 1 else int(recompiled_now), "recompiled": i >= 8,
            "total_compiles": 3 + int(i >= 8), "host_rss_bytes": 2**31 + i * 2**20,
            "device_memory_bytes": None, "eval_loss": None,
            "recompile_steps": [38] if recompiled_now else [],
            "recompile_causes": [{CAUSE!r}] if recompiled_now else []}}"""

# Points that arrive while the page is open travel as live comm messages (the path a run takes).
MORE_BUTTON = """\
import ipywidgets as ipw

more = ipw.Button(description="4 more intervals").add_class("wb-more")
more.on_click(lambda _: [dash(interval(i)) for i in range(13, 17)])
more"""


def expected(intervals: range, **dashboard) -> dict[str, dict[str, list]]:
    """What the page must draw: the same Dashboard fed the same intervals in this process."""
    scope: dict = {}
    exec(INTERVAL, scope)
    dash = Dashboard(min_interval_s=3600, **dashboard)  # one flush at the end: what is drawn is the same
    for i in intervals:
        dash(scope["interval"](i))
    dash.flush()
    return {name: {"x": dash.trace(name).x, "y": dash.trace(name).y} for name in _TRACES}


def assert_hover_text(state: dict) -> None:
    marker = next(t for t in state["traces"] if t["name"] == "recompilation")
    assert marker["x"] == [40] and marker["text"] == [
        "step 38: input 0: (8, 64) -&gt; (8, 128) at workbench/train/step.py:88"
    ], marker


def _bytes(text: str) -> float:
    """'8.62 MiB' -> bytes (the panel's `format_bytes`)."""
    value, unit = text.split()
    return float(value) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]


VOILA_CELLS = [
    """\
from widgets import ConfigPanel, Dashboard
from workbench.config import WorkbenchConfig

from workbench.data.records import build_datasets

cfg = WorkbenchConfig().with_overrides({"train.batch_size": 8, "data.max_examples": 600})
train_ds, _, _ = build_datasets(cfg)  # real token lengths of the shipped corpus
panel = ConfigPanel(cfg, target="v5e-1", lengths=train_ds)
panel.widget""",
    f"""\
dash = Dashboard(min_interval_s=0, title={TITLE!r})
dash""",
    INTERVAL + "\n\nfor i in range(1, 13):\n    dash(interval(i))",
    MORE_BUTTON,
]


MEMORY_BARS = """() => {
    const gd = [...document.querySelectorAll('.wb-live-plot')].find(g => g.dataset.name === 'memory per device');
    if (!gd || !gd.data || !gd.layout) return null;
    return {title: (gd.layout.title || {}).text, bars: gd.data.map(t => [t.name, [...t.x]]),
            drawn: gd.querySelectorAll('.barlayer .point').length};
}"""


def kernel_memory_bars(batch_size: int) -> dict:
    """The config panel's memory bar as the kernel draws it at `batch_size` (the Voilà cell's panel)."""
    from widgets import ConfigPanel
    from workbench.config import WorkbenchConfig
    from workbench.data.records import build_datasets

    cfg = WorkbenchConfig().with_overrides({"train.batch_size": 8, "data.max_examples": 600})
    train_ds, _, _ = build_datasets(cfg)
    figure = (
        ConfigPanel(cfg, target="v5e-1", lengths=train_ds).set(batch_size=batch_size).memory_figure.figure
    )
    return {"title": figure.layout.title.text, "bars": [[t.name, list(t.x)] for t in figure.data]}


def wait_for_memory_bars(page, want: dict, timeout_s: float) -> dict | None:
    """Poll the page's memory bar until its title and bars equal `want`; returns the last seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = page.evaluate(MEMORY_BARS)
        if (seen and {k: seen[k] for k in want} == want) or time.monotonic() > deadline:
            return seen
        page.wait_for_timeout(200)


def test_voila_page_updates_estimate_and_draws_every_live_update(tmp_path):
    pytest.importorskip("playwright.sync_api")
    app = write_notebook(tmp_path / "app.ipynb", VOILA_CELLS)
    bars_at_8, bars_at_16 = kernel_memory_bars(8), kernel_memory_bars(16)
    assert bars_at_8 != bars_at_16
    with voila(app, tmp_path) as url, chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(url, timeout=120_000)
        # Every cell has run once the last widget (the button) is on the page.
        more = page.locator(".wb-more button, button.wb-more").first
        more.wait_for(timeout=180_000)

        # The 12 intervals fed before the page attached: drawn from the synced state.
        state, missing = wait_until_drawn(page, TITLE, expected(range(1, 13), title=TITLE), timeout_s=60)
        assert not missing, missing
        assert_hover_text(state)
        assert state["points"] >= 60  # drawn as SVG points, not only held in plotly's data

        # The panel's memory bar (a FigureView) is drawn as the kernel drew it.
        bars_before = wait_for_memory_bars(page, bars_at_8, timeout_s=30)

        # Move the batch-size slider the way a user does with the keyboard.
        estimate = page.locator(".wb-memory-estimate .wb-estimate-value")
        before = estimate.inner_text()
        batch_before = page.locator(".wb-batch-size .widget-readout").inner_text()
        handle = page.locator(".wb-batch-size .noUi-handle")
        handle.focus()
        changed = (
            "before => document.querySelector('.wb-memory-estimate .wb-estimate-value').innerText != before"
        )
        t0 = time.perf_counter()  # one key press -> kernel -> redraw -> page: the round trip a user feels
        handle.press("ArrowRight")
        page.wait_for_function(changed, arg=before, timeout=60_000)
        round_trip_ms = 1000 * (time.perf_counter() - t0)
        for _ in range(7):
            handle.press("ArrowRight")
        page.wait_for_function(
            "() => document.querySelector('.wb-batch-size .widget-readout').innerText == '16'", timeout=60_000
        )
        page.wait_for_timeout(1000)
        after = estimate.inner_text()
        # The memory bar redrawn from the kernel reached the page: the page's figure is the kernel's.
        bars_after = wait_for_memory_bars(page, bars_at_16, timeout_s=30)
        batch_after = page.locator(".wb-batch-size .widget-readout").inner_text()

        # Four intervals fed while the page watches: every one must be drawn (a hard check).
        more.click()
        state, missing = wait_until_drawn(page, TITLE, expected(range(1, 17), title=TITLE), timeout_s=30)
        assert not missing, f"live updates missed on the Voilà page: {missing}"
        live = [entry for entry in state["log"] if not entry.get("snapshot")]
        assert [entry["seq"] for entry in live][-4:] == [13, 14, 15, 16], state["log"]
        # The panel's own figures drew too: the stacked memory bars and the length histogram.
        bars = page.locator(".js-plotly-plot .barlayer .point").count()

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        latencies = [e["drawn_ms"] - e["kernel_ms"] for e in live]
        (ARTIFACTS / "browser_round_trip.json").write_text(
            json.dumps({"slider_to_estimate_ms": round(round_trip_ms, 1), "live_update_ms": latencies})
        )
        page.set_viewport_size({"width": 1280, "height": 2300})  # Voilà scrolls inside its page: show it all
        page.wait_for_timeout(800)
        page.screenshot(path=str(ARTIFACTS / "browser_voila.png"), full_page=True)

    assert int(batch_after) > int(batch_before), (batch_before, batch_after)
    assert _bytes(after) > _bytes(before), (before, after)
    assert bars >= 2, bars
    assert bars_before and {k: bars_before[k] for k in bars_at_8} == bars_at_8, (bars_before, bars_at_8)
    assert bars_after and {k: bars_after[k] for k in bars_at_16} == bars_at_16, (bars_after, bars_at_16)
    assert bars_after["drawn"] >= 2, bars_after
    assert not errors, errors
    assert (ARTIFACTS / "browser_voila.png").stat().st_size > 10_000


LONG_TITLE = "Long run"
LAB_CELLS = [
    f"""\
from widgets import Dashboard

dash = Dashboard(min_interval_s=0, title={TITLE!r})
dash""",
    # Fed while the page watches (run-all after the page opened), a little apart like a real run.
    INTERVAL + "\n\nimport time\n\nfor i in range(1, 13):\n    dash(interval(i))\n    time.sleep(0.05)",
    MORE_BUTTON,
    f"""\
long = Dashboard(title={LONG_TITLE!r})
long""",
    # 10,000 intervals, flushed every 1,000: the page draws a bounded, decimated figure.
    """\
for i in range(1, 10_001):
    long(interval(i))
    if i % 1000 == 0:
        long.flush()""",
    """\
one_more = ipw.Button(description="one more").add_class("wb-one-more")
one_more.on_click(lambda _: (long(interval(10_001)), long.flush()))
one_more""",
]


def test_jupyterlab_page_open_before_the_run_draws_every_update(tmp_path):
    pytest.importorskip("playwright.sync_api")
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(root / "live.ipynb", LAB_CELLS)
    with jupyterlab(root, tmp_path) as base, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        open_lab_notebook_and_run_all(page, base, "live.ipynb", "live")
        more = page.locator(".wb-more button, button.wb-more").first
        wait_for_lab_output(page, more, timeout_s=240, what="the 'more' button")

        state, missing = wait_until_drawn(page, TITLE, expected(range(1, 13), title=TITLE), timeout_s=30)
        assert not missing, f"updates missed on the JupyterLab page: {missing}"
        assert_hover_text(state)
        more.click()
        state, missing = wait_until_drawn(page, TITLE, expected(range(1, 17), title=TITLE), timeout_s=30)
        assert not missing, f"live updates missed on the JupyterLab page: {missing}"

        # A long run: the page holds at most max_points per trace and a later update still lands fast.
        one_more = page.locator(".wb-one-more button, button.wb-one-more").first
        wait_for_lab_output(page, one_more, timeout_s=240, what="the 'one more' button")
        long_expected = expected(range(1, 10_001), title=LONG_TITLE)
        state, missing = wait_until_drawn(page, LONG_TITLE, long_expected, timeout_s=60)
        assert not missing, missing
        assert max(len(t["x"]) for t in state["traces"]) <= 2000
        long_expected = expected(range(1, 10_002), title=LONG_TITLE)
        t0 = time.perf_counter()
        one_more.click()
        state, missing = wait_until_drawn(page, LONG_TITLE, long_expected, timeout_s=20)
        click_to_drawn_s = time.perf_counter() - t0
        assert not missing, missing
        assert click_to_drawn_s < 5, click_to_drawn_s
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "browser_jupyterlab.png"), full_page=True)
    assert not errors, errors
