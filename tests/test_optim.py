"""The optimizers the trainer builds hold exactly the state the memory estimate counts for them."""

from __future__ import annotations

import pytest
import torch

from workbench import WorkbenchConfig
from workbench.analysis.estimate import model_shape, optimizer_state_elements
from workbench.analysis.state_bytes import OPTIMIZERS
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


def test_adamw_is_fused_on_cuda_only_with_its_step_counters_on_the_device():
    from types import SimpleNamespace

    from workbench.train.optim import use_fused

    def on(*devices: str) -> list[dict]:
        return [{"params": [SimpleNamespace(device=torch.device(d)) for d in devices]}]

    assert use_fused(on("cuda:0")) and not use_fused(on("cpu")) and not use_fused(on("xla:0"))
    model = torch.nn.Linear(4, 4)
    train = WorkbenchConfig().train
    host = build_optimizer(model, train)  # the CPU: the loop, its counters on the host
    fused = build_optimizer(model, train, fused=True)  # what CUDA builds (torch fuses AdamW on the CPU too)
    assert host.param_groups[0]["fused"] is False and fused.param_groups[0]["fused"] is True
    init_optimizer_state(fused)
    assert all(s["step"].device == p.device for p, s in fused.state.items())


def _adamw_steps(optimizer: torch.optim.Optimizer, model: torch.nn.Module, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()


@pytest.mark.parametrize("saved_fused", [True, False], ids=["fused-to-host", "host-to-fused"])
def test_a_checkpoint_of_fused_adamw_resumes_with_host_counters_and_back(tmp_path, saved_fused):
    from workbench.backend.hardware import detect
    from workbench.backend.selection import backend_for
    from workbench.train.checkpoint import CheckpointManager
    from workbench.train.optim import warmup_cosine
    from workbench.train.state import LoopState, TrainingState

    cfg = WorkbenchConfig().with_overrides({"train.learning_rate": 0.01, "train.weight_decay": 0.1})
    host = backend_for(detect("cpu"))

    def run(fused: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer, TrainingState]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        optimizer = build_optimizer(model, cfg.train, fused=fused)
        init_optimizer_state(optimizer)
        state = TrainingState(
            model, torch.nn.Module(), optimizer, warmup_cosine(optimizer, cfg.train), LoopState(), host
        )
        return model, optimizer, state

    written_model, written, written_state = run(saved_fused)
    _adamw_steps(written, written_model, 3, seed=1)
    manager = CheckpointManager(tmp_path)
    path = manager.save(3, written_state.state_dict(cfg.to_dict()))
    counters = [s["step"] for s in manager.load(path)["optimizer"]["state"].values()]
    assert all(c.device.type == "cpu" and c.dtype == torch.float32 and c.shape == () for c in counters)

    resumed_model, resumed, resumed_state = run(not saved_fused)
    resumed_state.load(manager, path, cfg.to_dict())
    assert resumed.param_groups[0]["fused"] is (not saved_fused)  # how this hardware runs the update
    for p_written, p_resumed in zip(written_model.parameters(), resumed_model.parameters()):
        live, saved = resumed.state[p_resumed], written.state[p_written]
        assert live["step"].device == p_resumed.device and float(live["step"]) == 3.0
        assert torch.equal(live["exp_avg_sq"], saved["exp_avg_sq"]) and torch.equal(p_resumed, p_written)
    # both continue alike: the fused kernel and the loop agree to rounding
    _adamw_steps(written, written_model, 2, seed=2)
    _adamw_steps(resumed, resumed_model, 2, seed=2)
    for p_written, p_resumed in zip(written_model.parameters(), resumed_model.parameters()):
        torch.testing.assert_close(p_resumed, p_written, rtol=1e-6, atol=1e-6)
