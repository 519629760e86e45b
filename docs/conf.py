"""Sphinx configuration of the XLA Workbench docs: MyST markdown pages, the API from docstrings,
and the config/CLI/metrics reference written from the code by ``_ext/workbench_reference.py``.

Built by ``make docs`` (``sphinx-build -W --keep-going -n -b html docs build/docs``) and by
``tests/test_docs.py`` in ``make test``: every warning is an error, every reference must resolve.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # the package itself, for autodoc, without installing it
sys.path.insert(0, os.path.abspath(str(DOCS / "_ext")))

project = "XLA Workbench"
author = "XLA Workbench contributors"
copyright = "XLA Workbench contributors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # its settings only: `google_sections` below applies it where it belongs
    "workbench_reference",  # _ext/: writes reference/config.md, cli.md and metrics.md from the code
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "**/.ipynb_checkpoints"]

# Headings get anchors, so a page links to a section as `page.md#a-heading` (GitHub's slugs).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# autodoc imports the package in this process: no runtime may start and torch_xla is never
# imported here (only workbench/backend imports it, and only when a function runs).
autodoc_mock_imports = ["torch_xla"]
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
# Functions and classes document their arguments Google-style ("Args:"); a field's docstring is prose
# whose first line may hold a colon ("Sequence-length planning: ..."), which napoleon would read as
# "type: description". So napoleon's own pass is off and `google_sections` runs it on the rest.
napoleon_google_docstring = False
napoleon_numpy_docstring = False

# Nitpicky mode: every reference must resolve. Types from other projects have no inventory here
# (no network), so their names are accepted as written.
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|transformers|peft|datasets|numpy|np|plotly|go|ipywidgets|ipw|anywidget|traitlets|yaml)(\..*)?",
    ),
    (r"py:.*", r"(abc|contextlib|pathlib|typing|collections|concurrent|threading|dataclasses|argparse|os)\..*"),
]


def google_sections(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Google-style "Args:"/"Returns:" sections of functions and classes into Sphinx fields."""
    if what not in ("class", "exception", "function", "method"):
        return
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import GoogleDocstring

    lines[:] = GoogleDocstring(lines, Config(napoleon_use_param=True), app, what, name, obj, options).lines()


def short_names(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """A bare class name in an annotation (``Target``, imported for type checking only, so autodoc
    sees the string) resolves to the one documented object of that name."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target or "." in target:
        return None
    domain = env.get_domain("py")
    matches = [name for name in domain.objects if name.endswith("." + target)]
    if len(matches) != 1:
        return None
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], matches[0], node, contnode)


def no_torch_xla(app: Any, exception: BaseException | None) -> None:
    """The build imports the package but must never have imported the real torch_xla (only
    autodoc's stand-in may be there): importing it starts no runtime, but a module that did would
    break the rule that only workbench/backend imports it, and only when a function runs."""
    module = sys.modules.get("torch_xla")
    if exception is None and module is not None and getattr(module, "__file__", None):
        from sphinx.util import logging

        logging.getLogger(__name__).warning("the docs build imported torch_xla from %s", module.__file__)


def setup(app: Any) -> None:
    app.connect("autodoc-process-docstring", google_sections)
    app.connect("missing-reference", short_names)
    app.connect("build-finished", no_torch_xla)


# Furo, the theme much of the Python ML ecosystem reads (pip, attrs, urllib3): code blocks scroll instead of
# cutting long commands, and the sidebar's captions are headings over their pages, not links repeated.
html_theme = "furo"
html_title = "XLA Workbench"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": True,
    "source_repository": "https://github.com/xla-workbench/xla-workbench/",
    "source_branch": "main",
    "source_directory": "docs/",
}
