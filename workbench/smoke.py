"""[from smoke] The smoke test people run first on a new machine: a few steps of a tiny causal LM.

It builds a model from `ModelConfig`, trains it on one fixed random batch (so the loss
must fall: the model memorises it), and reports loss and steps/s. On XLA the loss reaches
the host through step closures, so the loop itself never forces a sync.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from workbench.backend.hardware import HardwareInfo, detect
from workbench.backend.xla import runtime
from workbench.config import ModelConfig
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs


@dataclass
class SmokeResult:
    hardware: HardwareInfo
    losses: list[float] = field(default_factory=list)
    steps_per_s: float = 0.0
    compiles: int = 0

    @property
    def ok(self) -> bool:
        return len(self.losses) >= 2 and all(x == x for x in self.losses) and self.losses[-1] < self.losses[0]


def run_smoke(
    device_type: str = "auto",
    steps: int = 8,
    batch_size: int = 4,
    seq_len: int = 32,
    seed: int = 0,
    echo: bool = True,
) -> SmokeResult:
    hw = detect(device_type)  # type: ignore[arg-type]
    dev = runtime.device() if hw.via_xla else torch.device(hw.backend)
    cfg = ModelConfig(vocab_size=256)
    model = build_model(cfg, seed=seed).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    batch = torch.randint(0, cfg.vocab_size, (batch_size, seq_len), generator=gen).to(dev)
    result = SmokeResult(hardware=hw)
    before = runtime.metrics_snapshot()

    def record(step: int, loss: torch.Tensor) -> None:
        result.losses.append(float(loss))
        if echo:
            print(f"step {step:3d}  loss {float(loss):.4f}", flush=True)

    start = time.perf_counter()
    for step in range(steps):
        loss = model(**model_inputs({"input_ids": batch}, model), labels=batch).loss  # no host read
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if hw.via_xla:
            runtime.add_step_closure(record, (step, loss.detach()))
            runtime.sync()
        else:
            record(step, loss.detach())
    if hw.via_xla:
        runtime.wait_device_ops()
    elapsed = time.perf_counter() - start
    result.steps_per_s = steps / elapsed
    result.compiles = int(runtime.metrics_snapshot()["compiles"] - before["compiles"])
    if echo:
        print(
            f"{steps} steps on {hw.chip} ({hw.backend}, via_xla={hw.via_xla}): {result.steps_per_s:.2f} steps/s, {result.compiles} compiles"
        )
        print("smoke OK: loss fell" if result.ok else "smoke FAILED: loss did not fall")
    return result
