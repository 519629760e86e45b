"""Dynamic batch size: the ladder of batch sizes a run grows through, planned before it starts.

With ``train.dynamic_batch_every=N`` the loaded batch grows by ``dynamic_batch_factor`` every N
steps, up to the smallest of ``dynamic_batch_max`` and the memory estimate for the device. The
whole ladder is known up front, so the warm-up compiles every size and growth never compiles
mid-run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.analysis.batch import max_batch_size
from workbench.analysis.config_estimate import config_settings
from workbench.config import WorkbenchConfig
from workbench.models.checkpoint_offload import checkpoints_offloaded
from workbench.models.mlp_tiles import installed_tiling


def plan_batch_ladder(train: Any, *, dp_size: int, memory_cap: int | None) -> list[int]:
    """Batch sizes the run will use: the start size, grown every N steps, within every cap."""
    ladder = [train.batch_size]
    if not train.dynamic_batch_every:
        return ladder
    growths = (train.steps - 1) // train.dynamic_batch_every
    cap = train.dynamic_batch_max
    if memory_cap is not None:
        cap = memory_cap if cap is None else min(cap, memory_cap)
    for _ in range(growths):
        nxt = round(ladder[-1] * train.dynamic_batch_factor)
        nxt -= nxt % dp_size
        if nxt <= ladder[-1] or (cap is not None and nxt > cap):
            break
        ladder.append(nxt)
    return ladder


def memory_batch_cap(
    model: Any,
    cfg: WorkbenchConfig,
    *,
    memory_bytes: int | None,
    mesh: Any,
    dp_size: int,
    notice: Callable[[str], None],
) -> int | None:
    """The largest global batch the memory estimate allows at the longest length, or None when
    there is no limit to fit or no estimate can be made (said through `notice`). The estimate's
    settings are the config's (`config_settings`: accumulation's gradient buffer, a DPO run's reference,
    a GRPO run's rollout of prompts of max_length with their completions, ...), the activation offload
    and the MLP tiles as the prepared model runs them."""
    if memory_bytes is None:
        return None
    train = cfg.train
    try:
        settings = {
            **config_settings(cfg),
            # as the prepared model runs: its checkpoints offloaded or not, its MLP tiled or not
            "offload_activations": "on" if checkpoints_offloaded(model) else "off",
            "mlp_chunk_tokens": tiling.setting if (tiling := installed_tiling(model)) else None,
        }
        cap = int(
            max_batch_size(
                model.config,
                seq_len=cfg.data.max_length,
                memory_bytes=memory_bytes,
                multiple_of=dp_size,
                mesh=mesh,
                **settings,
            )
        )
    except Exception as err:  # an estimate that cannot be made must not stop training
        notice(f"dynamic batch: no memory estimate ({err}); growth is capped only by dynamic_batch_max")
        return None
    if cap < train.batch_size:
        notice(f"dynamic batch: the memory estimate allows only {cap} sequences; not growing")
    return cap


def batch_ladder(
    model: Any, cfg: WorkbenchConfig, hw: Any, *, mesh: Any, dp_size: int, notice: Callable[[str], None]
) -> list[int]:
    """The run's ladder: `plan_batch_ladder` within the memory estimate for `hw`'s devices."""
    if not cfg.train.dynamic_batch_every:
        return [cfg.train.batch_size]
    cap = memory_batch_cap(
        model, cfg, memory_bytes=hw.memory_per_device_bytes, mesh=mesh, dp_size=dp_size, notice=notice
    )
    return plan_batch_ladder(cfg.train, dp_size=dp_size, memory_cap=cap)
