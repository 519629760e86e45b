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
