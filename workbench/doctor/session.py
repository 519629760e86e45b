"""The session: Colab, Kaggle or a plain machine, and whether the run's files and model fit.

- Colab: is Google Drive mounted? Without it, checkpoints and the compile cache live in
  ``/content``, which is deleted with the runtime.
- Kaggle: ``/kaggle/working`` is what a saved version keeps, up to `KAGGLE_OUTPUT_LIMIT`: the
  room left there is the smaller of the disk's free bytes and what the limit leaves.
- Disk where ``train.checkpoint_dir`` and the compile cache go (the nearest existing parent of
  each), against what a checkpoint of the configured model needs (`workbench.doctor.sizing`):
  fail when one checkpoint does not fit, warn when the rotation does not (``keep_checkpoints``
  kept, plus the one being written before the oldest is removed).
- Host RAM (``MemAvailable`` in ``/proc/meminfo``) against what loading the model takes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from workbench.backend.compile_cache import CacheRoots, resolve_cache_dir
from workbench.backend.hardware import detect_platform
from workbench.config import ConfigError
from workbench.doctor.accelerator import Devices
from workbench.doctor.checks import Check, Status, worst
from workbench.doctor.roots import DoctorRoots
from workbench.doctor.sizing import ModelNeeds
from workbench.units import GB, GiB, MiB, format_bytes

Session = Literal["colab", "kaggle", "local"]

KAGGLE_OUTPUT_LIMIT = 20 * GB
"""What Kaggle keeps of /kaggle/working with a saved notebook version."""
KAGGLE_WALK_LIMIT = 100_000
"""Files counted under /kaggle/working before the count stops (a huge tree is not walked whole)."""
KAGGLE_LOW_ROOM = 2 * GiB
"""Less room than this in /kaggle/working warns: a few checkpoints of a small model fill it."""
CACHE_ROOM = 1 * GiB
"""Free space a compile cache should have: a few hundred programs of a few MiB each."""
LOW_DISK = 100 * MiB
"""Below this nothing more can be written usefully: a fail wherever the run writes."""
RAM_FLOOR = 2 * GiB
"""Without a config: less available memory than this leaves little room to load any model."""
DRIVE_MOUNT = "from google.colab import drive; drive.mount('/content/drive')"


def detect_session(roots: DoctorRoots) -> Session:
    """Colab or Kaggle from their variables (`detect_platform`) or their folders, else 'local'."""
    found = detect_platform(dict(roots.env))
    if found != "local":
        return found
    if (roots.fs_root / "kaggle" / "working").is_dir():
        return "kaggle"
    if (roots.fs_root / "content").is_dir():
        return "colab"
    return "local"


def nearest_existing(path: Path) -> Path:
    """`path` or its closest parent that exists: where its files would land."""
    return next((p for p in (path, *path.parents) if p.exists()), Path(path.anchor or "/"))


def _under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _tree_bytes(root: Path, limit: int = KAGGLE_WALK_LIMIT) -> tuple[int, bool]:
    """Bytes of the files under `root` and whether every file was counted (at most `limit`)."""
    total = seen = 0
    for folder, _, files in os.walk(root):
        for name in files:
            seen += 1
            if seen > limit:
                return total, False
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total, True


@dataclass(frozen=True)
class _Finding:
    status: Status
    saw: str
    fix: str | None = None


def _combine(name: str, findings: list[_Finding]) -> Check:
    """One check from several findings: the worst status, every finding's words and fixes."""
    fixes = [f.fix for f in findings if f.fix and f.status != "ok"]
    return Check(
        name,
        worst([f.status for f in findings]),
        "; ".join(f.saw for f in findings),
        "; ".join(fixes) or None,
    )


class _Session:
    """The session's facts the checks share: where it runs and the room its places have."""

    def __init__(self, roots: DoctorRoots) -> None:
        self.roots = roots
        self.kind = detect_session(roots)
        self.drive = roots.fs_root / "content" / "drive" / "MyDrive"
        self.kaggle_working = roots.fs_root / "kaggle" / "working"
        self._kaggle_room: tuple[int, str] | None = None

    def kaggle_room(self) -> tuple[int, str]:
        """Bytes a saved Kaggle version can still keep, and how that was worked out."""
        if self._kaggle_room is None:
            free = self.roots.disk_usage(self.kaggle_working).free
            used, complete = _tree_bytes(self.kaggle_working)
            left = max(0, KAGGLE_OUTPUT_LIMIT - used)
            counted = "" if complete else f" (counted the first {KAGGLE_WALK_LIMIT} files)"
            how = (
                f"{format_bytes(free)} free on its disk; {format_bytes(used)}{counted} of the "
                f"{KAGGLE_OUTPUT_LIMIT // GB} GB a saved version keeps used"
            )
            self._kaggle_room = (min(free, left), how)
        return self._kaggle_room

    def free_at(self, path: Path) -> tuple[int, Path]:
        """Free bytes where `path`'s files would land (Kaggle's output limit counted), and that place."""
        base = nearest_existing(path)
        free = int(self.roots.disk_usage(base).free)
        if self.kind == "kaggle" and self.kaggle_working.is_dir() and _under(base, self.kaggle_working):
            free = min(free, self.kaggle_room()[0])
        return free, base


def session_checks(
    roots: DoctorRoots,
    cfg: Any,
    needs: ModelNeeds | None,
    devices: Devices,
    *,
    xla_version: str | None,
) -> list[Check]:
    """The session, its storage, the disk for checkpoints and the compile cache, and host RAM."""
    session = _Session(roots)
    checks = [_session_check(session)]
    if session.kind == "colab":
        checks.append(_drive_check(session))
    if session.kind == "kaggle":
        checks.append(_kaggle_check(session))
    checks += [
        _checkpoint_disk_check(session, cfg, needs),
        _cache_disk_check(session, cfg, devices, xla_version),
        ram_check(roots, needs),
    ]
    return checks


def _session_check(session: _Session) -> Check:
    words = {
        "colab": "Google Colab",
        "kaggle": "Kaggle",
        "local": "a plain machine (no Colab or Kaggle signs)",
    }
    return Check("session", "ok", words[session.kind])


def _drive_check(session: _Session) -> Check:
    if session.drive.is_dir():
        return Check(
            "Drive",
            "ok",
            f"mounted at {session.drive}: checkpoints and the compile cache can outlive the runtime",
        )
    return Check(
        "Drive",
        "warn",
        f"not mounted ({session.drive} missing): checkpoints and the compile cache in /content are deleted with the runtime",
        DRIVE_MOUNT,
    )


def _kaggle_check(session: _Session) -> Check:
    if not session.kaggle_working.is_dir():
        return Check(
            "Kaggle output",
            "warn",
            f"{session.kaggle_working} is missing: nothing the run writes is kept with a saved version",
            "run in a Kaggle notebook (its /kaggle/working is kept), or write somewhere you copy out",
        )
    room, how = session.kaggle_room()
    saw = f"{session.kaggle_working}: {format_bytes(room)} left ({how})"
    if room < KAGGLE_LOW_ROOM:
        return Check(
            "Kaggle output",
            "warn",
            saw,
            f"delete what a saved version need not keep from {session.kaggle_working} (old checkpoints, caches)",
        )
    return Check("Kaggle output", "ok", saw)


def _persistence(session: _Session, path: Path, setting: str) -> _Finding | None:
    """A warning when `path` is on a disk the hosted session throws away."""
    if session.kind == "colab" and not _under(path, session.drive):
        return _Finding(
            "warn",
            f"{setting} is in the runtime's own disk, deleted with the runtime",
            f"{setting}=/content/drive/MyDrive/<folder> (after {DRIVE_MOUNT})",
        )
    if session.kind == "kaggle" and not _under(path, session.kaggle_working):
        return _Finding(
            "warn",
            f"{setting} is outside /kaggle/working: not kept with a saved version",
            f"{setting}=/kaggle/working/<folder>",
        )
    return None


def _checkpoint_disk_check(session: _Session, cfg: Any, needs: ModelNeeds | None) -> Check:
    setting = cfg.train.checkpoint_dir
    if setting is None:
        return Check("checkpoint disk", "ok", "train.checkpoint_dir is not set: no checkpoints are written")
    path = session.roots.resolve(setting)
    free, base = session.free_at(path)
    where = f"train.checkpoint_dir={setting!r}: {format_bytes(free)} free at {base}"
    elsewhere = f"free space under {base}, or set train.checkpoint_dir to a folder on a bigger disk"
    findings: list[_Finding] = []
    if needs is None:
        status: Status = "fail" if free < LOW_DISK else "ok"
        findings.append(_Finding(status, f"{where} (the checkpoint's size is unknown)", elsewhere))
    else:
        keep = cfg.train.keep_checkpoints
        rotation = (keep + 1) * needs.checkpoint_bytes
        if free < needs.checkpoint_bytes:
            findings.append(
                _Finding(
                    "fail",
                    f"{where}; one checkpoint takes {format_bytes(needs.checkpoint_bytes)}: it does not fit",
                    elsewhere,
                )
            )
        elif free < rotation:
            findings.append(
                _Finding(
                    "warn",
                    f"{where}; tight: keeping {keep} checkpoints while the next is written takes "
                    f"{format_bytes(rotation)} ({keep + 1} x {format_bytes(needs.checkpoint_bytes)})",
                    f"train.keep_checkpoints=1, or {elsewhere}",
                )
            )
        else:
            findings.append(_Finding("ok", f"{where}; {keep + 1} checkpoints take {format_bytes(rotation)}"))
    persistence = _persistence(session, path, "train.checkpoint_dir")
    return _combine("checkpoint disk", findings + ([persistence] if persistence else []))


def _cache_backend(devices: Devices, env_pjrt: str | None, xla_installed: bool) -> tuple[str, bool]:
    """The backend and XLA use a run will have, guessed without starting the runtime."""
    if xla_installed and devices.tpu and env_pjrt in (None, "TPU"):
        return "tpu", True
    if xla_installed and env_pjrt == "CPU":
        return "cpu", True
    if xla_installed and env_pjrt in ("CUDA", "GPU"):
        return "cuda", True
    return ("cuda" if devices.gpu_files else "cpu"), False


def _cache_disk_check(session: _Session, cfg: Any, devices: Devices, xla_version: str | None) -> Check:
    setting = cfg.train.compile_cache_dir
    pjrt = session.roots.env.get("PJRT_DEVICE", "").strip().upper() or None
    backend, via_xla = _cache_backend(devices, pjrt, xla_version is not None)
    roots = CacheRoots(
        drive=session.drive, kaggle=session.kaggle_working, workdir=session.roots.working_directory()
    )
    try:
        directory = resolve_cache_dir(
            setting,
            backend=backend,
            via_xla=via_xla,
            chip="chip",
            version=xla_version or "unknown",
            roots=roots,
        )
    except ConfigError as err:
        return Check(
            "compile cache disk", "fail", str(err), "set train.compile_cache_dir to 'auto', a folder, or None"
        )
    if directory is None:
        if setting is None:
            why = "off (train.compile_cache_dir=None)"
        elif not via_xla:
            why = "off: this run does not use XLA"
        else:
            why = f"off: train.compile_cache_dir='auto' keeps one on a TPU only (this run: XLA on {backend})"
        return Check("compile cache disk", "ok", why)
    cache_root = directory.parent  # entries go in a per-version, per-chip folder under it
    free, base = session.free_at(cache_root)
    where = f"{cache_root}: {format_bytes(free)} free at {base}"
    fix = f"free space under {base}, or set train.compile_cache_dir to a folder on a bigger disk (None: no cache)"
    if free < LOW_DISK:
        finding = _Finding("fail", f"{where}: no room for compiled programs", fix)
    elif free < CACHE_ROOM:
        finding = _Finding("warn", f"{where}: tight (a cache can take {format_bytes(CACHE_ROOM)})", fix)
    else:
        finding = _Finding("ok", where)
    persistence = _persistence(session, cache_root, "train.compile_cache_dir") if setting != "auto" else None
    return _combine("compile cache disk", [finding] + ([persistence] if persistence else []))


def read_meminfo(proc: Path) -> dict[str, int]:
    """``/proc/meminfo`` in bytes (its figures are KiB), e.g. ``{'MemAvailable': ...}``; empty when unreadable."""
    found: dict[str, int] = {}
    try:
        text = (proc / "meminfo").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            found[key.strip()] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    return found


def ram_check(roots: DoctorRoots, needs: ModelNeeds | None) -> Check:
    """Available host memory against what loading the model takes."""
    info = read_meminfo(roots.proc)
    available = info.get("MemAvailable")
    if available is None:
        return Check(
            "host RAM",
            "warn",
            f"cannot read MemAvailable from {roots.proc / 'meminfo'}",
            "check free memory by hand (free -h)",
        )
    total = f" of {format_bytes(info['MemTotal'])}" if "MemTotal" in info else ""
    saw = f"{format_bytes(available)} available{total}"
    fix = "use a runtime with more memory, a smaller model, or model.quantize=int8 with LoRA"
    if needs is None:
        if available < RAM_FLOOR:
            return Check(
                "host RAM",
                "warn",
                f"{saw}: little room to load a model",
                "close other notebooks or processes, or " + fix,
            )
        return Check("host RAM", "ok", saw)
    load = format_bytes(needs.load_bytes)
    if available < needs.load_bytes:
        return Check("host RAM", "fail", f"{saw}; loading the model takes {load}: it does not fit", fix)
    if available < 2 * needs.load_bytes:
        return Check(
            "host RAM",
            "warn",
            f"{saw}; loading the model takes {load}: tight (a dtype conversion while loading holds a second copy)",
            "close other notebooks or processes, or " + fix,
        )
    return Check("host RAM", "ok", f"{saw}; loading the model takes {load}")
