"""How a checkpoint's state is written and read: nested state dicts flattened into tensors plus a
JSON structure, safetensors files (or torch.distributed.checkpoint for sharded tensors), fsynced
files, SHA-256 digests, and the RNG states of Python, NumPy, torch and the backend's device.

`CheckpointManager` (``checkpoint.py``) decides where and when, `checkpoint_store` which of these
formats a run's tensors take; this module decides how. What depends on the device (host copies,
local shards, DCP planners, the device's RNG) is asked of the run's `Backend`.
DCP keeps its index in a pickle; it is read with torch's weights-only unpickler restricted to
DCP's metadata classes, never with `pickle.load`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench.backend.protocol import host_copies
from workbench.backend.selection import backend_of
from workbench.model_dirs import file_sha256
from workbench.models.layer_stack import layer_slice_origin

if TYPE_CHECKING:  # annotations only
    from workbench.backend.protocol import Backend

FORMAT_VERSION = 1


# ---- nested state <-> (JSON structure, flat tensors) ---------------------------------------


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, truncated or corrupted; the message says which file and why."""


class DamagedCheckpointError(CheckpointError):
    """A complete checkpoint's files no longer match its manifest (a file missing, truncated or corrupted,
    the manifest unreadable): damage after the write, which a resume steps back over. `reason`: one word
    for it (``missing``, ``truncated``, ``corrupted``, ``bad-manifest``)."""

    def __init__(self, message: str, reason: str = "damaged") -> None:
        super().__init__(message)
        self.reason = reason


class NoCheckpointVerifiesError(CheckpointError, ValueError):
    """Every checkpoint under a run's directory is damaged: nothing to resume from (the run cannot start)."""


def flatten_state(state: Any, prefix: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """Split a nested state into a JSON-able structure and a flat ``{key: tensor}`` dict.

    Supported leaves: tensors, NumPy arrays, int/float/bool/str/None. Containers: dict (any
    JSON-scalar keys, so optimizer state keyed by int survives), list, tuple. Tensor keys
    are the '/'-joined path, so a model state dict's keys are its parameter names.
    """
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(state, prefix, tensors)
    return structure, tensors


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}/{key}" if prefix else str(key)


def _encode(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    import numpy as np

    if isinstance(obj, torch.Tensor):
        if path in tensors:
            raise CheckpointError(f"two tensors map to the same checkpoint key {path!r}; rename one of them")
        tensors[path] = obj
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        tensors[path] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {"__ndarray__": path}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, _join(path, i), tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, _join(path, i), tensors) for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        items = []
        for key, value in obj.items():
            if not (key is None or isinstance(key, (bool, int, float, str))):
                raise CheckpointError(
                    f"cannot checkpoint key {key!r} at {path or '<root>'}: keys must be str/int/float/bool"
                )
            items.append([key, _encode(value, _join(path, key), tensors)])
        return {"__items__": items}
    raise CheckpointError(
        f"cannot checkpoint a {type(obj).__name__} at {path or '<root>'}: allowed are tensors, "
        "NumPy arrays, numbers, strings, None, and dicts/lists/tuples of them"
    )


def unflatten_state(structure: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Inverse of `flatten_state`."""
    if isinstance(structure, list):
        return [unflatten_state(v, tensors) for v in structure]
    if isinstance(structure, dict):
        if "__tensor__" in structure:
            return _tensor(tensors, structure["__tensor__"])
        if "__ndarray__" in structure:
            return _tensor(tensors, structure["__ndarray__"]).numpy()
        if "__tuple__" in structure:
            return tuple(unflatten_state(v, tensors) for v in structure["__tuple__"])
        if "__items__" in structure:
            return {key: unflatten_state(value, tensors) for key, value in structure["__items__"]}
        raise CheckpointError(f"state.json holds an unknown node {sorted(structure)}")
    return structure


def _tensor(tensors: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    try:
        return tensors[key]
    except KeyError:
        raise CheckpointError(f"checkpoint lacks tensor {key!r} that state.json refers to") from None


sha256 = file_sha256
"""The SHA-256 of a checkpoint file, as its manifest records it (`workbench.model_dirs.file_sha256`)."""


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not every filesystem lets a directory be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def files_under(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def host_tensors(tensors: Mapping[str, torch.Tensor], *, copy: bool = False) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors for writing: device tensors fetched in one batched transfer where the
    device allows (`workbench.backend.protocol.host_copies`), shared storage un-shared. A tensor
    already on the CPU and contiguous comes back as it is, not copied (a save needs no second copy of
    a host model), unless `copy` (a background save, which writes while training goes on changing the
    live tensors).

    A stacked layer weight's per-layer views (``model.scan_layers``,
    `workbench.models.layer_stack.layer_slice_origin`) are sliced on the host: each stacked tensor
    is fetched once, as it is on the device (no slicing program compiled, no copy on the device),
    and its layers copied out of it before the next is fetched."""
    keys = list(tensors)
    origins = [layer_slice_origin(t) for t in tensors.values()]
    # an FSDP2 shard (torchrun) is put together whole: collective, every rank asks in the same order
    values = [full_if_sharded(t.detach()) for t in tensors.values()]
    live = {i for i, t in enumerate(values) if copy and t.device.type == "cpu" and origins[i] is None}
    away = [i for i, t in enumerate(values) if t.device.type != "cpu" and origins[i] is None]
    for i, fetched in zip(away, host_copies([values[i] for i in away])):
        values[i] = fetched
    by_base: dict[int, list[int]] = {}
    for i, origin in enumerate(origins):
        if origin is not None:
            by_base.setdefault(id(origin[0]), []).append(i)
    for positions in by_base.values():
        stacked = origins[positions[0]][0]
        host = host_copies([stacked])[0]
        for i in positions:
            values[i] = host[origins[i][1]].clone()
        del host
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for i, (key, t) in enumerate(zip(keys, values)):
        host = t.to("cpu").contiguous()
        ptr = host.untyped_storage().data_ptr() if host.numel() else 0
        # copied when the live tensor would be kept, or when it shares memory with one already out (tied
        # weights: safetensors' own writer, which exports through transformers and peft use, refuses that)
        if (i in live and host is t) or (ptr and ptr in seen):
            host = host.clone()
        seen.add(ptr)
        out[key] = host
    return out


def full_if_sharded(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (gathered from every rank), any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_like(
    tensors: dict[str, torch.Tensor], targets: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """`tensors` (whole host tensors, e.g. a one-process checkpoint's safetensors part) with each one
    whose live target is a DTensor (FSDP2 under torchrun) cut to that target's mesh and placements, this
    rank's piece taken locally (no communication: every rank read the whole file). Without it a
    one-process checkpoint cannot be resumed under FSDP2: ``load_state_dict`` and the optimizer refuse to
    mix a plain tensor with a DTensor parameter."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    out = dict(tensors)
    for key, value in tensors.items():
        target = targets.get(key)
        if isinstance(target, DTensor) and not isinstance(value, DTensor):
            local = value.to(target.device)
            out[key] = distribute_tensor(local, target.device_mesh, target.placements, src_data_rank=None)
    return out


def host_layer_views(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` with every stacked layer weight's per-layer XLA view replaced by its host copy
    (`host_tensors`: each stacked tensor fetched once), the other tensors as they are. Before a
    sharded save: handed to DCP as views, every one would compile a program of its own, and a
    save that falls back to safetensors then finds them on the host already."""
    out = dict(tensors)
    views = {key: t for key, t in out.items() if layer_slice_origin(t) is not None}
    if views:
        out.update(host_tensors(views))
    return out


_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
_BLOCK_BYTES = 16 * 1024 * 1024


def write_block(handle: Any, block: memoryview | bytes) -> None:
    """Write one block of a checkpoint file (the one place a safetensors file's bytes go out: a bench
    wraps it to simulate a slow target such as a Drive mount)."""
    handle.write(block)


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: Path) -> str:
    """Write contiguous CPU `tensors` as a safetensors file, in blocks, hashing as it goes; returns the
    file's SHA-256 (the manifest's digest without reading the file back).

    Written here rather than by `safetensors.torch.save_file`, which builds the whole file in memory
    while holding the GIL: a background save would stall the training thread for its length. File
    writes and hashing release the GIL, so the training loop runs between blocks."""
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"cannot write tensor {name!r} of dtype {tensor.dtype} to safetensors")
        size = tensor.numel() * tensor.element_size()
        entries[name] = {
            "dtype": _SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the data starts 8-byte aligned, as the format asks
    digest = hashlib.sha256()
    with open(path, "wb") as handle:
        for block in _file_blocks(header, tensors):
            digest.update(block)
            write_block(handle, block)
    return digest.hexdigest()


def _file_blocks(header: bytes, tensors: Mapping[str, torch.Tensor]) -> Any:
    yield len(header).to_bytes(8, "little") + header
    for tensor in tensors.values():
        if not tensor.numel():
            continue
        raw = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
        for start in range(0, len(raw), _BLOCK_BYTES):
            yield raw[start : start + _BLOCK_BYTES]


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {str(path)!r}: {err}") from None


# ---- torch.distributed.checkpoint (SPMD) ---------------------------------------------------------


def unique_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One key per tensor object: tied weights (lm_head = embed_tokens) are written and read once."""
    seen: set[int] = set()
    out = {}
    for key, tensor in tensors.items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[key] = tensor
    return out


def host_shards(tensors: Mapping[str, torch.Tensor], backend: Backend) -> dict[str, Any]:
    """What a sharded save writes, copied to the host: each tensor sharded over `backend`'s mesh as its
    local shards (`Backend.local_shards_to_host`, one transfer), a stacked layer weight's views sliced
    on the host, other device tensors fetched, host tensors copied (training goes on changing them)."""
    values: dict[str, Any] = dict(host_layer_views(tensors))  # views: fresh host copies already
    sharded = [key for key, t in values.items() if backend.mesh_sharded(t)]
    for key, shards in zip(sharded, backend.local_shards_to_host([values[key] for key in sharded])):
        if any(shard.indices is Ellipsis for shard in shards.shards):
            # replicated: one shard is the whole tensor (torch_xla's planner takes no shard of it)
            values[key] = shards.shards[0].data
        else:
            values[key] = shards
    rest = {key: t for key, t in values.items() if key not in sharded and values[key] is tensors[key]}
    values.update(host_tensors(rest, copy=True))
    return values


def full_tensor(value: Any) -> torch.Tensor:
    """A host tensor, or the whole tensor put together from `host_shards`' local shards."""
    if isinstance(value, torch.Tensor):
        return value
    first = value.shards[0].data
    full = torch.empty(tuple(value.global_shape), dtype=first.dtype)
    for shard in value.shards:
        full[shard.indices if shard.indices is Ellipsis else tuple(shard.indices)] = shard.unpadded_data
    return full


def save_dcp(shards: dict[str, Any], directory: Path, *, planner: Any = None) -> bool:
    """Write `host_shards`' output through DCP with the backend's save `planner` (None: DCP's default)
    and check its index holds every tensor; False (nothing left behind) if not.

    torch_xla 2.9's SPMD planner silently leaves out tensors that are sharded *and* partially
    replicated (a data x fsdp mesh with data > 1) when one process holds all devices; such
    parts go to safetensors as full tensors instead (`full_tensor`: correct, just not sharded on
    disk). A scanned model's per-layer views are written as full CPU tensors (they carry no sharding).
    """
    import torch.distributed.checkpoint as dcp

    directory.mkdir()
    dcp.save(shards, storage_writer=dcp.FileSystemWriter(str(directory)), planner=planner)
    written = set(_dcp_reader(directory).read_metadata().state_dict_metadata)
    if set(shards) <= written:
        return True
    shutil.rmtree(directory)
    return False


def save_dcp_shared(tensors: dict[str, Any], directory: Path) -> None:
    """Every process of a torchrun launch calls it with its live `tensors` (FSDP2's DTensors, DDP's
    replicated ones): DCP's default planner writes each shard once, into the one `directory`."""
    import torch.distributed.checkpoint as dcp

    directory.mkdir(exist_ok=True)
    dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(directory)))


def load_dcp_to_host(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP directory as a whole host tensor, its shards put together by DCP itself
    (no device, no mesh: the layout it was written in does not matter). For reading a sharded
    checkpoint's weights outside the run that wrote it (`workbench.train.start`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = _dcp_reader(directory)
    entries = reader.read_metadata().state_dict_metadata
    targets = {
        key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for key, meta in entries.items()
        if isinstance(meta, TensorStorageMetadata)
    }
    dcp.load(targets, storage_reader=reader, planner=DefaultLoadPlanner(), no_dist=True)
    return targets


def _dcp_reader(directory: Path) -> Any:
    """DCP's file reader, with its pickled index read by the weights-only unpickler."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import metadata as md

    class RestrictedReader(dcp.FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            with open(directory / ".metadata", "rb") as f:
                try:
                    metadata = _RestrictedUnpickler(f).load()
                except CheckpointError:
                    raise
                except Exception as err:
                    raise CheckpointError(f"cannot read the DCP index of {str(directory)!r}: {err}") from None
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = md.StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return RestrictedReader(str(directory))


_DCP_DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)
"""Tensor dtypes a DCP index may name (torch's RNG and NumPy's state come as uint8/uint32 tensors)."""


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles DCP's index only: any global outside its metadata classes is refused."""

    _ALLOWED = {
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    } | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        *(("torch", dtype) for dtype in _DCP_DTYPES),
        ("torch", "strided"),
        ("torch", "contiguous_format"),
        ("torch", "preserve_format"),
        ("collections", "OrderedDict"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise CheckpointError(
                f"DCP index refers to {module}.{name}, which a checkpoint index never needs; refusing it"
            )
        return super().find_class(module, name)


def load_dcp(targets: dict[str, torch.Tensor], directory: Path, *, backend: Backend | None = None) -> None:
    """Read a DCP part into the live `targets` (`backend`'s tensors), resharded to their layout: through
    the backend's load planner (torch_xla's SPMD one) where it has one, else DCP's default one (collective
    across ranks under torchrun, a local read in one process). None: the targets are host tensors, or
    torchrun's (DCP's default planner)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    planner: Any = DefaultLoadPlanner()
    # outside a run (a `CheckpointManager` of its own), the backend of the device the targets are on
    backend = backend or backend_of(list(targets.values()))
    # torch_xla's planner reads each target's shards, which must not be mid-computation: a sync
    # just before (a resume's placement, zeroed weights) may still be running
    backend.wait()
    planners = backend.checkpoint_planners()
    planner = planners[1] if planners is not None else planner
    joined = dist.is_available() and dist.is_initialized()
    dcp.load(
        unique_tensors(targets), storage_reader=_dcp_reader(directory), planner=planner, no_dist=not joined
    )


# ---- RNG state -------------------------------------------------------------------------------------


def capture_rng(backend: Backend | None = None) -> dict[str, Any]:
    """Every RNG a training step may touch: Python, NumPy, torch CPU (+ CUDA, + the `backend` device's:
    `Backend.rng_state`, torch_xla's seed under key ``xla``)."""
    import random

    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s for s in torch.cuda.get_rng_state_all()]
    if backend is not None:
        state.update(backend.rng_state())
    return state


def restore_rng(state: Mapping[str, Any], backend: Backend | None = None) -> None:
    """Put back what `capture_rng` took; the device's own RNG through `backend` (a key another backend
    wrote is ignored, so a checkpoint written on one backend resumes on another)."""
    import random

    import numpy as np

    random.setstate(_as_tuples(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(tuple(np_state))
    torch.set_rng_state(state["torch"].to(torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.to(torch.uint8) for s in state["cuda"]])
    if backend is not None:
        backend.set_rng_state(dict(state))


def _as_tuples(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(v) for v in value)
    return value
