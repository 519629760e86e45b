"""Checkpoints that survive faults: atomic, verified, pickle-free.

A checkpoint is one directory ``<root>/step-00000120/`` holding

- ``<part>.safetensors`` for every top-level entry of the saved state that holds tensors
  (``model.safetensors`` is a plain weights file keyed by parameter name; optimizer moments,
  RNG states and so on go to their own files);
- ``state.json``: everything that is not a tensor (step, scheduler, sampler position,
  optimizer hyper-parameters, Python/NumPy RNG) plus the structure that puts the tensors
  back where they were;
- ``manifest.json``: size and SHA-256 of every other file, written last.

Which parts take which format is the run's `checkpoint_store.TensorStore`, chosen by its
`Replicas`. Under SPMD (``sharded=True``) the tensors of a part sharded over the mesh go through
`torch.distributed.checkpoint` with the backend's planners instead (``<part>.dcp/``): each
device's shard is written as it is, and loading writes shards straight into the already-sharded
destination tensors. Across torchrun's ranks every part holding tensors goes through DCP's default
planners, every rank writing its own shards (FSDP2) or one copy of replicated tensors (DDP) into
the same directory; the main rank writes the index files and renames it into place, the ranks
meeting through the `Replicas` (`broadcast`, `gather`, `barrier`). DCP reshards on load, so such a
checkpoint resumes with any number of processes, one included.
DCP keeps its index in a pickle; we read it with torch's weights-only unpickler
restricted to DCP's metadata classes, never with `pickle.load`.

Atomicity: everything is written into ``<root>/.tmp-step-...`` and fsynced, then the
directory is renamed into place (a rename within one directory is atomic on POSIX).
A crash before the rename leaves only a temporary directory, which `latest()` ignores and
the next `save` removes; the previous checkpoint stays loadable. `load` checks the manifest
first, so a truncated or corrupted file fails with `CheckpointError` naming the file and
what is wrong, instead of a confusing error deep inside a deserialiser.

The file formats (safetensors, DCP, JSON) live in `state_io`. Nothing is ever unpickled:
tensors come from safetensors (or DCP through a restricted unpickler), the rest from JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from workbench.backend.protocol import OneProcess, Replicas
from workbench.model_dirs import STEP_DIR, checkpoint_written_at, files_damage, manifest_files
from workbench.train.checkpoint_store import HostSnapshot, store_for
from workbench.train.finite import NonFiniteStateError, first_non_finite
from workbench.train.state_io import (
    FORMAT_VERSION,
    CheckpointError,
    DamagedCheckpointError,
    NoCheckpointVerifiesError,
    files_under,
    flatten_state,
    fsync_dir,
    fsync_file,
    full_tensor,
    load_dcp_to_host,
    load_safetensors,
    save_safetensors,
    sha256,
    shard_like,
    unflatten_state,
)

MANIFEST = "manifest.json"


def _workbench_version() -> str:
    try:
        return version("xla-workbench")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


WORKBENCH_VERSION = _workbench_version()
"""The version a checkpoint's manifest records: a later workbench says which one wrote it."""
STATE_JSON = "state.json"
_TMP_PREFIX = ".tmp-"
# A step directory moved aside while the same step is saved again: `_commit` below names it.
_MOVED_ASIDE = re.compile(r"^\.tmp-old-(step-\d{8,})-[0-9a-f]{8}$")


# ---- the manager -------------------------------------------------------------------------------


class CheckpointManager:
    """Save, find and load checkpoints under `root`, keeping the newest `keep`.

    `state` is a nested dict, typically ``{"model": ..., "optimizer": ..., "scheduler": ...,
    "sampler": ..., "rng": ..., "step": int}``. Each top-level entry holding tensors gets its
    own weights file. With ``sharded=True`` (SPMD), top-level entries that hold tensors sharded
    over the mesh are written through torch.distributed.checkpoint; loading those needs `into=`,
    the live state whose (sharded) tensors receive the values. `replicas`: the run's processes
    (None: this process alone, its tensors wherever they are); several save together (collective:
    all call `save`).
    """

    def __init__(
        self,
        root: str | Path,
        keep: int = 2,
        *,
        sharded: bool = False,
        replicas: Replicas | None = None,
        refuse_non_finite: bool = False,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep!r} is not allowed: must be >= 1")
        self.root = Path(root)
        self.keep = int(keep)
        self.sharded = bool(sharded)
        self.replicas = replicas or OneProcess()
        """The processes that save together; the main one alone repairs, indexes and renames."""
        self.store = store_for(self.replicas, sharded=self.sharded)
        """What each part's tensors become: host copies, a mesh's local shards, every rank's live shards."""
        self.refuse_non_finite = bool(refuse_non_finite)
        """`write` raises `NonFiniteStateError` (writing nothing) for a state holding inf or nan."""

    # ---- finding ----
    def checkpoints(self) -> list[Path]:
        """Complete checkpoints (renamed into place, with a manifest), the earliest written first.

        Ordered by when each was written (its manifest's ``created_unix``), then by step, not by
        step alone: a run restarted from an earlier point (or with ``resume=False``) writes lower
        steps after higher ones, and its own checkpoints are the ones to resume from and to keep.
        """
        if not self.root.is_dir():
            return []
        if self.replicas.is_main:  # across ranks one rank repairs the directory, never two racing to rename
            self._restore_moved_aside()
        found = []
        for entry in self.root.iterdir():
            match = STEP_DIR.match(entry.name)
            if match and entry.is_dir() and (entry / MANIFEST).is_file():
                found.append((checkpoint_written_at(entry), int(match.group(1)), entry))
        return [path for _, _, path in sorted(found)]

    def latest(self) -> Path | None:
        """The most recently written complete checkpoint, or None. Across ranks it is the main rank's
        answer (collective: every rank asks), so no rank loads a checkpoint the others do not."""
        found = self.checkpoints() if self.replicas.is_main else []
        return self.replicas.broadcast(found[-1] if found else None)

    def newest_verified(self, notice: Callable[[str], None]) -> Path | None:
        """The most recently written checkpoint that verifies, or None when there is none; each newer
        damaged one (`DamagedCheckpointError`: a file missing, truncated or corrupted, an unreadable
        manifest) is moved aside, never deleted, as ``step-N.damaged-<what>-<time>``, and `notice` says so.
        Hashes only as far back as the first that verifies. `NoCheckpointVerifiesError` when every one
        was damaged. Across ranks the main rank checks and moves; every rank gets its answer."""
        path, moved = None, []
        if self.replicas.is_main:
            for candidate in reversed(self.checkpoints()):
                try:
                    self.verify(candidate)
                except DamagedCheckpointError as err:
                    moved.append(self._move_aside(candidate, err, notice))
                    continue
                path = candidate
                break
        path, moved = self.replicas.broadcast((path, moved))
        if path is None and moved:
            raise NoCheckpointVerifiesError(
                f"no checkpoint under {str(self.root)!r} verifies: each was moved aside and kept ({', '.join(moved)}; "
                "the notices above say what is wrong with each). Re-run to start from step 0, or set "
                "train.checkpoint_dir to another directory"
            )
        return path

    def _move_aside(self, path: Path, err: DamagedCheckpointError, notice: Callable[[str], None]) -> str:
        """Rename a damaged checkpoint out of the resume's way, with a notice; returns its new name."""
        aside = path.with_name(f"{path.name}.damaged-{err.reason}-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(path, aside)
        fsync_dir(self.root)
        notice(f"{err}: moved aside as {aside.name} (kept, not deleted); a resume looks at the one before it")
        return aside.name

    def path_for(self, step: int) -> Path:
        """Where checkpoint `step` is (or will be, once written)."""
        return self.root / f"step-{int(step):08d}"

    @staticmethod
    def step_of(path: str | Path) -> int:
        match = STEP_DIR.match(Path(path).name)
        if not match:
            raise CheckpointError(
                f"{str(path)!r} is not a checkpoint directory (expected a name like step-00000120)"
            )
        return int(match.group(1))

    # ---- saving ----
    def save(self, step: int, state: Mapping[str, Any]) -> Path:
        """Write `state` as checkpoint `step` atomically; prune to the newest `keep`. Returns its path."""
        return self.write(self.snapshot(step, state))

    def snapshot(self, step: int, state: Mapping[str, Any], *, copy: bool = False) -> HostSnapshot:
        """`state` copied to the host: the only part of a save that must happen at the step boundary.
        `copy`: host tensors are copied too (training goes on changing them while `write` runs)."""
        if not isinstance(state, Mapping):
            raise CheckpointError(
                f"state is a {type(state).__name__}: it must be a dict with string keys (model, optimizer, ...)"
            )
        bad_keys = [k for k in state if not isinstance(k, str)]
        if bad_keys:
            raise CheckpointError(
                f"state key {bad_keys[0]!r} ({type(bad_keys[0]).__name__}) is not allowed: keys must be strings"
            )
        if int(step) < 0:
            raise CheckpointError(f"step={step!r} is not allowed: must be >= 0")
        snap = HostSnapshot(int(step))
        for part, value in state.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", part):
                raise CheckpointError(
                    f"state key {part!r} is not allowed: use letters, digits, '_', '-', '.'"
                )
            snap.structure[part], tensors = flatten_state(value)
            if tensors:
                self.store.copy_part(snap, part, tensors, copy=copy)
        snap.structure = json.loads(json.dumps(snap.structure))  # a copy: later changes to `state` stay out
        return snap

    def write(self, snap: HostSnapshot) -> Path:
        """Write a `snapshot` as its checkpoint, atomically (temporary directory, fsync, rename); prune
        to the newest `keep`. Touches no device: it runs on a background thread while training goes on.
        Across ranks every rank calls it: each writes its shards, the main rank the rest."""
        self._refuse_non_finite(snap)
        main = self.replicas.is_main
        if main:
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_stale_temporaries()
        final = self.path_for(snap.step)
        # one directory for every rank's files: the main rank names it
        tmp = self.root / self.replicas.broadcast(f"{_TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}")
        if main:
            tmp.mkdir()
        try:
            self._write_parts(snap, tmp, final, main=main)
        except BaseException:
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if main:
            self._prune(keep_path=final)
        self.replicas.barrier()  # nobody reads the checkpoint before it is in place
        return final

    def _refuse_non_finite(self, snap: HostSnapshot) -> None:
        """`NonFiniteStateError` before anything is written, when ``refuse_non_finite`` and the snapshot
        holds inf or nan (`workbench.train.finite`); across ranks every rank raises if any found one."""
        if not self.refuse_non_finite:
            return
        # a save is collective: every rank stops, or none
        found_by_each = self.replicas.gather(first_non_finite({**snap.files, **snap.sharded}))
        found = next((each for each in found_by_each if each is not None), None)
        if found is not None:
            raise NonFiniteStateError(snap.step, *found)

    def _write_parts(self, snap: HostSnapshot, tmp: Path, final: Path, *, main: bool) -> None:
        """The files of `snap` into `tmp`, then (main rank) the index, the manifest and the rename to `final`."""
        parts: dict[str, str] = {}
        digests: dict[str, str] = {}
        files = dict(snap.files)
        self.replicas.barrier()  # the directory exists for every rank
        for part, shards in snap.sharded.items():
            if self.store.write_dcp(shards, tmp / f"{part}.dcp"):
                parts[part] = "dcp"
            else:
                files[part] = {key: full_tensor(shards[unique]) for key, unique in snap.aliases[part].items()}
        if not main:  # DCP's save returns once every rank's shards are written: the rest is the main rank's
            return
        for part, tensors in files.items():
            digests[f"{part}.safetensors"] = save_safetensors(tensors, tmp / f"{part}.safetensors")
            parts[part] = "safetensors"
        payload = {
            "format_version": FORMAT_VERSION,
            "step": snap.step,
            "parts": parts,
            "state": snap.structure,
            # which written tensor each key of a DCP part is (tied weights are written once): what
            # a load without live destinations (`into`) needs to put every key back
            "aliases": {part: snap.aliases[part] for part, kind in parts.items() if kind == "dcp"},
        }
        (tmp / STATE_JSON).write_text(json.dumps(payload))
        manifest = {
            "format_version": FORMAT_VERSION,
            "workbench_version": WORKBENCH_VERSION,
            "step": snap.step,
            "created_unix": time.time(),
            "files": {},
        }
        for path in files_under(tmp):
            fsync_file(path)
            name = str(path.relative_to(tmp))
            digest = digests.get(name) or sha256(path)
            manifest["files"][name] = {"bytes": path.stat().st_size, "sha256": digest}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        fsync_file(tmp / MANIFEST)
        fsync_dir(tmp)
        self._commit(tmp, final)

    def _commit(self, tmp: Path, final: Path) -> None:
        """The atomic step: rename the finished temporary directory into place."""
        old = None
        if final.exists():  # re-saving a step: move the old one aside first, drop it after
            old = final.with_name(f"{_TMP_PREFIX}old-{final.name}-{uuid.uuid4().hex[:8]}")
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _remove_stale_temporaries(self) -> None:
        """Leftovers of saves that crashed before their rename, and of prunings cut short."""
        self._restore_moved_aside()
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(_TMP_PREFIX) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)

    def _restore_moved_aside(self) -> None:
        """A re-save of step N moves the old step-N aside before renaming the new one in; a crash between
        the two leaves only the moved-aside copy, which is complete: put it back (before anything lists
        the checkpoints, so a resume finds it)."""
        for entry in sorted(self.root.iterdir()):
            moved = _MOVED_ASIDE.match(entry.name)
            original = self.root / moved.group(1) if moved else None
            if original is not None and not original.exists() and (entry / MANIFEST).is_file():
                os.replace(entry, original)
                fsync_dir(self.root)

    def _prune(self, keep_path: Path) -> None:
        """Keep the `keep` most recently written checkpoints; never the one just written."""
        others = [path for path in self.checkpoints() if path != keep_path]
        for path in others[: max(0, len(others) - (self.keep - 1))]:
            # renamed first (atomic): a removal cut short leaves a temporary the next save clears, not a
            # checkpoint-sized folder nothing would ever delete
            doomed = path.with_name(f"{_TMP_PREFIX}del-{path.name}-{uuid.uuid4().hex[:8]}")
            os.replace(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    # ---- loading ----
    def verify(self, path: str | Path) -> dict[str, Any]:
        """Check `path` against its manifest; return the manifest or raise `CheckpointError`."""
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            complete = [p for p in self.checkpoints() if p != path] if path.parent == self.root else []
            instead = f"; the newest complete one is {str(complete[-1])!r}" if complete else ""
            raise CheckpointError(
                f"checkpoint {str(path)!r} is incomplete: it has no {MANIFEST} (its save did not finish: the "
                f"process stopped while writing it). Delete it and resume from a complete checkpoint{instead}"
            )
        try:
            manifest = json.loads(manifest_path.read_text())
            listed = manifest_files(manifest)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DamagedCheckpointError(
                f"checkpoint {str(path)!r} has an unreadable {MANIFEST}: {err}", "bad-manifest"
            ) from None
        if manifest.get("format_version") != FORMAT_VERSION:
            written_by = manifest.get("workbench_version")
            if written_by == "unknown":  # written from a source tree that was never installed
                written_by = None
            install = (
                f"pip install 'xla-workbench=={written_by}'" if written_by else "the workbench that wrote it"
            )
            raise CheckpointError(
                f"checkpoint {str(path)!r} was written by workbench {written_by or '(an earlier version)'} in "
                f"checkpoint format {manifest.get('format_version')!r}; this workbench ({WORKBENCH_VERSION}) reads "
                f"format {FORMAT_VERSION}: continue it with {install}, or start fresh with train.resume=false "
                "or another train.checkpoint_dir"
            )
        damage = files_damage(path, listed)
        if damage is not None:
            reason, words = damage
            raise DamagedCheckpointError(f"checkpoint {str(path)!r}: {words}", reason)
        return manifest

    def saved_config(self, path: str | Path) -> dict[str, Any] | None:
        """The run config a checkpoint was saved with (its ``config`` part), or None when it has none."""
        try:
            payload = json.loads((Path(path) / STATE_JSON).read_text())
            return unflatten_state(payload["state"]["config"], {})
        except (OSError, ValueError, KeyError, TypeError, CheckpointError):
            return None

    def load(
        self,
        path: str | Path | None = None,
        *,
        into: Mapping[str, Any] | None = None,
        parts: Collection[str] | None = None,
    ) -> dict[str, Any]:
        """Load checkpoint `path` (default: the latest) after verifying it; only `parts` when given.

        Returns the nested state with CPU tensors. Parts saved through torch.distributed.checkpoint
        are loaded into the matching tensors of `into` (same structure as what was saved) and
        those live tensors are returned in place of CPU copies; without `into` they come back as
        whole host tensors.
        """
        if path is None:
            path = self.latest()
            if path is None:
                raise CheckpointError(f"no complete checkpoint under {str(self.root)!r}")
        path = Path(path)
        self.verify(path)
        try:
            payload = json.loads((path / STATE_JSON).read_text())
        except ValueError as err:
            raise CheckpointError(
                f"checkpoint {str(path)!r}: {STATE_JSON} is not valid JSON: {err}"
            ) from None
        out: dict[str, Any] = {}
        for part, structure in payload["state"].items():
            if parts is not None and part not in parts:
                continue
            kind = payload["parts"].get(part)
            if kind is None:
                tensors: dict[str, torch.Tensor] = {}
            elif kind == "safetensors":
                tensors = load_safetensors(path / f"{part}.safetensors")
                if into is not None and part in into:  # a one-process checkpoint resumed under FSDP2
                    tensors = shard_like(tensors, flatten_state(into[part])[1])
            elif kind == "dcp" and into is not None and part in into:
                _, targets = flatten_state(into[part])
                self.store.load_dcp(targets, path / f"{part}.dcp")
                tensors = targets
            elif kind == "dcp":  # no live destinations: whole host tensors, each tied key put back
                written = load_dcp_to_host(path / f"{part}.dcp")
                aliases = payload.get("aliases", {}).get(part, {})
                tensors = {key: written[unique] for key, unique in aliases.items() if unique in written}
                tensors = {**written, **tensors}
            else:
                raise CheckpointError(f"checkpoint {str(path)!r}: unknown storage {kind!r} for part {part!r}")
            out[part] = unflatten_state(structure, tensors)
        return out
