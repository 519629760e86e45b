"""What the side-by-side benches (`bench/preference.py`, `bench/grpo.py`) share: each variant run in a
fresh process that prints its result row after a marker, the loop's step times and the median step
from them, and the table cells and error lines of their reports."""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MARK = "__VARIANT_RESULT__"
"""The prefix of the line a variant's process prints its result row on (JSON)."""


def print_row(row: Mapping[str, Any]) -> None:
    """A variant's result, for `in_fresh_process` to read back."""
    print(MARK + json.dumps(row), flush=True)


def bench_environment(*, plain_torch: bool, cpu_threads: int | None = None) -> dict[str, str]:
    """This process's environment for a variant's process, torch_xla's compile log left out.
    `plain_torch` (the other projects' trainers): with torch_xla installed, accelerate and transformers
    put the model on the XLA device unless told not to (their documented switch)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT_XLA_DEBUG")}
    if plain_torch:
        env["USE_TORCH_XLA"] = "0"
        if cpu_threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(cpu_threads)
    return env


def in_fresh_process(
    script: str | Path, name: str, args: Sequence[str], env: Mapping[str, str], *, cwd: Path, timeout: float
) -> dict:
    """Run `script --variant name *args` in a new interpreter; its row, with the process's wall time.
    RuntimeError with the stderr tail when it fails or prints no row."""
    start = time.perf_counter()
    argv = [sys.executable, str(script), "--variant", name, *args]
    proc = subprocess.run(argv, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout)
    lines = [line[len(MARK) :] for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"variant {name} failed:\n{proc.stderr[-3000:]}")
    row = json.loads(lines[-1])
    row["process_wall_s"] = time.perf_counter() - start
    return row


def record_steps(trainer: Any) -> tuple[list[int], list[float]]:
    """Per optimizer step, its real tokens and the wall clock when the loop counted it (the loop's
    own `step_done`, wrapped on this instance: nothing else changes)."""
    tokens, times = [], []
    count = trainer.loop.step_done

    def step_done(infos: Any) -> int:
        tokens.append(count(infos))
        times.append(time.perf_counter())
        return tokens[-1]

    trainer.loop.step_done = step_done
    return tokens, times


def step_rate(times: list[float]) -> dict:
    """The median step from each step's end time, the first step apart (the cores are shared: one
    slow step says little); min and mean beside it."""
    steps = [b - a for a, b in itertools.pairwise(times)]
    if not steps:
        return {"step_s": None, "min_step_s": None, "mean_step_s": None, "step_times_s": []}
    return {
        "step_s": statistics.median(steps),
        "min_step_s": min(steps),
        "mean_step_s": statistics.fmean(steps),
        "step_times_s": steps,
    }


def num(value: float | None, spec: str) -> str:
    """A table cell: `value` formatted, or '-' where there is none."""
    return format(value, spec) if value is not None else "-"


def error_line(err: BaseException) -> str:
    """The last exception line of a failed process's stderr (or the error itself)."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    found = [line for line in lines if "Error" in line or "Exception" in line]
    return (found or lines or [repr(err)])[-1].strip()
