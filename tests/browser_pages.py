"""Real frontends for the browser tests and bench/frontends.py: Voilà and JupyterLab servers,
headless Chromium (Playwright), and reading what a page's live dashboard drew.

Servers run in their own session (their kernels join it) and stop by process group. A page's
live plot (widgets/live_plot.js) exposes what it drew: ``gd.data`` (plotly's traces) and
``gd.wbLive`` (update number, snapshots taken, and per update the kernel's time stamp and the
page's ``Date.now()`` once drawn), so a check compares the page with the kernel's own figure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import nbformat

from workbench.demo import CHROMIUM_FLAGS, find_chromium

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = find_chromium()


class FrontendError(RuntimeError):
    """A server or page that did not come up; the message carries the server's log tail."""


def write_notebook(path: Path, cells: Sequence[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "TMPDIR": str(tmp),
            "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
            "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        }
    )
    return env


@contextlib.contextmanager
def _server(argv: list[str], port: int, tmp: Path, env: dict[str, str], name: str) -> Iterator[Path]:
    log = tmp / f"{name}.log"
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            argv, cwd=tmp, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise FrontendError(f"{name} exited early ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise FrontendError(
                        f"{name} did not listen in 90 s:\n{log.read_text()[-3000:]}"
                    ) from None
                time.sleep(0.3)
        yield log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def voila(notebook: Path, tmp: Path) -> Iterator[str]:
    """Voilà serving `notebook`; yields its URL (each page load starts a fresh kernel)."""
    port = free_port()
    argv = [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}"]
    argv += ["--Voila.ip=127.0.0.1", "--show_tracebacks=True"]
    with _server(argv, port, tmp, _env(tmp), "voila"):
        yield f"http://127.0.0.1:{port}/"


@contextlib.contextmanager
def jupyterlab(root: Path, tmp: Path) -> Iterator[str]:
    """JupyterLab serving `root` without a token; yields its base URL."""
    port = free_port()
    env = _env(tmp)
    settings = tmp / "lab-settings"
    # No news popup over the page (JupyterLab asks to fetch news on first start).
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True, exist_ok=True)
    news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    # Render every cell, not only those in view: a tall dashboard would leave the widgets below unrendered.
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp / "lab-workspaces")
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}"]
    argv += ["--ServerApp.token=", "--ServerApp.password=", "--ServerApp.ip=127.0.0.1"]
    argv += [
        "--ServerApp.disable_check_xsrf=True"
    ]  # a local test server: the bench shuts kernels down over REST
    argv += [f"--ServerApp.root_dir={root}"]
    with _server(argv, port, tmp, env, "jupyterlab"):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Headless Debian Chromium driven by Playwright (never `playwright install`)."""
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        raise FrontendError("chromium is not installed (make browser-deps installs it)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_FLAGS), headless=True)
        try:
            yield browser
        finally:
            browser.close()


def open_lab_notebook_and_run_all(page: Any, base_url: str, notebook: str, workspace: str) -> None:
    """Open `notebook` in a fresh JupyterLab workspace, wait for its kernel, then Run > Run All Cells.

    A click on Run All that lands before the session is wired up is ignored (the prompts stay
    ``[ ]:``), so the click is repeated until the first cell has started.
    """
    page.goto(f"{base_url}/lab/workspaces/{workspace}/tree/{notebook}?reset", timeout=120_000)
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=120_000)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=120_000)
    started = "() => { const p = document.querySelector('.jp-NotebookPanel .jp-InputPrompt'); return !!p && p.innerText.trim() !== '[ ]:'; }"
    for _ in range(6):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator("li[data-command='runmenu:run-all']").click()
        try:
            page.wait_for_function(started, timeout=10_000)
            return
        except Exception:  # playwright's TimeoutError: try again
            page.keyboard.press("Escape")
    raise FrontendError(f"JupyterLab did not start running {notebook} after 6 clicks on Run All")


LAB_CELLS_STATE = """() => [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell')].map(c => ({
    prompt: (c.querySelector('.jp-InputPrompt') || {}).innerText || '',
    errors: [...c.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], .jp-RenderedText[data-mime-type="application/vnd.jupyter.error"]')].map(e => e.innerText.slice(-600)),
}))"""


def wait_for_lab_output(page: Any, locator: Any, *, timeout_s: float, what: str) -> None:
    """Wait until `locator` is in the page (it may sit below the fold); a `FrontendError` that says
    where each cell stands (prompts, the tail of any error output) when it does not come in time:
    a slow kernel and a failed cell call for different fixes."""
    try:
        locator.wait_for(state="attached", timeout=timeout_s * 1000)
    except Exception as err:  # playwright's TimeoutError
        cells = page.evaluate(LAB_CELLS_STATE)
        kernel = page.evaluate(
            "() => (document.querySelector('.jp-Notebook-ExecutionIndicator') || {dataset: {}}).dataset.status"
        )
        lines = [
            f"cell {i}: {c['prompt'].strip()} {' | '.join(c['errors'])}".rstrip() for i, c in enumerate(cells)
        ]
        raise FrontendError(
            f"{what} did not appear in {timeout_s:.0f} s (kernel {kernel}):\n" + "\n".join(lines)
        ) from err


PLOT_STATE = """(title) => {
    const gd = [...document.querySelectorAll('.wb-live-plot')].find(g => g.dataset.name === title);
    if (!gd || !gd.wbLive) return null;
    return {
        seq: gd.wbLive.seq, snapshots: gd.wbLive.snapshots, deltas: gd.wbLive.deltas,
        errors: gd.wbLive.errors, log: gd.wbLive.log,
        traces: (gd.data || []).map(t => ({name: t.name, x: [...(t.x || [])], y: [...(t.y || [])],
                                           text: [...(t.text || [])]})),
        points: gd.querySelectorAll('.scatterlayer .point').length,
    };
}"""


def plot_state(page: Any, title: str) -> dict[str, Any] | None:
    """What the page's live plot titled `title` drew, or None if it has not rendered."""
    return page.evaluate(PLOT_STATE, title)


def differences(state: dict[str, Any] | None, expected: dict[str, dict[str, list]]) -> list[str]:
    """Traces whose drawn points differ from `expected` ({name: {'x': ..., 'y': ...}})."""
    if state is None:
        return ["the live plot has not rendered"]
    drawn = {t["name"]: t for t in state["traces"]}
    out = []
    for name, want in expected.items():
        got = drawn.get(name)
        if got is None:
            out.append(f"{name}: not on the page")
        elif got["x"] != want["x"] or got["y"] != want["y"]:
            out.append(
                f"{name}: page has {len(got['x'])} points (last x {got['x'][-1:]}), kernel {len(want['x'])}"
            )
    return out


def wait_until_drawn(
    page: Any, title: str, expected: dict[str, dict[str, list]], timeout_s: float
) -> tuple[dict[str, Any] | None, list[str]]:
    """Poll the page until its plot equals `expected`; returns the last state and what differs."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = plot_state(page, title)
        diff = differences(state, expected)
        if not diff or time.monotonic() > deadline:
            return state, diff
        page.wait_for_timeout(100)
