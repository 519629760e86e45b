"""Installed versions against what works together: Python, torch, torch_xla, libtpu, the project's pins.

The failure people meet most after a ``pip install`` in a notebook: something upgraded torch
and the runtime's torch_xla, built against the old one, now dies on import with ``_XLAC ...
undefined symbol``. torch_xla must have torch's major.minor, and on a TPU the libtpu that
torch_xla pins (``libtpu==...; extra == "tpu"`` in its metadata) or a hotfix of that release
(``0.0.21.1`` for ``==0.0.21``: Colab's TPU image ships one). Every version here is read
from package metadata (`InstalledPackages`), never by importing the package, so these checks
run, and name the pip line, precisely when importing torch_xla would crash.

transformers, peft and datasets are compared with the project's own pins (its metadata, or
pyproject.toml in a checkout that is not installed); the notebook libraries (ipykernel,
ipywidgets, anywidget, plotly) only warn when missing: the headless package runs without them.
On Colab and Kaggle only the `widgets` extra's libraries are checked: the runtime's own kernel
packages are never to be upgraded.
"""

from __future__ import annotations

import platform
import re
from typing import Any

from workbench.backend.torchtpu.detect import DISTRIBUTION as TORCHTPU
from workbench.backend.torchtpu.detect import is_torchtpu_metadata
from workbench.doctor.checks import Check
from workbench.doctor.roots import PROJECT, InstalledPackages, canonical_name

RESTART = "then restart Python (in Colab: Runtime > Restart session)"
LIBTPU_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")
LIBTPU_RELEASES = "https://storage.googleapis.com/libtpu-releases/index.html"
"""Where libtpu-nightly wheels live (the registry has only the stable `libtpu`)."""
PINNED_LIBRARIES = ("transformers", "peft", "datasets")
NOTEBOOK_LIBRARIES = ("ipykernel", "ipywidgets", "anywidget", "plotly")
WIDGET_LIBRARIES = ("ipywidgets", "anywidget", "plotly")
"""What the `widgets` extra installs (read from the extra itself where its metadata is there)."""
HOSTED_KERNEL_PACKAGES = ("ipykernel", "ipython", "jupyter-client", "notebook")
"""A hosted runtime's kernel and server: its frontend is built against these versions."""


def _packaging() -> Any:
    """The `packaging` library (a dependency of transformers and pip), or None where it is missing."""
    try:
        import packaging.requirements
        import packaging.specifiers
        import packaging.version

        return packaging
    except ImportError:
        return None


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: ``2.9.0+cu128`` -> (2, 9, 0); () when there is none."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def public_version(version: str) -> str:
    """`version` without its local build tag (``2.9.0+cu128`` -> ``2.9.0``): what pip can install."""
    return version.split("+", 1)[0]


def _series(version: str) -> str:
    """``2.9.*`` for ``2.9.1+cu128``: any release of that major.minor (a patch of torch may have no torch_xla twin)."""
    return ".".join(map(str, release(version)[:2])) + ".*"


def _pins(packages: InstalledPackages, extra: str | None) -> dict[str, Any]:
    """The project's requirements (base ones for `extra` None, else that extra's), by canonical name."""
    pkg = _packaging()
    if pkg is None:
        return {}
    found: dict[str, Any] = {}
    for text in packages.requires(PROJECT):
        try:
            requirement = pkg.requirements.Requirement(text)
        except pkg.requirements.InvalidRequirement:
            continue
        if extra is None:
            wanted = requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        else:
            wanted = requirement.marker is not None and requirement.marker.evaluate({"extra": extra})
        if wanted:
            found[canonical_name(requirement.name)] = requirement
    return found


def _satisfies(requirement: Any, version: str) -> bool:
    """Whether `version` meets `requirement`'s specifier (True when the version cannot be parsed)."""
    pkg = _packaging()
    try:
        return bool(requirement.specifier.contains(version, prereleases=True))
    except pkg.version.InvalidVersion:
        return True


def _spec(requirement: Any) -> str:
    """``transformers<6,>=4.57``: the requirement without its marker, as pip takes it."""
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    return f"{requirement.name}{extras}{requirement.specifier}"


def python_check(packages: InstalledPackages, running: str | None = None) -> Check:
    """The running Python against the project's ``Requires-Python``."""
    running = running or platform.python_version()
    wanted = packages.requires_python(PROJECT)
    pkg = _packaging()
    if not wanted or pkg is None:
        return Check("python", "ok", running)
    specifier = pkg.specifiers.SpecifierSet(wanted)
    if specifier.contains(running, prereleases=True):
        return Check("python", "ok", f"{running} (the project needs {wanted})")
    return Check(
        "python",
        "fail",
        f"{running}, but {PROJECT} needs Python {wanted}",
        f"run on a Python {wanted} (e.g. `uv venv --python 3.11`, or a newer notebook runtime)",
    )


def torchtpu_present(packages: InstalledPackages) -> bool:
    """Whether the installed ``torch-tpu`` distribution is Google's TorchTPU."""
    return packages.version(TORCHTPU) is not None and is_torchtpu_metadata(TORCHTPU, packages.urls(TORCHTPU))


def torch_checks(packages: InstalledPackages, *, tpu: bool) -> list[Check]:
    """torch, torch_xla (same major.minor as torch) and libtpu (the version torch_xla pins)."""
    torch, xla = packages.version("torch"), packages.version("torch_xla")
    torchtpu = torchtpu_present(packages)
    return [
        _torch_check(packages, torch, xla),
        _xla_check(torch, xla, tpu=tpu, torchtpu=torchtpu),
        _libtpu_check(packages, xla, tpu=tpu),
    ]


def _torch_check(packages: InstalledPackages, torch: str | None, xla: str | None) -> Check:
    if torch is not None:
        return Check("torch", "ok", torch)
    if xla is not None:
        fix = f"pip install torch=={public_version(xla)} (the torch your torch_xla {xla} was built for), {RESTART}"
    else:
        pinned = _pins(packages, "xla-cpu").get("torch")
        fix = f"pip install {_spec(pinned) if pinned else 'torch'}"
    return Check("torch", "fail", "not installed: nothing can train", fix)


def _xla_check(torch: str | None, xla: str | None, *, tpu: bool, torchtpu: bool = False) -> Check:
    if xla is None:
        if torchtpu:
            return Check("torch_xla", "ok", "not installed: TorchTPU drives the TPU (its lines below)")
        if tpu and torch is not None:
            return Check(
                "torch_xla",
                "fail",
                "not installed, but this machine has a TPU: without torch_xla it stays unused",
                f'pip install "torch_xla[tpu]=={_series(torch)}" (the release series of torch {torch}), {RESTART}',
            )
        return Check("torch_xla", "ok", "not installed: runs on CUDA or the CPU (XLA:CPU needs torch_xla)")
    if torch is None:
        return Check("torch_xla", "fail", f"{xla} without torch", f"pip install torch=={public_version(xla)}")
    if release(torch)[:2] != release(xla)[:2]:
        pair = public_version(xla)
        tpu_extra = "[tpu]" if tpu else ""
        return Check(
            "torch_xla",
            "fail",
            f"{xla} with torch {torch}: torch_xla needs the torch of its own major.minor "
            "(importing it fails with `_XLAC ... undefined symbol`)",
            f'pip install torch=={pair} "torch_xla{tpu_extra}=={pair}", {RESTART}',
        )
    return Check("torch_xla", "ok", f"{xla} (matches torch {torch})")


def _libtpu_pin(packages: InstalledPackages) -> Any:
    """The libtpu requirement torch_xla declares for its ``tpu`` extra, or None."""
    pkg = _packaging()
    if pkg is None:
        return None
    for text in packages.requires("torch_xla"):
        try:
            requirement = pkg.requirements.Requirement(text)
        except pkg.requirements.InvalidRequirement:
            continue
        if canonical_name(requirement.name) not in LIBTPU_DISTRIBUTIONS:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": "tpu"}):
            return requirement
    return None


def _libtpu_check(packages: InstalledPackages, xla: str | None, *, tpu: bool) -> Check:
    installed = next(
        ((name, v) for name in LIBTPU_DISTRIBUTIONS if (v := packages.version(name)) is not None), None
    )
    have = f"{installed[0]} {installed[1]}" if installed else "not installed"
    if not tpu:
        return Check("libtpu", "ok", f"{have} (only a TPU needs it)")
    if xla is None:
        return Check("libtpu", "ok", f"{have} (torch_xla, which pins it, is not installed)")
    pin = _libtpu_pin(packages)
    if pin is None:
        if installed:
            return Check("libtpu", "ok", f"{have} (torch_xla {xla} declares no libtpu pin)")
        return Check(
            "libtpu",
            "fail",
            f"not installed: torch_xla {xla} cannot reach the TPU without it",
            f'pip install "torch_xla[tpu]=={public_version(xla)}", {RESTART}',
        )
    finder = f" -f {LIBTPU_RELEASES}" if canonical_name(pin.name) == "libtpu-nightly" else ""
    fix = f'pip install "{_spec(pin)}"{finder}, {RESTART}'
    if installed is None:
        return Check("libtpu", "fail", f"not installed: torch_xla {xla} needs {_spec(pin)}", fix)
    hotfix = _hotfix_series(pin)
    if canonical_name(installed[0]) != canonical_name(pin.name):
        matches = False
    else:
        matches = _satisfies(pin, installed[1]) or (hotfix is not None and _is_hotfix(installed[1], hotfix))
    accepted = f"{_spec(pin)}" + (f" or a {hotfix}.x hotfix of it" if hotfix else "")
    if not matches:
        return Check(
            "libtpu",
            "fail",
            f"{have}, but torch_xla {xla} needs {accepted} (another libtpu fails to start the TPU "
            "or crashes in it)",
            fix,
        )
    if not _satisfies(pin, installed[1]):
        return Check(
            "libtpu",
            "ok",
            f"{have}: a hotfix of the {_spec(pin)} torch_xla {xla} pins ({hotfix}.x releases are accepted: "
            "same release, later fixes; Colab's TPU image ships one)",
        )
    return Check("libtpu", "ok", f"{have} (what torch_xla {xla} pins; {accepted} accepted)")


def _hotfix_series(pin: Any) -> str | None:
    """``0.0.21`` for a pin of exactly ``==0.0.21``: libtpu's hotfixes add a fourth number (0.0.21.1)
    that PEP 440's ``==`` refuses. None for any other pin (a range, a wildcard, ``===``): pip's own
    reading of it stands."""
    specifiers = list(pin.specifier)
    if len(specifiers) != 1 or specifiers[0].operator != "==" or specifiers[0].version.endswith(".*"):
        return None
    return specifiers[0].version


def _is_hotfix(version: str, series: str) -> bool:
    """Whether `version` is a final release extending `series` (``0.0.21.1`` of ``0.0.21``)."""
    pkg = _packaging()
    try:
        have, pinned = pkg.version.Version(version), pkg.version.Version(series)
    except pkg.version.InvalidVersion:
        return False
    if have.is_prerelease or have.is_devrelease or len(have.release) <= len(pinned.release):
        return False
    return have.release[: len(pinned.release)] == pinned.release


def scan_check(packages: InstalledPackages) -> Check:
    """How a scanned model's backward runs on a mesh, with the jax and torchax this environment has.

    Under SPMD torch_xla's scan backward ties each gradient's sharding to its input's with jax's
    ``shard_alike`` through ``call_jax``; that step fails without jax and torchax both (Colab's jax
    without torchax) and does not partition with torch_xla 2.8 and jax 0.7.2 (Kaggle's image), so the
    workbench always runs the plain backward and XLA's sharding propagation shards the gradients
    (`workbench.backend.xla.scan_support`). Read from metadata: nothing is imported.
    """
    name = "scan on a mesh"
    xla, jax, torchax = (packages.version(n) for n in ("torch_xla", "jax", "torchax"))
    if xla is None:
        return Check(name, "ok", "torch_xla not installed: no XLA scan")
    have = f"jax {jax}" if jax is not None else "no jax"
    have += (
        f", torchax {torchax}" if torchax is not None else " (torchax only as torch_xla's own copy, if any)"
    )
    return Check(
        name,
        "ok",
        f"torch_xla {xla}, {have}: scan under SPMD runs the workbench's plain backward, not torch_xla's "
        "jax shard_alike step (it needs jax and torchax both, and fails to partition on torch_xla 2.8 "
        "with jax 0.7.2); XLA's propagation shards the gradients, as in every tested run",
    )


def library_checks(packages: InstalledPackages) -> list[Check]:
    """transformers, peft and datasets against the project's pins (missing or outside: fail)."""
    pins = _pins(packages, None)
    checks = []
    for name in PINNED_LIBRARIES:
        version, pin = packages.version(name), pins.get(canonical_name(name))
        wanted = _spec(pin) if pin is not None else name
        if version is None:
            checks.append(
                Check(name, "fail", f"not installed ({PROJECT} needs {wanted})", f'pip install "{wanted}"')
            )
        elif pin is not None and not _satisfies(pin, version):
            checks.append(
                Check(
                    name,
                    "fail",
                    f"{version}, outside the project's {wanted}",
                    f'pip install "{wanted}", {RESTART}',
                )
            )
        else:
            checks.append(
                Check(name, "ok", version + (f" (the project needs {wanted})" if pin is not None else ""))
            )
    return checks


def notebook_check(packages: InstalledPackages, *, hosted: bool = False) -> Check:
    """The notebook libraries: warn when one the notebooks need is missing or too old.

    On a hosted runtime (Colab, Kaggle) the notebooks install the `widgets` extra only, into a
    kernel that is already running: only what that extra needs is checked (ipywidgets, anywidget,
    plotly), and the runtime's own kernel packages (`HOSTED_KERNEL_PACKAGES`) are reported, never
    to be upgraded: replacing the running kernel's ipykernel or jupyter-client under the
    hosting frontend is what breaks a hosted session. On a local machine the `notebook` extra's
    pins (a kernel included) stay advice.
    """
    widget_pins = _pins(packages, "widgets")
    if hosted:
        pins = widget_pins
        names = tuple(pins) or WIDGET_LIBRARIES
    else:
        pins = {**_pins(packages, "notebook"), **widget_pins}
        names = NOTEBOOK_LIBRARIES
    seen, wrong = [], []
    for name in names:
        version, pin = packages.version(name), pins.get(canonical_name(name))
        if version is None or (pin is not None and not _satisfies(pin, version)):
            wrong.append(_spec(pin) if pin is not None else name)
        seen.append(f"{name} {version or 'missing'}")
    saw = ", ".join(seen)
    if hosted:
        kernel = [f"{name} {v}" for name in HOSTED_KERNEL_PACKAGES if (v := packages.version(name))]
        if kernel:
            saw += f"; the runtime's own kernel, left as it is: {', '.join(kernel)}"
    if not wrong:
        return Check("notebook libraries", "ok", saw)
    needs = "the widgets extra needs" if hosted else "the widgets and notebooks need"
    return Check(
        "notebook libraries",
        "warn",
        f"{saw}: {needs} {', '.join(wrong)} (the headless package does not)",
        "pip install " + " ".join(f'"{spec}"' for spec in wrong),
    )


def version_checks(packages: InstalledPackages, *, tpu: bool, hosted: bool = False) -> list[Check]:
    """Every version check, in the order a reader fixes them (`hosted`: a Colab or Kaggle runtime)."""
    return [
        python_check(packages),
        *torch_checks(packages, tpu=tpu),
        scan_check(packages),
        *library_checks(packages),
        notebook_check(packages, hosted=hosted),
    ]
