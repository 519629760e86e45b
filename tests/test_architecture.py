"""The layout rules of docs/ARCHITECTURE.md, checked on the source: the runtime seam, sizes, names (the layers: test_imports.py)."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("workbench", "widgets")

# The layers and the import graph (no circle, no upward import) are tests/test_imports.py's.


def _modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _runtime_imports(tree: ast.Module) -> list[tuple[str, int]]:
    """(module, line) of every import that runs (those under `if TYPE_CHECKING:` do not)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "workbench":  # `from workbench import runtime` style: the names are modules
                found += [(f"workbench.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
    return found


def test_torch_xla_is_imported_only_behind_the_runtime_seam():
    # the xla room: runtime.py, the TPU-only Pallas attention call kept apart from it (`tpu_attention.py`),
    # and the host placements of offloaded checkpoints (`host_offload.py`)
    seam = {
        REPO / "workbench" / "backend" / "xla" / name
        for name in ("runtime.py", "tpu_attention.py", "host_offload.py")
    }
    wrong = [
        f"{path.relative_to(REPO)}:{line}"
        for package in PACKAGES
        for path in _modules(package)
        if path not in seam
        for target, line in _runtime_imports(ast.parse(path.read_text()))
        if target.split(".")[0] == "torch_xla"
    ]
    assert not wrong, (
        f"torch_xla imported outside workbench/backend/xla/runtime.py, tpu_attention.py and host_offload.py: {wrong}"
    )


TRAINING_LAYER = ("train", "rl")
"""Packages of `workbench` that run on any execution backend without asking which one it is."""
ASKING_THE_BACKEND = (
    "generate.py",
    "decoding.py",
    "generation_controls.py",
    "analysis/trace.py",
    "analysis/advice.py",
)
"""Modules that ask the `Backend` too: sampling (fixed rows and a static cache where each new shape
compiles, the step's end, the RNG, host copies), the profiler's traces and its advice."""
EXECUTION_MODEL_WORDS = ("xla", "ranks")


def _names_in(test: ast.AST) -> list[str]:
    """Every identifier, attribute and string a condition reads."""
    names = []
    for node in ast.walk(test):
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.append(node.value)
    return names


def _python_files(path: Path) -> list[Path]:
    """`path` itself when it is a module, else every module under it (a path that holds none fails)."""
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    assert files, f"{path.relative_to(REPO)} holds no module: name what it became"
    return files


def _conditions(tree: ast.Module) -> list[ast.AST]:
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            found.append(node.test)
        elif isinstance(node, ast.comprehension):
            found.extend(node.ifs)
        elif isinstance(node, ast.Match):
            found.append(node.subject)
    return found


def test_the_training_layer_never_branches_on_the_execution_model():
    """`workbench.train` and `workbench.rl` (and the `ASKING_THE_BACKEND` modules) ask the backend
    (`workbench.backend.protocol`: `Backend`, `Replicas`) instead of testing whether they run on
    torch_xla or across torchrun's ranks."""
    wrong = []
    for package in TRAINING_LAYER + ASKING_THE_BACKEND:
        for path in _python_files(REPO / "workbench" / package):
            for test in _conditions(ast.parse(path.read_text())):
                named = [n for n in _names_in(test) if any(w in n.lower() for w in EXECUTION_MODEL_WORDS)]
                if named:
                    wrong.append(f"{path.relative_to(REPO)}:{test.lineno}: {ast.unparse(test)}")
    assert not wrong, "the training layer branches on the execution model:\n" + "\n".join(wrong)


OBJECTIVE_BLIND = ("train", "data", "analysis/estimate.py", "analysis/config_estimate.py",
                   "analysis/activations.py", "analysis/state_bytes.py", "analysis/objective_memory.py",
                   "analysis/batch.py", "analysis/long_context.py")  # fmt: skip
"""The code every objective runs through without asking which it is: the training loop (step, warm-up,
streams, checkpoints), the data layer and the memory estimate."""
OBJECTIVES_OWN = ("data/preference.py", "data/prompts.py")
"""Modules of the data layer that are one objective's own: DPO's pairs, GRPO's prompts."""
OBJECTIVE_WORDS = ("sft", "dpo", "grpo", "distill", "teacher", "preference", "rollout", "reward")


def _objective_names(test: ast.AST) -> list[str]:
    """What a condition reads that names an objective: ``train.objective``, or a word of one."""
    named = [n for n in _names_in(test) if any(w in n.lower() for w in OBJECTIVE_WORDS)]
    return named + [
        ast.unparse(node)
        for node in ast.walk(test)
        if isinstance(node, ast.Attribute)
        and node.attr == "objective"
        and ast.unparse(node).endswith("train.objective")
    ]


def test_the_loop_the_data_and_the_estimate_never_ask_which_objective_runs():
    """They call the objective protocol (`workbench.objective_registry.Objective`,
    `workbench.train.objective_run.ObjectiveRun`, the estimate's `StepRows`) instead of testing
    ``train.objective`` or an objective's name; the objectives' own modules are exempt."""
    wrong = []
    for part in OBJECTIVE_BLIND:
        root = REPO / "workbench" / part
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            if str(path.relative_to(REPO / "workbench")) in OBJECTIVES_OWN:
                continue
            for test in _conditions(ast.parse(path.read_text())):
                if _objective_names(test):
                    wrong.append(f"{path.relative_to(REPO)}:{test.lineno}: {ast.unparse(test)}")
    assert not wrong, "code below the objectives asks which objective runs:\n" + "\n".join(wrong)


def test_the_headless_package_never_imports_ui_code():
    wrong = [
        f"{path.relative_to(REPO)}:{line} imports {target}"
        for path in _modules("workbench")
        for target, line in _runtime_imports(ast.parse(path.read_text()))
        if target.split(".")[0] in ("widgets", "ipywidgets", "plotly", "anywidget", "IPython")
    ]
    assert not wrong


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_600_lines(package):
    long = {
        str(p.relative_to(REPO)): n for p in _modules(package) if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, f"split these by job: {long}"


def test_the_trainer_class_stays_under_300_lines():
    tree = ast.parse((REPO / "workbench" / "train" / "trainer.py").read_text())
    (trainer,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer"]
    assert trainer.end_lineno - trainer.lineno + 1 < 300


def _public_definitions(path: Path) -> list[str]:
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                names += [e.id for e in elements if isinstance(e, ast.Name)]
    return [n for n in names if not n.startswith("_") and n != "__all__"]


def test_no_public_name_is_defined_in_two_modules():
    where = collections.defaultdict(list)
    for package in PACKAGES:
        for path in _modules(package):
            for name in _public_definitions(path):
                where[name].append(_module_name(path))
    twice = {name: modules for name, modules in where.items() if len(modules) > 1}
    assert not twice, f"defined in more than one module (define once, import elsewhere): {twice}"


def test_a_notebook_saved_before_the_backend_rooms_still_imports_what_moved():
    with pytest.warns(
        DeprecationWarning, match=r"workbench\.backend\.runtime moved to workbench\.backend\.xla\.runtime"
    ):
        from workbench.backend import runtime
    from workbench.backend.xla import runtime as moved

    assert runtime is moved
    with pytest.raises(ImportError):
        from workbench.backend import no_such_module  # noqa: F401
