"""Where every doctor check reads from, injectable so each branch is tested on made-up trees.

The TPU, Colab and Kaggle branches cannot run on a development machine, so no check touches
``/proc``, ``/dev``, ``/content`` or the installed packages directly: each reads through a
`DoctorRoots`. The defaults are the real machine; tests give temporary directories holding a
fake ``/proc/<pid>/fd`` whose links point at a fake ``/dev/accel0``, a mapping of package
versions, a ``disk_usage`` that reports a nearly full disk, and so on.

`InstalledPackages` answers "which version of this distribution is installed, and what does it
require" from ``importlib.metadata`` or from the injected mappings. It never imports a package:
importing a torch_xla built for another torch is exactly what crashes (``_XLAC ... undefined
symbol``), and the doctor is what runs when that is the problem.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.backend.torchtpu.detect import distribution_urls

PROJECT = "xla-workbench"
"""This project's distribution name: its pins are what installed versions are compared with."""


def canonical_name(name: str) -> str:
    """A distribution name as packaging compares them: ``torch_xla`` and ``Torch-XLA`` are ``torch-xla``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class DoctorRoots:
    """The places and sources the checks read (the real machine by default)."""

    proc: Path = Path("/proc")
    """Processes: ``<pid>/fd/*`` links, ``<pid>/cmdline``, and ``meminfo``."""
    dev: Path = Path("/dev")
    """Device files: ``accel*`` and ``vfio/*`` (TPUs), ``nvidia*`` (GPUs)."""
    sys: Path = Path("/sys")
    """sysfs: TPU chips on the PCI bus (``bus/pci/devices``)."""
    tmp: Path = Path("/tmp")
    """Where libtpu keeps its lock file (``libtpu_lockfile``)."""
    fs_root: Path = Path("/")
    """Where ``content`` (Colab) and ``kaggle`` (Kaggle) are looked for."""
    cwd: Path | None = None
    """What relative config paths are relative to; None: the current directory."""
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    versions: Mapping[str, str] | None = None
    """Distribution name -> installed version; None reads ``importlib.metadata``. A name absent
    from the mapping is not installed."""
    requirements: Mapping[str, Sequence[str]] | None = None
    """Distribution name -> its requirement strings (``libtpu==0.0.21; extra == "tpu"``). With
    `versions` given, these stand in for the metadata (None: no requirements); otherwise None
    reads ``importlib.metadata``."""
    home_pages: Mapping[str, Sequence[str]] | None = None
    """Distribution name -> its Home-page and Project-URLs (which vendor's ``torch_tpu`` is installed).
    With `versions` given, these stand in for the metadata (None: none); otherwise read from it."""
    disk_usage: Callable[[Path], Any] = shutil.disk_usage
    """Returns an object with ``total``, ``used`` and ``free`` bytes for a path."""
    self_pid: int = field(default_factory=os.getpid)
    """The process running the doctor: never counted as "another process" holding the TPU."""

    def working_directory(self) -> Path:
        return self.cwd if self.cwd is not None else Path.cwd()

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """`path` made absolute against the working directory (``~`` expanded)."""
        resolved = Path(path).expanduser()
        return resolved if resolved.is_absolute() else self.working_directory() / resolved

    def packages(self) -> InstalledPackages:
        return InstalledPackages(self.versions, self.requirements, self.home_pages)


class InstalledPackages:
    """Installed distributions' versions and requirements, read from metadata or given mappings."""

    def __init__(
        self,
        versions: Mapping[str, str] | None = None,
        requirements: Mapping[str, Sequence[str]] | None = None,
        home_pages: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._from_metadata = versions is None
        self._home_pages = {canonical_name(k): list(v) for k, v in (home_pages or {}).items()}
        self._versions = {canonical_name(k): v for k, v in (versions or {}).items()}
        self._requirements = {canonical_name(k): list(v) for k, v in (requirements or {}).items()}
        self._read_requirements_from_metadata = versions is None and requirements is None

    def version(self, name: str) -> str | None:
        """The installed version of distribution `name`, or None when it is not installed."""
        if not self._from_metadata:
            return self._versions.get(canonical_name(name))
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    def requires(self, name: str) -> list[str]:
        """The requirement strings distribution `name` declares (empty when none or not installed)."""
        if not self._read_requirements_from_metadata:
            return self._requirements.get(canonical_name(name), [])
        try:
            return list(importlib.metadata.requires(name) or [])
        except importlib.metadata.PackageNotFoundError:
            # A checkout used from sys.path, not pip-installed: its pins are in pyproject.toml
            return _pyproject_requirements() if canonical_name(name) == PROJECT else []

    def urls(self, name: str) -> list[str]:
        """Distribution `name`'s Home-page and Project-URLs (empty when none or not installed)."""
        if not self._from_metadata:
            return self._home_pages.get(canonical_name(name), [])
        try:
            return distribution_urls(importlib.metadata.distribution(name))
        except importlib.metadata.PackageNotFoundError:
            return []

    def requires_python(self, name: str) -> str | None:
        """The ``Requires-Python`` of distribution `name` (None when unknown or injected)."""
        if not self._from_metadata:
            return None
        try:
            return importlib.metadata.metadata(name).get("Requires-Python")
        except importlib.metadata.PackageNotFoundError:
            if canonical_name(name) == PROJECT:
                return _pyproject().get("project", {}).get("requires-python")
            return None


def _pyproject() -> dict[str, Any]:
    """This checkout's pyproject.toml as a dict (empty when absent, or before Python 3.11's tomllib)."""
    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        import tomllib
    except ImportError:  # Python 3.10: no TOML reader in the standard library
        return {}
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _pyproject_requirements() -> list[str]:
    """pyproject.toml's dependencies written as metadata writes them (extras behind a marker)."""
    project = _pyproject().get("project", {})
    found = list(project.get("dependencies", []))
    for extra, requirements in project.get("optional-dependencies", {}).items():
        found += [f'{requirement}; extra == "{extra}"' for requirement in requirements]
    return found
