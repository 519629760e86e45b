"""The sharding plan: every parameter's partition spec and per-device shard, from shapes alone.

`plan_sharding` takes (name, shape, dtype) per parameter, the mesh's axis sizes and a rule
table (`workbench.parallel.rules`) and decides each parameter's final spec: the first matching
rule's tensor-parallel spec, then the FSDP axis on the largest dimension the rule leaves free
(one that divides by the fsdp size). A parameter no rule matches is replicated and *reported*
(with a warning); an axis that does not divide a dimension is an error naming the parameter,
the dimension, its size and the axis. The `ShardingReport` (`workbench.parallel.sharding_report`)
holds a `ShardEntry` per parameter,
the totals per device and, through `shard_map`, which device holds which slice (`ShardMap`,
what the mesh widget draws). Each entry says where its rule came from (`ShardEntry.source`).
Rules see through PEFT's wrappers and LoRA adapters follow their base layer (`lora_spec`). A
quantized layer's ``weight`` (int8 ``[out, in]`` or packed int4 ``[out, in / 2]``,
`workbench.models.quantize`) takes its layer's rule like any weight, and its ``weight_scale``
follows that weight's final spec (`scale_spec`), so each device scales the rows and blocks it holds.

Plain Python, nothing is built or moved: the plan can be made for hardware that is not here.
`workbench.parallel.apply` applies it to a real model.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from workbench.parallel.mesh import AXES
from workbench.parallel.rules import rules_for_mesh
from workbench.parallel.sharding_report import ShardEntry, ShardingReport
from workbench.parallel.sharding_rule import (
    FSDP_FALLBACK,
    AxisEntry,
    PartitionSpec,
    ShardingError,
    ShardingRule,
    as_rules,
    axes_of,
)

# ---- the plan ------------------------------------------------------------------------


def _itemsize(dtype: Any) -> int:
    """Bytes per element of a torch dtype or its name ('float32', 'torch.bfloat16')."""
    import torch

    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        resolved = getattr(torch, name, None)
        if not isinstance(resolved, torch.dtype):
            raise ShardingError(f"dtype {dtype!r} is not a torch dtype name (e.g. 'float32', 'bfloat16')")
        dtype = resolved
    return int(dtype.itemsize)


def plan_sharding(
    params: Iterable[tuple[str, Sequence[int], Any]],
    axis_sizes: Mapping[str, int],
    rules: Iterable[Any],
    *,
    device_ids: Sequence[int] | None = None,
    warn_fallback: bool = True,
    transposed: Collection[str] = (),
    adjust_for_mesh: bool = True,
) -> ShardingReport:
    """Decide every parameter's partition spec from the rules (shapes only; nothing runs).

    `params` yields (name, shape, dtype). The first matching rule wins; rules see through PEFT's
    wrappers (a LoRA layer's ``q_proj.base_layer.weight`` matches as ``q_proj.weight``, see
    `rule_name`), and a LoRA adapter follows its base layer (`lora_spec`). `transposed` names
    base weights stored [in, out] (Conv1D, PEFT's ``fan_in_fan_out``), which a square shape
    cannot tell. The notes of a `RuleTable` go into the report. Errors name the parameter, the
    dimension, its size and the mesh axis that does not divide it.

    The rules are taken as the mesh applies them (`workbench.parallel.rules.rules_for_mesh`, where fsdp
    divides the weights it moves); rules already adjusted, or a caller's (``adjust_for_mesh=False``), as they are.
    """
    sizes = {str(k): int(v) for k, v in axis_sizes.items()}
    notes = list(getattr(rules, "notes", ()))
    params = [(name, tuple(int(s) for s in shape), dtype) for name, shape, dtype in params]
    rule_list = _for_mesh(as_rules(rules), sizes, params) if adjust_for_mesh else as_rules(rules)
    scales = {name: shape for name, shape, _dtype in params if _SCALE.match(name)}
    entries: dict[str, ShardEntry] = {}
    for name, shape, dtype in params:
        if _ADAPTER.match(name) or name in scales:
            continue  # after every base layer has its spec
        matched = next((r for r in rule_list if r.applies(rule_name(name), len(shape))), None)
        entries[name] = _entry(
            name,
            shape,
            dtype,
            _spec_for(name, shape, matched, sizes),
            sizes,
            matched.pattern if matched else None,
            matched.note if matched else "replicated: no rule matched",
            matched.source if matched else "no rule",
        )
    for name, shape, dtype in params:
        if name in scales:
            entries[name] = _scale_entry(name, shape, dtype, entries, sizes)
        elif name not in entries:
            entries[name] = _adapter_entry(name, shape, dtype, entries, sizes, set(transposed), scales)
    report = ShardingReport(
        [entries[name] for name, _shape, _dtype in params],
        sizes,
        list(device_ids) if device_ids else list(range(math.prod(sizes.values()))),
        notes,
    )
    if report.fallbacks and warn_fallback:
        warnings.warn(
            f"{len(report.fallbacks)} parameter(s) matched no sharding rule and stay replicated on every "
            f"device: {', '.join(report.fallbacks[:8])}{' ...' if len(report.fallbacks) > 8 else ''}",
            stacklevel=3,
        )
    return report


def _for_mesh(
    rule_list: list[ShardingRule],
    sizes: Mapping[str, int],
    params: Sequence[tuple[str, tuple[int, ...], Any]],
) -> list[ShardingRule]:
    """`rule_list` with `rules_for_mesh`'s rule in front, unless it is there or fsdp cannot split a weight it names."""
    adjusted = list(rules_for_mesh(rule_list, sizes))
    added = adjusted[: len(adjusted) - len(rule_list)]
    if all(rule in rule_list for rule in added):
        return rule_list
    fsdp = sizes.get("fsdp", 1)
    for mesh_rule in added:
        hits = [shape for name, shape, _ in params if mesh_rule.applies(rule_name(name), len(shape))]
        if any(len(shape) != 2 or shape[1] % fsdp for shape in hits):
            return rule_list
    return adjusted


def _entry(
    name: str,
    shape: tuple[int, ...],
    dtype: Any,
    spec: PartitionSpec,
    sizes: dict[str, int],
    rule: str | None,
    note: str,
    source: str,
) -> ShardEntry:
    local = tuple(dim // math.prod(sizes[a] for a in axes_of(e)) for dim, e in zip(shape, spec, strict=True))
    return ShardEntry(
        name=name,
        shape=shape,
        dtype=str(dtype).replace("torch.", ""),
        itemsize=_itemsize(dtype),
        spec=spec,
        local_shape=local,
        rule=rule,
        note=note,
        source=source,
    )


# ---- PEFT: wrapped base layers and LoRA adapters ---------------------------------------

# PEFT keeps a wrapped layer's own weight under `base_layer` (LoRA), a trainable copy under
# `modules_to_save.<adapter>` next to the frozen `original_module`: all name the same weight.
_WRAPPERS = re.compile(r"\.(?:base_layer|original_module|modules_to_save\.[^.]+)(?=\.)")
_ADAPTER = re.compile(
    r"^(?P<layer>.+)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)"
    r"\.[^.]+(?:\.weight)?$"
)
_SCALE = re.compile(r"^(?P<weight>.+\.weight)_scale$")
"""A quantized layer's scales (`workbench.models.quantize.QuantizedLinear.weight_scale`)."""


def rule_name(name: str) -> str:
    """The name rules match: PEFT's wrappers left out (``q_proj.base_layer.weight`` -> ``q_proj.weight``)."""
    return _WRAPPERS.sub("", name)


def lora_spec(
    kind: str, shape: tuple[int, ...], base_shape: tuple[int, ...], base_spec: PartitionSpec, transposed: bool
) -> PartitionSpec:
    """A LoRA adapter's `model`-axis spec, consistent with its base weight's spec.

    A Linear base is [out, in] with ``lora_A`` [r, in] and ``lora_B`` [out, r] (the delta is
    B @ A): ``lora_A`` takes the base's `model` split of `in`, ``lora_B`` that of `out`, the
    rank dimension is never split. So a column-parallel base (out on `model`) gets ``lora_B``
    split like its output and ``lora_A`` replicated over `model`; a row-parallel base (in on
    `model`) gets ``lora_A`` split like its input and ``lora_B`` replicated over `model`. A base
    stored [in, out] (`transposed`: Conv1D, and embeddings, whose ``lora_embedding_A`` is
    [r, vocab] and ``lora_embedding_B`` [hidden, r]) swaps the roles of its dimensions; DoRA's
    magnitude [out] follows `out`. Only the `model` axis is taken over: FSDP is placed apart.
    """
    in_dim, out_dim = (0, 1) if transposed or kind.startswith("lora_embedding") else (1, 0)
    if kind.endswith("_A"):
        own_in = shape[1]
        if base_shape[in_dim] != own_in and base_shape[out_dim] == own_in:  # a Conv1D nobody named
            in_dim, out_dim = out_dim, in_dim
        return (None, _model_part(base_spec[in_dim]))
    own_out = shape[0]
    if base_shape[out_dim] != own_out and base_shape[in_dim] == own_out:
        in_dim, out_dim = out_dim, in_dim
    return (_model_part(base_spec[out_dim]),) + (None,) * (len(shape) - 1)


def _model_part(entry: AxisEntry) -> AxisEntry:
    return "model" if "model" in axes_of(entry) else None


def _adapter_entry(
    name: str,
    shape: tuple[int, ...],
    dtype: Any,
    entries: Mapping[str, ShardEntry],
    sizes: dict[str, int],
    transposed: set[str],
    scales: Mapping[str, tuple[int, ...]],
) -> ShardEntry:
    """A LoRA adapter's entry: `lora_spec` from its base layer, then FSDP where it divides."""
    found = _ADAPTER.match(name)
    assert found is not None
    layer, kind = found["layer"], found["kind"]
    base = next((entries[n] for n in (f"{layer}.base_layer.weight", f"{layer}.weight") if n in entries), None)
    if base is None or len(base.shape) != 2 or len(shape) not in (1, 2):
        spec = _fsdp_where_it_divides((None,) * len(shape), shape, sizes)
        note = f"{kind}: no 2-D base weight of {layer} found, FSDP only"
        return _entry(name, shape, dtype, spec, sizes, None, note, FSDP_FALLBACK)
    base_shape = base.shape
    scale = scales.get(f"{base.name}_scale")
    if scale is not None:  # a quantized Linear: [out, in], in packed two a byte when its scales are blockwise
        base_shape = (base.shape[0], base.shape[1] * (2 if len(scale) == 2 else 1))
    model = lora_spec(kind, shape, base_shape, base.spec, base.name in transposed)
    spec = _fsdp_where_it_divides(model, shape, sizes)
    split = "split over model" if any(model) else "replicated over model"
    note = f"{kind} of {layer.rsplit('.', 1)[-1]}: {split}, like its base"
    return _entry(name, shape, dtype, spec, sizes, base.rule, note, base.source)


def scale_spec(shape: tuple[int, ...], weight_spec: PartitionSpec, sizes: Mapping[str, int]) -> PartitionSpec:
    """A quantized weight's scales' spec, from the weight's final spec: per-channel scales ``[out]``
    take the weight's dim-0 entry; blockwise scales ``[out, blocks]`` take the weight's entry per
    dimension where it divides (a shard of the packed ``in`` holds whole blocks), else replicate it."""
    spec: list[AxisEntry] = []
    for dim, size in enumerate(shape):
        entry = weight_spec[dim] if dim < len(weight_spec) else None
        parts = math.prod(sizes.get(a, 1) for a in axes_of(entry))
        spec.append(entry if size % parts == 0 else None)
    return tuple(spec)


def _scale_entry(
    name: str, shape: tuple[int, ...], dtype: Any, entries: Mapping[str, ShardEntry], sizes: dict[str, int]
) -> ShardEntry:
    """A quantized weight's scales: `scale_spec` from the weight's entry (FSDP only without one)."""
    found = _SCALE.match(name)
    assert found is not None
    weight = entries.get(found["weight"])
    if weight is None:
        spec = _fsdp_where_it_divides((None,) * len(shape), shape, sizes)
        note = f"scales: no weight {found['weight']} found, FSDP only"
        return _entry(name, shape, dtype, spec, sizes, None, note, FSDP_FALLBACK)
    spec = scale_spec(shape, weight.spec, sizes)
    layer = rule_name(found["weight"]).rsplit(".", 2)[-2]
    note = f"scales of {layer}: follow its weight"
    return _entry(name, shape, dtype, spec, sizes, weight.rule, note, weight.source)


def _fsdp_where_it_divides(
    spec: PartitionSpec, shape: tuple[int, ...], sizes: dict[str, int]
) -> PartitionSpec:
    """`spec` (axes of size 1 dropped) with `fsdp` on the largest free dimension it divides, if any."""
    out = [e if e is not None and all(sizes.get(a, 1) > 1 for a in axes_of(e)) else None for e in spec]
    fsdp = sizes.get("fsdp", 1)
    fitting = [d for d in range(len(shape)) if out[d] is None and shape[d] % fsdp == 0]
    if fsdp > 1 and fitting:
        out[max(fitting, key=lambda d: (shape[d], -d))] = "fsdp"
    return tuple(out)


def _spec_for(
    name: str, shape: tuple[int, ...], matched: ShardingRule | None, sizes: dict[str, int]
) -> PartitionSpec:
    ndim = len(shape)
    if matched is None or matched.spec is None or ndim == 0:
        return (None,) * ndim
    spec: list[AxisEntry] = list(matched.spec) if matched.spec else [None] * ndim
    if len(spec) != ndim:
        raise ShardingError(
            f"rule {matched.pattern!r} gives {len(spec)} spec entries but parameter {name!r} has "
            f"{ndim} dimension(s) (shape {list(shape)})"
        )
    # Drop axes of size 1 (and workbench axes a hand-made mesh lacks): they split nothing, and
    # the report should show only real splits. An axis name nobody knows is a typo: refuse it.
    for dim, entry in enumerate(spec):
        axes = axes_of(entry)
        for axis in axes:
            if axis not in sizes and axis not in AXES:
                raise ShardingError(
                    f"rule {matched.pattern!r} for {name!r} names mesh axis {axis!r}; the mesh has "
                    f"{', '.join(sizes)}"
                )
        kept = tuple(a for a in axes if sizes.get(a, 1) > 1)
        spec[dim] = None if not kept else kept[0] if len(kept) == 1 else kept
    used = {a for e in spec for a in axes_of(e)}
    fsdp = sizes.get("fsdp", 1)
    if matched.fsdp and fsdp > 1 and "fsdp" not in used:
        free = [d for d in range(ndim) if spec[d] is None]
        fitting = [d for d in free if shape[d] % fsdp == 0]
        if free and not fitting:
            largest = max(free, key=lambda d: shape[d])
            raise ShardingError(
                f"parameter {name!r} (shape {list(shape)}): no free dimension divides by mesh axis "
                f"'fsdp' ({fsdp}); dim {largest} has size {shape[largest]}. Pick an fsdp size that "
                "divides it, or add a rule that replicates this parameter"
            )
        if fitting:
            # Largest dimension first; the lower index wins a tie (stable, predictable layouts).
            spec[max(fitting, key=lambda d: (shape[d], -d))] = "fsdp"
    for dim, entry in enumerate(spec):
        parts = math.prod(sizes[a] for a in axes_of(entry))
        if shape[dim] % parts:
            axes = "+".join(axes_of(entry))
            raise ShardingError(
                f"parameter {name!r} (shape {list(shape)}): dim {dim} has size {shape[dim]}, not "
                f"divisible by mesh axis {axes!r} ({parts}). Choose a mesh size that divides it "
                "(or pad the dimension, e.g. resize the vocabulary to a multiple of it)"
            )
    return tuple(spec)
