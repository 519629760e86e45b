"""The import graph of `workbench` and `widgets`, held to docs/ARCHITECTURE.md's layers: no circle, no upward import.

The graph: one node per module (a package is its ``__init__``), one edge per import statement whose target is
one of those modules, wherever the statement sits: at the top, inside a function, under
``if TYPE_CHECKING:`` (an annotation ties two modules together too), absolute or relative. ``from P import
name`` is an edge to the module ``P.name`` when there is one, else to ``P``. Not counted: the parent packages
Python imports on the way to a module (``workbench.data`` before ``workbench.data.records``), and imports by
a string (``importlib.import_module``).

The layers are data here, `LAYERS`, in the order and with the words of ARCHITECTURE.md's table (a test
checks that the two agree). A layer may import the layers it names and, through them, everything those
may; modules of one layer import each other freely, so long as no circle closes. The tests fail on any
circle and on any import from a lower layer into a higher one.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"


@dataclass(frozen=True)
class Layer:
    holds: tuple[str, ...]
    """Its modules and packages, by their name under ``workbench`` (``config``, ``backend``, ...)."""
    may_import: tuple[str, ...]
    """The layers below it that it names; it may import what they may, too."""


LAYERS: dict[str, Layer] = {
    "config": Layer(
        (
            "units",
            "config",
            "config_checks",
            "config_parse",
            "config_reference",
            "config_grpo",
            "families",
            "objective_registry",
        ),
        (),
    ),
    "hub": Layer(("hub",), ()),
    "model_dirs": Layer(("model_dirs",), ("hub",)),
    "gguf": Layer(("gguf",), ()),
    "backend": Layer(("backend",), ("config",)),
    "trackers": Layer(("trackers",), ("backend",)),
    "models": Layer(("models",), ("backend", "hub")),
    "parallel": Layer(("parallel",), ("backend", "models")),
    "data": Layer(("data",), ("backend", "model_dirs")),
    "analysis": Layer(("analysis",), ("backend", "models", "parallel")),
    "train": Layer(
        ("train",),
        (
            "config",
            "hub",
            "model_dirs",
            "gguf",
            "backend",
            "trackers",
            "models",
            "parallel",
            "data",
            "analysis",
        ),
    ),
    "rl": Layer(("rl",), ("train", "generation")),
    "generation": Layer(("generate", "decoding", "generation_controls"), ("backend",)),
    "objectives": Layer(("objectives",), ("train", "rl", "generation")),
    "commands": Layer(
        (
            "__init__",
            "demo",
            "smoke",
            "__main__",
            "run",
            "launch",
            "eval_command",
            "eval_rewards",
            "eval_setup",
            "export_command",
            "publish",
            "plan_command",
            "interrupt",
            "config_command",
            "doctor",
        ),
        (
            "config",
            "hub",
            "model_dirs",
            "gguf",
            "backend",
            "trackers",
            "models",
            "parallel",
            "data",
            "analysis",
            "train",
            "rl",
            "generation",
            "objectives",
        ),
    ),
}
"""`workbench`'s layers, bottom to top, as ARCHITECTURE.md's table lists them (``__init__`` is the package's
own module, `workbench`). `widgets` sits above all of them (`WIDGETS`)."""

WIDGETS = "widgets"
"""The notebook UI: it may import every layer of `workbench`, which never imports it."""

# ---- the graph ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int

    def where(self) -> str:
        return f"{_path(self.source).relative_to(REPO)}:{self.line} imports {self.target}"


@cache
def _modules() -> dict[str, Path]:
    found = {}
    for package in ("workbench", WIDGETS):
        for path in sorted((REPO / package).rglob("*.py")):
            found[".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def _path(module: str) -> Path:
    return _modules()[module]


def _imports(module: str) -> Iterator[Import]:
    """Every import in `module` whose target is a module of the graph (see the module docstring)."""
    path, modules = _path(module), _modules()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                target = next(
                    (".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules),
                    None,
                )
                if target is not None:
                    yield Import(module, target, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                if target in modules:
                    yield Import(module, target, node.lineno)


@cache
def graph() -> dict[str, dict[str, Import]]:
    """module -> {imported module -> its first import statement}; a module's imports of itself left out."""
    edges: dict[str, dict[str, Import]] = {module: {} for module in _modules()}
    for module in _modules():
        for found in _imports(module):
            if found.target != module:
                edges[module].setdefault(found.target, found)
    return edges


def circles(edges: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges[target])))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# ---- the layers --------------------------------------------------------------------------------------


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == WIDGETS:
        return WIDGETS
    name = parts[1] if len(parts) > 1 else "__init__"
    return next((layer for layer, spec in LAYERS.items() if name in spec.holds), None)


@cache
def allowed(layer: str) -> frozenset[str]:
    """The layers `layer` may import: those it names and, through them, those they may."""
    if layer == WIDGETS:
        return frozenset(LAYERS)
    named = LAYERS[layer].may_import
    return frozenset(named).union(*(allowed(below) for below in named))


def upward(found: Import) -> bool:
    """An import of a layer its own may not import (one above it, or beside it)."""
    source, target = layer_of(found.source), layer_of(found.target)
    return source != target and target not in allowed(source)


def test_every_module_is_in_a_layer():
    homeless = [module for module in _modules() if layer_of(module) is None]
    assert not homeless, f"put these in a layer of LAYERS (and in docs/ARCHITECTURE.md's table): {homeless}"


def test_no_import_circle():
    edges = graph()
    found = circles(edges)
    shown = [
        " <-> ".join(circle)
        + "".join(f"\n    {edges[m][t].where()}" for m in circle for t in edges[m] if t in circle)
        for circle in found
    ]
    assert not found, "import circles (move what both sides need below them):\n" + "\n".join(shown)


def test_no_import_from_a_lower_layer_into_a_higher_one():
    wrong = [
        f"{found.where()}: layer {layer_of(found.source)!r} may import only {sorted(allowed(layer_of(found.source)))}"
        for targets in graph().values()
        for found in targets.values()
        if upward(found)
    ]
    assert not wrong, "\n".join(wrong)


# ---- the table ---------------------------------------------------------------------------------------


def _table_rows() -> list[tuple[set[str], set[str]]]:
    """(what the row holds, the layers its 'may import' names) for each row of ARCHITECTURE.md's layer table."""
    section = ARCHITECTURE.read_text().split("## Layers of `workbench`", 1)[1].split("\n## ", 1)[0]
    names = {name: layer for layer, spec in LAYERS.items() for name in (layer, *spec.holds)}
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        holds_cell, may_cell = line.split(" | ", 1)[0], line.rstrip(" |").rsplit(" | ", 1)[1]
        holds = {m.removesuffix(".py").rstrip("/") for m in re.findall(r"`([\w/]+(?:\.py|/))`", holds_cell)}
        while re.search(r"\([^()]*\)", may_cell):  # what is in parentheses explains: it names no layer
            may_cell = re.sub(r"\([^()]*\)", "", may_cell)
        if may_cell.strip() in ("everything", "everything above"):
            rows.append((holds, {"everything"}))
            continue
        words = {w.removesuffix(".py").rstrip("/") for w in re.findall(r"[\w/.]+", may_cell)}
        rows.append((holds, {names[w] for w in words if w in names}))
    return rows


def test_the_architecture_table_and_these_layers_agree():
    rows = _table_rows()
    order = list(LAYERS)
    assert len(rows) == len(LAYERS), f"the table has {len(rows)} rows, LAYERS {len(LAYERS)} layers"
    for position, (layer, (holds, named)) in enumerate(zip(order, rows, strict=True)):
        spec = LAYERS[layer]
        assert holds == set(spec.holds), (
            f"{layer}: the table's row holds {sorted(holds)}, LAYERS {spec.holds}"
        )
        if named == {"everything"}:  # "everything above" (train), "everything" (the commands, the last row)
            named = set(order[:position])
        assert named == set(spec.may_import), (
            f"{layer}: the table says {sorted(named)}, LAYERS {spec.may_import}"
        )


# ---- the counts, for a report --------------------------------------------------------------------------


if __name__ == "__main__":  # python -m tests.test_imports: the circles and upward imports, for a report
    every = circles(graph())
    up = [found for targets in graph().values() for found in targets.values() if upward(found)]
    print(f"{len(every)} circles, {len(up)} upward imports")
    for circle in every:
        print("circle:", " <-> ".join(circle))
    for found in up:
        print("upward:", found.where())
    sys.exit(0)
