"""The hosted-runtime tier: Colab's and Kaggle's TPU images as they are, with the workbench installed the
way its notebooks install it there, running what a user runs, on XLA:CPU.

Each image is a pins file (tests/hosted/colab-tpu.txt, kaggle-tpu.txt: the published package list's
versions, its source and date) built into a virtual environment on the image's Python
(tests/hosted/stacks.py; cached between runs, see docs/hosted-runtimes.md), with this checkout's wheel
installed without dependencies. Per image, in as few processes as the flows allow (tests/hosted/flows.py):

- the doctor on a simulated TPU VM of Colab (``/dev/accel0``, ``/content``) and of Kaggle
  (``/kaggle/working``), with the environment's real versions: no failed check, and no advice to upgrade
  the packages of the kernel the runtime runs;
- ``info``, ``smoke``, the quickstart's training (whose losses must equal the main environment's, on
  Python 3.11, 3.12 and 3.13);
- ``train`` on an fsdp=8 mesh, LoRA on an int8 base with the decoder stack scanned, ``generate`` from the
  adapter and from the base; on Colab's image once more with torchax unimportable (jax alone);
- notebooks/04_finetune.ipynb through papermill, in a kernel whose Python is the image's environment.

A stack that cannot be built fails with the installer's error (uv's for the image's pins, pip's for the
project), never a skip. The image's own pins must survive the install: pip keeps its torch, torch_xla,
libtpu, jax and transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.hosted import stacks
from tests.hosted.flows import RESULT_MARK
from tests.test_notebooks import TEST_PARAMETERS, execute
from workbench.doctor.roots import canonical_name

pytestmark = pytest.mark.hosted

REPO = Path(__file__).resolve().parent.parent
FLOWS = REPO / "tests" / "hosted" / "flows.py"
STACKS = stacks.STACK_NAMES
HOSTS = ("colab", "kaggle")
KEPT = (
    "torch",
    "torch-xla",
    "libtpu",
    "jax",
    "jaxlib",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "datasets",
    "huggingface-hub",
    "numpy",
)
"""The image's pins the project's install must leave as they are (the rest is reported, not required)."""
KERNEL_PACKAGES = ("ipykernel", "ipython", "jupyter-client", "jupyter_client", "notebook", "traitlets")
"""A hosted runtime's own kernel: the doctor may name them, never tell a user to upgrade them."""
LAUNCH_TIMEOUT_S = 900


def _clean_env(devices: int) -> dict[str, str]:
    """The environment of a process in a hosted stack: XLA on `devices` CPU devices, nothing of the checkout
    on the path (the installed distribution is what runs), no inherited torch_xla debug settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PT_XLA_DEBUG", "XLA_", "COLAB_", "KAGGLE_"))
        and k not in ("PYTHONPATH", "VIRTUAL_ENV", "XLA_WORKBENCH_CACHE")
    }
    env.update({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices), "PYTHONUNBUFFERED": "1"})
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_flows(python: Path, part: str, devices: int, **params: Any) -> dict[str, Any]:
    """tests/hosted/flows.py's `part` in `python`'s environment, from a directory outside the checkout."""
    with tempfile.TemporaryDirectory(prefix=f"wb-hosted-{part}-") as work:
        proc = subprocess.run(
            [str(python), str(FLOWS), part, json.dumps({"work": work, **params})],
            cwd=work,
            env=_clean_env(devices),
            capture_output=True,
            text=True,
            timeout=LAUNCH_TIMEOUT_S,
        )
    results = [line[len(RESULT_MARK) :] for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not results:
        tail = "\n".join((proc.stdout + "\n" + proc.stderr).strip().splitlines()[-40:])
        pytest.fail(f"{python} flows.py {part} exited {proc.returncode}:\n{tail}", pytrace=False)
    return json.loads(results[-1])


class HostedRuns:
    """The stacks the selected tests need, built one after the other in a background thread (the next one
    builds while the tests of the first run), and each of their flows run once, whichever test asks first."""

    def __init__(self, scratch: Path, names: list[str]) -> None:
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hosted-build")
        wheel = self._builder.submit(stacks.build_project_wheel, scratch / "wheel")
        self._stacks = {name: self._builder.submit(self._build, name, wheel) for name in names}
        self._runs: dict[tuple[str, str], Any] = {}

    @staticmethod
    def _build(name: str, wheel: Future[Path]) -> stacks.Stack:
        found = stacks.ensure_stack(name)
        stacks.install_project(found, wheel.result())
        return found

    def stack(self, name: str) -> stacks.Stack:
        try:
            found = self._stacks[name].result()
        except stacks.StackBuildError as err:
            pytest.fail(f"the {name} stack cannot be built: {err}", pytrace=False)
        if found.python_note:
            warnings.warn(f"{name}: {found.python_note}", UserWarning, stacklevel=1)
        return found

    def _once(self, name: str, part: str, make: Callable[[], Any]) -> Any:
        """`make()`'s result, or its failure, kept for every later test (a failed launch is not rerun)."""
        if (name, part) not in self._runs:
            try:
                self._runs[name, part] = make()
            except pytest.fail.Exception as failed:
                self._runs[name, part] = failed
        found = self._runs[name, part]
        if isinstance(found, pytest.fail.Exception):
            pytest.fail(str(found), pytrace=False)
        return found

    def session(self, name: str) -> dict[str, Any]:
        return self._once(name, "session", lambda: run_flows(self.stack(name).interpreter, "session", 1))

    def mesh(self, name: str, **params: Any) -> dict[str, Any]:
        part = "mesh" + "".join(f" {key}={value}" for key, value in sorted(params.items()))
        return self._once(name, part, lambda: run_flows(self.stack(name).interpreter, "mesh", 8, **params))

    def main_quickstart(self) -> dict[str, Any]:
        return self._once("main", "quickstart", lambda: run_flows(Path(sys.executable), "quickstart", 1))

    def close(self) -> None:
        self._builder.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def hosted(request, tmp_path_factory) -> Iterator[HostedRuns]:
    """The stacks this session's selected tests use (every stack when one of them compares them all)."""
    here = [item for item in request.session.items if item.module is request.module]
    named = {item.callspec.params.get("name") if hasattr(item, "callspec") else None for item in here}
    names = list(STACKS) if None in named else [name for name in STACKS if name in named]
    runs = HostedRuns(tmp_path_factory.mktemp("hosted"), names)
    yield runs
    runs.close()


def _pins(name: str) -> dict[str, Requirement]:
    _, lines = stacks.pins_of(stacks.HERE / f"{name}.txt")
    return {canonical_name(Requirement(line).name): Requirement(line) for line in lines}


def _command_ok(flow: dict[str, Any]) -> str:
    """The flow's output, after checking it exited 0."""
    text = f"{flow['stdout']}\n{flow['stderr']}"
    assert flow["code"] == 0, f"workbench {' '.join(flow['argv'][:1])} exited {flow['code']}:\n{text[-3000:]}"
    return text


@pytest.mark.parametrize("name", STACKS)
def test_the_install_keeps_the_image_s_pins(hosted, name):
    versions = hosted.session(name)["versions"]
    changed = {
        pkg: f"{pin.specifier} -> {versions.get(pkg, 'missing')}"
        for pkg, pin in _pins(name).items()
        if pkg in KEPT and not pin.specifier.contains(versions.get(pkg, "0"), prereleases=True)
    }
    assert not changed, f"installing xla-workbench[widgets] replaced the image's {changed}"
    assert versions.get("xla-workbench") and versions.get("peft"), "the project or its peft is missing"
    assert hosted.session(name)["jax_bridge"]["jax"], "both images have jax"


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("name", STACKS)
def test_the_doctor_on_a_simulated_tpu_vm_reports_no_failure(hosted, name, host):
    report = hosted.session(name)["doctor"][host]
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert not failed, f"{name} on a {host} TPU VM:\n{report['table']}"
    assert report["ok"]
    session = next(c for c in report["checks"] if c["name"] == "session")
    assert ("Colab" if host == "colab" else "Kaggle") in session["saw"], report["table"]
    for check in report["checks"]:
        fix = (check["fix"] or "").lower()
        advised = [pkg for pkg in KERNEL_PACKAGES if pkg.replace("_", "-") in fix.replace("_", "-")]
        assert not advised, f"the doctor tells a hosted user to change the runtime's kernel: {check}"


@pytest.mark.parametrize("name", STACKS)
def test_info_and_smoke_run(hosted, name):
    run = hosted.session(name)
    _command_ok(run["info"])
    info = json.loads(run["info"]["stdout"])
    assert info["via_xla"] and info["num_devices"] == 1
    assert "smoke OK: loss fell" in _command_ok(run["smoke"])


@pytest.mark.parametrize("name", STACKS)
def test_lora_on_an_int8_base_scanned_on_an_fsdp_mesh_trains_and_generates(hosted, name):
    run = hosted.mesh(name)
    text = _command_ok(run["train"])
    assert "trained 3/3 steps" in text and "0 after warm-up" in text, text[-3000:]
    assert run["metrics"]["hardware"]["num_devices"] == 8 and run["metrics"]["config"]["mesh"]["fsdp"] == 8
    assert "model.quantize=int8: " in text, "the base was not quantized"
    assert run["scans"] == [{"scanned": True, "layers": 2}], (
        f"the decoder stack was not scanned: {run['scans']}"
    )
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(run["adapter_files"])
    assert "model.safetensors" not in run["adapter_files"], "the adapter directory holds the whole model"
    for which in ("adapter", "base"):
        out = _command_ok(run["generate"][which])
        assert out.startswith("How do I open a file?") and "tokens in" in out, (
            f"generate from the {which}: {out}"
        )


def test_a_scanned_mesh_run_with_jax_but_not_torchax_trains(hosted):
    # torch_xla 2.9's own scan backward under SPMD reaches jax through torchax (`call_jax`) and raised
    # "Jax is required for this feature" where torchax cannot import (its wheel's copy needs flax); the
    # workbench's plain backward runs instead on every stack
    run = hosted.mesh("colab-tpu", without_torchax=True, generate=False)
    assert run["jax_bridge"] == {"jax": True, "torchax": False}, run["jax_bridge"]
    text = _command_ok(run["train"])
    assert "trained 3/3 steps" in text, text[-3000:]
    assert run["scans"] == [{"scanned": True, "layers": 2}], (
        f"the decoder stack was not scanned: {run['scans']}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", STACKS)
def test_the_finetune_notebook_runs_in_the_image_s_kernel(hosted, name, tmp_path):
    papermill = pytest.importorskip("papermill")
    found = hosted.stack(name)
    kernels = tmp_path / "jupyter" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    argv = [str(found.interpreter), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (kernels / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": name, "language": "python"})
    )
    work = tmp_path / "work"  # not the checkout: the kernel imports the installed workbench
    work.mkdir()
    adapter, merged = work / "adapter", work / "merged"
    parameters = {**TEST_PARAMETERS["04_finetune"], "adapter_dir": str(adapter), "merged_dir": str(merged)}
    output = tmp_path / "04_finetune.ipynb"
    try:
        execute(
            "04_finetune", output, parameters, tmp_path / "jupyter", cwd=work, env=_clean_env(1), timeout=300
        )
    except papermill.PapermillExecutionError as err:
        pytest.fail(
            f"04_finetune in {name}'s kernel failed in cell {err.cell_index}: {err.ename}: {err.evalue}"
        )
    nb = json.loads(output.read_text())
    printed = "".join(
        "".join(o.get("text", ""))
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
    )
    assert nb["metadata"]["language_info"]["version"] == found.python_version, "not the image's Python"
    assert (adapter / "adapter_config.json").is_file() and (merged / "config.json").is_file()
    assert f"reloaded from {merged}: " in printed, printed[-2000:]


def test_the_quickstart_gives_the_same_losses_on_every_python(hosted):
    runs = {"main": hosted.main_quickstart(), **{name: hosted.session(name)["quickstart"] for name in STACKS}}
    pythons = {name: run["python"] for name, run in runs.items()}
    reference = runs["main"]
    for name, run in runs.items():
        assert run["tokens_sha256"] == reference["tokens_sha256"], (
            f"{name} (Python {run['python']}) trains on other data than the main environment "
            f"(Python {reference['python']}): {pythons}"
        )
        assert run["losses"] == pytest.approx(reference["losses"], abs=2e-4), (
            f"quickstart losses differ: { {n: (r['python'], r['losses']) for n, r in runs.items()} }"
        )
