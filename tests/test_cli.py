"""`python -m workbench info|smoke`: the commands people run first on a new machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, xla_env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _plain_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "CPU_NUM_DEVICES")}
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.mark.xla
def test_info_json_on_xla_cpu() -> None:
    proc = _run(["info", "--json"], xla_env(8))
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["backend"] == "cpu" and info["via_xla"] is True and info["num_devices"] == 8


def test_info_table_on_plain_cpu() -> None:
    proc = _run(["info"], _plain_env())
    assert proc.returncode == 0, proc.stderr
    assert "backend" in proc.stdout and "via_xla                     False" in proc.stdout


def test_smoke_unavailable_backend_exits_nonzero_with_reason() -> None:
    proc = _run(["smoke", "--device-type", "cuda"], _plain_env())
    assert proc.returncode == 2
    assert "device_type='cuda' requested" in proc.stderr


@pytest.mark.xla
def test_smoke_trains_on_xla_cpu() -> None:
    proc = _run(["smoke", "--steps", "6"], xla_env(1))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "smoke OK: loss fell" in proc.stdout and "via_xla=True" in proc.stdout
