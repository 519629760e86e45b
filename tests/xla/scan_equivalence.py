"""Scanned against unrolled decoder stacks on one XLA:CPU device (tests/test_scan.py).

The same tiny model (same seed, fp32) is prepared twice by the trainer's `prepare_model`, once
with ``scan=True`` (`workbench.models.scan`) and once without, then trained `steps` AdamW
steps by the same hand-written step (forward with an attention mask, the model's own loss,
backward, optimizer step, one sync). Reported for each: the losses, the programs compiled,
which decoder layers' trainable parameters moved, the state_dict keys; for the scanned one,
whether the scan is installed, whether transformers' own per-layer checkpointing is off, and
how often the layer was traced in Python after the first step (never: the trace is cached).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from tests.tiny import tiny
from tests.xla import run
from workbench.backend.xla import runtime
from workbench.config import WorkbenchConfig
from workbench.models import scan as scan_module
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs
from workbench.models.layer_stack import per_layer_parameters
from workbench.models.scan import scanned_layers
from workbench.train.model_setup import prepare_model

BATCH, LENGTH = 2, 24
LAYER_TRACES = [0]
"""Calls of a scanned layer's Python forward: only tracing calls it (the scan then runs the trace)."""


def count_layer_traces() -> None:
    forward = scan_module._LayerForward.forward

    def counted(self, *args, **kwargs):
        LAYER_TRACES[0] += 1
        return forward(self, *args, **kwargs)

    scan_module._LayerForward.forward = counted


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder().layers


def layer_trainables(model: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    """Each decoder layer's trainable tensors (host copies) under their per-layer names, stacked or not."""
    per_layer: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor, trainable in per_layer_parameters(model):
        index = re.search(r"layers\.(\d+)\.", name)
        if trainable and index:
            per_layer.setdefault(int(index.group(1)), {})[name] = tensor.cpu().clone()
    return [per_layer[i] for i in sorted(per_layer)]


def train(family: str, layers: int, steps: int, *, scan: bool, remat: bool, lora: bool) -> dict[str, Any]:
    overrides = {"model.scan_layers": scan, "train.gradient_checkpointing": remat, "train.seed": 0}
    if lora:
        overrides.update({"lora.rank": 4, "lora.alpha": 8})
    cfg = WorkbenchConfig().with_overrides(overrides)
    model = build_model(tiny(family, num_layers=layers), seed=0)
    model = prepare_model(model, cfg.train, cfg.model, xla=True, lora=cfg.lora)
    dev = runtime.device()
    model.to(dev)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2, foreach=False)
    before = layer_trainables(model)
    ids = torch.randint(3, 500, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1)).to(dev)
    compiles = runtime.compile_count()
    losses = []
    traces_after_first_step = 0
    for step in range(steps):
        if step == 1:
            traces_after_first_step = LAYER_TRACES[0]
        batch = {"input_ids": ids}
        loss = model(**model_inputs(batch, model), labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        runtime.sync()
    compiles = runtime.compile_count() - compiles
    retraces = LAYER_TRACES[0] - traces_after_first_step
    moved = [
        all(not torch.equal(now[n], start[n]) for n in start)
        for now, start in zip(layer_trainables(model), before)
    ]
    stack = scanned_layers(model)
    return {
        "losses": [float(v) for v in runtime.to_cpu(losses)],
        "compiles": compiles,
        "layers_moved": moved,
        "trainable_per_layer": len(before[0]),
        "state_dict_keys": sorted(model.state_dict()),
        "scanned": stack is not None,
        "layer_traces_after_first_step": retraces,
        "layer_traces": LAYER_TRACES[0],
        "remat": bool(stack.remat) if stack is not None else None,
        "hf_checkpointing": any(getattr(m, "gradient_checkpointing", False) for m in decoder_layers(model)),
    }


def main(
    family: str = "llama", layers: int = 4, steps: int = 3, remat: bool = False, lora: bool = False
) -> dict:
    kwargs = dict(remat=remat, lora=lora)
    count_layer_traces()
    return {
        "unrolled": train(family, layers, steps, scan=False, **kwargs),
        "scanned": train(family, layers, steps, scan=True, **kwargs),
    }


if __name__ == "__main__":
    run(main)
