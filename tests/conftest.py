"""Shared test helpers.

XLA tests run in a subprocess with ``PJRT_DEVICE=CPU`` and ``CPU_NUM_DEVICES=8`` set
before torch_xla is imported: each gets a fresh runtime (SPMD can only be switched on
before the first XLA tensor exists) and clean compile metrics, and the main pytest
process never imports torch_xla, so the rest of the suite is not slowed by it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULT_MARK = "__WORKBENCH_RESULT__"

_PREAMBLE = f"""
import json as _json, sys as _sys
def emit(obj):
    print({RESULT_MARK!r} + _json.dumps(obj), flush=True)
"""


def xla_env(devices: int = 8, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices), "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra or {})
    return env


def run_xla(code: str, *, devices: int = 8, timeout: int = 900, env: dict[str, str] | None = None) -> Any:
    """Run `code` in a fresh Python on `devices` virtual XLA:CPU devices; return what it `emit()`s.

    The script gets an `emit(obj)` function; the last emitted object is returned. A failing
    script fails the test with the end of its stderr.
    """
    script = _PREAMBLE + textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=xla_env(devices, env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    results = [line[len(RESULT_MARK) :] for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not results:
        tail = "\n".join((proc.stdout + "\n" + proc.stderr).strip().splitlines()[-40:])
        pytest.fail(f"XLA subprocess failed (exit {proc.returncode}):\n{tail}", pytrace=False)
    return json.loads(results[-1])


@pytest.fixture
def xla():
    """`xla(code, devices=8)` runs `code` on virtual XLA:CPU devices in a subprocess."""
    return run_xla
