"""XLA test scenarios: one module per scenario, each with a ``main(**params) -> dict``.

Every scenario runs in its own process on virtual XLA:CPU devices (``tests/conftest.py``'s
``run_scenario``); by hand::

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=8 python -m tests.xla.fsdp_bucketed_run '{"checkpoint_dir": "/tmp/ck"}'

A module ends with ``if __name__ == "__main__": run(main)``: the parameters come in as one JSON
object (argv[1]) and the result goes out as one JSON line on stdout, after ``RESULT_MARK``.
This package imports nothing heavy: the pytest process imports it without starting torch_xla.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

RESULT_MARK = "__WORKBENCH_RESULT__"


def run(main: Callable[..., Any]) -> None:
    """Call `main` with the JSON parameters from argv[1]; print its result as one marked JSON line."""
    params = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    result = main(**params)
    print(RESULT_MARK + json.dumps(result), flush=True)
