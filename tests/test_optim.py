"""The optimizers the trainer builds hold exactly the state the memory estimate counts for them."""

from __future__ import annotations

import pytest
import torch

from workbench import WorkbenchConfig
from workbench.analysis.estimate import OPTIMIZERS, model_shape, optimizer_state_elements
from workbench.models.build import build_model
from workbench.train.optim import build_optimizer, init_optimizer_state


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_estimated_optimizer_state_is_what_the_built_optimizer_creates(optimizer):
    cfg = WorkbenchConfig.from_dict(
        {
            "model": {
                "hidden_size": 32,
                "num_layers": 2,
                "num_heads": 4,
                "num_kv_heads": 2,
                "intermediate_size": 64,
                "vocab_size": 128,
            },
            "train": {"optimizer": optimizer},
        }
    )
    model = build_model(cfg.model)
    built = build_optimizer(model, cfg.train)
    init_optimizer_state(built)
    elements = sum(
        value.numel()
        for state in built.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0  # not the scalar step counters
    )
    assert elements == optimizer_state_elements(model_shape(model), optimizer)


def test_the_update_runs_a_list_at_a_time_on_cuda_only():
    from types import SimpleNamespace

    from workbench.train.optim import use_foreach

    def on(*devices: str) -> list[dict]:
        return [{"params": [SimpleNamespace(device=torch.device(d)) for d in devices]}]

    assert use_foreach(on("cuda:0", "cuda:0"))
    assert not use_foreach(on("cpu")) and not use_foreach(on("cuda:0", "cpu")) and not use_foreach(on())
    # XLA tensors report device type 'xla': the per-parameter loop, traced into the step's program
    assert not use_foreach(on("xla:0"))
    model = torch.nn.Linear(4, 4)
    built = build_optimizer(model, WorkbenchConfig().train)
    assert built.param_groups[0]["foreach"] is False  # the CPU: the loop the bitwise tests compare


def test_a_resume_keeps_how_this_hardware_runs_the_update():
    from workbench.train.optim import load_optimizer_state

    train = WorkbenchConfig().with_overrides({"train.learning_rate": 0.01}).train
    model = torch.nn.Linear(4, 4)
    written = build_optimizer(model, train)  # as a CUDA run wrote it: a list at a time
    init_optimizer_state(written)
    saved = written.state_dict()
    for group in saved["param_groups"]:
        group["foreach"], group["lr"] = True, 0.5
    resumed = build_optimizer(model, train)
    init_optimizer_state(resumed)
    load_optimizer_state(resumed, saved)
    assert all(g["foreach"] is False and g["lr"] == 0.5 for g in resumed.param_groups)
