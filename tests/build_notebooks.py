"""Build the committed notebooks/*.ipynb from their jupytext sources, notebooks/*.py.

Each source is one notebook written as plain Python in jupytext's percent format
(https://jupytext.readthedocs.io): a ``# %%`` line starts a cell, and its header marks the kind::

    # %% [markdown]             a markdown cell, its lines commented out
    # %% tags=["parameters"]    the flat literals papermill overrides
    # %% shared="install"       filled with INSTALL below: the same first cell in every notebook
    # %% shared="doctor"        filled with DOCTOR below: the preflight check, right after the parameters
    # %% shared="xla_on_cpu"    filled with XLA_ON_CPU below

Edit a source, then regenerate the notebooks (no outputs, stable cell ids, a python3 kernel)::

    python -m tests.build_notebooks

The quickstart is also written into the package (`PACKAGED`), where `python -m workbench demo`
finds it in an installed distribution. `tests/test_notebooks.py` checks that every committed
file equals what this module builds, then executes each notebook with papermill.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(p.stem for p in NOTEBOOK_DIR.glob("[0-9]*.py"))
# Package data (pyproject.toml's [tool.setuptools.package-data]); workbench.demo reads it.
PACKAGED = {"00_quickstart": REPO / "workbench" / "notebooks" / "00_quickstart.ipynb"}

INSTALL = """\
# Colab / Kaggle: install the workbench when it is missing. Anywhere else this cell changes nothing.
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

# Where pip gets the project on a hosted runtime; set WORKBENCH_PIP_SPEC to use a fork or a wheel.
# No `xla-cpu` extra: Colab and Kaggle TPU images ship a matched torch / torch_xla pair. `widgets`, not
# `notebook`: the running kernel needs the UI libraries only, not a second Jupyter over the runtime's own.
PIP_SPEC = os.environ.get("WORKBENCH_PIP_SPEC", "xla-workbench[widgets] @ git+https://github.com/xla-workbench/xla-workbench")

if importlib.util.find_spec("workbench") is None:
    checkout = next((p for p in (Path.cwd(), *Path.cwd().parents) if (p / "workbench" / "__init__.py").exists()), None)
    if checkout is not None:  # a clone of the repository: use it as it is
        sys.path.insert(0, str(checkout))
    elif any(k.startswith(("COLAB_", "KAGGLE_")) for k in os.environ):
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", PIP_SPEC])
    else:
        raise ModuleNotFoundError("workbench is not installed here: run `pip install -e '.[notebook]'` in the repository")
if any(k.startswith("COLAB_") for k in os.environ):
    from google.colab import output  # Colab draws third-party widgets (the workbench's plots are anywidgets) only when asked

    output.enable_custom_widget_manager()"""

# The first cell that does anything after installing (the parameters cell only names values): a session
# that cannot train stops here, with the fixes, instead of in a traceback a few cells later.
DOCTOR = """\
# Preflight (`python -m workbench doctor` in a terminal): torch / torch_xla / libtpu versions that work together,
# a TPU no other process holds, Drive or Kaggle storage, disk and memory. A failed check stops here with its fix.
from IPython.display import display

from workbench import doctor

report = doctor()  # versions come from package metadata: this runs even where importing torch_xla would crash
if report.ok:
    from widgets.doctor_view import doctor_view  # the widgets import torch: only once the versions check out

    display(doctor_view(report))
else:
    print(report.table())
report.raise_on_fail()"""

# No TPU or GPU: XLA on the CPU still shows the XLA story (compiles, shapes, SPMD meshes).
XLA_ON_CPU = """\
# Without a TPU or GPU, run XLA on the CPU (set before torch_xla starts; a TPU or GPU is used as it is).
from workbench.backend.xla import presence, runtime

if cpu_xla_devices and not presence.tpu_present() and "PJRT_DEVICE" not in os.environ and not runtime.runtime_started():
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["CPU_NUM_DEVICES"] = str(cpu_xla_devices)"""

SHARED = {"install": INSTALL, "doctor": DOCTOR, "xla_on_cpu": XLA_ON_CPU}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook `name` as committed, from ``notebooks/<name>.py``."""
    source = NOTEBOOK_DIR / f"{name}.py"
    nb = jupytext.reads(source.read_text(), fmt="py:percent")
    for i, cell in enumerate(nb.cells):
        shared = cell.metadata.pop("shared", None)
        if shared is not None:
            if shared not in SHARED or cell.source.strip():
                raise ValueError(
                    f"{source.name}: cell {i} must be an empty shared cell, one of {sorted(SHARED)}"
                )
            cell.source = SHARED[shared]
        # Only tags reach the notebook; jupytext's own bookkeeping stays out.
        cell.metadata = {"tags": cell.metadata["tags"]} if cell.metadata.get("tags") else {}
        cell["id"] = f"{name[:2]}-{i:02d}"  # stable ids: regenerating changes nothing
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "accelerator": "TPU",
    }
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(name)) + "\n"


def targets(name: str) -> list[Path]:
    """Every file the notebook `name` is committed as."""
    return [NOTEBOOK_DIR / f"{name}.ipynb", *([PACKAGED[name]] if name in PACKAGED else [])]


def main() -> int:
    for name in NOTEBOOKS:
        text = render(name)
        for path in targets(name):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print("wrote", path.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
