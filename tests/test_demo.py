"""`python -m workbench demo`: the papermill plumbing, the report and its screenshot.

The quickstart notebook itself runs in tests/test_notebooks.py; here small stand-in notebooks
check what the demo does around it (parameters, outputs, the failing-cell message, the PNG), and
that it finds the quickstart in the installed package, not in the repository.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import tomllib

import workbench
from workbench import demo

REPO = Path(__file__).resolve().parent.parent

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# What a newcomer must not see in the terminal from `make demo`: the kernel's transport warning,
# kernel-manager and event-loop noise, zmq/tornado errors at shutdown, the debugger's frozen-modules
# warning, widget-frontend and comm warnings, and any traceback or warning at all.
TERMINAL_NOISE = (
    r"without encryption",
    r"CurveZMQ",
    r"\[IPKernelApp\]",
    r"\[NbClientApp\]",
    r"Proactor event loop",
    r"Exception ignored",
    r"\bzmq\b",
    r"tornado",
    r"jupyter_client",
    r"[Kk]ernel (died|restarting|didn't respond)",
    r"Input is not a terminal",
    r"frozen modules|frozen_modules|PYDEVD_DISABLE_FILE_VALIDATION|[Dd]ebugger warning",
    r"Widget Javascript not detected",
    r"\bcomm\b|comm_open|CommManager",
    r"Warning\b|WARNING",
    r"Traceback",
)
# The demo's own lines (run_demo's prints); anything else in the terminal is someone else's.
DEMO_LINES = (
    "running ",
    "wrote ",
    "no chromium found",
    "chromium failed",
    "screenshot skipped",
)


def assert_quiet(terminal: str) -> None:
    """Every line printed to the terminal is the demo's own, and none is kernel or transport noise."""
    noisy = [line for line in terminal.splitlines() if any(re.search(p, line) for p in TERMINAL_NOISE)]
    assert not noisy, "the demo printed noise:\n" + "\n".join(noisy)
    foreign = [line for line in terminal.splitlines() if line.strip() and not line.startswith(DEMO_LINES)]
    assert not foreign, "the demo printed lines that are not its own:\n" + "\n".join(foreign)


def _notebook(path, *cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_demo_writes_notebook_report_and_screenshot(tmp_path, capsys):
    nb = _notebook(
        tmp_path / "stand_in.ipynb",
        'report_html = "unset"',
        """\
from widgets import Dashboard

dash = Dashboard(min_interval_s=0)
for step in range(1, 7):
    dash({"step": step, "loss": 5.0 / step, "tokens_per_s": 1000.0 * step, "step_time_s": 0.1,
          "compiles": 0, "total_compiles": 4, "host_rss_bytes": 2**30})
dash.export_html(report_html)""",
    )
    out = tmp_path / "reports"
    assert demo.run_demo(out, notebook=nb) == 0
    executed = nbformat.read(out / "quickstart.ipynb", as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and str(out / "quickstart.html") in injected[0].source
    assert (out / "quickstart.html").stat().st_size > 1_000_000  # plotly.js embedded
    printed = capsys.readouterr().out
    assert "wrote" in printed and "quickstart.html" in printed
    if demo.find_chromium() is None:
        pytest.skip("chromium is not installed: no screenshot to check")
    png = (out / "dashboard.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    assert len(png) > 30_000  # a drawn page; a blank 1280x1150 capture compresses to a few KB


@pytest.mark.slow
def test_demo_reports_the_failing_cell(tmp_path, capsys):
    nb = _notebook(tmp_path / "broken.ipynb", 'report_html = "unset"', "raise ValueError('no data here')")
    assert demo.run_demo(tmp_path / "reports", notebook=nb, screenshot=False) == 1
    err = capsys.readouterr().err
    assert "ValueError: no data here" in err and "cell" in err


def test_demo_runs_the_packaged_quickstart_from_any_directory(tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    calls = []
    monkeypatch.setattr(papermill, "execute_notebook", lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.chdir(tmp_path)
    assert demo.run_demo("reports", screenshot=False) == 0
    (notebook, executed), kwargs = calls[0]
    assert Path(notebook) == demo.quickstart_notebook()
    assert Path(notebook).is_relative_to(Path(workbench.__file__).parent)  # package data
    assert Path(executed) == tmp_path / "reports" / "quickstart.ipynb"
    assert kwargs["cwd"] == str(tmp_path)
    assert kwargs["parameters"]["report_html"] == str(tmp_path / "reports" / "quickstart.html")
    # The packaged copy is the committed quickstart (test_notebooks checks both against the source).
    assert Path(notebook).read_text() == (REPO / "notebooks" / "00_quickstart.ipynb").read_text()


def _install_like_a_wheel(site: Path) -> None:
    """Copy what a wheel of this project holds of `workbench`: its modules and the package data
    pyproject.toml declares, nothing else from the repository."""
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in (REPO / "workbench").rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(REPO)
        declared = any(
            rel.is_relative_to(Path(*package.split(".")))
            and any(fnmatch.fnmatch(str(rel.relative_to(Path(*package.split(".")))), g) for g in globs)
            for package, globs in package_data.items()
        )
        if path.suffix == ".py" or declared:
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, site / rel)


def test_an_installed_package_finds_its_quickstart(tmp_path):
    site, elsewhere = tmp_path / "site-packages", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _install_like_a_wheel(site)
    code = (
        "import workbench, workbench.demo as d; p = d.quickstart_notebook(); "
        "print(workbench.__file__); print(p); print(p.is_file())"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    module, notebook, exists = proc.stdout.split()
    assert Path(module).is_relative_to(site), "imported the checkout, not the installed copy"
    assert Path(notebook) == site / "workbench" / "notebooks" / "00_quickstart.ipynb"
    assert exists == "True"


def test_demo_without_the_notebook_says_so(tmp_path, capsys):
    assert demo.run_demo(tmp_path, notebook=tmp_path / "missing.ipynb") == 1
    assert "not found" in capsys.readouterr().err


def _fake_chromium(tmp_path, monkeypatch, script: str) -> None:
    fake = tmp_path / "chromium"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(demo, "find_chromium", lambda: str(fake))


def test_a_crashing_chromium_skips_the_screenshot(tmp_path, monkeypatch, capsys):
    _fake_chromium(tmp_path, monkeypatch, "echo 'Trace/breakpoint trap' >&2; exit 133")
    page = tmp_path / "page.html"
    page.write_text("<html><body>report</body></html>")
    assert demo.screenshot_html(page, tmp_path / "shot.png") is False
    err = capsys.readouterr().err
    assert "exited with status 133" in err and "Trace/breakpoint trap" in err


def test_a_hanging_chromium_skips_the_screenshot(tmp_path, monkeypatch, capsys):
    _fake_chromium(tmp_path, monkeypatch, "exit 0")

    def hang(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(demo.subprocess, "run", hang)
    assert demo.screenshot_html(tmp_path / "page.html", tmp_path / "shot.png") is False
    assert "did not finish in 120 s" in capsys.readouterr().err


@pytest.mark.slow
def test_the_kernel_prints_nothing_to_the_terminal(tmp_path, capfd):
    """The notebook's kernel shares the terminal's stdout and stderr (file descriptors, hence
    `capfd`): a notebook that starts widgets, FigureWidgets (anywidget comms) and the dashboard
    leaves only the demo's own lines there; the kernel's TCP-without-encryption warning is gone."""
    nb = _notebook(
        tmp_path / "widgets.ipynb",
        'report_html = "unset"',
        """\
import plotly.graph_objects as go
from widgets import Dashboard

dash = Dashboard(min_interval_s=0)
dash({"step": 1, "loss": 2.0, "tokens_per_s": 1000.0, "step_time_s": 0.1, "compiles": 1,
      "total_compiles": 1, "host_rss_bytes": 2**30})
display(go.FigureWidget(go.Scatter(x=[1, 2], y=[3, 4])))
dash""",
    )
    status = demo.run_demo(tmp_path / "reports", notebook=nb, screenshot=False)
    terminal = capfd.readouterr()
    assert status == 0, terminal.out + terminal.err
    assert "wrote" in terminal.out
    assert_quiet(terminal.out + terminal.err)


@pytest.mark.slow
def test_the_quickstart_demo_is_quiet(tmp_path, capfd, monkeypatch):
    """The demo's own path on the packaged quickstart, at small parameters (tests/test_notebooks.py
    checks what the quickstart computes; here only what reaches the terminal)."""
    monkeypatch.chdir(tmp_path)
    parameters = {"steps": 6, "log_every": 3, "max_examples": 300, "save_dir": None}
    status = demo.run_demo("reports", parameters=parameters, screenshot=False)
    terminal = capfd.readouterr()
    assert status == 0, terminal.out + terminal.err
    assert (tmp_path / "reports" / "quickstart.html").is_file()
    assert_quiet(terminal.out + terminal.err)


def test_the_kernel_gets_curve_keys():
    """What removes ipykernel's plain-TCP warning: the kernel manager is asked for CurveZMQ keys,
    and the installed python3 kernelspec declares it can use them (so "auto" provisions them)."""
    zmq = pytest.importorskip("zmq")
    kernelspec = pytest.importorskip("jupyter_client.kernelspec")
    if not zmq.has("curve"):
        pytest.skip("this libzmq has no CURVE: the kernel runs unencrypted and warns")
    assert demo.kernel_manager_config().KernelManager.transport_encryption == "auto"
    spec = kernelspec.KernelSpecManager().get_kernel_spec("python3")
    assert "curve" in spec.metadata.get("supported_encryption", [])


def test_shutting_the_kernel_down_sends_it_no_interrupt():
    """An interrupt at shutdown can land in a message the idle kernel is handling, and ipykernel then
    logs "KeyboardInterrupt caught in kernel" on the terminal: the demo's kernel manager sends none,
    and the kernel still stops."""
    import asyncio
    import signal

    async def shut_down() -> tuple[list[int], bool]:
        km = demo.quiet_kernel_manager_class()(kernel_name="python3")
        await km.start_kernel()
        sent: list[int] = []
        send = km.provisioner.send_signal

        async def record(signum: int) -> None:
            sent.append(signum)
            await send(signum)

        km.provisioner.send_signal = record
        await km.shutdown_kernel()
        return sent, await km.is_alive()

    sent, alive = asyncio.run(shut_down())
    assert signal.SIGINT not in sent, sent
    assert not alive


def test_without_chromium_the_last_line_says_how_to_get_the_screenshot(tmp_path, monkeypatch, capsys):
    """No Chromium on PATH: the demo still succeeds, and its last line names what to install and the
    command to run again, `make`'s under `make demo` (whose Makefile installs it), else the CLI's."""
    papermill = pytest.importorskip("papermill")
    monkeypatch.setattr(papermill, "execute_notebook", lambda *args, **kwargs: None)
    monkeypatch.setattr(demo, "find_chromium", lambda: None)
    monkeypatch.setenv("MAKELEVEL", "1")  # what make sets in the commands it runs
    assert demo.run_demo(tmp_path / "reports") == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        "no chromium found: dashboard.png skipped. Install it with 'make browser-deps' "
        "(as root; it runs apt-get install chromium), then re-run 'make demo'"
    )
    assert last.startswith(DEMO_LINES)
    # the target the line names exists and installs Chromium; `make demo` is the target it re-runs
    makefile = (REPO / "Makefile").read_text()
    target = re.search(r"^browser-deps:\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert (
        target
        and "apt-get" in target.group(1)
        and "install" in target.group(1)
        and "chromium" in target.group(1)
    )
    assert re.search(r"^demo:", makefile, re.MULTILINE)

    monkeypatch.delenv("MAKELEVEL")  # `python -m workbench demo --out elsewhere`, from an installed package
    assert demo.run_demo(tmp_path / "elsewhere") == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        "no chromium found: dashboard.png skipped. Install it (Debian/Ubuntu: apt-get install chromium), "
        f"then re-run 'python -m workbench demo --out {tmp_path / 'elsewhere'}'"
    )
