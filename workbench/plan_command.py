"""``python -m workbench plan``: will this config fit the chip, before anything is loaded or compiled.

``plan --config FILE [KEY=VALUE ...] [--chip v5e-1 --chip v5e-8 ...]`` prints, per chip, what the
config panel (`widgets.config_panel`) shows, for a terminal: the memory estimate of one training step
per device (`workbench.analysis.estimate.estimate` with the config's own settings,
`config_settings`), every part of its breakdown (whatever parts the estimate has: a new term shows up
here without an edit), whether it fits with the estimator's headroom, the largest batch that fits
(`workbench.analysis.batch.max_batch_size`) and the programs warm-up will compile (`warmup_programs`).
A GRPO run adds its two peaks: the rollout's (the weights, the KV cache and the sampler's buffers of
the generation batch) and the training step's (the weights, one micro-batch's activations and logits
and the generation's batches).

Chips are `workbench.backend.targets.TARGETS` names in any case (``v5e-1``, ``v5e-8``, ``v6e-1``,
``h100``; ``h100-80gb`` and ``a100-80gb`` say the memory), ``cpu`` (this machine's memory) or ``auto``
(the detected hardware, the default). Exit 0 when the run fits every chip asked, 1 when it does not
fit one, 2 for a bad config, override or chip. Nothing here loads weights or data, or starts a runtime
(a ``model.pretrained_path`` is read for its ``config.json`` alone: an adapter's or a training
checkpoint's base's).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, WorkbenchConfig, load_config, steps_per_generation
from workbench.units import format_bytes

HEADROOM = 0.1
"""The share of a device the estimate leaves free (`MemoryEstimate.fits`' default: XLA's own buffers)."""
CHIP_ALIASES = {"h100-80gb": "H100", "a100-80gb": "A100-80GB", "a100-40gb": "A100-40GB"}
"""Chip names with the memory spelled out, as people write them, for `TARGETS`' names."""


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``plan`` subcommand's arguments (overrides may also come between or after the options)."""
    parser.add_argument("--config", metavar="FILE", help="a YAML config (default: the built-in defaults)")
    parser.add_argument(
        "--chip",
        action="append",
        metavar="CHIP",
        help="a chip or slice to plan for, repeatable: v5e-1, v5e-8, v6e-1, h100-80gb, cpu, ... "
        "(default: auto, the detected hardware)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, as train takes")


def plan_target(name: str) -> Any:
    """The `Target` a ``--chip`` value names; a ValueError listing the names allowed otherwise."""
    from workbench.backend.hardware import detect
    from workbench.backend.targets import TARGETS, resolve_target

    if name == "auto":
        return resolve_target("auto")
    if name.lower() == "cpu":
        return resolve_target(detect("cpu"))
    by_lower = {key.lower(): key for key in TARGETS} | {k: v for k, v in CHIP_ALIASES.items()}
    if name.lower() not in by_lower:
        allowed = ", ".join([*TARGETS, *CHIP_ALIASES, "cpu", "auto"])
        raise ValueError(f"--chip {name!r} is not allowed: one of {allowed}")
    return TARGETS[by_lower[name.lower()]]


@dataclass
class ChipPlan:
    """What `plan_chip` found for one chip."""

    chip: str
    memory_bytes: int | None
    """One device's memory (None: unknown)."""
    devices: int
    """Devices the run spreads over there (the mesh's, or one without it)."""
    slice_devices: int
    """Devices the chip or slice has."""
    estimate: Any
    """The `MemoryEstimate` of a step."""
    fits: bool
    largest_batch: int | None
    """The largest ``train.batch_size`` the estimate lets fit (GRPO: prompts); None: memory unknown."""
    programs: int | None
    """Programs warm-up compiles (None: the backend compiles nothing up front)."""
    programs_note: str
    rollout_peak_bytes: int | None = None
    """GRPO: the rollout's peak per device (weights, KV cache and sampler buffers)."""
    step_peak_bytes: int | None = None
    """GRPO: the training step's peak per device."""


def plan_chip(cfg: WorkbenchConfig, target: Any) -> ChipPlan:
    """The estimate, the fit, the largest batch and the warm-up's programs of `cfg` on `target`."""
    from workbench.analysis.batch import max_batch_size
    from workbench.analysis.config_estimate import config_settings_on
    from workbench.analysis.estimate import estimate
    from workbench.parallel.mesh import MeshSpec, data_parallel_size

    mesh = MeshSpec.from_config(cfg.mesh).resolve(target.num_devices) if cfg.mesh.enabled else None
    devices = math.prod((mesh.data, mesh.fsdp, mesh.model)) if mesh is not None else 1
    settings = config_settings_on(cfg, target, mesh=mesh)
    memory = target.memory_per_device_bytes
    est = estimate(
        cfg.model,
        batch_size=cfg.train.batch_size,
        seq_len=cfg.data.max_length,
        memory_bytes=memory,
        **settings,
    )
    dp = data_parallel_size({"data": mesh.data, "fsdp": mesh.fsdp, "model": mesh.model} if mesh else {})
    largest = None
    if memory is not None:
        largest = max_batch_size(
            cfg.model,
            seq_len=cfg.data.max_length,
            memory_bytes=memory,
            headroom=HEADROOM,
            multiple_of=dp,
            **settings,
        )
    programs, note = warmup_programs(cfg, target, sharded=mesh is not None and devices > 1)
    result = ChipPlan(
        chip=target.label,
        memory_bytes=memory,
        devices=devices,
        slice_devices=target.num_devices,
        estimate=est,
        fits=est.fits(memory, headroom=HEADROOM),
        largest_batch=largest,
        programs=programs,
        programs_note=note,
    )
    if est.objective_report is not None:  # GRPO: the rollout and the step never hold their transients at once
        transient = est.objective_report.training_transient_bytes
        resident = est.total_bytes - est.breakdown.get("rollout", 0) - transient
        result.step_peak_bytes = resident + transient
        result.rollout_peak_bytes = resident + est.objective_report.peak_bytes
    return result


def warmup_programs(cfg: WorkbenchConfig, target: Any, *, sharded: bool) -> tuple[int | None, str]:
    """(programs warm-up compiles before the first step, how they add up). Off XLA nothing is compiled up
    front (a GPU's ``train.compile`` compiles one graph per bucket shape in warm-up). On XLA: per prompt
    or row bucket, the step (one program, two under accumulation: the micro-step and the last with the
    update) and, for GRPO, the rollout's prefill, decode step and layout, its read's gather across the
    devices, the cut into micro-steps; per eval bucket the eval's (GRPO: its greedy rollout); and one
    that puts the state back. The buckets are at most ``bucketing.max_buckets`` (a count the data
    decides under 'auto'); sliding-window layers add decode programs at the window's edges."""
    tpu = target.chip[:1] == "v" and target.chip[1:2].isdigit()
    xla = tpu or cfg.train.device_type in ("xla", "tpu")
    b, train = cfg.bucketing, cfg.train
    if not xla:
        gpu = target.chip not in ("cpu",) and not tpu
        compiled = train.compile == "on" or (train.compile == "auto" and gpu)
        if compiled and train.objective != "grpo":
            return None, "train.compile: one graph per bucket shape, compiled in warm-up"
        return None, "none: the step runs eagerly (nothing compiled up front)"
    if b.packing or b.strategy == "max":
        buckets, bound = 1, "1 shape (bucketing: every row at data.max_length)"
    elif b.max_buckets == "auto":
        from workbench.rl.wiring import AUTO_PROMPT_BUCKETS

        buckets = AUTO_PROMPT_BUCKETS if train.objective == "grpo" else None
        bound = (
            f"at most {buckets} prompt buckets (max_buckets auto under GRPO)"
            if buckets
            else "bucketing.max_buckets auto: the count the data's lengths decide"
        )
    elif b.strategy == "none":
        buckets = -(-cfg.data.max_length // b.multiple_of)
        bound = f"up to {buckets} shapes (strategy none: every multiple of {b.multiple_of})"
    else:
        buckets, bound = int(b.max_buckets), f"at most {b.max_buckets} buckets"
    step = 1 if train.grad_accum == 1 else 2
    evals = bool(train.eval_every) and cfg.data.eval_fraction > 0
    if train.objective == "grpo":
        splits = steps_per_generation(cfg) > 1 or cfg.grpo.mask_truncated_completions
        rollout = 3 + int(sharded) + int(splits)
        per = rollout + step + (3 + int(sharded) if evals else 0)
        what = f"rollout {rollout} + step {step}" + (f" + greedy eval {3 + int(sharded)}" if evals else "")
    else:
        per = step + int(evals)
        what = f"step {step}" + (" + eval 1" if evals else "")
    if buckets is None:
        return None, f"{bound}; {what} programs each, and 1 to restore the state"
    return buckets * per + 1, f"{bound} x ({what}) + 1 to restore the state"


def chip_report(plan: ChipPlan, cfg: WorkbenchConfig) -> str:
    """One chip's plan as text: the breakdown, the fit, GRPO's peaks, the largest batch, the programs."""
    from workbench.analysis.estimate import BREAKDOWN_MEANINGS

    est = plan.estimate
    used = f"{plan.devices} of {plan.slice_devices} device(s)"
    if plan.devices < plan.slice_devices and not cfg.mesh.enabled:
        used += " (mesh.enabled=false)"
    lines = [f"{plan.chip}: {used}, attention {est.attention}; per device"]
    host_parts = set(est.host_parts())  # in host memory: listed apart, never a share of the device's total
    for title, parts in breakdowns(est).items():
        if title != "breakdown":
            lines.append(f"  {title}:")
        rows = sorted(((k, v) for k, v in parts.items() if v and k not in host_parts), key=lambda kv: -kv[1])
        width = max((len(k) for k, _ in rows), default=5)
        for key, value in rows:
            share = 100 * value / max(est.total_bytes, 1)
            meaning = BREAKDOWN_MEANINGS.get(key, "")
            lines.append(f"  {key:<{width}}  {format_bytes(value):>10}  {share:5.1f}%  {meaning}".rstrip())
    if est.host_bytes:
        lines.append(f"  host memory {format_bytes(est.host_bytes)}, beside the device's:")
        for key in sorted(host_parts):
            meaning = BREAKDOWN_MEANINGS.get(key, "")
            lines.append(f"    {key}  {format_bytes(est.breakdown[key])}  {meaning}".rstrip())
    if plan.memory_bytes is None:
        verdict = "memory unknown: fits by default"
    else:
        usable = plan.memory_bytes * (1 - HEADROOM)
        verdict = (
            f"of {format_bytes(int(usable))} usable ({format_bytes(plan.memory_bytes)} less "
            f"{HEADROOM:.0%} headroom): {'fits' if plan.fits else 'DOES NOT FIT'}"
        )
    lines.append(f"  total {format_bytes(est.total_bytes)} {verdict}")
    if plan.rollout_peak_bytes is not None:
        rollout = est.objective_report
        lines.append(
            f"  GRPO: rollout peak {format_bytes(plan.rollout_peak_bytes)} (KV cache "
            f"{format_bytes(rollout.kv_cache_bytes)} and sampler {format_bytes(rollout.sampler_bytes)} for "
            f"{rollout.rows} rows of {rollout.prompt_length} + {rollout.completion_positions}), step peak "
            f"{format_bytes(plan.step_peak_bytes)}"
        )
    counts = {"grpo": "prompt(s)", "dpo": "pair(s)"}.get(cfg.train.objective, "row(s)")
    if plan.largest_batch is not None:
        lines.append(
            f"  largest train.batch_size that fits: {plan.largest_batch} {counts} "
            f"(this config: {cfg.train.batch_size})"
            if plan.largest_batch
            else "  largest train.batch_size that fits: none (not even the smallest)"
        )
    programs = "" if plan.programs is None else f"{plan.programs} programs: "
    lines.append(f"  warm-up compiles {programs}{plan.programs_note}")
    return "\n".join(lines)


def breakdowns(est: Any) -> dict[str, dict[str, int]]:
    """Every byte table the estimate carries: its ``breakdown`` and any other ``*breakdown`` mapping
    (e.g. host-side terms), so a new one is printed without a change here."""
    found = {}
    for f in fields(est):
        value = getattr(est, f.name)
        if f.name.endswith("breakdown") and isinstance(value, dict):
            found[f.name] = {k: int(v) for k, v in value.items() if isinstance(v, (int, float))}
    return found


def summary(cfg: WorkbenchConfig, est: Any) -> str:
    """The config's run in one line: objective, model, precision, rows."""
    train = cfg.train
    what = f"train.objective={train.objective}, {est.num_parameters / 1e6:,.1f}M parameters"
    what += (
        f", LoRA r{est.lora_rank} ({est.trainable_parameters / 1e6:,.2f}M trained)" if est.lora_rank else ""
    )
    what += f", {est.quantize} base" if est.quantize != "none" else ""
    what += f", {train.precision}"
    what += ", gradient checkpointing" if train.gradient_checkpointing else ""
    if est.objective_report is not None:
        grpo = cfg.grpo
        rows = f"{train.batch_size} prompt(s) x {grpo.num_generations} completions a micro-step"
        rows += f" of {cfg.data.max_length} + {grpo.max_completion_length} tokens"
        rows += f", {steps_per_generation(cfg)} micro-step(s) a rollout, {train.grad_accum} a step"
    else:
        rows = f"{train.batch_size} x {cfg.data.max_length} tokens a micro-step, {train.grad_accum} a step"
    chunk = est.loss_chunk_positions
    rows += f"; logits in chunks of {chunk} positions" if chunk else "; logits unchunked"
    return f"{what}\n{rows}"


def shape_config(cfg: WorkbenchConfig) -> WorkbenchConfig:
    """`cfg` with ``model.pretrained_path`` at the transformers checkpoint whose shape the run trains: an
    adapter's or a training checkpoint's base (`workbench.model_dirs`), the directory itself otherwise."""
    from workbench.model_dirs import resolve_model_dir

    path = cfg.model.pretrained_path
    if path is None:
        return cfg
    # a Hub id's JSON files alone: the plan reads shapes, never weights
    root = resolve_model_dir(path, field="model.pretrained_path", use="config").transformers_root
    if root is None or Path(root) == Path(path):
        return cfg
    return cfg.with_overrides({"model.pretrained_path": str(root)})


def run_plan_command(args: argparse.Namespace) -> int:
    """Print the plan for each chip; exit 0 all fit, 1 one does not, 2 a bad config or chip."""
    try:
        cfg = shape_config(load_config(args.config, list(args.overrides)))
        plans = [plan_chip(cfg, plan_target(name)) for name in args.chip or ["auto"]]
    except (ConfigError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([plan_json(p) for p in plans], indent=2))
    else:
        print(summary(cfg, plans[0].estimate))
        for p in plans:
            print()
            print(chip_report(p, cfg))
    return 0 if all(p.fits for p in plans) else 1


def plan_json(plan: ChipPlan) -> dict[str, Any]:
    est = plan.estimate
    return {
        "chip": plan.chip,
        "memory_bytes": plan.memory_bytes,
        "devices": plan.devices,
        "total_bytes": est.total_bytes,
        **{title: parts for title, parts in breakdowns(est).items()},
        "host_bytes": getattr(est, "host_bytes", None),
        "fits": plan.fits,
        "largest_batch": plan.largest_batch,
        "rollout_peak_bytes": plan.rollout_peak_bytes,
        "step_peak_bytes": plan.step_peak_bytes,
        "loss_chunk_positions": est.loss_chunk_positions,
        "warmup_programs": plan.programs,
        "warmup_programs_note": plan.programs_note,
    }
