"""The compiled native step (``train.compile``) on the CPU: the losses of eager, one graph per bucket
shape compiled in warm-up and none after, a recompile explained with its cause and place, 'auto''s rule,
and the same under torchrun with FSDP2 (one launch of 2 gloo ranks, `tests/dist/compiled.py`).

The runs compile with torch.compile's 'aot_eager' backend: the same Dynamo graphs, guards and
AOTAutograd as the product's 'inductor', without inductor's C++ build of each CPU graph (17-86 s a
shape on a 2-core host, `bench/compile_native.py`).
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch

from tests.test_train import tiny_cfg, token_dataset
from workbench.backend.hardware import HardwareInfo
from workbench.backend.protocol import Backend
from workbench.backend.selection import backend_for
from workbench.config import ConfigError, WorkbenchConfig
from workbench.train import Trainer, compiled_step
from workbench.train.compiled_step import compile_wanted

STEPS = 6


def _run(setting: str) -> tuple[Trainer, object]:
    cfg = tiny_cfg(**{"train.compile": setting, "train.steps": STEPS, "train.learning_rate": 1e-2})
    trainer = Trainer(cfg, train_dataset=token_dataset(48))
    return trainer, trainer.fit()


@pytest.fixture(scope="module")
def runs():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_step, "BACKEND", "aot_eager")
        eager = _run("off")
        with pytest.warns(RuntimeWarning, match="train.compile on"):
            compiled = _run("on")
    return {"eager": eager, "compiled": compiled}


def test_the_compiled_step_trains_as_the_eager_step_does(runs):
    (_, eager), (trainer, compiled) = runs["eager"], runs["compiled"]
    assert trainer.engine.compiled is not None and runs["eager"][0].engine.compiled is None
    eager_losses = [m["loss"] for m in eager.history]
    compiled_losses = [m["loss"] for m in compiled.history]
    assert len(compiled_losses) == STEPS
    assert compiled_losses == pytest.approx(eager_losses, abs=1e-5, rel=1e-5)
    assert compiled_losses[-1] < compiled_losses[0]
    assert any("torch.compile (aot_eager" in n for n in compiled.notices)


def test_warm_up_compiles_one_graph_per_bucket_shape_and_nothing_compiles_after(runs):
    trainer, result = runs["compiled"]
    shapes = trainer.data.shapes(trainer.loop.batch_size, trainer.data.train_dataset)
    assert len(shapes) == 2  # two buckets: two batch shapes, two graphs
    assert result.warmup_compiles == len(shapes)
    assert result.compiles_after_warmup == 0
    assert not any(m["recompiled"] for m in result.history)
    assert runs["eager"][1].warmup_compiles == 0  # an eager CPU step has nothing to warm up


def test_a_shape_warm_up_did_not_cover_is_explained_with_its_cause_and_place(runs):
    trainer, _ = runs["compiled"]
    rows, length = trainer.data.shapes(trainer.loop.batch_size, trainer.data.train_dataset)[0]
    ids = torch.randint(1, 100, (rows, length + 8))  # a length no bucket has: a new graph
    batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}
    out = trainer.engine.train_step([batch])
    metrics = trainer.profiler.step(int(ids.numel()), loss=out["loss"], inputs=[batch], log=True)
    assert metrics["recompiled"] and metrics["compiles"] == 1
    (cause,) = metrics["recompile_causes"]
    # what changed, where it was compiled (the step engine's frame), and Dynamo's own reason
    assert f"({rows}, {length}) → ({rows}, {length + 8}) int64" in cause, cause
    assert re.search(r"compiled at workbench/train/step\.py:\d+ \(_forward\)", cause), cause
    reason = (
        rf"dynamo: tensor 'batch\['input_ids'\]' size mismatch at index 1\. expected \d+, actual {length + 8}"
    )
    assert re.search(reason, cause), cause
    advice = [a.message for a in trainer.profiler.advice() if a.kind == "recompilation"]
    assert advice and "step.py" in advice[0]


def _backend(kind: str, *, via_xla: bool = False) -> Backend:
    """The run's backend for detection's answer: plain torch on `kind`, or torch_xla on it (nothing
    here starts a device: `compile_wanted` reads the backend's device type and capabilities alone)."""
    hw = HardwareInfo(kind, via_xla, kind.upper(), kind, 1, 1, 1, 0, None, None, 1, "local")  # type: ignore[arg-type]
    return backend_for(hw)


def test_auto_compiles_on_cuda_only_and_xla_ignores_on_with_a_notice():
    cuda, cpu, xla = _backend("cuda"), _backend("cpu"), _backend("cpu", via_xla=True)
    assert compile_wanted("auto", backend=cuda) == (True, [])
    assert compile_wanted("auto", backend=cpu) == (False, [])
    assert compile_wanted("on", backend=cpu) == (True, [])
    assert compile_wanted("off", backend=cuda) == (False, [])
    wanted, notices = compile_wanted("on", backend=xla)
    assert not wanted and len(notices) == 1 and "XLA" in notices[0]
    assert compile_wanted("auto", backend=xla) == (False, [])
    assert compile_wanted("auto", backend=_backend("cuda", via_xla=True)) == (False, [])
    from workbench.rl.wiring import GRPORun  # an objective whose step never compiles says why

    wanted, notices = compile_wanted("on", backend=cuda, eager_reason=GRPORun.eager_reason)
    assert not wanted and "GRPO" in notices[0]


def test_the_step_compiles_with_the_runs_own_backend_tpu_on_torchtpu(monkeypatch):
    """Without a test's override the compiled step takes the run's torch.compile backend
    (`routing.compile_backend`): TorchTPU's 'tpu' (a stand-in registered under that name here)."""
    import torch._dynamo.backends.registry as registry

    from workbench.models.build import build_model
    from workbench.train.compiled_step import compiled_forward
    from workbench.train.objective import CausalLMObjective

    graphs: list[int] = []

    def tpu_stand_in(graph, example_inputs):
        graphs.append(len(example_inputs))
        return graph.forward

    monkeypatch.setitem(registry._BACKENDS, "tpu", None)
    monkeypatch.setitem(registry._COMPILER_FNS, "tpu", tpu_stand_in)
    monkeypatch.setattr(compiled_step, "BACKEND", None)
    model = build_model(tiny_cfg().model, seed=0)
    step, notices = compiled_forward("on", model, CausalLMObjective(), backend=_backend("tpu"))
    assert step is not None and step.backend == "tpu" and "(tpu, static shapes)" in notices[-1]
    ids = torch.randint(0, 64, (2, 8))
    out = step({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    assert graphs and torch.isfinite(out["loss_sum"])


def test_compile_reads_yaml_on_and_off_and_names_the_choices_of_a_bad_setting():
    # YAML 1.1 reads a bare on/off as a boolean: the setting still means what it says
    assert WorkbenchConfig.from_yaml("train:\n  compile: off\n").train.compile == "off"
    assert WorkbenchConfig.from_yaml("train:\n  compile: on\n").train.compile == "on"
    with pytest.raises(ConfigError, match=r"train\.compile.*'auto'.*'off'.*'on'"):
        tiny_cfg(**{"train.compile": "fast"})


def test_under_torchrun_fsdp2_the_compiled_step_trains_as_the_eager_one(tmp_path):
    # one launch of 2 CPU ranks (gloo): FSDP2's hooks split each shape's graph, warm-up's restore puts
    # each rank's shard back, and nothing compiles after warm-up
    from tests.test_distributed import dist_env, torchrun

    out = tmp_path / "compiled.json"
    done = subprocess.run(
        torchrun(2, "-m", "tests.dist.compiled", str(out)),
        env=dist_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())
    eager, compiled = runs["off"], runs["on"]
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-5)
    assert eager["warmup_compiles"] == 0 and compiled["compiles_after_warmup"] == 0
    assert compiled["warmup_compiles"] >= compiled["bucket_shapes"] >= 1
