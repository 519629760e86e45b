"""Every notebook runs end to end under papermill at small parameters (one test per notebook).

Executed copies go to notebooks/executed/ (git-ignored). A failing notebook fails its test with
the failing cell's number, exception name and message. The committed notebooks (and the
quickstart's copy in the package) must equal what `tests/build_notebooks.py` builds from their
jupytext sources, notebooks/*.py, and carry no outputs.

The quickstart runs once per module (`quickstart_run`): its test checks the report, and the
chained tests fine-tune the checkpoint it saved with 04_finetune (`finetune_run`), then tune that
adapter further with 06_preference (DPO) and with 07_grpo (GRPO), as a user runs them. The
kernel is the Python running the tests (`python3_kernel`), whatever kernelspec is installed.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

from tests.build_notebooks import NOTEBOOKS, render, targets

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO / "notebooks"
EXECUTED = NOTEBOOK_DIR / "executed"

# Small parameters: each notebook finishes in well under two minutes on a 2-core CPU.
TEST_PARAMETERS: dict[str, dict[str, object]] = {
    "00_quickstart": {
        "steps": 10,
        "log_every": 5,
        "max_examples": 400,
        "report_html": str(EXECUTED / "quickstart.html"),
    },
    "01_sharding": {"steps": 4, "max_examples": 300, "max_buckets": 2},
    "02_bucketing": {"steps": 6, "max_examples": 300, "max_buckets": 3},
    "03_memory_and_profiling": {"steps": 6, "log_every": 3, "max_examples": 300},
    "04_finetune": {
        "steps": 8,
        "log_every": 4,
        "max_new_tokens": 16,
        "model_dir": None,  # alone: a tiny model from scratch (the chained test loads the quickstart's)
        "adapter_dir": None,
        "merged_dir": None,
    },
    "05_distillation": {
        "teacher_steps": 8,
        "steps": 6,
        "log_every": 3,
        "max_examples": 300,
        "max_buckets": 2,
    },
    "06_preference": {
        "steps": 6,
        "log_every": 3,
        "eval_every": 3,
        "max_new_tokens": 8,
        "adapter_dir": None,  # alone: fresh LoRA on a tiny model (the chained test tunes 04_finetune's adapter)
        "out_dir": None,
    },
    "07_grpo": {
        "sft_steps": 4,  # alone: a tiny model fine-tuned first (the chained test starts from 04_finetune's adapter)
        "hidden_size": 64,
        "num_layers": 2,
        "intermediate_size": 128,
        "sft_batch_size": 4,
        "sft_dir": str(EXECUTED / "math-sft"),
        "num_generations": 4,
        "max_completion_length": 8,
        "steps": 4,
        "batch_size": 2,
        "log_every": 2,
        "eval_every": 4,
        "adapter_dir": None,
        "out_dir": None,
    },
}

# Set per run to paths under a temporary directory: the quickstart saves a checkpoint, 04_finetune
# fine-tunes it and saves the adapter and the merged model, 06_preference tunes that adapter with DPO and
# 07_grpo with GRPO.
CHAINED_PARAMETERS = {
    "00_quickstart": ("save_dir",),
    "04_finetune": ("model_dir", "adapter_dir", "merged_dir"),
    "06_preference": ("adapter_dir", "out_dir"),
    "07_grpo": ("adapter_dir", "out_dir"),
}


def test_every_notebook_has_test_parameters():
    assert set(TEST_PARAMETERS) == set(NOTEBOOKS)
    assert sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb")) == sorted(NOTEBOOKS)
    assert len(NOTEBOOKS) == 8


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_shared_cells_come_from_one_place(name):
    # The install and XLA:CPU cells are written once, in tests/build_notebooks.py.
    source = (NOTEBOOK_DIR / f"{name}.py").read_text()
    assert source.count('# %% shared="install"') == 1 and "find_spec" not in source


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_notebooks_use_the_public_imports(name):
    # What users write: `from workbench.train import Trainer`, `from widgets import Dashboard`, ...
    imports = re.findall(r"^from (\S+) import", (NOTEBOOK_DIR / f"{name}.py").read_text(), re.M)
    private = [m for m in imports if m.startswith(("widgets.", "workbench.train.", "workbench.data."))]
    assert not private, f"{name}.py imports from inside a package: {private}"


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_committed_notebook_is_generated_and_clean(name):
    text = render(name)
    for path in targets(name):
        assert path.read_text() == text, (
            f"{path.relative_to(REPO)} differs from notebooks/{name}.py: run `python -m tests.build_notebooks`"
        )
    nb = nbformat.reads(text, as_version=4)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code_cells), "committed with outputs"
    assert 'find_spec("workbench")' in code_cells[0].source and "pip" in code_cells[0].source
    tagged = [c for c in code_cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0] is code_cells[1]
    # Flat literals only: papermill overrides them by name.
    for line in tagged[0].source.splitlines():
        name_part, _, value = line.partition("=")
        assert name_part.strip().isidentifier(), line
        json.loads(
            value.split("  #")[0]
            .strip()
            .replace("None", "null")
            .replace("True", "true")
            .replace("False", "false")
        )
    for key in [*TEST_PARAMETERS[name], *CHAINED_PARAMETERS.get(name, ())]:
        assert f"\n{key} = " in "\n" + tagged[0].source, (
            f"test parameter {key!r} is not in the parameters cell"
        )


@pytest.fixture(scope="module")
def python3_kernel(tmp_path_factory):
    """A "python3" kernelspec for this interpreter, found first through JUPYTER_PATH: the notebooks
    run on the packages under test, not on whichever environment an installed kernelspec names."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )
    return root


def execute(
    name: str,
    output: Path,
    parameters: dict[str, object],
    kernel_path: Path,
    *,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    timeout: int = 240,
):
    """Run notebooks/<name>.ipynb with papermill into `output`, in the ``python3`` kernel found first
    under `kernel_path`, from `cwd`, the kernel's environment `env` (default: this process's); the
    executed notebook. A failing cell raises papermill's PapermillExecutionError."""
    papermill = pytest.importorskip("papermill")
    output.parent.mkdir(parents=True, exist_ok=True)
    env_before = dict(os.environ)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    # The kernel inherits this environment; it must not inherit XLA settings from elsewhere.
    for key in ("PJRT_DEVICE", "CPU_NUM_DEVICES"):
        os.environ.pop(key, None)
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(kernel_path), os.environ.get("JUPYTER_PATH", "")]
    ).rstrip(os.pathsep)
    try:
        papermill.execute_notebook(
            str(NOTEBOOK_DIR / f"{name}.ipynb"),
            str(output),
            parameters=parameters,
            kernel_name="python3",
            cwd=str(cwd),
            progress_bar=False,
            log_output=False,
            execution_timeout=timeout,
            store_widget_state=False,  # each FigureWidget would store the whole plotly.js bundle
        )
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    return nbformat.read(output, as_version=4)


def run_notebook(name: str, output: Path, parameters: dict[str, object], kernel_path: Path):
    """`execute`, failing the test with the failing cell's number, exception and message."""
    papermill = pytest.importorskip("papermill")
    try:
        nb = execute(name, output, parameters, kernel_path)
    except papermill.PapermillExecutionError as err:
        pytest.fail(
            f"{name}.ipynb failed in cell {err.cell_index} ({err.exec_count=}): {err.ename}: {err.evalue}\n"
            f"executed copy: {output}",
            pytrace=False,
        )
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
    ]
    assert not errors
    return nb


def printed(nb) -> str:
    """Everything the notebook's code cells printed."""
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


@pytest.fixture(scope="module")
def quickstart_run(python3_kernel, tmp_path_factory):
    """The quickstart executed once at its test parameters, saving its model: (notebook, checkpoint)."""
    checkpoint = tmp_path_factory.mktemp("chain") / "quickstart"
    parameters = {**TEST_PARAMETERS["00_quickstart"], "save_dir": str(checkpoint)}
    nb = run_notebook("00_quickstart", EXECUTED / "00_quickstart.ipynb", parameters, python3_kernel)
    return nb, checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_notebook_executes(name, request, python3_kernel):
    if name == "00_quickstart":
        request.getfixturevalue("quickstart_run")  # shared with the chained test
        # The trainer fed the dashboard through its callback; the report holds every interval.
        report = Path(TEST_PARAMETERS[name]["report_html"])
        text = report.read_text()
        assert len(text) > 1_000_000 and not re.search(r"<script[^>]+src=", text)
        found = re.search(r'Plotly\.newPlot\(\s*"workbench-dashboard",\s*(\[.*?\]),\s*\{', text, re.S)
        assert found, "no dashboard figure in the report"
        traces = {t["name"]: t for t in json.loads(found.group(1))}
        assert traces["train loss"]["x"] == [5, 10] and traces["tokens/s"]["x"] == [5, 10]
    else:
        nb = run_notebook(name, EXECUTED / f"{name}.ipynb", TEST_PARAMETERS[name], python3_kernel)
        if name == "06_preference":  # fresh adapters: the reference is the same weights without them
            assert "DPO reference: adapters_off" in printed(nb)
        if name == "07_grpo":  # no adapter given: a tiny model fine-tuned on the format, then GRPO from it
            text = printed(nb)
            assert "fine-tuned a tiny llama" in text and "reward/right_working" in text
            assert re.search(r"compiles: \d+ in warm-up, 0 after it\n", text)


@pytest.fixture(scope="module")
def finetune_run(quickstart_run, python3_kernel, tmp_path_factory):
    """04_finetune on the quickstart's checkpoint (int8 base), saving its adapter and merged model:
    (notebook, checkpoint, adapter, merged)."""
    _, checkpoint = quickstart_run
    assert (checkpoint / "config.json").is_file() and (checkpoint / "tokenizer.json").is_file()
    out = tmp_path_factory.mktemp("finetune")
    adapter, merged = out / "adapter", out / "merged"
    parameters = {
        **TEST_PARAMETERS["04_finetune"],
        "model_dir": str(checkpoint),
        "adapter_dir": str(adapter),
        "merged_dir": str(merged),
        "quantize": "int8",
    }
    nb = run_notebook("04_finetune", EXECUTED / "04_finetune-chained.ipynb", parameters, python3_kernel)
    return nb, checkpoint, adapter, merged


@pytest.mark.slow
def test_finetune_loads_the_quickstart_checkpoint_and_saves_adapter_and_merged_model(finetune_run):
    # What users do: the quickstart saves a checkpoint; 04_finetune fine-tunes it with LoRA on an
    # int8 base (model.quantize), saves the adapter and a merged (dequantized) checkpoint, reloads it.
    nb, checkpoint, adapter, merged = finetune_run
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    assert not (adapter / "model.safetensors").exists(), "the adapter directory holds the whole model"
    assert (merged / "config.json").is_file() and list(merged.glob("*.safetensors"))
    assert not (merged / "adapter_config.json").exists()
    text = printed(nb)
    assert f"{checkpoint}: training " in text, "the quickstart's checkpoint was not the base model"
    assert "base int8) on" in text and "int8 base" in text, "the base was not quantized"
    assert f"reloaded from {merged}: " in text


@pytest.mark.slow
def test_finetune_without_a_checkpoint_says_how_to_make_one(python3_kernel, tmp_path):
    papermill = pytest.importorskip("papermill")
    missing = tmp_path / "checkpoints" / "quickstart"
    with pytest.raises(papermill.PapermillExecutionError) as err:
        execute("04_finetune", tmp_path / "04_finetune.ipynb", {"model_dir": str(missing)}, python3_kernel)
    assert err.value.ename == "FileNotFoundError"
    assert "run 00_quickstart first" in err.value.evalue and "model_dir=None" in err.value.evalue


@pytest.mark.slow
def test_preference_and_grpo_tune_the_finetune_adapter(finetune_run, python3_kernel, tmp_path):
    # SFT, then DPO: 06_preference continues 04_finetune's adapter on the shipped pairs. The
    # reference is the adapter's model ('auto' resolves to 'precompute'), and the tuned adapter is
    # saved as an adapter directory again. Then SFT, then GRPO: 07_grpo continues the same adapter on
    # math-sample's prompts (one test: the chain's 00 and 04 runs serve both).
    _, _, adapter, _ = finetune_run
    tuned = tmp_path / "tuned"
    parameters = {**TEST_PARAMETERS["06_preference"], "adapter_dir": str(adapter), "out_dir": str(tuned)}
    nb = run_notebook("06_preference", EXECUTED / "06_preference-chained.ipynb", parameters, python3_kernel)
    text = printed(nb)
    assert f"{adapter}: training " in text, "04_finetune's adapter was not the starting model"
    assert "DPO reference: precompute" in text, "the reference was not the adapter's model"
    assert "reward_accuracy" in text and "DPO loss" in text
    assert (tuned / "adapter_config.json").is_file() and (tuned / "adapter_model.safetensors").is_file()
    assert not (tuned / "model.safetensors").exists(), "the adapter directory holds the whole model"

    rl_tuned = tmp_path / "grpo"
    parameters = {**TEST_PARAMETERS["07_grpo"], "adapter_dir": str(adapter), "out_dir": str(rl_tuned)}
    nb = run_notebook("07_grpo", EXECUTED / "07_grpo-chained.ipynb", parameters, python3_kernel)
    text = printed(nb)
    assert f"{adapter}: training " in text, "04_finetune's adapter was not the starting model"
    assert "fine-tuned a tiny" not in text, "an SFT ran although the adapter was given"
    assert "held-out accuracy before GRPO" in text and "reward/math_answer" in text
    assert re.search(r"compiles: \d+ in warm-up, 0 after it\n", text)
    assert (rl_tuned / "adapter_config.json").is_file() and not (rl_tuned / "model.safetensors").exists()
