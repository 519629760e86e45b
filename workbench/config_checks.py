"""The checks that read several sections of one `WorkbenchConfig` together (a key against another
section's key), beside the per-section range checks in `workbench.config._validate`, then the run's
objective's own (`workbench.objective_registry.Objective.check_config`: DPO's reference and batches,
GRPO's rows and rewards); and the names ``train.report_to`` takes (`validate_report_to`), kept here to
keep `workbench.config` to its fields.

Each check is a ``require(ok, key, value, allowed)`` call, so `workbench.config_reference` lists its
message under the key it names, as it does for `workbench.config`'s own.
"""

from __future__ import annotations

import difflib
from typing import Any

from workbench.config_parse import require
from workbench.objective_registry import objective_for

REFERENCE_FREE_LOSSES = ("simpo", "orpo")
"""``train.dpo_loss`` values that need no reference model: no reference forward, no copy, no precompute."""


def validate_run(obj: Any) -> None:
    """Keys of one section of a `workbench.config.WorkbenchConfig` checked against another's: lengths,
    quantization, token budgets, pairs; then what the run's objective requires of the rest."""
    require(
        obj.data.max_length <= obj.model.max_position_embeddings or obj.model.pretrained_path is not None,
        "data.max_length",
        obj.data.max_length,
        f"must be <= model.max_position_embeddings={obj.model.max_position_embeddings}",
    )
    # A quantized base is frozen integers: only LoRA adapters can train on top of it.
    require(
        obj.model.quantize == "none" or obj.lora.rank > 0,
        "model.quantize",
        obj.model.quantize,
        f"needs LoRA adapters to train (lora.rank={obj.lora.rank} trains the base weights, which "
        "'int8'/'int4' freeze as integers): set lora.rank >= 1 (e.g. 16) or model.quantize=none",
    )
    # With a token budget the loader sizes every bucket's batch from it and ignores
    # train.batch_size, so growing the batch would change no batch and only skip data (the
    # epoch resumes as if the batches had grown).
    require(
        obj.train.dynamic_batch_every == 0 or obj.bucketing.tokens_per_batch is None,
        "train.dynamic_batch_every",
        obj.train.dynamic_batch_every,
        f"must be 0 while bucketing.tokens_per_batch={obj.bucketing.tokens_per_batch} is set "
        "(the token budget fixes every batch size); unset one of them",
    )
    objective = objective_for(obj)
    require(
        obj.data.pair_by is None or objective.example_kind == "pairs",
        "data.pair_by",
        obj.data.pair_by,
        "pairs responses for preference tuning: set train.objective=dpo, or data.pair_by=null",
    )
    objective.check_config(obj)


REPORT_TO = ("none", "tensorboard", "trackio", "wandb")
"""The names `TrainConfig.report_to` takes (`workbench.trackers`)."""


def validate_report_to(obj: Any) -> None:
    """`TrainConfig.report_to` (of the ``train`` section `obj`): tracker names (a list, or one name; 'a,b' is a list too), 'none' alone."""
    value = obj.report_to
    if isinstance(value, str):
        value = [n.strip() for n in value.strip().removeprefix("[").removesuffix("]").split(",") if n.strip()]
        obj.report_to = value[0] if len(value) == 1 else value
    for name in value:
        close = difflib.get_close_matches(name, REPORT_TO, n=1, cutoff=0.6)
        require(
            name in REPORT_TO,
            "train.report_to",
            obj.report_to,
            f"{name!r} is not a tracker{f'; did you mean {close[0]!r}?' if close else ''} (one of "
            f"{', '.join(REPORT_TO)}, or a list of them)",
        )
    require(
        "none" not in value or len(value) == 1,
        "train.report_to",
        obj.report_to,
        "'none' stands alone: leave it out of a list of trackers",
    )
