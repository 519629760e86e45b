"""Shared test helpers.

XLA scenarios are modules under ``tests/xla/``, each with a ``main(**params) -> dict``. A test
runs one with ``xla_scenario("name", **params)``: ``python -m tests.xla.<name> '<params as JSON>'``
in a subprocess with ``PJRT_DEVICE=CPU`` and ``CPU_NUM_DEVICES=8`` set before torch_xla is
imported. Each run gets a fresh runtime (SPMD can only be switched on before the first XLA
tensor exists) and clean compile metrics, and the main pytest process never imports torch_xla,
so the rest of the suite is not slowed by it.

A scenario whose result several tests check is run once per test module by a module-scoped
fixture next to those tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.xla import RESULT_MARK

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = Path(__file__).resolve().parent / "xla"

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
"""XLA:CPU's LLVM code generation at its lowest level, for every XLA process the tests start
(scenarios, the CLI, notebooks, torchrun): compiling is most of an XLA test's time on a CPU, and
this halves it (28 s → 14 s of CPU for three tp-plan families). What the tests check is XLA's own
HLO-level work, the same at any backend level: the programs and how many compile, the shardings,
the compiler's memory analysis (equal to the byte), and the losses (equal to the last digit on the
families tried). Only the machine code of the tiny programs runs slower."""


def with_test_xla_flags(flags: str | None) -> str:
    """`flags` (an ``XLA_FLAGS`` value) with `TEST_XLA_FLAGS` added unless it sets the level itself."""
    flags = (flags or "").strip()
    if "--xla_backend_optimization_level" in flags:
        return flags
    return f"{flags} {TEST_XLA_FLAGS}".strip()


# the main pytest process never starts XLA; every process it starts inherits the flags
os.environ["XLA_FLAGS"] = with_test_xla_flags(os.environ.get("XLA_FLAGS"))


def xla_env(devices: int = 8, extra: dict[str, str] | None = None) -> dict[str, str]:
    # torch_xla's debug settings come only from `extra`: a scenario never inherits another's log
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT_XLA_DEBUG")}
    env.update({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices), "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    extra = dict(extra or {})
    if "XLA_FLAGS" in extra:  # a scenario's own flags join the suite's, rather than replace them
        env["XLA_FLAGS"] = with_test_xla_flags(f"{env.get('XLA_FLAGS', '')} {extra.pop('XLA_FLAGS')}")
    env.update(extra)
    return env


def run_scenario(
    name: str,
    *,
    devices: int = 8,
    timeout: int = 900,
    env: dict[str, str] | None = None,
    **params: Any,
) -> Any:
    """Run ``tests/xla/<name>.py``'s ``main(**params)`` on `devices` virtual XLA:CPU devices in a
    fresh Python; return its result (decoded from JSON).

    `params` must be JSON-serialisable; `env` adds environment variables. A failing scenario
    fails the test with the end of its output.
    """
    if not name.isidentifier() or not (SCENARIOS / f"{name}.py").is_file():
        raise ValueError(f"no XLA scenario {name!r}: expected a module tests/xla/{name}.py")
    proc = subprocess.run(
        [sys.executable, "-m", f"tests.xla.{name}", json.dumps(params)],
        cwd=REPO,
        env=xla_env(devices, env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    results = [line[len(RESULT_MARK) :] for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not results:
        tail = "\n".join((proc.stdout + "\n" + proc.stderr).strip().splitlines()[-40:])
        pytest.fail(f"XLA scenario {name} failed (exit {proc.returncode}):\n{tail}", pytrace=False)
    return json.loads(results[-1])


# The test files that take longest, longest first (per-file totals from `--junitxml` of a full run,
# 2026-11-27: test_attention ~19% of the suite, the next four ~10% each). `make test` runs files in
# parallel workers in collection order (`--dist loadfile --no-loadscope-reorder`), so starting these
# first keeps one long file from being left to run alone at the end.
LONGEST_FIRST = (
    "test_attention.py",
    "test_hosted.py",
    "test_layer_stack.py",
    "test_tp_plan.py",
    "test_sharding.py",
    "test_notebooks.py",
    "test_bucketing.py",
    "test_distributed.py",
    "test_scan.py",
    "test_quantize.py",
    "test_generate.py",
    "test_session_end.py",
    "test_bad_inputs.py",
    "test_chunked_loss.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the longest files first (a stable sort: each file keeps its own order of tests)."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def xla_scenario() -> Callable[..., Any]:
    """`xla_scenario(name, devices=8, env=None, **params)` runs the scenario module
    ``tests/xla/<name>.py`` on virtual XLA:CPU devices in a subprocess."""
    return run_scenario


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """A tokenizer cache of the module's own (the data tests train the default tokenizer into it)."""
    return tmp_path_factory.mktemp("wb-cache")


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    """The default config's tokenizer (trained on the embedded corpus, with a chat template)."""
    from workbench.config import DataConfig
    from workbench.data import get_tokenizer

    return get_tokenizer(DataConfig(), cache_dir=cache_dir)
