"""`python -m workbench demo`: the papermill plumbing, the report and its screenshot.

The quickstart notebook itself runs in tests/test_notebooks.py; here small stand-in notebooks
check what the demo does around it (parameters, outputs, the failing-cell message, the PNG).
"""

from __future__ import annotations

import subprocess

import nbformat
import pytest

from workbench import demo

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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
