"""Real SPMD on 8 virtual devices: one model family trained unsharded and on each mesh; the
shards, gradients and optimizer state checked against the plan; the batch loader; clear errors
at the edges (tests/test_sharding.py)."""

from __future__ import annotations

import math
from typing import Any

import torch

from tests.tiny import tiny
from tests.xla import run
from workbench.backend.hardware import detect
from workbench.backend.xla import runtime
from workbench.config import ModelConfig
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs
from workbench.parallel.apply import batch_sharding, batch_spec, move_model, shard_batch, shard_model
from workbench.parallel.mesh import MeshError, MeshSpec, mesh_preset
from workbench.parallel.sharding_report import shard_map
from workbench.parallel.sharding_rule import ShardingError


def device_number(name: str) -> int:
    return int(name.rsplit(":", 1)[1])


def mesh_id(spec: dict[str, int]) -> str:
    return "x".join(f"{k}{v}" for k, v in spec.items())


def train(cfg: ModelConfig, ids_cpu: torch.Tensor, spec: dict[str, int] | None) -> dict[str, Any]:
    """Three AdamW steps unsharded (`spec` None) or on the mesh `spec`, then the layout checks."""
    model = build_model(cfg, seed=0)
    report = None
    if spec is None:
        move_model(model)
        batch = {"input_ids": ids_cpu.to(runtime.device())}
    else:
        mesh = MeshSpec(**spec).build()
        report = shard_model(model, mesh)
        batch = shard_batch({"input_ids": ids_cpu, "note": "passes through"}, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiles0, transfers0 = runtime.compile_count(), runtime.transfer_count()
    losses = []
    for _ in range(3):
        # The trainer's forward: its objective's inputs (`model_inputs`) carry an attention mask,
        # which keeps transformers 5 from reading the device to look for packed rows.
        loss = model(**model_inputs(batch, model), labels=batch["input_ids"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        runtime.sync()
    out: dict[str, Any] = {
        "compiles": runtime.compile_count() - compiles0,
        "transfers": runtime.transfer_count() - transfers0,
    }
    out["losses"] = [float(v) for v in runtime.to_cpu(losses)]
    if report is None:
        return out
    # One more backward with a sync before the optimizer (as gradient accumulation does): the
    # gradients that survive the step must be sharded like their parameters.
    model(**model_inputs(batch, model), labels=batch["input_ids"]).loss.backward()
    runtime.sync(wait=True)  # shards can only be read once the step has finished
    params = dict(model.named_parameters())
    out["tied"] = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    wrong_shape, wrong_place, wrong_grad, state_layout, state_bigger = [], [], [], [], []
    fractions = {}
    for e in report.entries:
        p = params[e.name]
        shapes = runtime.local_shard_shapes(p) if any(e.spec) else [tuple(p.shape)]
        fractions[e.name] = [e.fraction, math.prod(shapes[0]) / p.numel(), [list(s) for s in set(shapes)]]
        if any(tuple(s) != e.local_shape for s in shapes):
            wrong_shape.append([e.name, [list(s) for s in shapes], list(e.local_shape)])
        placed = {device_number(d): idx for d, idx in runtime.local_shard_indices(p)}
        for shard in report.device_map(e.name).shards:
            got = placed.get(shard.device)
            if got is not None and tuple(map(tuple, got)) != shard.index:
                wrong_place.append([e.name, shard.device, got, shard.index])
        for key in ("grad", "exp_avg", "exp_avg_sq"):
            state = p.grad if key == "grad" else opt.state[p][key]
            local = (
                runtime.local_shard_shapes(state)[0] if runtime.sharding_spec(state) else tuple(state.shape)
            )
            if tuple(local) != e.local_shape:
                wrong = wrong_grad if key == "grad" else state_layout
                wrong.append([e.name, key, list(local), list(e.local_shape)])
            if math.prod(local) > math.prod(e.local_shape):
                state_bigger.append([e.name, key, list(local), list(e.local_shape)])
    ids = batch["input_ids"]
    placed_rows = {device_number(d): tuple(map(tuple, idx)) for d, idx in runtime.local_shard_indices(ids)}
    expected = shard_map(
        "input_ids", tuple(ids.shape), batch_spec(2, report.axis_sizes), report.axis_sizes, report.device_ids
    )
    out.update(
        wrong_shape=wrong_shape,
        wrong_place=wrong_place,
        wrong_grad=wrong_grad,
        state_layout=state_layout,
        state_bigger=state_bigger,
        fractions=fractions,
        batch_rows={str(d): list(idx[0]) for d, idx in placed_rows.items()},
        batch_as_expected=placed_rows == {s.device: s.index for s in expected.shards},
        note=batch["note"],
        fallbacks=report.fallbacks,
        specs={e.name: e.spec for e in report.entries},
    )
    return out


def edge_errors(mesh: Any) -> dict[str, str]:
    """Clear errors at the edges, in the same SPMD process."""
    errors = {}
    try:
        shard_batch({"input_ids": torch.zeros(6, 4, dtype=torch.long)}, mesh)
    except ShardingError as err:
        errors["batch"] = str(err)
    try:
        MeshSpec(data=-1, fsdp=2, num_slices=2).build()
    except MeshError as err:
        errors["multislice_on_cpu"] = str(err)
    try:
        MeshSpec(data=2, fsdp=2, model=4).build()
    except MeshError as err:
        errors["too_big"] = str(err)
    return errors


def main(family: str, meshes: list[dict[str, int]]) -> dict[str, Any]:
    # detect() starts the runtime; no XLA tensor exists yet, so SPMD can still be switched on.
    hw = detect("xla")
    preset = mesh_preset(hw)
    runtime.use_spmd()
    cfg = tiny(family)
    ids_cpu = torch.randint(0, 512, (8, 32), generator=torch.Generator().manual_seed(0))

    results: dict[str, Any] = {
        "preset": preset.axis_sizes if preset else None,
        "unsharded": train(cfg, ids_cpu, None),
    }
    for spec in meshes:
        results[mesh_id(spec)] = train(cfg, ids_cpu, spec)

    # The device loader applies the same batch sharding as shard_batch.
    mesh = MeshSpec(data=2, fsdp=2, model=2).build()
    loader = runtime.device_loader(
        [{"input_ids": ids_cpu}], runtime.device(), batch_sharding=batch_sharding(mesh)
    )
    loaded = next(iter(loader))
    direct = shard_batch({"input_ids": ids_cpu}, mesh)
    results["loader_spec"] = [
        runtime.sharding_spec(loaded["input_ids"]),
        runtime.sharding_spec(direct["input_ids"]),
    ]
    results["errors"] = edge_errors(mesh)
    return results


if __name__ == "__main__":
    run(main)
