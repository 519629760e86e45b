"""The install files agree: environment.yml installs the same extras pyproject.toml defines."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_environment_yml_matches_pyproject() -> None:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    deps = env["dependencies"]
    assert "python=3.11" in deps
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    installs = [line for line in pip_section if re.match(r"^(-e\s+)?\.\[", line)]
    assert len(installs) == 1, f"environment.yml must install the package once, got {pip_section}"
    extras = set(re.search(r"\[(.*)\]", installs[0]).group(1).split(","))
    assert extras == set(_pyproject()["project"]["optional-dependencies"]), (
        "environment.yml extras differ from pyproject"
    )
    assert _pyproject()["project"]["requires-python"].startswith(">=3.1")


def test_base_dependencies_leave_torch_alone() -> None:
    project = _pyproject()["project"]
    names = [re.split(r"[<>=\[ ]", d)[0].lower() for d in project["dependencies"]]
    assert "torch" not in names and "torch_xla" not in names and "torch-xla" not in names
    for needed in ("transformers", "datasets", "tokenizers"):
        assert needed in names
    xla_cpu = project["optional-dependencies"]["xla-cpu"]
    assert xla_cpu[:2] == ["torch==2.9.0", "torch_xla==2.9.0"]
    assert any(d.startswith("transformers>=5") for d in xla_cpu), (
        "the XLA:CPU environment runs transformers 5"
    )
    notebook = " ".join(project["optional-dependencies"]["notebook"])
    for needed in ("jupyterlab", "ipywidgets", "anywidget", "plotly", "papermill", "ipykernel"):
        assert needed in notebook


def test_widgets_extra_is_slim_and_inside_notebook() -> None:
    extras = _pyproject()["project"]["optional-dependencies"]
    widgets = extras["widgets"]
    names = {re.split(r"[<>=\[ ]", d)[0].lower() for d in widgets}
    # What a live Colab/Kaggle kernel needs for the UI, and nothing that replaces its Jupyter.
    assert names == {"ipywidgets", "anywidget", "plotly"}
    assert set(widgets) <= set(extras["notebook"]), "notebook must carry widgets' pins unchanged"
    # Colab's TPU image ships ipywidgets 7.7.1, the version its frontend draws: the install keeps it
    (ipywidgets,) = [Requirement(d) for d in widgets if d.startswith("ipywidgets")]
    assert ipywidgets.specifier.contains("7.7.1") and ipywidgets.specifier.contains("8.1.5")


def test_notebook_install_cell_installs_the_widgets_extra() -> None:
    from tests.build_notebooks import INSTALL

    spec = re.search(r'"(xla-workbench\[[^\]]+\][^"]*)"', INSTALL).group(1)
    assert spec.startswith("xla-workbench[widgets] @ "), spec


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
