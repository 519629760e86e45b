"""``train.objective: dpo``: preference tuning on prompt/chosen/rejected pairs (DPO, IPO, SimPO, ORPO).

The examples are pairs (`workbench.data.preference`: each side tokenised, two rows a pair), the loss
and its reference are `workbench.objectives.dpo`'s (imported when a run starts), and the memory
estimate counts each pair as two rows with, for a 'copy' reference, the frozen copy's weights
(`workbench.analysis.objective_memory.PairRows`). The settings are ``train.dpo_*`` and
``train.simpo_gamma``; the reference-free losses (`REFERENCE_FREE_LOSSES`) read no reference.
"""

from __future__ import annotations

from typing import Any

from workbench.config_checks import REFERENCE_FREE_LOSSES
from workbench.config_parse import require
from workbench.objective_registry import Objective, register_objective, set_keys


class Preference(Objective):
    """Preference optimisation on pairs: ``train.dpo_loss`` picks the loss."""

    name = "dpo"
    summary = "preference optimisation on prompt/chosen/rejected pairs"
    example_kind = "pairs"
    settings = ("train.dpo_beta", "train.dpo_loss", "train.simpo_gamma", "train.dpo_reference")

    def check_config(self, cfg: Any) -> None:
        """A reference the run can have, pairs it can batch."""
        train = cfg.train
        require(
            train.dpo_reference != "adapters_off"
            or cfg.lora.rank > 0
            or train.dpo_loss in REFERENCE_FREE_LOSSES,
            "train.dpo_reference",
            train.dpo_reference,
            "'adapters_off' needs LoRA adapters (lora.rank >= 1); without them use 'copy' or 'precompute'",
        )
        require(
            not cfg.bucketing.packing,
            "bucketing.packing",
            cfg.bucketing.packing,
            "must be false under train.objective=dpo: a pair's chosen and rejected answers are rows of their own",
        )

    def examples(self, cfg: Any, tokenizer: Any, cache_dir: Any) -> Any:
        from workbench.data import preference

        return preference.tokenize_pairs(preference.load_pairs(cfg.data, cache_dir), tokenizer, cfg.data)

    def memory(self, cfg: Any) -> Any:
        from workbench.analysis.preference_memory import PairRows

        return PairRows(reference_mode(cfg))

    def start(self, trainer: Any, *, teacher: Any = None) -> Any:
        if teacher is not None:
            raise ValueError("train.objective='dpo' takes no teacher: distillation and DPO are separate runs")
        from workbench.objectives.dpo import PreferenceRun

        return PreferenceRun()

    def idle_settings(self, cfg: Any, *, teacher: Any = None) -> list[str]:
        train, idle = cfg.train, []
        if train.dpo_loss in REFERENCE_FREE_LOSSES:
            idle.append(("train.dpo_reference", f"train.dpo_loss={train.dpo_loss!r} takes no reference"))
        if train.dpo_loss != "simpo":
            idle.append(
                ("train.simpo_gamma", f"only train.dpo_loss='simpo' reads it, not {train.dpo_loss!r}")
            )
        given = set(set_keys(cfg, [key for key, _ in idle]))
        return [
            f"{key}={getattr(train, key.split('.', 1)[1])!r}: {why}; it is ignored"
            for key, why in idle
            if key in given
        ]


def reference_mode(cfg: Any) -> str:
    """The reference a `workbench.config.WorkbenchConfig` plans for: 'auto' is 'adapters_off' under
    LoRA, 'copy' without (a run continuing trained adapters precomputes instead, which needs less: the
    estimate stays on the safe side); a reference-free loss is planned as 'precompute' (no reference
    forward, no copy)."""
    train = cfg.train
    if train.dpo_loss in REFERENCE_FREE_LOSSES:
        return "precompute"
    if train.dpo_reference != "auto":
        return str(train.dpo_reference)
    return "adapters_off" if cfg.lora.rank else "copy"


register_objective(Preference())
