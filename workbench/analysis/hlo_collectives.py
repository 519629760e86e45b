"""Every collective in a compiled XLA program, read from its optimised HLO text.

Under SPMD the partitioner inserts the collectives a sharding needs; the optimised HLO
(``XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text"``, files ``*after_optimizations.txt``)
lists each with its shape and replica groups. `read_collectives` parses one module's text into
`Collective` records: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute and
their asynchronous ``-start`` forms (the ``-done`` half moves nothing of its own), wherever they
sit: the entry computation, a fusion, a while body (counted trip-count times when the loop's
trip count is knowable: XLA's ``known_trip_count`` annotation, else a ``counter < N``
condition), a conditional branch (counted once).

Replica groups come in two spellings, both parsed (`parse_replica_groups`): explicit
``{{0,1},{2,3}}`` and iota ``[2,4]<=[8]`` / ``[4,2]<=[2,4]T(1,0)``. `group_axes` names the mesh
axes a group spans, from the mesh's device grid (`workbench.parallel.mesh.device_grid`).

Bytes, per device and per execution (what `Collective` reports):

- ``size_bytes``: the logical size S of the collective: the tensor all-reduced; the full
  (gathered) tensor of an all-gather; the full (pre-scatter) operand of a reduce-scatter; the
  tensor each device holds for an all-to-all or a permute.
- ``wire_bytes``: what each device sends over the links with the bandwidth-optimal ring
  algorithm on n devices: all-reduce 2(n-1)/n x S, all-gather and reduce-scatter (n-1)/n x S,
  all-to-all (n-1)/n x S, collective-permute S.

One pattern is marked (``scatter_pattern``): an all-reduce whose only users keep one
1/n-th slice each (a ``dynamic-slice`` by partition): the partitioner's spelling of a
reduce-scatter. TPU's and GPU's XLA pipelines rewrite it into a reduce-scatter
(``ReduceScatterCreator``); XLA:CPU's does not, so on the CPU it moves twice the bytes it would
on a TPU. ``tpu_wire_bytes`` is the figure after that rewrite.

Plain Python on text: nothing here compiles or starts a runtime.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

COLLECTIVE_KINDS: tuple[str, ...] = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)
"""The collective opcodes read, without their ``-start`` suffix."""

ELEMENT_BYTES: dict[str, float] = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "u64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "f8e4m3b11fnuz": 1,
}
"""Bytes per element of each HLO element type (tokens and opaque values count 0)."""


class HloParseError(ValueError):
    """HLO text this reader cannot make sense of; the message quotes the line."""


# ---- shapes ------------------------------------------------------------------------------

_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")


def shape_bytes(type_text: str) -> int:
    """Bytes of an HLO type: ``f32[64,64]{1,0}``, a tuple ``(f32[8], s32[])`` (summed), ``token[]`` (0)."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(type_text):
        if dtype not in ELEMENT_BYTES:
            continue  # token, opaque
        total += math.prod(int(d) for d in dims.split(",") if d) * ELEMENT_BYTES[dtype]
    return math.ceil(total)


def _tuple_parts(type_text: str) -> list[str]:
    """The top-level elements of a tuple type (the type itself when it is no tuple)."""
    text = re.sub(r"/\*.*?\*/", "", type_text.strip())
    if not text.startswith("("):
        return [text]
    parts, depth, start = [], 0, 1
    for i, ch in enumerate(text):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 1:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start : len(text) - 1].strip())
    return [p for p in parts if p]


# ---- replica groups ------------------------------------------------------------------------


def parse_replica_groups(text: str, num_devices: int | None = None) -> list[list[int]]:
    """Device groups from XLA's spelling: ``{{0,1},{2,3}}``, ``{}`` (one group of every device:
    needs `num_devices`), or iota ``[G,S]<=[d0,d1,...]`` with an optional ``T(perm)``."""
    text = text.strip()
    iota = re.fullmatch(r"\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", text)
    if iota:
        groups_shape = [int(v) for v in iota[1].split(",")]
        dims = [int(v) for v in iota[2].split(",")]
        perm = [int(v) for v in iota[3].split(",")] if iota[3] else list(range(len(dims)))
        if (
            len(groups_shape) != 2
            or math.prod(groups_shape) != math.prod(dims)
            or sorted(perm) != list(range(len(dims)))
        ):
            raise HloParseError(f"replica_groups={text!r}: not an iota list [groups,size]<=[dims]T(perm)")
        ids = _transposed_iota(dims, perm)
        size = groups_shape[1]
        return [ids[g * size : (g + 1) * size] for g in range(groups_shape[0])]
    if not text.startswith("{"):
        raise HloParseError(f"replica_groups={text!r}: expected {{{{...}}}} or an iota list [G,S]<=[N]")
    groups = [[int(v) for v in g.split(",") if v.strip()] for g in re.findall(r"\{([0-9,\s]*)\}", text[1:-1])]
    groups = [g for g in groups if g]
    if not groups:
        if num_devices is None:
            raise HloParseError("replica_groups={} means every device: give num_devices")
        return [list(range(num_devices))]
    return groups


def _transposed_iota(dims: Sequence[int], perm: Sequence[int]) -> list[int]:
    """``iota(prod(dims)).reshape(dims).transpose(perm).flatten()``, without numpy."""
    strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
    out_dims = [dims[p] for p in perm]
    out = []
    for flat in range(math.prod(dims)):
        index, rest = [], flat
        for size in reversed(out_dims):
            index.append(rest % size)
            rest //= size
        index.reverse()
        out.append(sum(index[k] * strides[perm[k]] for k in range(len(perm))))
    return out


def group_axes(
    groups: Sequence[Sequence[int]], axis_sizes: Mapping[str, int], device_ids: Sequence[int]
) -> tuple[str, ...] | None:
    """The mesh axes the devices of each group differ along (axes of size 1 never), in mesh order.
    A partial group (fewer devices than those axes hold: a few heads' worth of a model axis) is
    named by the axes it lies along; None when the groups lie along no axis at all."""
    names = list(axis_sizes)
    position = {int(d): i for i, d in enumerate(device_ids)}
    spanned: set[str] = set()
    for group in groups:
        coords = []
        for device in group:
            if device not in position:
                raise HloParseError(
                    f"device {device} of a replica group is not on the mesh {list(device_ids)}"
                )
            rest, c = position[device], {}
            for axis in reversed(names):
                c[axis] = rest % axis_sizes[axis]
                rest //= axis_sizes[axis]
            coords.append(c)
        spanned |= {a for a in names if len({c[a] for c in coords}) > 1}
    axes = tuple(a for a in names if a in spanned)
    return axes if axes or all(len(g) <= 1 for g in groups) else None


# ---- instructions and computations -----------------------------------------------------------

_HEADER = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'known_trip_count[^0-9]*"?n"?\s*:\s*"?(\d+)')


@dataclass(frozen=True)
class _Instruction:
    name: str
    type_text: str
    opcode: str
    rest: str
    """Operands and attributes: everything after the opening parenthesis."""

    @property
    def operands(self) -> list[str]:
        depth, end = 1, len(self.rest)
        for i, ch in enumerate(self.rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                end = i
                break
        return re.findall(r"%([\w.\-]+)", self.rest[:end])


def _computations(text: str) -> tuple[dict[str, list[_Instruction]], str | None]:
    comps: dict[str, list[_Instruction]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and "=" not in line.split("->")[0].split("(")[0]:
            current = header[2]
            comps[current] = []
            if header[1]:
                entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is None:
            continue
        found = _INSTRUCTION.match(line)
        if found:
            comps[current].append(_Instruction(found[1], found[2], found[3], found[4]))
    return comps, entry


def _trip_count(instr: _Instruction, comps: Mapping[str, list[_Instruction]]) -> int | None:
    known = _TRIP.search(instr.rest)
    if known:
        return int(known[1])
    condition = re.search(r"condition=%?([\w.\-]+)", instr.rest)
    body = comps.get(condition[1], []) if condition else []
    compares = [i for i in body if i.opcode == "compare" and "direction=LT" in i.rest]
    constants = [
        i
        for i in body
        if i.opcode == "constant" and re.fullmatch(r"[su](32|64)\[\]", i.type_text.split("{")[0])
    ]
    if len(compares) == 1 and len(constants) == 1:
        value = re.match(r"\s*(-?\d+)\)", constants[0].rest)
        return int(value[1]) if value else None
    return None


def _multiplicities(
    comps: Mapping[str, list[_Instruction]], entry: str
) -> tuple[dict[str, int], dict[str, bool]]:
    """How many times each computation runs per execution of the entry, and whether that count
    is certain (a while loop of unknown trip count is counted once and marked uncertain).

    Calls form a DAG: each computation's count is the sum over its call sites, taken once all its
    callers are counted. An async pair names its wrapped computation twice (``async-start`` and
    ``async-done``, both ``calls=``): only the start runs it."""
    edges: dict[str, list[tuple[str, int, bool]]] = {}
    pending = {entry}
    seen = {entry}
    while pending:  # the call graph reachable from the entry
        name = pending.pop()
        for instr in comps.get(name, []):
            if instr.opcode in ("async-done", "async-update"):
                continue
            callees = _CALLS.findall(instr.rest)
            branches = _BRANCHES.search(instr.rest)
            if branches:
                callees += re.findall(r"%?([\w.\-]+)", branches[1])
            trips = _trip_count(instr, comps) if instr.opcode == "while" else 1
            for callee in (c for c in callees if c in comps):
                loop_body = instr.opcode == "while" and re.search(
                    rf"body=%?{re.escape(callee)}\b", instr.rest
                )
                factor = (trips or 1) if loop_body else 1
                edges.setdefault(name, []).append((callee, factor, bool(loop_body and trips is None)))
                if callee not in seen:
                    seen.add(callee)
                    pending.add(callee)
    callers = dict.fromkeys(seen, 0)
    for targets in edges.values():
        for callee, _, _ in targets:
            callers[callee] += 1
    times: dict[str, int] = {entry: 1}
    certain: dict[str, bool] = {entry: True}
    ready = [name for name, n in callers.items() if n == 0]
    while ready:
        name = ready.pop()
        for callee, factor, unknown in edges.get(name, []):
            times[callee] = times.get(callee, 0) + times.get(name, 0) * factor
            certain[callee] = certain.get(callee, True) and certain.get(name, True) and not unknown
            callers[callee] -= 1
            if callers[callee] == 0:
                ready.append(callee)
    return times, certain


# ---- collectives --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Collective:
    """One collective of a compiled program (per device, per execution of the program)."""

    name: str
    kind: str
    """One of `COLLECTIVE_KINDS` (an async ``-start`` is reported under its synchronous name)."""
    computation: str
    dtype: str
    shape: tuple[int, ...]
    """The shape of `size_bytes`'s tensor (the first one for a multi-operand collective)."""
    size_bytes: int
    group_size: int
    num_groups: int
    axes: tuple[str, ...] | None
    """The mesh axes its groups span (None: groups that are no whole sub-mesh, or no mesh given)."""
    count: int = 1
    """Executions per execution of the program (a while body's trip count)."""
    count_known: bool = True
    asynchronous: bool = False
    scatter_pattern: bool = False
    """An all-reduce whose users each keep a 1/n slice: a reduce-scatter on TPU (see module doc)."""

    @property
    def wire_bytes(self) -> float:
        """Bytes one device sends per execution with the ring algorithm (module doc)."""
        return ring_wire_bytes(self.kind, self.size_bytes, self.group_size)

    @property
    def tpu_wire_bytes(self) -> float:
        """`wire_bytes` after TPU's XLA rewrote an all-reduce + slice into a reduce-scatter."""
        kind = "reduce-scatter" if self.scatter_pattern else self.kind
        return ring_wire_bytes(kind, self.size_bytes, self.group_size)

    @property
    def axis_label(self) -> str:
        if self.axes is None:
            return f"{self.group_size} devices (irregular)"
        return "+".join(self.axes) if self.axes else "none"


def ring_wire_bytes(kind: str, size_bytes: float, group_size: int) -> float:
    """Bytes each of `group_size` devices sends for a collective of logical size `size_bytes`."""
    n = group_size
    if n <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2 * (n - 1) / n * size_bytes
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n * size_bytes
    if kind == "collective-permute":
        return float(size_bytes)
    raise ValueError(f"kind={kind!r} is not allowed: one of {', '.join(COLLECTIVE_KINDS)}")


def read_collectives(
    text: str,
    axis_sizes: Mapping[str, int] | None = None,
    device_ids: Sequence[int] | None = None,
) -> list[Collective]:
    """Every collective in one HLO module's text, with the mesh axes it spans when `axis_sizes`
    (and `device_ids`, the mesh's device grid in row-major order; default ``0..n-1``) are given."""
    comps, entry = _computations(text)
    if entry is None:
        raise HloParseError("no ENTRY computation in the HLO text (is it a *after_optimizations.txt dump?)")
    times, certain = _multiplicities(comps, entry)
    num_devices = math.prod(axis_sizes.values()) if axis_sizes else None
    ids = list(device_ids) if device_ids is not None else list(range(num_devices or 0))
    types = {i.name: i for instrs in comps.values() for i in instrs}
    # computations that slice by partition: the fused half of an all-reduce + dynamic-slice
    slicing = {name for name, instrs in comps.items() if any(i.opcode == "dynamic-slice" for i in instrs)}
    users: dict[str, list[_Instruction]] = {}
    for instrs in comps.values():
        for instr in instrs:
            for operand in instr.operands:
                users.setdefault(operand, []).append(instr)
    found = []
    for comp, instrs in comps.items():
        if comp not in times:
            continue  # never called: nothing runs
        for instr in instrs:
            kind, asynchronous = instr.opcode, False
            if kind.endswith("-start") and kind[: -len("-start")] in COLLECTIVE_KINDS:
                kind, asynchronous = kind[: -len("-start")], True
            if kind not in COLLECTIVE_KINDS:
                continue
            found.append(
                _collective(
                    instr,
                    kind,
                    asynchronous,
                    comp,
                    times[comp],
                    certain[comp],
                    types,
                    users,
                    axis_sizes,
                    ids,
                    num_devices,
                    slicing,
                )
            )
    return found


def _collective(
    instr: _Instruction,
    kind: str,
    asynchronous: bool,
    computation: str,
    count: int,
    count_known: bool,
    types: Mapping[str, _Instruction],
    users: Mapping[str, list[_Instruction]],
    axis_sizes: Mapping[str, int] | None,
    device_ids: Sequence[int],
    num_devices: int | None,
    slicing: set[str],
) -> Collective:
    if kind == "collective-permute":
        pairs = re.search(r"source_target_pairs=(\{.*?\}\})", instr.rest)
        groups = parse_replica_groups(pairs[1]) if pairs else [[0]]
        group_size, num_groups = 2, len(groups)
    else:
        spelled = re.search(
            r"replica_groups=(\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?|\{(?:\{[0-9,\s]*\},?)*\})", instr.rest
        )
        groups = parse_replica_groups(spelled[1] if spelled else "{}", num_devices)
        group_size, num_groups = len(groups[0]), len(groups)
    operand_types = [types[o].type_text for o in instr.operands if o in types]
    result_parts = _tuple_parts(instr.type_text)
    if asynchronous and kind in ("all-gather", "collective-permute") and len(result_parts) >= 2:
        result_parts = result_parts[len(result_parts) // 2 :] if kind == "all-gather" else result_parts[1:2]
    result_bytes = sum(shape_bytes(p) for p in result_parts)
    operand_bytes = sum(shape_bytes(t) for t in operand_types) or None
    if kind == "all-gather":
        size = result_bytes
    elif kind == "reduce-scatter":
        size = operand_bytes or result_bytes * group_size
    else:
        size = result_bytes
    first = _ARRAY.search(result_parts[0]) if result_parts else None
    dtype = first[1] if first else "?"
    shape = tuple(int(d) for d in first[2].split(",") if d) if first else ()
    axes = group_axes(groups, axis_sizes, device_ids) if axis_sizes and kind != "collective-permute" else None
    if kind == "collective-permute" and axis_sizes:
        axes = group_axes(groups, axis_sizes, device_ids) if groups and len(groups[0]) == 2 else None
    scatter = kind == "all-reduce" and _sliced_by_every_user(instr, users, slicing, group_size)
    return Collective(
        instr.name,
        kind,
        computation,
        dtype,
        shape,
        size,
        group_size,
        num_groups,
        axes,
        count,
        count_known,
        asynchronous,
        scatter,
    )


def _sliced_by_every_user(
    instr: _Instruction, users: Mapping[str, list[_Instruction]], slicing: set[str], group_size: int
) -> bool:
    """True when every user of an all-reduce keeps 1/group_size of its elements through a slice by
    partition (a ``dynamic-slice``, or a fusion that takes the partition id or calls a computation
    that slices): the all-reduce + dynamic-slice pattern TPU's XLA turns into a reduce-scatter."""
    if group_size <= 1:
        return False
    followers = users.get(instr.name, [])
    if instr.opcode == "all-reduce-start":
        followers = [u for f in followers if f.opcode == "all-reduce-done" for u in users.get(f.name, [])]
    if not followers:
        return False
    elements = _elements(instr.type_text)
    for user in followers:
        callee = re.search(r"calls=%?([\w.\-]+)", user.rest)
        slices = user.opcode == "dynamic-slice" or (
            user.opcode == "fusion"
            and ("partition-id" in user.operands or (callee is not None and callee[1] in slicing))
        )
        # a fusion may slice and then reduce its slice (the clipping norm's sum of squares): at most 1/n kept
        kept = _elements(user.type_text) * group_size
        if not slices or (kept != elements if user.opcode == "dynamic-slice" else kept > elements):
            return False
    return True


def _elements(type_text: str) -> int:
    return sum(math.prod(int(d) for d in dims.split(",") if d) for _t, dims in _ARRAY.findall(type_text))


# ---- dumps on disk ---------------------------------------------------------------------------------


def optimized_modules(dump_dir: str | Path) -> list[Path]:
    """The ``*after_optimizations.txt`` modules of an XLA dump directory, in the order XLA wrote them."""
    root = Path(dump_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"dump_dir={str(root)!r} is not a directory (XLA_FLAGS=--xla_dump_to=DIR)")
    return sorted(p for p in root.glob("*after_optimizations.txt"))


def module_name(path: str | Path) -> str:
    """``module_0046.SyncTensorsGraph.2538`` from a dump file's name."""
    return Path(path).name.split(".cpu_after")[0].split(".tpu_after")[0].split(".gpu_after")[0]


def largest_module(paths: Iterable[str | Path]) -> Path:
    """The dump file of the largest module (most text): a training step's program."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise FileNotFoundError("no *after_optimizations.txt module in the dump (was the dump flag set?)")
    return max(paths, key=lambda p: p.stat().st_size)


__all__ = [
    "COLLECTIVE_KINDS",
    "Collective",
    "HloParseError",
    "group_axes",
    "largest_module",
    "optimized_modules",
    "parse_replica_groups",
    "read_collectives",
    "ring_wire_bytes",
    "shape_bytes",
]
