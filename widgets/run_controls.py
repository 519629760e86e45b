"""The config panel's controls for the run it plans: the target hardware (the detected one or a named
slice such as v5e-8), the model size, the global batch, the sequence length, gradient accumulation,
the optimizer, the precision, gradient checkpointing, the LoRA rank (0 = full fine-tuning), the mesh
axes (only the factorisations of the target's device count are offered) and the bucket count; and the
config settings they describe.

`RunControls` holds the widgets, each starting at the config's own value; the panel
(`widgets.config_panel.ConfigPanel`) lays them out and wires them beside the memory-saving controls
(`widgets.config_controls`) and the 'auto' bucket controls (`widgets.bucket_tradeoff`), and asks each
group for its overrides. The bucket slider's count reaches the config through the 'auto' controls,
which decide whether it counts. The hardware targets come from `workbench.backend.targets`, the model
sizes from `workbench.models.presets`.
"""

from __future__ import annotations

from typing import Any, get_args, get_type_hints

import ipywidgets as ipw

from widgets.config_controls import TOOLTIP
from workbench.backend.targets import TARGETS, Target, mesh_factorisations, resolve_target
from workbench.config import TrainConfig, WorkbenchConfig
from workbench.models.presets import MODEL_PRESETS

OWN_MODEL = "as configured"
"""The model-size choice that keeps the config's own model (the others are `MODEL_PRESETS`)."""
SEQ_LENS = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
"""The sequence lengths offered, plus the config's own."""
LORA_RANKS = [0, 4, 8, 16, 32, 64, 128]
"""The LoRA ranks offered (0: off, full fine-tuning), plus the config's own."""


def _mesh_label(axes: tuple[int, int, int]) -> str:
    data, fsdp, model = axes
    return f"data={data} × fsdp={fsdp} × model={model}"


def _literal_options(field: str) -> list[str]:
    return list(get_args(get_type_hints(TrainConfig)[field]))


class RunControls:
    """The target, model-size, training, mesh and bucket-count controls, as widgets."""

    def __init__(
        self, cfg: WorkbenchConfig, target: Target, *, style: dict[str, str], layout: ipw.Layout
    ) -> None:
        self._base = cfg
        self.target_choice = ipw.Dropdown(
            options=[(target.label, target), *((t.label, t) for t in TARGETS.values() if t != target)],
            value=target,
            description="Target",
            style=style,
            layout=layout,
        )
        pretrained = cfg.model.pretrained_path
        self.model_size = ipw.Dropdown(
            options=[OWN_MODEL, *MODEL_PRESETS],
            value=OWN_MODEL,
            description="Model size",
            style=style,
            layout=layout,
            # A checkpoint's own config decides its shape: a preset would change the YAML, not the run.
            disabled=bool(pretrained),
            **{TOOLTIP: f"fixed by model.pretrained_path={pretrained}" if pretrained else ""},
        )
        self.batch_size = ipw.IntSlider(
            value=cfg.train.batch_size,
            min=1,
            max=max(256, cfg.train.batch_size),
            description="Batch size (global)",
            style=style,
            layout=layout,
            continuous_update=False,
        )
        seq_options = sorted({*SEQ_LENS, cfg.data.max_length})
        self.seq_len = ipw.SelectionSlider(
            options=seq_options,
            value=cfg.data.max_length,
            description="Sequence length",
            style=style,
            layout=layout,
            continuous_update=False,
        )
        self.grad_accum = ipw.IntSlider(
            value=cfg.train.grad_accum,
            min=1,
            max=max(64, cfg.train.grad_accum),
            description="Grad accumulation",
            style=style,
            layout=layout,
            continuous_update=False,
        )
        self.optimizer = ipw.Dropdown(
            options=_literal_options("optimizer"),
            value=cfg.train.optimizer,
            description="Optimizer",
            style=style,
            layout=layout,
        )
        self.precision = ipw.Dropdown(
            options=_literal_options("precision"),
            value=cfg.train.precision,
            description="Precision",
            style=style,
            layout=layout,
        )
        self.checkpointing = ipw.Checkbox(
            value=cfg.train.gradient_checkpointing, description="Gradient checkpointing", indent=False
        )
        self.lora_rank = ipw.Dropdown(
            options=[
                (f"{r} (off: full fine-tuning)" if r == 0 else str(r), r)
                for r in sorted({*LORA_RANKS, cfg.lora.rank})
            ],
            value=cfg.lora.rank,
            description="LoRA rank",
            style=style,
            layout=layout,
        )
        self.mesh = ipw.Dropdown(description="Mesh axes", style=style, layout=layout)
        self.set_mesh_options(target.num_devices, preferred=(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model))
        fixed = cfg.bucketing.max_buckets if cfg.bucketing.max_buckets != "auto" else 4
        self.buckets = ipw.IntSlider(
            value=fixed,
            min=1,
            max=max(16, fixed),
            description="Buckets",
            style=style,
            layout=layout,
            continuous_update=False,
        )
        for w, name in (
            (self.batch_size, "wb-batch-size"),
            (self.seq_len, "wb-seq-len"),
            (self.buckets, "wb-buckets"),
            (self.mesh, "wb-mesh"),
            (self.target_choice, "wb-target"),
            (self.lora_rank, "wb-lora-rank"),
        ):
            w.add_class(name)

    @property
    def target(self) -> Target:
        return self.target_choice.value

    def set_mesh_options(self, num_devices: int, preferred: tuple[int, int, int] | None = None) -> None:
        """Offer the mesh shapes of `num_devices`, keeping `preferred`, else the current one, when offered."""
        options = mesh_factorisations(num_devices)
        current = (
            preferred if preferred in options else self.mesh.value if self.mesh.value in options else None
        )
        self.mesh.options = [(_mesh_label(axes), axes) for axes in options]
        self.mesh.value = current or options[0]

    def overrides(self) -> dict[str, Any]:
        """The ``train.*``, ``lora.rank``, ``data.max_length``, ``mesh.*`` and, for a preset or a
        sequence past the model's positions, ``model.*`` settings these controls describe."""
        data, fsdp, model = self.mesh.value
        overrides: dict[str, Any] = {
            "train.batch_size": self.batch_size.value,
            "train.grad_accum": self.grad_accum.value,
            "train.optimizer": self.optimizer.value,
            "train.precision": self.precision.value,
            "train.gradient_checkpointing": self.checkpointing.value,
            "lora.rank": self.lora_rank.value,
            "data.max_length": self.seq_len.value,
            "mesh.data": data,
            "mesh.fsdp": fsdp,
            "mesh.model": model,
            "mesh.enabled": self.target.num_devices > 1,
        }
        if self.model_size.value != OWN_MODEL:
            for key, value in MODEL_PRESETS[self.model_size.value].items():
                overrides[f"model.{key}"] = value
        if (
            self.seq_len.value > self._base.model.max_position_embeddings
            and self.model_size.value == OWN_MODEL
        ):
            overrides["model.max_position_embeddings"] = self.seq_len.value
        return overrides

    def checked(self, name: str, value: Any) -> Any:
        """`value` as control `name` takes it from Python (a target by name, a mesh as a tuple); a
        ValueError for a model size under a ``pretrained_path`` or a mesh the target does not offer."""
        if name == "target":
            return resolve_target(value)
        if name == "model_size" and self.model_size.disabled and value != OWN_MODEL:
            raise ValueError(
                f"model_size={value!r} is not allowed: the shape comes from "
                f"model.pretrained_path={self._base.model.pretrained_path!r}"
            )
        if name == "mesh":
            value = tuple(value)
            allowed = [v for _, v in self.mesh.options]
            if value not in allowed:
                raise ValueError(
                    f"mesh={value!r} is not allowed on {self.target.num_devices} devices: "
                    f"expected one of {allowed}"
                )
        return value


__all__ = ["LORA_RANKS", "OWN_MODEL", "SEQ_LENS", "RunControls"]
