"""The step profiler: how fast a run trains, measured without slowing it, and why it is not faster.

`StepProfiler` is called once per optimizer step; every `log_every` steps it returns one
metrics dict, the `IntervalMetrics` of `workbench.analysis.metrics` (speed, MFU from
`workbench.analysis.flops`, compiles, transfers, memory, input wait). Between log intervals it
touches only host-side counters (the execution backend's, `workbench.backend.protocol.Backend`:
torch_xla's metrics or Dynamo's graphs; a clock), never a device tensor, so it forces no device
sync; at the log interval it reads the loss once (one device->host transfer).
It keeps the history (JSON/CSV export) and turns what it saw into `Advice`: recompilation
after warm-up, a device->host transfer every step, low MFU, memory near the limit, steps
waiting on input, and on a mesh of several devices the communication of a step: its collectives
predicted once from shapes (`workbench.analysis.advice`: `Advice` and the communication finding).

Each recompilation is explained (`workbench.analysis.recompiles`): the step's input signature
(`step(..., inputs=batch)`: shapes and dtypes from tensor metadata, never the device) is
diffed against those of the programs already compiled, and the Python frame that triggered
the compile is read from torch_xla's compile log (`workbench.backend.xla.compile_log`, on when
``PT_XLA_DEBUG_LEVEL>=1`` and ``PT_XLA_DEBUG_FILE`` are set before the first compile; the `Trainer`
switches it on), off XLA from torch.compile's (`workbench.backend.native.dynamo_compiles`), only when a
counter rose: the backend's `compile_reader`.
"""

from __future__ import annotations

import contextlib
import csv
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.analysis.advice import Advice, communication_finding
from workbench.analysis.communication import CommunicationReport
from workbench.analysis.flops import mfu
from workbench.analysis.metrics import INTERVAL_KEYS, OBJECTIVE_KEYS, IntervalMetrics, perplexity
from workbench.analysis.recompiles import RecompileTracker, input_signatures
from workbench.backend.protocol import Backend
from workbench.backend.selection import backend_for

if TYPE_CHECKING:
    from workbench.backend.hardware import HardwareInfo


# ---- the step profiler -------------------------------------------------------------------


class StepProfiler:
    """Per-step timing and counters; a metrics dict every `log_every` steps.

    Call `step(tokens, loss=..., lr=...)` once per optimizer step, after the step was launched
    (after ``runtime.sync()`` on XLA). Time between calls spent fetching the next batch can
    be marked with ``with profiler.input_wait(): batch = next(it)`` (or passed as
    ``step(..., input_wait_s=...)``) for the "waiting on input" advice. A loop whose input stream
    does part of the step's own work (sampling the batch it then trains on) passes those seconds as
    ``step(..., input_work_s=...)``, and a loop that reads from the device by design (those samples'
    tokens) passes its reads as ``step(..., expected_transfers=...)``: neither is then advised against.

    `hw`: the hardware (peak FLOP/s, memory per device, whether XLA drives it); None for unknown.
    `flops_per_token`: from `training_flops_per_token`, for MFU. `peak_flops`: total peak over
    all devices, overriding `hw` (the CPU has none in the chip table). `memory_limit_bytes`:
    per-device memory to compare usage against (default: what the device or `hw` reports).
    `memory_estimate_bytes`: e.g. `analysis.estimate.estimate(...).total_bytes`, used for the
    memory advice where the device reports no usage (XLA:CPU) and no compiled-program figure
    is logged.
    `warmup_steps`: compiles up to this step are expected; later ones are recompilations,
    explained in ``recompile_causes`` and the advice (`recompiles`).
    `sync_at_log`: at a log step with no loss to read, wait for the device so the interval's
    time is the device's, not the host's.
    `stat_names`: the metrics keys of the objective's own figures (`OBJECTIVE_KEYS` it fills), in the
    order of the 1-D tensor `step` takes as ``stats``; the eval's come as ``eval_loss.stats``.
    `communication`: the run's step collectives (`run_communication`), or a function returning them,
    called once at the first `advice()`; on a mesh of several devices the advice says what they cost.
    `backend`: the run's execution backend, whose counters, compile records and memory figures are read
    (default: `backend_for(hw)`).
    """

    low_mfu_threshold = 0.2
    memory_near_fraction = 0.9
    input_bound_fraction = 0.1

    def __init__(
        self,
        hw: HardwareInfo | None = None,
        *,
        flops_per_token: float | None = None,
        log_every: int = 10,
        memory_limit_bytes: int | None = None,
        peak_flops: float | None = None,
        memory_estimate_bytes: int | None = None,
        warmup_steps: int = 3,
        sync_at_log: bool = True,
        stat_names: Sequence[str] = (),
        communication: CommunicationReport | Callable[[], CommunicationReport | None] | None = None,
        backend: Backend | None = None,
    ) -> None:
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
            raise ValueError(f"log_every={log_every!r} is not allowed: an int >= 1")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps={warmup_steps!r} is not allowed: an int >= 0")
        self.hw = hw
        self.flops_per_token = flops_per_token
        self.log_every = log_every
        self.memory_limit_bytes = memory_limit_bytes
        self.peak_flops = peak_flops
        self.memory_estimate_bytes = memory_estimate_bytes
        self.warmup_steps = warmup_steps
        self.sync_at_log = sync_at_log
        self.stat_names = tuple(stat_names)
        self._communication = communication
        self._communication_advice: list[Advice] | None = None
        self.history: list[dict[str, Any]] = []
        self.backend = backend if backend is not None else backend_for(hw)
        # the CPU reports no device memory (XLA:CPU's runtime fails when asked): never ask it
        self._device_memory_unavailable = hw is not None and hw.backend == "cpu"
        self._step = 0
        self._tokens_seen = 0
        self._start = time.perf_counter()
        self.recompiles = RecompileTracker()
        """The input signatures seen and each recompilation with its cause."""
        self._compile_log: Any = self.backend.compile_reader()
        self._open_interval(self._start, self._counters())

    # ---- the clock and counters ----
    def _counters(self) -> tuple[int, float, int]:
        """(programs compiled, seconds compiling, device->host transfers) so far in this process."""
        backend = self.backend
        return backend.compile_count(), backend.compile_time_s(), backend.transfer_count()

    def _open_interval(self, now: float, counters: tuple[int, float, int]) -> None:
        self._interval_start = now
        self._interval_steps = 0
        self._interval_tokens = 0
        self._interval_wait = 0.0
        self._interval_work = 0.0  # of the wait: the step's own work done inside the input stream
        self._interval_expected: int | None = None
        self._interval_counters = counters
        self._last_compiles = counters[0]
        self._interval_first_recompile = len(self.recompiles.recompiles)

    def exclude_compiles(self) -> None:
        """Programs compiled since the last step (e.g. by a checkpoint save) are not the loop's recompilations."""
        self._last_compiles = self._counters()[0]
        self._skip_compile_log()

    def _skip_compile_log(self) -> None:
        if self._compile_log is not None:
            self._compile_log.skip()

    def reset_clock(self) -> None:
        """Start timing now (e.g. after warm-up compiles that should not count as step time)."""
        self._open_interval(time.perf_counter(), self._counters())
        self._skip_compile_log()

    @contextlib.contextmanager
    def input_wait(self) -> Iterator[None]:
        """Time spent in the block counts as waiting on input."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._interval_wait += time.perf_counter() - t0

    # ---- one step ----
    def step(
        self,
        tokens: int,
        loss: Any = None,
        lr: float | None = None,
        *,
        input_wait_s: float | None = None,
        eval_loss: float | None = None,
        log: bool | None = None,
        grad_norm: Any = None,
        inputs: Any = None,
        stats: Any = None,
        input_work_s: float = 0.0,
        expected_transfers: int | None = None,
    ) -> IntervalMetrics | None:
        """Record one optimizer step of `tokens` real tokens. Returns the metrics dict at a log
        step (every `log_every` steps, or when `log=True`), else None.

        `loss` may be a device tensor: it is read only at a log step. So may `grad_norm`; like
        the loss it is read after the interval's transfer count is taken, so the
        profiler's own reads never count as the loop's transfers. Nothing here reads a device
        value between log steps.

        `inputs`: the step's batch (a dict of tensors) or its batches (a list of dicts, one per
        accumulation step), for the recompile forensics: only their shapes and dtypes are read.
        `stats`: the objective's figures (`stat_names`), a 1-D tensor read like the loss.
        `input_work_s`: seconds of the step's own work spent inside the input stream since the last
        step (a batch sampled on the device as it was fetched): left out of the interval's
        ``input_wait_s``, which counts only waiting. `expected_transfers`: the device->host reads the
        loop made by design since the last step (reading those samples), the interval's
        ``expected_transfers``; the host-transfer advice counts only the rest. Both count whichever
        step they are given at, so a loop passes what it did since its last call.
        """
        self._step += 1
        self._tokens_seen += int(tokens)
        self._interval_steps += 1
        self._interval_tokens += int(tokens)
        if input_wait_s:
            self._interval_wait += float(input_wait_s)
        if input_work_s:
            self._interval_work += float(input_work_s)
        if expected_transfers is not None:
            self._interval_expected = (self._interval_expected or 0) + int(expected_transfers)
        # host-side counter: which step compiled (recompiles after warm-up are the advice)
        compiles = self._counters()[0]
        signatures = input_signatures(inputs)
        if compiles > self._last_compiles and self._step > self.warmup_steps:
            self._explain_recompile(compiles - self._last_compiles, signatures)
        else:
            if compiles > self._last_compiles:  # warm-up programs: expected, not explained
                self._skip_compile_log()
            self.recompiles.remember(signatures)
        self._last_compiles = compiles
        if log is None:
            log = self._step % self.log_every == 0
        if not log:
            return None
        return self._log(loss, lr, eval_loss, grad_norm, stats)

    def _explain_recompile(self, programs: int, signatures: Any) -> None:
        log_on = self._compile_log is not None and self._compile_log.path is not None
        records = self._compile_log.new_records() if log_on else []
        self.recompiles.observe(self._step, signatures, programs, records, log_on=log_on)

    def _log(
        self, loss: Any, lr: float | None, eval_loss: float | None, grad_norm: Any, stats: Any
    ) -> IntervalMetrics:
        # counters first: the profiler's own reads of the loss and grad norm are not the user's transfers
        compiles, compile_time, transfers = self._counters()
        in_interval = self.recompiles.recompiles[self._interval_first_recompile :]
        loss_value = _to_float(loss)
        grad_norm_value = _to_float(grad_norm)
        figures = self._objective_figures(stats, eval_loss)
        if loss_value is None and self.sync_at_log:
            self.backend.wait()
        now = time.perf_counter()
        after_read = self._counters()
        c0, t0, x0 = self._interval_counters
        interval = max(now - self._interval_start, 1e-12)
        steps = self._interval_steps
        tokens_per_s = self._interval_tokens / interval
        device_used, device_limit = self._device_memory()
        waited = max(0.0, self._interval_wait - self._interval_work)
        metrics: IntervalMetrics = {
            "step": self._step,
            "loss": loss_value,
            "lr": float(lr) if lr is not None else None,
            "step_time_s": interval / max(steps, 1),
            "tokens_per_s": tokens_per_s,
            "mfu": mfu(tokens_per_s, self.flops_per_token, self.hw, peak_flops=self.peak_flops),
            "compiles": compiles - c0,
            "compile_time_s": compile_time - t0,
            "total_compiles": compiles,
            "recompiled": bool(in_interval),
            "transfers": transfers - x0,
            "expected_transfers": self._interval_expected,
            "host_rss_bytes": _host_rss(),
            "device_memory_bytes": device_used,
            "device_memory_limit_bytes": device_limit,
            "tokens_seen": self._tokens_seen,
            "elapsed_s": now - self._start,
            "eval_loss": float(eval_loss) if eval_loss is not None else None,
            "eval_perplexity": getattr(eval_loss, "perplexity", perplexity(eval_loss)),
            "steps_in_interval": steps,
            "interval_s": interval,
            "input_wait_s": waited,
            "input_wait_fraction": waited / interval,
            "compiled_program_bytes": self.backend.compiled_program_bytes(),
            "recompile_steps": [r.step for r in in_interval],
            "recompile_causes": [r.describe() for r in in_interval],
            "grad_norm": grad_norm_value,
            **figures,
        }
        self.history.append(metrics)
        self._open_interval(time.perf_counter(), after_read)
        return metrics

    def _objective_figures(self, stats: Any, eval_loss: Any) -> dict[str, float | None]:
        """The objective's figures of the contract (`OBJECTIVE_KEYS`): the step's `stats` (one read) and
        the eval's, else None."""
        figures: dict[str, float | None] = dict.fromkeys(OBJECTIVE_KEYS)
        if stats is not None and self.stat_names:
            values = stats.detach().cpu().tolist() if hasattr(stats, "detach") else list(stats)
            figures.update((k, float(v)) for k, v in zip(self.stat_names, values) if k in figures)
        for name, value in (getattr(eval_loss, "stats", None) or {}).items():
            if f"eval_{name}" in figures:
                figures[f"eval_{name}"] = float(value)
        return figures

    def _device_memory(self) -> tuple[int | None, int | None]:
        limit = self.memory_limit_bytes
        if self._device_memory_unavailable:
            return None, limit
        info = self.backend.memory_in_use()
        if info is None:  # the backend cannot say (XLA:CPU): stop asking
            self._device_memory_unavailable = True
            return None, limit
        return info["bytes_used"], limit or info["bytes_limit"] or None

    # ---- advice ----
    def advice(self) -> list[Advice]:
        """What the history says to change, one `Advice` per kind found."""
        found: list[Advice] = []
        recompiles = self.recompiles.recompiles
        if recompiles:
            steps = [r.step for r in recompiles]
            causes = [r.describe() for r in recompiles]
            remedies = []
            if any(r.changes != () for r in recompiles):  # shapes changed, or unknown
                remedies.append(
                    "Bucket sequence lengths (bucketing.strategy, max_buckets) or pad to fixed lengths, "
                    "and pre-compile the bucket shapes before training."
                )
            if any(r.changes == () for r in recompiles):
                remedies.append(
                    "Where the inputs kept their shapes, a Python number or branch in the step changed "
                    "the graph: pass such values as device tensors."
                )
            found.append(
                Advice(
                    "recompilation",
                    f"{len(steps)} step(s) compiled a new program after warm-up "
                    f"(steps {_short(steps)}): {_causes(causes)}. {' '.join(remedies)}",
                    {"steps": steps, "causes": causes},
                )
            )
        every_step = [
            m for m in self.history if m["steps_in_interval"] and _unplanned(m) >= m["steps_in_interval"]
        ]
        if every_step:
            worst = max(every_step, key=lambda m: _unplanned(m) / m["steps_in_interval"])
            found.append(
                Advice(
                    "host_transfer",
                    f"device->host transfers every step ({_unplanned(worst)} in {worst['steps_in_interval']} "
                    f"steps up to step {worst['step']}): a .item(), print() or Python `if` on a tensor in the "
                    "loop stalls it each step. Read values in a step closure (runtime.add_step_closure) or "
                    "let the profiler read the loss at the log interval.",
                    {"intervals": [m["step"] for m in every_step]},
                )
            )
        steady = [
            m
            for m in self.history
            if m["mfu"] is not None and m["step"] > self.warmup_steps and not m["compiles"]
        ]
        if steady:
            mean_mfu = sum(m["mfu"] for m in steady) / len(steady)
            if mean_mfu < self.low_mfu_threshold:
                found.append(
                    Advice(
                        "low_mfu",
                        f"MFU {100 * mean_mfu:.1f}% (below {100 * self.low_mfu_threshold:.0f}%): the chip is "
                        "mostly idle. The batch is probably too small: raise the batch size (analysis.batch.max_batch_size "
                        "says how far), use longer sequences or packing, and check the other advice.",
                        {"mfu": mean_mfu, "intervals": len(steady)},
                    )
                )
        near = self._memory_pressure()
        if near is not None:
            used, limit, source = near
            found.append(
                Advice(
                    "memory_near_limit",
                    f"memory at {100 * used / limit:.0f}% of {limit / 2**30:.2f} GiB per device ({source}): "
                    "turn on gradient checkpointing, shard with FSDP (mesh.fsdp), or halve the micro-batch "
                    "and double grad_accum.",
                    {"used_bytes": used, "limit_bytes": limit, "source": source},
                )
            )
        waiting = [m for m in self.history if m["input_wait_fraction"] >= self.input_bound_fraction]
        if waiting:
            worst = max(waiting, key=lambda m: m["input_wait_fraction"])
            found.append(
                Advice(
                    "input_bound",
                    f"steps wait on input: {100 * worst['input_wait_fraction']:.0f}% of the time up to step "
                    f"{worst['step']} went to fetching batches. Use the device loader's prefetch "
                    "(runtime.device_loader), DataLoader workers, and tokenize ahead of time.",
                    {"fraction": worst["input_wait_fraction"], "intervals": [m["step"] for m in waiting]},
                )
            )
        return found + self.communication_advice()

    def communication_advice(self) -> list[Advice]:
        """The 'communication' advice (one, or none off a mesh), worked out at the first call from shapes."""
        if self._communication_advice is None:
            source = self._communication
            report = source() if callable(source) else source
            self._communication_advice = [] if report is None else communication_finding(report, self.hw)
        return self._communication_advice

    def _memory_pressure(self) -> tuple[int, int, str] | None:
        """(used, limit, source) when the newest interval's memory is near the limit, else None.

        The best figure available wins: the device's own, then the compiled program's, then the
        estimate (XLA:CPU reports no device usage).
        """
        if not self.history:
            return None
        m = self.history[-1]
        limit = m["device_memory_limit_bytes"] or self.memory_limit_bytes
        if not limit and self.hw is not None:
            limit = self.hw.memory_per_device_bytes
        if not limit:
            return None
        used, source = int(self.memory_estimate_bytes or 0), "estimate"
        for key, name in (("compiled_program_bytes", "compiled program"), ("device_memory_bytes", "device")):
            if m.get(key):  # a later (better) figure replaces an earlier one
                used, source = int(m[key]), name
        return (used, int(limit), source) if used and used >= self.memory_near_fraction * limit else None

    # ---- export ----
    def to_json(self, path: str | Path) -> Path:
        """History and advice as JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "log_every": self.log_every,
            "warmup_steps": self.warmup_steps,
            "flops_per_token": self.flops_per_token,
            "hardware": self.hw.to_dict() if self.hw is not None else None,
            "history": self.history,
            "advice": [asdict(a) for a in self.advice()],
        }
        path.write_text(json.dumps(payload, indent=2, default=str))
        return path

    def to_csv(self, path: str | Path) -> Path:
        """One row per log interval, one column per `IntervalMetrics` key."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        columns = list(INTERVAL_KEYS)
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for row in self.history:
                writer.writerow({k: _csv_cell(row.get(k)) for k in columns})
        return path


def _unplanned(metrics: Any) -> int:
    """An interval's transfers beyond the reads its loop declared it makes by design (`expected_transfers`)."""
    return int(metrics["transfers"]) - int(metrics.get("expected_transfers") or 0)


def _to_float(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach()
        if value.numel() != 1:
            raise ValueError(f"loss must be a scalar, got a tensor of shape {tuple(value.shape)}")
        return float(value.item())
    return float(value)


def _host_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(map(str, value))
    return value


def _causes(causes: Sequence[str], limit: int = 3) -> str:
    text = " | ".join(causes[:limit])
    return text + (f" | ... ({len(causes)} in all)" if len(causes) > limit else "")


def _short(steps: Sequence[int], limit: int = 8) -> str:
    text = ", ".join(map(str, steps[:limit]))
    return text + (f", ... ({len(steps)} in all)" if len(steps) > limit else "")
