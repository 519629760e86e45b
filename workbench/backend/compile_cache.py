"""The persistent XLA compilation cache: where it goes, switching it on in time, what it saved.

Long compiles are paid again in every session unless torch_xla keeps its compiled programs on
disk (``torch_xla.runtime.initialize_cache``). This module owns the workbench's use of it:

- `resolve_cache_dir`: ``train.compile_cache_dir`` to a directory, a pure function of the
  setting, the hardware and the filesystem roots (injectable, so it is tested without a TPU).
  ``'auto'`` turns the cache on for TPUs only: in Colab's mounted Drive, in ``/kaggle/working``
  on Kaggle, else ``./.xla_cache``; an explicit path turns it on for any XLA run (XLA:CPU too);
  None turns it off. Entries go in a subfolder named after the torch_xla version and the chip
  (`cache_key`), so an upgrade or another chip never reads stale programs.
- `enable_compile_cache`: checks the directory (a bad explicit path is a `ConfigError` naming
  the field) and points torch_xla at it. torch_xla reads the setting when it first compiles,
  so this must come before any XLA compile in the process; when it comes too late (a notebook
  that ran XLA work in earlier cells) it says so once in its notices and the run goes on.
- `CompileCache.run_notices`: after the run, torch_xla's counters (``PersistentCacheHit``,
  ``PersistentCacheMiss``, ``PersistentCacheDeserializeFailure``) say what the cache did:
  "5 of 6 programs loaded from <dir>" where it works (TPU, GPU). XLA:CPU in torch_xla 2.9
  writes entries but cannot read them back (every load fails and the program compiles again):
  that is said once, and no saving is claimed.
- `describe_compile_cache`: one line for ``python -m workbench info``.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from workbench.backend.hardware import HardwareInfo
from workbench.backend.xla import runtime
from workbench.config import ConfigError

_FIELD = "train.compile_cache_dir"
_ALLOWED = "a directory this process can create and write, 'auto' (a cache on a TPU) or None (no cache)"

# torch_xla's counters for lookups that went to disk (torch_xla/csrc/runtime/cache.h): a program
# found in memory counts in none of them.
_HIT, _MISS, _LOAD_FAILURE = "PersistentCacheHit", "PersistentCacheMiss", "PersistentCacheDeserializeFailure"


@dataclass(frozen=True)
class CacheRoots:
    """Where 'auto' looks for a place that outlives the session (injectable for tests)."""

    drive: Path = Path("/content/drive/MyDrive")
    """Colab's Google Drive, when mounted (``drive.mount('/content/drive')``)."""
    kaggle: Path = Path("/kaggle/working")
    """Kaggle's output folder, kept with a saved notebook version."""
    workdir: Path | None = None
    """The working directory ('auto' elsewhere, and relative explicit paths); None: the current one."""

    def working_directory(self) -> Path:
        return self.workdir if self.workdir is not None else Path.cwd()


def xla_version() -> str:
    """The installed torch_xla's version, read from its package metadata (nothing is imported)."""
    try:
        return importlib.metadata.version("torch_xla")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def cache_key(version: str, chip: str) -> str:
    """The subfolder entries go in: programs serialized by one torch_xla for one chip kind."""
    return f"torch_xla-{version}-{chip}".replace(os.sep, "-")


def resolve_cache_dir(
    setting: str | None,
    *,
    backend: str,
    via_xla: bool,
    chip: str,
    version: str,
    roots: CacheRoots = CacheRoots(),
) -> Path | None:
    """The directory compiled programs go in for `setting` on this hardware, or None for no cache.

    `setting` is ``train.compile_cache_dir``: None (off), 'auto' or a path. Runs not driven by
    XLA have no cache. Raises `ConfigError` for a setting that is not a usable path string.
    """
    if setting is None:
        return None
    if not isinstance(setting, str) or not setting.strip():
        raise ConfigError(f"{_FIELD}={setting!r} is not allowed: expected {_ALLOWED}")
    if not via_xla:
        return None
    key = cache_key(version, chip)
    if setting.strip() == "auto":
        # TPU only: the chips whose compiles are long and whose runtimes (Colab, Kaggle, TPU VMs)
        # are thrown away between sessions. GPUs and XLA:CPU need an explicit path.
        if backend != "tpu":
            return None
        if roots.drive.is_dir():
            return roots.drive / "xla_cache" / key
        if roots.kaggle.is_dir():
            return roots.kaggle / "xla_cache" / key
        return roots.working_directory() / ".xla_cache" / key
    path = Path(setting.strip()).expanduser()
    if not path.is_absolute():
        path = roots.working_directory() / path
    return path / key


def prepare_cache_dir(path: Path, setting: str) -> Path:
    """Create `path` and check it can be written; `ConfigError` naming the setting when not."""
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        problem = f"{blocker} is a file, not a directory"
    else:
        try:
            path.mkdir(parents=True, exist_ok=True)
            # os.access ignores permission bits for root: only writing a real file is a sure check
            with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
                pass
            return path
        except OSError as err:
            problem = f"{path} cannot be created or written ({err.strerror or err})"
    raise ConfigError(f"{_FIELD}={setting!r} is not allowed: {problem}; expected {_ALLOWED}")


def _disk_counters() -> dict[str, int]:
    return {name: runtime.counter_value(name) for name in (_HIT, _MISS, _LOAD_FAILURE)}


@dataclass
class CompileCache:
    """The cache of one run: its directory, whether torch_xla uses it, and what it has said."""

    directory: Path | None
    """Where entries go; None when the run has no cache."""
    active: bool
    """True when torch_xla in this process caches its programs in `directory`."""
    backend: str
    notices: tuple[str, ...] = ()
    """What enabling it said (too late in this process, a directory 'auto' could not use)."""
    baseline: dict[str, int] = field(default_factory=dict)
    """torch_xla's cache counters when the run began (they count for the whole process)."""

    def lookups(self) -> dict[str, int]:
        """Programs looked up on disk since the run began: 'loaded', 'not_found', 'unreadable'."""
        if not self.active:
            return {"loaded": 0, "not_found": 0, "unreadable": 0}
        now = _disk_counters()
        diff = {name: now[name] - self.baseline.get(name, 0) for name in now}
        return {"loaded": diff[_HIT], "not_found": diff[_MISS], "unreadable": diff[_LOAD_FAILURE]}

    def run_notices(self) -> list[str]:
        """What the cache did in this run, read from torch_xla's counters (call once, at the end);
        each line is also warned, as the Trainer's notices are. Nothing when it was off or unused."""
        counts = self.lookups()
        total = sum(counts.values())
        if not total:
            return []
        loaded, unreadable = counts["loaded"], counts["unreadable"]
        if unreadable and self.backend == "cpu":
            message = (
                f"compile cache: XLA:CPU (torch_xla {xla_version()}) writes entries to {self.directory} "
                f"but cannot read them back ({unreadable} of {total} failed to load and compiled again), "
                "so every session compiles again: no compile time is saved on this backend"
            )
        elif unreadable:
            message = (
                f"compile cache: {loaded} of {total} programs loaded from {self.directory}; {unreadable} "
                "entries could not be read back and were compiled again (written by another torch_xla or chip?)"
            )
        else:
            message = f"compile cache: {loaded} of {total} programs loaded from {self.directory}"
            if counts["not_found"]:
                message += f", {counts['not_found']} compiled and written to it"
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return [message]


def enable_compile_cache(
    setting: str | None, hw: HardwareInfo, *, roots: CacheRoots = CacheRoots()
) -> CompileCache:
    """Point torch_xla's persistent compilation cache at the directory `setting` resolves to.

    Call before the process's first XLA compile (the `Trainer` does, first thing after
    detecting the hardware; in a notebook, build the Trainer or call this in an early cell).
    A bad explicit path raises `ConfigError`; 'auto' never raises (an unusable directory turns
    the cache off with a notice). Too late in this process: a notice, no cache, no error.
    """
    directory = resolve_cache_dir(
        setting, backend=hw.backend, via_xla=hw.via_xla, chip=hw.chip, version=xla_version(), roots=roots
    )
    off = CompileCache(directory=None, active=False, backend=hw.backend)
    if directory is None:
        return off
    assert setting is not None  # resolve_cache_dir returns None for None
    try:
        prepare_cache_dir(directory, setting)
    except ConfigError as err:
        if setting.strip() != "auto":
            raise
        return _with_notice(off, f"compile cache off: {err}")
    baseline = _disk_counters()
    if not runtime.initialize_compile_cache(directory):
        current = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
        already = f" (it caches in {current})" if current else ""
        return _with_notice(
            off,
            f"compile cache not enabled: XLA already compiled programs in this process{already}, and "
            f"torch_xla fixes its cache at the first compile; to cache in {directory}, call "
            f"workbench.backend.compile_cache.enable_compile_cache(cfg.{_FIELD}, hw) before any XLA work "
            "(a notebook's first cells, right after detect()) or restart the runtime and build the Trainer first",
        )
    return CompileCache(directory=directory, active=True, backend=hw.backend, baseline=baseline)


def _with_notice(cache: CompileCache, message: str) -> CompileCache:
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    cache.notices = (*cache.notices, message)
    return cache


def describe_compile_cache(setting: str | None, hw: HardwareInfo, *, roots: CacheRoots = CacheRoots()) -> str:
    """One line on the cache `setting` gives on this hardware: its directory and entries, or why none."""
    try:
        directory = resolve_cache_dir(
            setting, backend=hw.backend, via_xla=hw.via_xla, chip=hw.chip, version=xla_version(), roots=roots
        )
    except ConfigError as err:
        return str(err)
    if directory is None:
        if setting is None:
            return f"off ({_FIELD}=None)"
        if not hw.via_xla:
            return "off (the run does not use XLA)"
        return f"off ({_FIELD}='auto' keeps one on a TPU only; set a path to use one here)"
    entries = sum(1 for p in directory.iterdir() if p.is_file()) if directory.is_dir() else 0
    note = "; XLA:CPU writes entries but cannot read them back" if hw.backend == "cpu" else ""
    return f"{directory} ({entries} entr{'y' if entries == 1 else 'ies'}{note})"
