"""Live dashboard updates in real frontends: misses and kernel-to-page latency, JupyterLab and Voilà.

For each frontend one server runs, and each run gets a fresh page and a fresh kernel (Voilà
starts a kernel per page load; JupyterLab opens a new copy of the notebook, so a new session,
and its kernel is shut down after the run). The page opens first, then the kernel feeds the
dashboard `--updates` intervals 0.1 s apart (a button click runs the loop, as a training run
would call the dashboard), one flush each. A run's misses are the intervals the page's figure
lacks 30 s after the last one was sent, compared point by point with the same Dashboard built
in this process. Latency: the kernel stamps ``time.time()`` into each delta, the page records
``Date.now()`` once ``Plotly.extendTraces`` has drawn it (same machine, same clock).

    .venv/bin/python bench/frontends.py              # 10 runs of each (about 6 minutes on 2 cores)
    .venv/bin/python bench/frontends.py --runs 3

Prints a table and writes bench/results/frontends.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.browser_pages import (  # noqa: E402  (the repo root is put on the path first)
    chromium,
    jupyterlab,
    open_lab_notebook_and_run_all,
    voila,
    wait_until_drawn,
    write_notebook,
)
from widgets.dashboard import _TRACES, Dashboard  # noqa: E402

TITLE = "Frontend bench"
INTERVAL = """\
def interval(i):
    return {"step": i, "loss": 5.0 / i, "tokens_per_s": 1000.0 + i, "step_time_s": 0.05, "mfu": None,
            "compiles": int(i == 1), "recompiled": False, "total_compiles": 1, "host_rss_bytes": 2**31 + i}"""


def cells(updates: int) -> list[str]:
    return [
        f"from widgets import Dashboard\n\ndash = Dashboard(min_interval_s=0, title={TITLE!r})\ndash",
        INTERVAL,
        f"""\
import time
import ipywidgets as ipw

def feed(_):
    for i in range(1, {updates + 1}):
        dash(interval(i))
        time.sleep(0.1)

go = ipw.Button(description="feed").add_class("wb-feed")
go.on_click(feed)
go""",
    ]


def expected(updates: int) -> dict[str, dict[str, list]]:
    scope: dict = {}
    exec(INTERVAL, scope)
    dash = Dashboard(min_interval_s=3600, title=TITLE)
    for i in range(1, updates + 1):
        dash(scope["interval"](i))
    dash.flush()
    return {name: {"x": dash.trace(name).x, "y": dash.trace(name).y} for name in _TRACES}


def measure(page, updates: int, want: dict) -> dict:
    """Click the feed button on a ready page; how many intervals were drawn, and when."""
    button = page.locator(".wb-feed button, button.wb-feed").first
    button.wait_for(state="attached", timeout=180_000)
    page.wait_for_function(
        f"() => [...document.querySelectorAll('.wb-live-plot')].some(g => g.dataset.name === {TITLE!r} && g.wbLive && g.wbLive.seq >= 0)",
        timeout=60_000,
    )
    button.click()
    page.wait_for_timeout(100 * updates)  # the kernel's loop
    state, missing = wait_until_drawn(page, TITLE, want, timeout_s=30)
    drawn = len(next((t["x"] for t in (state or {}).get("traces", []) if t["name"] == "train loss"), []))
    live = [e for e in (state or {}).get("log", []) if not e.get("snapshot")]
    return {
        "missed": updates - drawn,
        "differences": missing,
        "latencies_ms": [e["drawn_ms"] - e["kernel_ms"] for e in live],
        "snapshots": (state or {}).get("snapshots", 0),
    }


def run_voila(runs: int, updates: int, tmp: Path) -> list[dict]:
    app = write_notebook(tmp / "bench.ipynb", cells(updates))
    want = expected(updates)
    results = []
    with voila(app, tmp) as url, chromium() as browser:
        for _ in range(runs):
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            t0 = time.perf_counter()
            page.goto(url, timeout=120_000)
            page.locator(".wb-feed button, button.wb-feed").first.wait_for(timeout=180_000)
            ready_s = time.perf_counter() - t0
            results.append({"page_ready_s": ready_s, **measure(page, updates, want)})
            page.close()  # Voilà shuts the page's kernel down
    return results


def _shutdown_kernels(base: str) -> None:
    with urllib.request.urlopen(f"{base}/api/sessions") as response:
        sessions = json.load(response)
    for session in sessions:
        request = urllib.request.Request(f"{base}/api/sessions/{session['id']}", method="DELETE")
        urllib.request.urlopen(request).close()


def run_jupyterlab(runs: int, updates: int, tmp: Path) -> list[dict]:
    root = tmp / "root"
    root.mkdir()
    want = expected(updates)
    results = []
    with jupyterlab(root, tmp) as base, chromium() as browser:
        for run in range(runs):
            write_notebook(root / f"run{run}.ipynb", cells(updates))
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            open_lab_notebook_and_run_all(page, base, f"run{run}.ipynb", f"run{run}")
            page.locator(".wb-feed button, button.wb-feed").first.wait_for(state="attached", timeout=180_000)
            ready_s = time.perf_counter() - t0
            results.append({"page_ready_s": ready_s, **measure(page, updates, want)})
            page.close()
            _shutdown_kernels(base)
    return results


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(frontend: str, results: list[dict], updates: int) -> dict:
    latencies = [ms for r in results for ms in r["latencies_ms"]]
    return {
        "frontend": frontend,
        "runs": len(results),
        "updates_sent": updates * len(results),
        "updates_missed": sum(r["missed"] for r in results),
        "runs_with_a_miss": sum(1 for r in results if r["missed"] or r["differences"]),
        "snapshots": sum(r["snapshots"] for r in results),
        "latency_median_ms": round(statistics.median(latencies), 1) if latencies else None,
        "latency_p95_ms": round(percentile(latencies, 0.95), 1) if latencies else None,
        "page_ready_median_s": round(statistics.median(r["page_ready_s"] for r in results), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--updates", type=int, default=20)
    args = parser.parse_args()
    rows, raw = [], {}
    for frontend, runner in (("JupyterLab", run_jupyterlab), ("Voilà", run_voila)):
        with tempfile.TemporaryDirectory(prefix="bench-frontends-") as tmp:
            raw[frontend] = runner(args.runs, args.updates, Path(tmp))
        rows.append(summarize(frontend, raw[frontend], args.updates))
    print(
        f"Live dashboard updates: {args.runs} runs per frontend, {args.updates} updates 0.1 s apart per run"
    )
    header = (
        f"{'frontend':<11} {'runs':>4} {'sent':>5} {'missed':>6} {'runs w/ miss':>12} {'snapshots':>9} "
        f"{'latency median':>14} {'p95':>8} {'page ready':>10}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['frontend']:<11} {r['runs']:>4} {r['updates_sent']:>5} {r['updates_missed']:>6} "
            f"{r['runs_with_a_miss']:>12} {r['snapshots']:>9} {r['latency_median_ms']:>11} ms "
            f"{r['latency_p95_ms']:>5} ms {r['page_ready_median_s']:>8} s"
        )
    out = REPO / "bench" / "results" / "frontends.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": rows, "runs": raw, "updates_per_run": args.updates}, indent=2))
    print(f"wrote {out.relative_to(REPO)}")
    if any(r["updates_missed"] or r["runs_with_a_miss"] for r in rows):
        sys.exit("some live updates were missed")


if __name__ == "__main__":
    main()
