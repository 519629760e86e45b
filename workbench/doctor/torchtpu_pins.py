"""TorchTPU's pins: torch 2.11-2.15, libtpu >= 0.0.50, and no torch_xla in the same environment.

These lines appear only where a ``torch-tpu`` distribution is installed. Which vendor's it is comes
from its home page (`workbench.backend.torchtpu.detect`): SOPHGO's PyTorch bridge for its own chips
is also a ``torch_tpu`` distribution, and gets one warning line saying runs leave it alone. For
Google's TorchTPU the pins are read from its own ``Requires-Dist`` (those of 0.2.0 where the metadata
declares none), and torch_xla beside it fails: their torch and libtpu pins exclude each other and both
would drive the chips. Like every version check, nothing is imported.
"""

from __future__ import annotations

from typing import Any

from workbench.backend.torchtpu.detect import (
    DISTRIBUTION,
    HOME,
    LIBTPU_REQUIREMENT,
    TORCH_REQUIREMENT,
    is_torchtpu_metadata,
)
from workbench.doctor.checks import Check
from workbench.doctor.roots import InstalledPackages, canonical_name
from workbench.doctor.versions import RESTART, _packaging, _satisfies, _spec

CHECK_NAME = "TorchTPU"


def _requirement(packages: InstalledPackages, name: str, fallback: str) -> Any:
    """torch-tpu's requirement on `name`, from its metadata, else `fallback` (0.2.0's)."""
    pkg = _packaging()
    for text in packages.requires(DISTRIBUTION):
        try:
            requirement = pkg.requirements.Requirement(text)
        except pkg.requirements.InvalidRequirement:
            continue
        if canonical_name(requirement.name) == name and (
            requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        ):
            return requirement
    return pkg.requirements.Requirement(fallback)


def torchtpu_checks(packages: InstalledPackages, *, tpu: bool) -> list[Check]:
    """The TorchTPU lines: which torch_tpu, torch and libtpu against its pins, torch_xla beside it."""
    version = packages.version(DISTRIBUTION)
    if version is None or _packaging() is None:
        return []
    urls = packages.urls(DISTRIBUTION)
    if not is_torchtpu_metadata(DISTRIBUTION, urls):
        made_by = urls[0] if urls else "no home page"
        return [
            Check(
                CHECK_NAME,
                "warn",
                f"{DISTRIBUTION} {version} is installed but is not TorchTPU ({made_by}, not {HOME}): "
                "runs leave its torch_tpu module alone",
                f"if you meant TorchTPU: pip uninstall -y {DISTRIBUTION} && pip install {DISTRIBUTION}, {RESTART}",
            )
        ]
    checks = [
        Check(
            CHECK_NAME, "ok", f"{DISTRIBUTION} {version} ({HOME}): a TPU run uses it when torch_xla is absent"
        )
    ]
    checks.append(_pin_check(packages, "torch", TORCH_REQUIREMENT, version, needed=True))
    checks.append(_pin_check(packages, "libtpu", LIBTPU_REQUIREMENT, version, needed=tpu))
    xla = packages.version("torch_xla")
    if xla is not None:
        checks.append(
            Check(
                "TorchTPU and torch_xla",
                "fail",
                f"torch_xla {xla} and {DISTRIBUTION} {version} share this environment: their torch and libtpu "
                "pins exclude each other and both drive the TPU chips",
                f"pip uninstall -y {DISTRIBUTION} (to run on torch_xla) or pip uninstall -y torch_xla (to run on "
                f"TorchTPU), {RESTART}",
            )
        )
    else:
        checks.append(Check("TorchTPU and torch_xla", "ok", "torch_xla is not installed beside TorchTPU"))
    return checks


def _pin_check(packages: InstalledPackages, name: str, fallback: str, version: str, *, needed: bool) -> Check:
    """`name`'s installed version against torch-tpu's requirement on it (`needed`: a run needs it here)."""
    requirement = _requirement(packages, name, fallback)
    wanted = _spec(requirement)
    check_name = f"TorchTPU {name}"
    have = packages.version(name)
    if have is None:
        if not needed:
            return Check(
                check_name, "ok", f"not installed (only a TPU needs it; {DISTRIBUTION} pins {wanted})"
            )
        return Check(
            check_name,
            "fail",
            f"not installed: {DISTRIBUTION} {version} needs {wanted}",
            f'pip install "{wanted}"',
        )
    if _satisfies(requirement, have):
        return Check(check_name, "ok", f"{have} (what {DISTRIBUTION} {version} pins: {wanted})")
    status = "fail" if needed else "warn"
    return Check(
        check_name,
        status,
        f"{have}, but {DISTRIBUTION} {version} needs {wanted}",
        f'pip install "{wanted}", {RESTART}',
    )
