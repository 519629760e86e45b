"""Checkpoints cross between scanned (stacked layer weights) and unscanned runs of the Trainer on
XLA:CPU (tests/test_layer_stack.py).

Each case trains a writer (a tiny 3-layer Llama, ``train.steps`` 4, a checkpoint every 2 steps),
then a reader with the other ``model.scan_layers`` resumes from the writer's step-2 checkpoint and
trains steps 3 and 4. Reported per case: the writer's and the reader's losses and programs
compiled after warm-up (a resume must not change a tensor's sharding or layout), the tensors
(per-layer model state and expanded optimizer state, host copies) where the reader's state
right after loading differs from the writer's state at step 2 (bitwise), whether their optimizer
hyper-parameters match, how the checkpoint's parts were stored (safetensors or sharded DCP) and
whether any key in it is a stacked one.

``part="single"`` (one device): full fine-tune with Adafactor and LoRA with AdamW, both
directions; the Adafactor writers, scanned and unscanned, also compare their losses, and each
scanned writer's exports (`save_model`: full; adapter and merged) from its stacked XLA model are
compared with the same weights' exports once unstacked.
``part="mesh"`` (data=1 x fsdp=4 x model=2 over 8 devices, sharded checkpoints; data=1 because a
data axis > 1 makes every tensor partially replicated and `CheckpointManager` then falls back to
full tensors in safetensors, state_io.save_dcp): full fine-tune with AdamW, both directions; then
scanned -> unscanned on data=2 x fsdp=2 x model=2, where that fallback writes the checkpoint; and
the sharding reports of a scanned and an unscanned run: the stacked q_proj entry, its layer-0
twin and the live parameters' HLO sharding strings (with a reference tensor sharded as the
report says); and in how many chunks DCP wrote a layer's weight and the embedding.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.backend.xla import runtime
from workbench.models.layer_stack import expand_optimizer_state, model_stacks
from workbench.models.scan import uninstall_scan
from workbench.train import Trainer
from workbench.train.adapter_files import save_model
from workbench.train.lora import is_lora
from workbench.train.state import model_state
from workbench.train.state_io import _dcp_reader, host_tensors

COMMON = {
    "train.device_type": "xla",
    "train.steps": 4,
    "train.log_every": 1,
    "train.checkpoint_every": 2,
    "train.keep_checkpoints": 3,
    "train.learning_rate": 1e-2,
    "model.num_layers": 3,
}
CASES: dict[str, dict[str, Any]] = {
    "full, adafactor": {"train.optimizer": "adafactor"},
    "lora, adamw": {"lora.rank": 4, "lora.alpha": 8.0, "train.weight_decay": 0.1},
    "mesh, full, adamw": {
        "mesh.enabled": True,
        "mesh.data": 1,
        "mesh.fsdp": 4,
        "mesh.model": 2,
        "train.weight_decay": 0.1,
    },
    "hsdp, full, adamw": {
        "mesh.enabled": True,
        "mesh.data": 2,
        "mesh.fsdp": 2,
        "mesh.model": 2,
        "train.weight_decay": 0.1,
    },
}
Q_PROJ = "model.layers.{index}.self_attn.q_proj.weight"


def snapshot(trainer: Trainer) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Host copies of what a checkpoint holds of the model and the optimizer, under per-layer names
    and in the unscanned layout, and the optimizer's hyper-parameters."""
    optimizer = expand_optimizer_state(trainer.optimizer, trainer.model)
    tensors = {f"model/{name}": value for name, value in model_state(trainer.model).items()}
    for index, state in optimizer["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{index}/{key}"] = value
    groups = [{k: v for k, v in group.items()} for group in optimizer["param_groups"]]
    # host_tensors hands CPU tensors (Adam's step counters) back as they are: copy them, they go on
    copies = {key: value.clone() for key, value in host_tensors(tensors).items()}
    return copies, json.loads(json.dumps(groups, default=str))


def differences(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
    """Keys missing on one side, or whose dtype, shape or bits differ."""
    out = sorted(set(got) ^ set(expected))
    for key in expected.keys() & got.keys():
        a, b = got[key], expected[key]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            out.append(key)
    return sorted(out)


def checkpoint_facts(path: Path) -> dict[str, Any]:
    """How each part of the checkpoint at `path` is stored, and whether any tensor key is stacked."""
    from safetensors import safe_open

    parts = json.loads((path / "state.json").read_text())["parts"]
    keys: list[str] = []
    for part, kind in parts.items():
        if kind == "safetensors":
            with safe_open(str(path / f"{part}.safetensors"), framework="pt") as f:
                keys += list(f.keys())
        else:
            keys += list(_dcp_reader(path / f"{part}.dcp").read_metadata().state_dict_metadata)
    chunks = {}
    if parts.get("model") == "dcp":  # how many pieces a layer's weight and the embedding were written in
        metadata = _dcp_reader(path / "model.dcp").read_metadata().state_dict_metadata
        for name in (Q_PROJ.format(index=1), "model.embed_tokens.weight"):
            chunks[name] = len(metadata[name].chunks)
    return {
        "parts": parts,
        "stacked_keys": [k for k in keys if ".stacked." in k],
        "keys": len(keys),
        "chunks": chunks,
    }


def fit_writer(case: str, scan: bool, root: Path) -> tuple[Trainer, dict[str, Any]]:
    cfg = tiny_cfg(**COMMON, **CASES[case], **{"model.scan_layers": scan, "train.checkpoint_dir": str(root)})
    trainer = Trainer(cfg, train_dataset=token_dataset(48))
    at_step_2: dict[str, Any] = {}
    compiles: dict[str, Any] = {"capture": 0, "saves": []}

    def capture(metrics: dict[str, Any]) -> None:  # the state the step-2 checkpoint saves
        if metrics["step"] == 2:
            before = runtime.compile_count()
            at_step_2["tensors"], at_step_2["groups"] = snapshot(trainer)
            compiles["capture"] = runtime.compile_count() - before  # this test's own reading

    save = trainer.save_checkpoint

    def counted_save(wait: bool = True) -> Path:
        before = runtime.compile_count()
        out = save(wait=wait)
        compiles["saves"].append(runtime.compile_count() - before)
        return out

    trainer.callbacks.append(capture)
    trainer.save_checkpoint = counted_save  # type: ignore[method-assign]
    result = trainer.fit()
    facts = {
        "losses": [m["loss"] for m in result.history],
        "stacked": bool(model_stacks(trainer.model)),
        "after": result.compiles_after_warmup - compiles["capture"],
        "capture_compiles": compiles["capture"],
        "save_compiles": compiles["saves"],
    }
    return trainer, {**facts, **at_step_2}


def fit_reader(case: str, scan: bool, checkpoint: Path, root: Path) -> tuple[Trainer, dict[str, Any]]:
    root.mkdir(parents=True)
    shutil.copytree(checkpoint, root / checkpoint.name)
    cfg = tiny_cfg(**COMMON, **CASES[case], **{"model.scan_layers": scan, "train.checkpoint_dir": str(root)})
    trainer = Trainer(cfg, train_dataset=token_dataset(48))
    loaded: dict[str, Any] = {}
    load = trainer.load_checkpoint

    def load_and_capture(path: Any = None) -> Path:
        out = load(path)
        loaded["tensors"], loaded["groups"] = snapshot(trainer)
        return out

    trainer.load_checkpoint = load_and_capture  # type: ignore[method-assign]
    result = trainer.fit()
    losses = [m["loss"] for m in result.history]
    steps = [m["step"] for m in result.history]
    facts = {"losses": losses, "steps": steps, "stacked": bool(model_stacks(trainer.model))}
    return trainer, {**facts, "after": result.compiles_after_warmup, **loaded}


def cross(case: str, writer_scan: bool, root: Path) -> tuple[dict[str, Any], Trainer, Trainer]:
    """Write scanned (or not), resume the other way; what the test checks."""
    name = f"{case.replace(', ', '-')}-{'scanned' if writer_scan else 'unscanned'}"
    writer, written = fit_writer(case, writer_scan, root / name / "writer")
    checkpoint = root / name / "writer" / "step-00000002"
    reader, read = fit_reader(case, not writer_scan, checkpoint, root / name / "reader")
    result = {
        "writer_stacked": written["stacked"],
        "reader_stacked": read["stacked"],
        "writer_losses": written["losses"],
        "reader_losses": read["losses"],
        "reader_steps": read["steps"],
        "compiles_after_warmup": [written["after"], read["after"]],
        "capture_compiles": written["capture_compiles"],
        "save_compiles": written["save_compiles"],
        "tensors": len(written["tensors"]),
        "differences": differences(read["tensors"], written["tensors"]),
        "groups_equal": read["groups"] == written["groups"],
        "checkpoint": checkpoint_facts(checkpoint),
    }
    return result, writer, reader


def exports(model: torch.nn.Module, root: Path) -> dict[str, dict[str, torch.Tensor]]:
    """What `save_model` writes of `model` (a LoRA model: its adapter and the merged model)."""
    from safetensors.torch import load_file

    written = {"full": ("model.safetensors", False)}
    if is_lora(model):
        written = {"adapter": ("adapter_model.safetensors", False), "merged": ("model.safetensors", True)}
    out = {}
    for kind, (file, merged) in written.items():
        save_model(model, root / kind, merged=merged)
        out[kind] = load_file(str(root / kind / file))
    return out


def export_differences(trainer: Trainer, root: Path) -> dict[str, Any]:
    """A stacked model's exports on XLA against the same weights' exports once unstacked
    (`uninstall_scan`: each layer's own parameters again, the plain export path)."""
    stacked = exports(trainer.model, root / "stacked")
    uninstall_scan(trainer.model)
    assert not model_stacks(trainer.model)
    plain = exports(trainer.model, root / "unstacked")
    return {
        kind: {"tensors": len(plain[kind]), "differences": differences(stacked[kind], plain[kind])}
        for kind in plain
    }


def sharding_facts(trainer: Trainer) -> dict[str, Any]:
    """The sharding report's q_proj entry (stacked or layer 0), the live parameter's HLO sharding,
    and the HLO sharding of a fresh tensor of its shape marked with the report's spec."""
    report = {entry.name: entry for entry in trainer.sharding_report.entries}
    stacked = model_stacks(trainer.model)
    name = Q_PROJ.format(index="*" if stacked else 0)
    entry = report[name]
    live_name = "model.layers.stacked.self_attn.q_proj.weight" if stacked else name
    live = trainer.model.get_parameter(live_name)
    reference = torch.zeros(tuple(live.shape)).to(runtime.device())
    runtime.mark_sharding(reference, trainer.mesh, entry.spec)
    return {
        "name": name,
        "in_report": sorted(n for n in report if "q_proj" in n),
        "spec": [list(a) if isinstance(a, tuple) else a for a in entry.spec],
        "shape": list(entry.shape),
        "live_shape": list(live.shape),
        "live_sharding": runtime.sharding_spec(live),
        "reference_sharding": runtime.sharding_spec(reference),
    }


def main(part: str, root: str) -> dict[str, Any]:
    base = Path(root)
    if part == "single":
        out = {}
        for case in ("full, adafactor", "lora, adamw"):
            for writer_scan in (True, False):
                result, writer, _ = cross(case, writer_scan, base)
                if writer_scan:
                    result["exports"] = export_differences(
                        writer, base / f"exports-{case.replace(', ', '-')}"
                    )
                out[f"{case}: {'scanned' if writer_scan else 'unscanned'} -> other"] = result
        return out
    if part == "mesh":
        result, writer, reader = cross("mesh, full, adamw", True, base)
        back, _, _ = cross("mesh, full, adamw", False, base)
        hsdp, _, _ = cross("hsdp, full, adamw", True, base)
        return {
            "mesh, full, adamw: scanned -> other": result,
            "mesh, full, adamw: unscanned -> other": back,
            "hsdp, full, adamw: scanned -> other": hsdp,
            "scanned_sharding": sharding_facts(writer),
            "unscanned_sharding": sharding_facts(reader),
        }
    raise ValueError(f"part={part!r} is not allowed: expected 'single' or 'mesh'")


if __name__ == "__main__":
    run(main)
