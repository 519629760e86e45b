"""Each rank builds the tiny default model, rank r adding r to every weight, then `wrap`s it with FSDP2
(or HSDP): the main rank writes whether every rank then holds rank 0's original weights.

    torchrun --standalone --nproc_per_node=N -m tests.dist.same_start OUT.json DATA FSDP
"""

from __future__ import annotations

import json
import sys


def main(out: str, data: int, fsdp: int) -> None:
    import torch
    import torch.distributed as dist

    from workbench.config import WorkbenchConfig
    from workbench.models.build import build_model
    from workbench.parallel import torch_parallel
    from workbench.parallel.torch_parallel import ObjectiveStep, RankMesh

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build_model(WorkbenchConfig().model, vocab_size=64, seed=0)
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank)  # what an unseeded initialisation would do: each rank its own start
    layout = RankMesh(data=data, fsdp=fsdp)
    step = torch_parallel.wrap(
        ObjectiveStep(model, torch.nn.Identity()),
        layout,
        torch_parallel.device_mesh(layout, "cpu"),
        precision="fp32",
        device=torch.device("cpu"),
    )
    mismatched = [
        name
        for name, p in step.model.named_parameters()
        if not torch.equal(p.full_tensor() if hasattr(p, "full_tensor") else p, expected[name])
    ]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mismatched)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"strategy": layout.strategy, "mismatched": everyone, "parameters": len(expected)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
