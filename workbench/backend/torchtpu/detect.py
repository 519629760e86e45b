"""Is the ``torch_tpu`` module on this path Google's TorchTPU? Answered from distribution metadata.

Two projects install a top-level ``torch_tpu`` module: Google's TorchTPU (PyPI ``torch-tpu`` 0.2.0,
Home-page ``https://github.com/google-pytorch/torch_tpu``, Author "torch team") and SOPHGO's PyTorch
bridge for its own TPU chips (setup.py ``name='torch_tpu'``, url ``https://github.com/sophgo/torch-tpu``,
author "sophgo"). Both distributions are named ``torch_tpu``, so neither the module name nor the
distribution name says which one is installed: the home page or a project URL does.

`find_torch_tpu` locates the module without importing it (importing TorchTPU scans the PCI bus and
registers a device), finds the distribution whose files provide it in the same ``sys.path`` entry, and
reads that distribution's metadata. Nothing here imports torch.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MODULE = "torch_tpu"
"""The top-level module both vendors install."""
DISTRIBUTION = "torch-tpu"
"""TorchTPU's distribution name, canonical (its metadata spells it ``torch_tpu``)."""
HOME = "github.com/google-pytorch/torch_tpu"
"""TorchTPU's repository, as its wheel's Home-page names it (scheme and case aside)."""
TORCH_REQUIREMENT = "torch>=2.11.0,<=2.15.0"
"""``Requires-Dist`` of torch-tpu 0.2.0 for torch, as its wheel declares it."""
LIBTPU_REQUIREMENT = "libtpu>=0.0.50"
"""``Requires-Dist`` of torch-tpu 0.2.0 for libtpu."""


@dataclass(frozen=True)
class TorchTPUFinding:
    """A ``torch_tpu`` module on the path and the distribution that installed it."""

    module_path: str
    """Where the module is (its package directory or file)."""
    distribution: str | None
    """The distribution's name as its metadata spells it; None when no installed metadata lists the module."""
    version: str | None
    home_page: str | None
    """The Home-page field, else the first Project-URL; None when the metadata names neither."""
    author: str | None

    @property
    def is_torchtpu(self) -> bool:
        """Google's TorchTPU: distribution ``torch-tpu`` whose home page is google-pytorch/torch_tpu."""
        return self.distribution is not None and is_torchtpu_metadata(
            self.distribution, [self.home_page] if self.home_page else []
        )

    def notice(self) -> str | None:
        """One line for a ``torch_tpu`` that is not TorchTPU (None when it is): why it is left alone."""
        if self.is_torchtpu:
            return None
        if self.distribution is None:
            return (
                f"a {MODULE} module at {self.module_path} has no installed distribution metadata: it is not taken "
                f"for TorchTPU ({DISTRIBUTION} from {HOME}); runs do not use it"
            )
        made_by = ", ".join(
            part for part in (self.home_page, f"author {self.author!r}" if self.author else None) if part
        )
        version = f" {self.version}" if self.version else ""
        return (
            f"the {MODULE} module at {self.module_path} comes from {self.distribution}{version} "
            f"({made_by or 'no home page'}), not from TorchTPU ({DISTRIBUTION} from {HOME}): runs do not use it"
        )

    def describe(self) -> str:
        """``torch_tpu 0.2.0 from https://github.com/google-pytorch/torch_tpu``: who installed the module."""
        version = self.version or "(no metadata)"
        return f"{self.distribution or MODULE} {version} from {self.home_page or 'an unknown home page'}"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _url_key(url: str) -> str:
    """``https://GitHub.com/google-pytorch/torch_tpu.git/`` -> ``github.com/google-pytorch/torch_tpu``."""
    text = url.strip().lower()
    text = re.sub(r"^[a-z+]+://", "", text).removeprefix("www.")
    return text.rstrip("/").removesuffix(".git")


def is_torchtpu_metadata(name: str, urls: Iterable[str]) -> bool:
    """Whether a distribution called `name` with these home page / project URLs is Google's TorchTPU."""
    if _canonical(name) != DISTRIBUTION:
        return False
    for url in urls:
        key = _url_key(url)
        if key == HOME or key.startswith(HOME + "/"):
            return True
    return False


def distribution_urls(dist: importlib.metadata.Distribution) -> list[str]:
    """The Home-page and every Project-URL of `dist` (``Label, URL`` entries reduced to the URL)."""
    meta = dist.metadata
    urls = [meta["Home-page"]] if meta.get("Home-page") else []
    for entry in meta.get_all("Project-URL") or []:
        urls.append(entry.split(",", 1)[-1].strip())
    return urls


def _provides_module(dist: importlib.metadata.Distribution) -> bool:
    """Whether `dist` installs the top-level ``torch_tpu``: its top_level.txt (setuptools) or RECORD."""
    top_level = dist.read_text("top_level.txt")
    if top_level is not None and MODULE in top_level.split():
        return True
    # RECORD read as text: parsing every distribution's file list (`dist.files`) takes seconds
    record = dist.read_text("RECORD") or ""
    return any(line.startswith((f"{MODULE}/", f"{MODULE}.py,")) for line in record.splitlines())


def _module_location(search_path: Sequence[str]) -> tuple[str, str] | None:
    """(the module's path, the search-path entry holding it), found without importing it."""
    loaded = sys.modules.get(MODULE)
    if loaded is not None and getattr(loaded, "__file__", None):
        origin = os.path.dirname(os.path.abspath(loaded.__file__))
        module_path = origin if os.path.basename(loaded.__file__).startswith("__init__.") else loaded.__file__
        return module_path, os.path.dirname(module_path.rstrip(os.sep))
    spec = importlib.machinery.PathFinder.find_spec(MODULE, list(search_path))
    if spec is None:
        return None
    if spec.submodule_search_locations:
        module_path = next(iter(spec.submodule_search_locations))
    elif spec.origin:
        module_path = spec.origin
    else:
        return None
    return module_path, os.path.dirname(os.path.abspath(module_path).rstrip(os.sep))


def find_torch_tpu(search_path: Sequence[str] | None = None) -> TorchTPUFinding | None:
    """The ``torch_tpu`` module on `search_path` (default ``sys.path``) and who installed it; None
    when there is none. Imports nothing."""
    paths = list(sys.path if search_path is None else search_path)
    located = _module_location(paths)
    if located is None:
        return None
    module_path, entry = located
    beside = [d for d in importlib.metadata.distributions(path=[entry]) if _provides_module(d)]
    # an editable install keeps its metadata in site-packages, apart from the source it points at
    found = beside or [d for d in importlib.metadata.distributions(path=paths) if _provides_module(d)]
    if not found:
        return TorchTPUFinding(module_path, None, None, None, None)
    dist = found[0]
    urls = distribution_urls(dist)
    return TorchTPUFinding(
        module_path=module_path,
        distribution=dist.metadata["Name"],
        version=dist.version,
        home_page=next(
            (u for u in urls if is_torchtpu_metadata(DISTRIBUTION, [u])), urls[0] if urls else None
        ),
        author=dist.metadata.get("Author") or None,
    )


def torchtpu_installed(search_path: Sequence[str] | None = None) -> bool:
    """Whether Google's TorchTPU is what ``import torch_tpu`` would load here."""
    found = find_torch_tpu(search_path)
    return found is not None and found.is_torchtpu
