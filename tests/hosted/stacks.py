"""Virtual environments that copy Colab's and Kaggle's TPU images, for the hosted-runtime tier.

Each image is a pins file beside this module (``colab-tpu.txt``, ``kaggle-tpu.txt``): the published
package list's pins of what the workbench touches, headed by its source, date and ``# python: X.Y``.
`ensure_stack` makes one virtual environment per image, on that Python from pyenv where it is there
(else the nearest Python found, and `Stack.python_note` says so), installs the pins with uv (as Kaggle
builds its image; uv's cache unpacks each wheel once and links it into both environments, so torch's
4 GiB of CUDA libraries are written once), then the project with pip, as the notebooks install it on a
hosted runtime: ``xla-workbench[widgets]`` with no ``xla-cpu`` extra, so pip keeps the image's torch,
torch_xla and transformers. uv itself is installed from the registry into the cache on first use.

A built environment is kept under ``~/.cache/xla-workbench/hosted/<image>-<key>`` (``XLA_WORKBENCH_HOSTED``
moves it), the key a hash of the pins file, what pyproject.toml installs there (Requires-Python, the
dependencies, the ``widgets`` extra) and the Python used: a rerun on the same machine reuses it, a changed
pin or dependency builds a new one. A build goes into a temporary directory renamed into place when it
finished, under a file lock, so an interrupted build is never reused and two
processes asking for the same stack build it once. Since the project's code changes more often than its
dependencies, `install_project` puts this checkout's wheel into the environment (no dependencies) each
time a test session uses it.

``python -m tests.hosted.stacks [NAME ...]`` builds (or finds) the stacks and prints where they are.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
STACK_NAMES = ("colab-tpu", "kaggle-tpu")
PYENV_VERSIONS = Path.home() / ".pyenv" / "versions"
PROJECT_SOURCES = ("pyproject.toml", "README.md", "LICENSE", "workbench", "widgets")
"""What a wheel of the project is built from (the rest of the checkout stays out of the copy)."""
PIP_TIMEOUT_S = 1500
UV_REQUIREMENT = "uv>=0.9"


class StackBuildError(RuntimeError):
    """A stack's environment could not be built; the message holds the installer's own error (uv's for the
    image's pins, pip's for the project)."""


@dataclass(frozen=True)
class Stack:
    """One hosted image: its pins file, the Python it runs and where its environment lives."""

    name: str
    pins_file: Path
    python_wanted: str
    python: Path
    python_version: str
    python_note: str
    """Empty when the image's Python is the one used; otherwise which Python stands in for it."""
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def interpreter(self) -> Path:
        return self.bin / "python"


def cache_root() -> Path:
    """Where built environments are kept (outside the repository, so a fresh clone reuses them)."""
    default = Path.home() / ".cache" / "xla-workbench" / "hosted"
    return Path(os.environ.get("XLA_WORKBENCH_HOSTED", default)).expanduser()


def pins_of(pins_file: Path) -> tuple[str, list[str]]:
    """(the image's ``major.minor`` Python, its requirement lines) from a pins file."""
    text = pins_file.read_text()
    found = re.search(r"^#\s*python:\s*(\d+\.\d+)\s*$", text, re.M)
    if found is None:
        raise ValueError(f"{pins_file}: no '# python: X.Y' line naming the image's Python")
    lines = [line.strip() for line in text.splitlines()]
    return found.group(1), [line for line in lines if line and not line.startswith("#")]


def _version_of(python: Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _candidates() -> list[Path]:
    """Every Python this machine offers: pyenv's versions, then those on PATH."""
    found = sorted(PYENV_VERSIONS.glob("*/bin/python3")) if PYENV_VERSIONS.is_dir() else []
    for name in ("python3.14", "python3.13", "python3.12", "python3.11", "python3.10", "python3"):
        path = shutil.which(name)
        if path:
            found.append(Path(path))
    return found


def find_python(wanted: str) -> tuple[Path, str, str]:
    """(interpreter, its version, a note) for the image's Python `wanted` (``3.13``): that release from
    pyenv or PATH when there; else the nearest release that has venv, with a note saying so."""

    def minor(version: str) -> tuple[int, int]:
        major, minor_, *_ = (int(part) for part in version.split("."))
        return major, minor_

    target = minor(wanted)
    offers: list[tuple[Path, str]] = []
    for path in _candidates():
        try:
            offers.append((path, _version_of(path)))
        except (OSError, subprocess.CalledProcessError):
            continue
    if not offers:
        raise StackBuildError(f"no Python found for the image's Python {wanted} (pyenv or PATH)")
    exact = [(p, v) for p, v in offers if minor(v) == target]
    if exact:
        path, version = exact[0]
        return path, version, ""
    path, version = min(offers, key=lambda pv: (abs(minor(pv[1])[1] - target[1]), -minor(pv[1])[1]))
    return (
        path,
        version,
        f"Python {wanted} is not on this machine: the nearest, {version} ({path}), stands in",
    )


def stack(name: str) -> Stack:
    """The stack `name` (``colab-tpu``, ``kaggle-tpu``) with its Python found and its environment's path."""
    pins_file = HERE / f"{name}.txt"
    if name not in STACK_NAMES or not pins_file.is_file():
        raise ValueError(f"no hosted stack {name!r}: expected one of {', '.join(STACK_NAMES)}")
    wanted, _ = pins_of(pins_file)
    python, version, note = find_python(wanted)
    digest = hashlib.sha256()
    for part in (pins_file.read_bytes(), _install_requirements().encode(), version.encode()):
        digest.update(hashlib.sha256(part).digest())
    venv = cache_root() / f"{name}-{digest.hexdigest()[:16]}"
    return Stack(name, pins_file, wanted, python, version, note, venv)


def _install_requirements() -> str:
    """What pyproject.toml makes pip install on a hosted runtime (Requires-Python, the dependencies and the
    `widgets` extra), as one string: the rest of the file (other extras, tool settings) leaves a built
    environment valid."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [project.get("requires-python", ""), *project.get("dependencies", [])]
    wanted += project.get("optional-dependencies", {}).get("widgets", [])
    return "\n".join(wanted)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (a file beside the environments), held for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(args: list[str], log: Path, what: str) -> None:
    """Run a build step, appending its output to `log`; a failure raises with the end of its output."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(args)}\n")
        out.flush()
        proc = subprocess.run(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PIP_NO_INPUT": "1",
                "PYTHONNOUSERSITE": "1",
                "UV_CACHE_DIR": str(cache_root() / "uv-cache"),
                "UV_LINK_MODE": "hardlink",
                "UV_NO_PROGRESS": "1",
            },
            timeout=PIP_TIMEOUT_S,
        )
    if proc.returncode != 0:
        lines = [line for line in log.read_text().splitlines() if "is ignored: it is neither" not in line]
        tail = "\n".join(lines[-60:])
        raise StackBuildError(f"{what} failed (exit {proc.returncode}); the end of its output:\n{tail}")


def uv_tool() -> Path:
    """uv, installed once from the registry into the cache (``tools/``) with the running Python's pip."""
    tools = cache_root() / "tools"
    uv = tools / "bin" / "uv"
    if uv.is_file():
        return uv
    with _locked(cache_root() / "tools.lock"):
        if not uv.is_file():
            building = tools.with_name(f"tools.partial-{os.getpid()}")
            shutil.rmtree(building, ignore_errors=True)
            log = cache_root() / "tools.log"
            log.write_text("")
            pip = [sys.executable, "-m", "pip", "install", "--no-input", "-q", "--target", str(building)]
            _run([*pip, UV_REQUIREMENT], log, f"pip install {UV_REQUIREMENT}")
            building.rename(tools)
    return uv


def project_copy(destination: Path) -> Path:
    """The files a wheel of this checkout is built from, copied to `destination` (no build litter in the
    checkout, which other processes may be using)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in PROJECT_SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=ignore)
        elif source.is_file():
            shutil.copy2(source, destination / name)
    return destination


def ensure_stack(name: str) -> Stack:
    """The stack `name`'s environment, built when no finished one is cached; raises `StackBuildError`
    with the installer's error when it cannot be built."""
    found = stack(name)
    marker = found.venv / ".built"
    if marker.is_file():
        return found
    with _locked(cache_root() / f"{name}.lock"):
        if marker.is_file():  # another process built it while this one waited
            return found
        for stale in cache_root().glob(f"{name}-*.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)  # an interrupted build (the lock says nobody is on it)
        building = found.venv.with_name(f"{found.venv.name}.partial-{os.getpid()}")
        log = cache_root() / f"{found.venv.name}.log"
        log.write_text(f"building {name} on Python {found.python_version} ({found.python})\n")
        started = time.monotonic()
        try:
            _run([str(found.python), "-m", "venv", str(building)], log, f"{name}: python -m venv")
            python = str(building / "bin" / "python")
            # The image's own packages with uv, as Kaggle builds its image: its cache holds each wheel unpacked
            # once and links it into every environment, so the two images' common CUDA libraries (4 GiB) are
            # downloaded and written once.
            _run(
                [str(uv_tool()), "pip", "install", "--python", python, "-r", str(found.pins_file)],
                log,
                f"{name}: uv pip install -r {found.pins_file.name}",
            )
            # The project as a notebook installs it, with pip; no .pyc compiled at install (imports do it).
            pip = [python, "-m", "pip", "install", "--no-input", "--no-compile", "--progress-bar", "off"]
            with tempfile.TemporaryDirectory(prefix="wb-project-") as tmp:
                source = project_copy(Path(tmp))
                _run([*pip, f"{source}[widgets]"], log, f'{name}: pip install "xla-workbench[widgets]"')
            _fix_script_paths(building, found.venv)
            (building / marker.name).write_text(f"built in {time.monotonic() - started:.0f} s\n")
            shutil.rmtree(found.venv, ignore_errors=True)
            building.rename(found.venv)  # the commit: only a finished environment ever has the final name
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        for older in cache_root().glob(f"{name}-*"):  # environments of earlier pins: not used again
            if older.is_dir() and older != found.venv and ".partial-" not in older.name:
                shutil.rmtree(older, ignore_errors=True)
    return found


def _fix_script_paths(venv: Path, final: Path) -> None:
    """Point the console scripts the installers wrote in `venv` at the interpreter it will have once
    renamed to `final`."""
    old_prefix, new_prefix = str(venv).encode(), str(final).encode()
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        head = script.read_bytes()[:512]
        if head.startswith(b"#!") and old_prefix in head:
            # a new file, not a write through a link that the uv cache may share
            fixed = script.with_name(f".{script.name}.fixed")
            fixed.write_bytes(script.read_bytes().replace(old_prefix, new_prefix))
            fixed.chmod(script.stat().st_mode)
            fixed.replace(script)


def build_project_wheel(out_dir: Path) -> Path:
    """A wheel of this checkout (pure Python) built into `out_dir`, with the running Python's pip."""
    with tempfile.TemporaryDirectory(prefix="wb-project-") as tmp:
        source = project_copy(Path(tmp))
        log = out_dir / "wheel.log"
        out_dir.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        _run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out_dir), str(source)],
            log,
            "building the project's wheel",
        )
    (wheel,) = out_dir.glob("xla_workbench-*.whl")
    return wheel


def install_project(found: Stack, wheel: Path) -> None:
    """This checkout's code into the stack (its dependencies stay the image's), under the stack's lock."""
    with _locked(cache_root() / f"{found.name}.lock"):
        log = cache_root() / f"{found.venv.name}.project.log"
        log.write_text("")
        _run(
            [
                str(found.interpreter),
                "-m",
                "pip",
                "install",
                "--no-input",
                "-q",
                "--no-deps",
                "--force-reinstall",
                str(wheel),
            ],
            log,
            f"{found.name}: installing this checkout's wheel",
        )


def main(argv: list[str]) -> int:
    for name in argv or STACK_NAMES:
        started = time.monotonic()
        found = ensure_stack(name)
        note = f" ({found.python_note})" if found.python_note else ""
        print(
            f"{name}: {found.venv} on Python {found.python_version}{note}, {time.monotonic() - started:.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
