"""`make demo` / ``python -m workbench demo``: run the quickstart notebook headless and keep its report.

Executes the quickstart notebook with papermill on whatever hardware is there and writes

- ``<out>/quickstart.ipynb``: the executed notebook (text outputs; widget state is not stored,
  since each plot widget would carry the whole plotly.js bundle);
- ``<out>/quickstart.html``: the training dashboard's own export, a self-contained page with
  plotly.js embedded and the run's config — it opens offline, which an nbconvert rendering of the
  executed notebook would not (its widgets need a live kernel or stored widget state);
- ``<out>/dashboard.png``: a headless Chromium screenshot of that page, when Chromium is installed.

The notebook is package data, ``workbench/notebooks/00_quickstart.ipynb`` (a copy of
``notebooks/00_quickstart.ipynb`` that tests/build_notebooks.py writes), so the demo runs from an
installed distribution as well as from a checkout, in whatever directory it is started from.

The terminal shows only the demo's own lines: the kernel papermill starts shares the terminal's
stderr, so what it would print there is fixed where it comes from (`kernel_manager_config`).

This module imports papermill only when it runs; it never imports the widget libraries itself
(the notebook does, in its own kernel).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traitlets.config import Config

# The quickstart inside the installed `workbench` package (see pyproject's package-data).
QUICKSTART = ("notebooks", "00_quickstart.ipynb")
# What Debian's Chromium needs to run headless here: no sandbox as root, no GPU, and nothing
# that reaches for the network (there is none).
CHROMIUM_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def quickstart_notebook() -> Path:
    """The quickstart notebook shipped inside the `workbench` package, wherever it is installed."""
    return Path(str(resources.files("workbench").joinpath(*QUICKSTART)))


def kernel_manager_config() -> Config:
    """The settings of the kernel manager papermill starts: CurveZMQ keys for the kernel's sockets.

    ipykernel 7 logs "Kernel is running over TCP without encryption ..." on its stderr, which is
    the terminal's, whenever its sockets are plain TCP. jupyter_client provisions CurveZMQ keys
    when `KernelManager.transport_encryption` asks for them and the kernelspec declares
    ``supported_encryption: ["curve"]`` (ipykernel's own spec, the one `make venv` installs, does).
    "auto" rather than "required": a kernelspec without that declaration still starts, unencrypted,
    instead of failing the demo. Nothing is set where this jupyter_client has no such setting or
    libzmq was built without CURVE (it would be refused or warned about as unknown).
    """
    import zmq
    from jupyter_client.manager import KernelManager
    from traitlets.config import Config

    config = Config()
    if zmq.has("curve") and KernelManager.class_traits().get("transport_encryption") is not None:
        config.KernelManager.transport_encryption = "auto"
    return config


def quiet_kernel_manager_class() -> type:
    """jupyter_client's `AsyncKernelManager`, except that shutting a kernel down sends it no SIGINT.

    jupyter_client interrupts a kernel before asking it to shut down. papermill shuts the kernel down
    after the last cell, when it is idle, but it may still be handling a message (a widget's comm
    message): the interrupt lands there and ipykernel logs "KeyboardInterrupt caught in kernel" on its
    stderr, the terminal's. An idle kernel needs no interrupt to shut down; a kernel that does not
    answer is still terminated and then killed by jupyter_client's own escalation.
    """
    from jupyter_client import AsyncKernelManager

    class QuietShutdownKernelManager(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:
            if self.shutting_down:
                return
            await super()._async_interrupt_kernel()

    return QuietShutdownKernelManager


def find_chromium() -> str | None:
    """The Chromium (or Chrome) binary on PATH, if any."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot_html(
    html_path: str | Path, png_path: str | Path, *, width: int = 1280, height: int = 1150
) -> bool:
    """Screenshot a static HTML file with headless Chromium.

    False when no Chromium is installed or it fails (the reason is printed to stderr): the
    screenshot is an extra, and a browser crash must not turn a successful run into an error.
    """
    chromium = find_chromium()
    if chromium is None:
        return False
    png_path = Path(png_path).resolve()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        try:
            subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--hide-scrollbars",
                    *CHROMIUM_FLAGS,
                    f"--user-data-dir={profile}",
                    f"--window-size={width},{height}",
                    "--virtual-time-budget=10000",  # let plotly lay out and draw before the capture
                    f"--screenshot={png_path}",
                    Path(html_path).resolve().as_uri(),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
        except subprocess.CalledProcessError as err:
            tail = (err.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
            print(
                f"screenshot skipped: {chromium} exited with status {err.returncode}"
                + (f": {' / '.join(tail)}" if tail else ""),
                file=sys.stderr,
            )
            return False
        except subprocess.TimeoutExpired as err:
            print(f"screenshot skipped: {chromium} did not finish in {err.timeout:.0f} s", file=sys.stderr)
            return False
        except OSError as err:  # e.g. the binary on PATH is not executable
            print(f"screenshot skipped: cannot run {chromium}: {err}", file=sys.stderr)
            return False
    return png_path.exists()


def run_demo(
    out_dir: str | Path = "reports",
    *,
    notebook: str | Path | None = None,
    parameters: dict[str, Any] | None = None,
    screenshot: bool = True,
) -> int:
    """Execute the quickstart (or `notebook`) headless; 0 on success, 1 when a cell fails (its
    error is printed). The kernel runs in the current directory."""
    try:
        import papermill
    except ImportError:
        print("error: the demo needs papermill: pip install -e '.[notebook]'", file=sys.stderr)
        return 1
    notebook = quickstart_notebook() if notebook is None else Path(notebook)
    if not notebook.is_file():
        print(f"error: {notebook} not found (is the package installed with its data?)", file=sys.stderr)
        return 1
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    executed, report = out / "quickstart.ipynb", out / "quickstart.html"
    params = {"report_html": str(report), **(parameters or {})}
    print(f"running {notebook.name} headless with papermill (parameters: {params}) ...", flush=True)
    try:
        papermill.execute_notebook(
            str(notebook),
            str(executed),
            parameters=params,
            kernel_name="python3",
            cwd=str(Path.cwd()),
            progress_bar=False,
            log_output=False,
            store_widget_state=False,
            config=kernel_manager_config(),
            kernel_manager_class=quiet_kernel_manager_class(),
        )
    except papermill.PapermillExecutionError as err:
        print(
            f"error: {notebook.name} failed in cell {err.cell_index}: {err.ename}: {err.evalue}\n"
            f"the executed notebook is at {executed}",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {executed}")
    print(f"wrote {report}")
    if screenshot:
        png = out / "dashboard.png"
        if screenshot_html(report, png):
            print(f"wrote {png}")
        elif find_chromium() is None:
            print(no_chromium_line(out_dir))  # the last line: how a newcomer gets the picture too
        else:
            print("chromium failed (reason above): skipped the dashboard screenshot")
    return 0


def no_chromium_line(out_dir: str | Path = "reports", environ: Mapping[str, str] | None = None) -> str:
    """The demo's last line when no Chromium is installed: how to get one, and the command to run again.

    Under `make demo` (make sets ``MAKELEVEL`` in its commands' environment) the checkout's Makefile
    is at hand, whose ``browser-deps`` target installs Debian's Chromium when run as root; a demo
    started any other way (an installed package, no Makefile) gets the package manager's command and
    its own command line back (with ``--out`` where it wrote elsewhere than ``reports``).
    """
    env = os.environ if environ is None else environ
    if env.get("MAKELEVEL"):
        how, rerun = "with 'make browser-deps' (as root; it runs apt-get install chromium)", "make demo"
    else:
        out = "" if str(out_dir) == "reports" else f" --out {shlex.quote(str(out_dir))}"
        how, rerun = "(Debian/Ubuntu: apt-get install chromium)", f"python -m workbench demo{out}"
    return f"no chromium found: dashboard.png skipped. Install it {how}, then re-run '{rerun}'"
