"""Applying a sharding plan with torch_xla: parameters, their gradients and batches on the mesh.

`shard_model` moves a model to the XLA device (`move_model`, which ties its embeddings again),
plans it (`workbench.parallel.plan.plan_sharding`, with the family's rules by default) and
annotates every parameter with ``mark_sharding``, and each gradient like its parameter.
`shard_batch` moves a batch with dim 0 split over ``data x fsdp``; `batch_sharding` is the same
split for the background device loader.

Every torch_xla call goes through `workbench.backend.xla.runtime`. Importing this module starts nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from workbench.backend.xla import runtime
from workbench.models.layer_stack import LAYER_WILDCARD, stacked_parameter_names
from workbench.parallel.mesh import BATCH_AXES, MeshSpec, axis_sizes_of, check_batch_size, device_grid
from workbench.parallel.plan import plan_sharding
from workbench.parallel.rules import rules_for
from workbench.parallel.sharding_report import ShardingReport
from workbench.parallel.sharding_rule import AxisEntry, PartitionSpec

# ---- applying it ---------------------------------------------------------------------


def unique_parameters(model: Any) -> list[tuple[str, Any]]:
    """(name, parameter) with tied weights once (the first name wins, like named_parameters)."""
    return list(model.named_parameters())


def move_model(model: Any) -> Any:
    """Move `model` to the XLA device (if it is not there) and tie its embeddings again.

    ``module.to(xla)`` unties shared parameters (lm_head and the input embedding become two
    tensors), which would shard, update and store them separately; `tie_weights()` restores
    the sharing the config asks for.
    """
    if any(not runtime.is_xla_tensor(p) for p in model.parameters()):
        model.to(runtime.device())
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


def shard_model(
    model: Any, mesh: Any, rules: Iterable[Any] | None = None, *, shard_grads: bool = True
) -> ShardingReport:
    """Move `model` to the XLA device if needed and annotate every parameter with its sharding.

    `mesh` is a torch_xla mesh or a `MeshSpec` (built here). `rules` defaults to the model
    family's table (`rules_for(model)`: its transformers tensor-parallel plan, a hand table, or
    FSDP only). A PEFT model works as it is: base weights get the specs they have without LoRA,
    adapters specs consistent with them (`workbench.parallel.plan.lora_spec`). Optimizer state
    created afterwards follows the parameters' sharding; build the optimizer after calling this.

    With `shard_grads` each gradient is annotated like its parameter as soon as backward
    accumulates it. Without that, GSPMD is free to return gradients that outlive a step (gradient
    accumulation, or a sync between backward and the optimizer) fully replicated: measured on
    fsdp=8, every device then held the whole gradient.
    """
    if isinstance(mesh, MeshSpec):
        mesh = mesh.build()
    sizes = axis_sizes_of(mesh)
    move_model(model)
    params = unique_parameters(model)
    stacked = stacked_parameter_names(model)
    # a stacked layer weight is planned as layer 0's weight, then given its unsharded layer axis
    layer_zero = {name: stacked[name][0].format(index=0) for name, _ in params if name in stacked}
    report = plan_sharding(
        ((layer_zero.get(name, name), tuple(p.shape)[name in stacked :], p.dtype) for name, p in params),
        sizes,
        rules_for(model) if rules is None else rules,
        device_ids=device_grid(mesh, sizes),
        transposed=transposed_weights(model),
        adjust_for_mesh=rules is None,  # `rules_for_mesh` on the model's own rules, never on a caller's
    )
    report = with_layer_axis(report, {zero: stacked[name] for name, zero in layer_zero.items()})
    by_name = {
        stacked[name][0].format(index=LAYER_WILDCARD) if name in stacked else name: p for name, p in params
    }
    for entry in report.entries:
        if entry.shape:
            param = by_name[entry.name]
            runtime.mark_sharding(param, mesh, entry.spec)
            if shard_grads and param.requires_grad:
                param.register_post_accumulate_grad_hook(_grad_sharder(mesh, entry.spec))
    return report


def with_layer_axis(report: ShardingReport, stacked: Mapping[str, tuple[str, int]]) -> ShardingReport:
    """`report` with each stacked weight's entry (planned under its layer-0 name) shown as the
    stacked tensor: named ``layers.*.<name>``, shape ``[layers, ...]``, the layer axis unsharded."""
    if not stacked:
        return report
    entries = []
    for entry in report.entries:
        if entry.name in stacked:
            template, layers = stacked[entry.name]
            entry = dataclasses.replace(
                entry,
                name=template.format(index=LAYER_WILDCARD),
                shape=(layers, *entry.shape),
                spec=(None, *entry.spec),
                local_shape=(layers, *entry.local_shape),
            )
        entries.append(entry)
    return dataclasses.replace(report, entries=entries)


def transposed_weights(model: Any) -> set[str]:
    """Names of the base weights PEFT keeps [in, out] (``fan_in_fan_out``: GPT-2's Conv1D)."""
    return {
        f"{name}.base_layer.weight"
        for name, module in model.named_modules()
        if getattr(module, "fan_in_fan_out", False) and hasattr(module, "base_layer")
    }


def _grad_sharder(mesh: Any, spec: PartitionSpec) -> Any:
    def hook(param: Any) -> None:
        if param.grad is not None:
            runtime.mark_sharding(param.grad, mesh, spec)

    return hook


def batch_spec(ndim: int, axis_sizes: Mapping[str, int]) -> PartitionSpec:
    """Dim 0 over data x fsdp (axes of size 1 left out), the rest replicated."""
    kept = tuple(a for a in BATCH_AXES if axis_sizes.get(a, 1) > 1)
    first: AxisEntry = None if not kept else kept[0] if len(kept) == 1 else kept
    return (first,) + (None,) * (ndim - 1)


def shard_batch(batch: Mapping[str, Any], mesh: Any) -> dict[str, Any]:
    """Move a batch's tensors to the XLA device with dim 0 split over data x fsdp.

    Non-tensor values and scalars pass through unchanged.
    """
    import torch

    if isinstance(mesh, MeshSpec):
        mesh = mesh.build()
    sizes = axis_sizes_of(mesh)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            out[key] = value
            continue
        check_batch_size(int(value.shape[0]), sizes, name=f"batch[{key!r}]")
        tensor = value if runtime.is_xla_tensor(value) else value.to(runtime.device())
        runtime.mark_sharding(tensor, mesh, batch_spec(tensor.dim(), sizes))
        out[key] = tensor
    return out


def batch_sharding(mesh: Any, ndim: int = 2) -> Any:
    """The ShardingSpec `runtime.device_loader(..., batch_sharding=...)` applies to each batch."""
    if isinstance(mesh, MeshSpec):
        mesh = mesh.build()
    return runtime.batch_sharding_spec(mesh, batch_spec(ndim, axis_sizes_of(mesh)))
