"""What a resume needs: the loop's own position (`LoopState`) and the checkpoint of a whole run
(`TrainingState`), which gathers the state of each component from its owner.

The loop's fields are checkpointed as one object under ``"loop"``; model, optimizer, scheduler
and RNG states sit beside it under their own keys. A model with frozen parameters (LoRA) is
checkpointed by its trainable ones only (`model_state`): the frozen base comes back from where
the run builds or loads it, so a LoRA checkpoint is the adapters' size plus their optimizer state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from workbench.backend.protocol import Backend
from workbench.config import WEIGHT_SHAPE_FIELDS
from workbench.models.layer_stack import (
    collapse_optimizer_state,
    expand_optimizer_state,
    model_stacks,
)
from workbench.train.checkpoint import CheckpointManager
from workbench.train.lora import trainable_parameters
from workbench.train.optim import load_optimizer_state
from workbench.train.state_io import CheckpointError, capture_rng, restore_rng
from workbench.train.stream import BatchInfo


@dataclass
class LoopState:
    """Step, tokens and data position of a run, and the batch layout it has reached."""

    step: int = 0
    """Optimizer steps completed (across resumes)."""
    tokens_seen: int = 0
    """Real tokens trained on."""
    epoch: int = 0
    batch_in_epoch: int = 0
    """Batches of `epoch` consumed: a resume continues at this index."""
    sequences_in_epoch: int = 0
    """Sequences of `epoch` consumed: a batch-size change re-enters the epoch past them."""
    batch_size: int = 1
    """Sequences per loaded batch (grows with dynamic batching)."""
    split: int = 1
    """Micro-batches each loaded batch is cut into (doubled by each out-of-memory retry)."""

    def step_done(self, batches: Iterable[BatchInfo]) -> int:
        """Count a finished optimizer step over `batches`; returns its real tokens."""
        tokens = 0
        for info in batches:
            first_of_epoch = info.index == 0
            self.sequences_in_epoch = info.sequences + (0 if first_of_epoch else self.sequences_in_epoch)
            self.epoch, self.batch_in_epoch = info.epoch, info.index + 1
            tokens += info.tokens
        self.step += 1
        self.tokens_seen += tokens
        return tokens

    def resize_batch(self, batch_size: int) -> None:
        """Continue the same epoch at `batch_size`, past the sequences already seen."""
        self.batch_size = batch_size
        self.batch_in_epoch = self.sequences_in_epoch // batch_size

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        missing = [f.name for f in fields(self) if f.name not in state]
        if missing:
            raise ValueError(
                f"the checkpoint's loop state lacks {', '.join(missing)}: it is not a workbench checkpoint"
            )
        for f in fields(self):
            setattr(self, f.name, int(state[f.name]))


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model tensors a checkpoint holds: the whole state dict, or, when some parameters are frozen
    (a LoRA model's base), only the trainable parameters (detached: they share the live storage).
    Under per-layer names either way: a stacked layer weight (``model.scan_layers``) gives one
    tensor per layer, so scanned and unscanned runs write the same checkpoint."""
    if all(p.requires_grad for p in model.parameters()):
        return model.state_dict()
    return trainable_parameters(model)


def load_model_state(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Copy `saved` (what `model_state` wrote) into the live model, keeping each tensor's device and sharding."""
    live = model_state(model)
    if live.keys() != saved.keys():
        missing, extra = sorted(live.keys() - saved.keys()), sorted(saved.keys() - live.keys())
        raise ValueError(
            f"the checkpoint's model holds {len(saved)} tensors, this run trains {len(live)}"
            + (f"; missing {missing[:3]}" if missing else "")
            + (f"; unexpected {extra[:3]}" if extra else "")
            + ": resume with the model and LoRA settings (lora.*) the checkpoint was written with"
        )
    if all(p.requires_grad for p in model.parameters()):
        model.load_state_dict(saved)
        return
    if model_stacks(model):  # per-layer tensors are stacked into their live stacked weight
        model.load_state_dict(saved, strict=False)
        return
    with torch.no_grad():
        for name, value in saved.items():
            if value is not live[name]:
                live[name].copy_(value.to(live[name].dtype))


@dataclass
class TrainingState:
    """Everything a checkpoint holds, gathered from its owners: model, objective, optimizer,
    scheduler, the loop and the RNGs (the `backend` device's among them). Loads copy *into* the live
    tensors, so a resumed run keeps each tensor's device and sharding and runs the programs compiled
    before."""

    model: torch.nn.Module
    objective: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loop: LoopState
    backend: Backend
    """The run's `Backend`, whose device RNG a checkpoint holds beside the host's."""

    def _has_objective_state(self) -> bool:
        return any(True for _ in self.objective.parameters())

    def state_dict(self, config: dict[str, Any]) -> dict[str, Any]:
        """The nested dict `CheckpointManager.save` writes (with the run's config beside it)."""
        state: dict[str, Any] = {
            "model": model_state(self.model),
            "optimizer": expand_optimizer_state(self.optimizer, self.model),
            "scheduler": self.scheduler.state_dict(),
            "loop": self.loop.state_dict(),
            "rng": capture_rng(self.backend),
            "config": config,
        }
        if self._has_objective_state():
            state["objective"] = self.objective.state_dict()
        return state

    def nbytes(self) -> int:
        """Bytes of tensor state a checkpoint of this run holds (the model tensors it saves, the optimizer
        state): what a save's write is planned from before one has been timed."""
        params = list(self.model.parameters())
        saved = params if all(p.requires_grad for p in params) else [p for p in params if p.requires_grad]
        moments = [
            t for s in self.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
        ]
        return sum(t.numel() * t.element_size() for t in [*saved, *moments])

    def load(self, checkpoints: CheckpointManager, path: Path, config: dict[str, Any] | None = None) -> None:
        """Restore from `path`; the optimizer state must already exist (sharded loads need destinations).
        With the run's `config`, a checkpoint written for another model, LoRA or optimizer is refused
        up front, naming the settings that differ; a load that fails on shapes names them too."""
        differences = config_differences(checkpoints.saved_config(path), config) if config is not None else []
        if differences:
            raise CheckpointError(_mismatch(path, differences))
        try:
            self._load(checkpoints, path)
        except RuntimeError as err:  # our own mismatch errors (ValueError) say what differs already
            shapes = "size" in str(err) or "shape" in str(err)
            if isinstance(err, CheckpointError) or not shapes:  # a bad file, or no mismatch at all (e.g. OOM)
                raise
            raise CheckpointError(_mismatch(path, [f"{type(err).__name__}: {err}"])) from err

    def _load(self, checkpoints: CheckpointManager, path: Path) -> None:
        into = {
            "model": model_state(self.model),
            "optimizer": expand_optimizer_state(self.optimizer, self.model),
        }
        if self._has_objective_state():
            into["objective"] = self.objective.state_dict()
        state = checkpoints.load(path, into=into)
        with torch.no_grad():
            # a stacked model's checkpoint tensors are per-layer slices: always copied back in
            if state["model"] is not into["model"] or model_stacks(self.model):
                load_model_state(self.model, state["model"])
            if "objective" in state:
                self.objective.load_state_dict(state["objective"])
        load_optimizer_state(
            self.optimizer, collapse_optimizer_state(self.optimizer, self.model, state["optimizer"])
        )
        self.scheduler.load_state_dict(state["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr
        self.loop.load_state_dict(state["loop"])
        restore_rng(state["rng"], self.backend)


def config_differences(saved: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """The settings a checkpoint's tensors depend on that differ between its run (`saved`) and this one:
    the model's shape (for a model built from the config), the LoRA adapters and the optimizer."""
    if not saved:
        return []
    fields_ = [("lora", "rank"), ("train", "optimizer")]
    if saved.get("lora", {}).get("rank") or current.get("lora", {}).get("rank"):
        fields_.append(("lora", "target_modules"))  # which adapters exist, when there are any
    scratch = not saved.get("model", {}).get("pretrained_path") and not current["model"].get(
        "pretrained_path"
    )
    if scratch:
        fields_ += [("model", name) for name in ("family", *WEIGHT_SHAPE_FIELDS)]
    out = []
    for section, name in fields_:
        was, now = saved.get(section, {}).get(name), current.get(section, {}).get(name)
        if was is not None and was != now:
            out.append(f"{section}.{name}={was!r} there, {now!r} here")
    return out


def _mismatch(path: Path, what: list[str]) -> str:
    return (
        f"checkpoint {str(path)!r} was written by a run this one cannot continue ({'; '.join(what)}): "
        "resume with the settings it was written with, or start fresh with train.resume=false or another "
        "train.checkpoint_dir"
    )
