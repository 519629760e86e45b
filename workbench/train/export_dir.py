"""Where a trained model is exported, and the write that never destroys what the workbench did not write.

Every export (`workbench.train.adapter_files.save_model`, so ``Trainer.save_pretrained`` and ``train
--save-pretrained DIR``) goes through `check_export_dir` and `staged_export`:

- a new or empty directory is written; so is an earlier export of the workbench (it carries
  `EXPORT_MARKER`, or `workbench_base_model.json` for adapters saved before the marker existed);
- a non-empty directory the workbench did not write is refused (`ExportDirError`, naming the
  directory, what is in it and the fix) unless the caller overwrites on purpose (``--overwrite``,
  ``overwrite=True``);
- the run's own base model (``model.pretrained_path``, the bases an adapter there records, the
  directory the weights were loaded from) and its checkpoint directory are refused even then, as is
  any directory holding one of them and any complete checkpoint (``step-N`` with its manifest):
  replacing it would lose the weights the run started from or its checkpoints;
- the files are written into a hidden sibling directory, which is renamed into place once complete
  (where `path` is a symlink, beside and in place of the directory it points to: the link stays);
  an earlier directory is renamed aside first and removed only after the new one is in place, so a
  save that fails or is killed leaves the old directory whole (and at most a ``.NAME.saving-*``
  sibling behind).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workbench.model_dirs import ADAPTER_CONFIG, BASE_MODEL_FILE, STEP_DIR

EXPORT_MARKER = "workbench_export.json"
"""Written into every export: what wrote it and when; a later save may replace a directory holding it."""
OVERWRITE_HINT = "--overwrite on the command line, overwrite=True in Python"


class ExportDirError(ValueError):
    """A directory an export must not write: someone else's files, or the run's own base or checkpoints."""


def check_export_dir(
    path: str | Path, *, overwrite: bool = False, protected: Mapping[Path, str] | None = None
) -> Path:
    """`path` as a directory an export may write (returned); `ExportDirError` when it is not.

    `protected` maps directories to what they are for this run (``"the run's base model
    (model.pretrained_path)"``): `path` may be none of them nor hold one, even with `overwrite`."""
    path = Path(path).expanduser()
    target = path.resolve()
    for kept, role in (protected or {}).items():
        kept = Path(kept).expanduser().resolve()
        if target == kept or target in kept.parents:
            inside = "" if target == kept else f", which holds {str(kept)!r}"
            raise ExportDirError(
                f"cannot save into {str(path)!r}: it is {role}{inside}; saving there would replace the "
                "files this run started from (overwriting is refused here too): save into a new directory, "
                f"e.g. {str(path.parent / (path.name + '-trained'))!r}"
            )
    here = Path.cwd()
    if target == here or target in here.parents:  # a directory cannot be swapped while it is in use
        raise ExportDirError(
            f"cannot save into {str(path)!r}: it is the current directory or holds it; save into a new "
            "directory, e.g. 'trained-model'"
        )
    if STEP_DIR.match(target.name) and (target / "manifest.json").is_file():  # any run's, this one's too
        raise ExportDirError(
            f"cannot save into {str(path)!r}: it is a training checkpoint (its manifest.json is there), which "
            "a resume or generate --model reads (overwriting is refused here too): save into a new directory, "
            f"e.g. {str(target.parent.parent / (target.parent.name + '-export'))!r}"
        )
    if path.exists() and not path.is_dir():
        raise ExportDirError(f"cannot save into {str(path)!r}: it is a file; give a directory (new or empty)")
    if overwrite or not path.is_dir():
        return path
    names = sorted(entry.name for entry in path.iterdir())
    if names and not is_export(path):
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        raise ExportDirError(
            f"cannot save into {str(path)!r}: it holds files the workbench did not write ({shown}); "
            f"save into a new or empty directory, or replace its contents on purpose ({OVERWRITE_HINT})"
        )
    return path


def is_export(path: Path) -> bool:
    """Whether `path` is an earlier export of the workbench (its marker, or an adapter's base record)."""
    return (path / EXPORT_MARKER).is_file() or (path / BASE_MODEL_FILE).is_file()


def run_protected_dirs(cfg: Any) -> dict[Path, str]:
    """The directories a run's export must never replace: its checkpoint directory, its
    ``model.pretrained_path`` and, for an adapter there, the bases it records (read from its JSON
    files only: nothing is loaded or hashed). The weights' own directory is `save_model`'s to add."""
    protected: dict[Path, str] = {}
    if cfg.train.checkpoint_dir:
        protected[Path(cfg.train.checkpoint_dir)] = "the run's checkpoint directory (train.checkpoint_dir)"
    node = Path(cfg.model.pretrained_path).expanduser() if cfg.model.pretrained_path else None
    role = "the run's base model (model.pretrained_path)"
    while node is not None and node not in protected:
        protected[node] = role
        node, role = _recorded_base(node), "the base model of the adapter in model.pretrained_path"
    return protected


def _recorded_base(path: Path) -> Path | None:
    """The base directory an adapter at `path` records (the workbench's record, then peft's); None else."""
    names = []
    for name, key in ((BASE_MODEL_FILE, "name_or_path"), (ADAPTER_CONFIG, "base_model_name_or_path")):
        try:
            names.append(str(json.loads((path / name).read_text()).get(key) or ""))
        except (OSError, ValueError, AttributeError):
            continue
    return next((Path(n).expanduser() for n in names if n and Path(n).expanduser().is_dir()), None)


@contextmanager
def staged_export(path: Path, *, kind: str, write: bool = True) -> Iterator[Path]:
    """A hidden sibling directory of `path` to write the export into; on a clean exit it is marked and
    put in `path`'s place (an earlier directory there removed only after). Not `write`: yields `path`
    and touches nothing (a rank that does not write)."""
    if not write:
        yield path
        return
    if path.is_symlink():  # a link to a directory elsewhere (a Drive folder): write there, keep the link
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.saving-", dir=path.parent))
    staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; an export is shared like any directory
    try:
        yield staging
        marker = {"written_by": "workbench", "kind": kind, "created_unix": time.time()}
        (staging / EXPORT_MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        _put_in_place(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _put_in_place(staging: Path, path: Path) -> None:
    """Rename `staging` to `path`; a directory already there is renamed aside first and removed after."""
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()
    if not path.exists():
        os.replace(staging, path)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.replaced-", dir=path.parent))
    try:
        os.replace(path, aside / path.name)
    except BaseException:  # the old directory stands where it was: nothing left beside it
        aside.rmdir()
        raise
    try:
        os.replace(staging, path)
    except BaseException:
        os.replace(aside / path.name, path)  # the old export back, whole
        raise
    shutil.rmtree(aside, ignore_errors=True)
