"""detect() on 8 virtual XLA:CPU devices (tests/test_hardware.py)."""

from __future__ import annotations

import time
from typing import Any

from tests.xla import run
from workbench.backend.hardware import detect


def main() -> dict[str, Any]:
    hw = detect()
    t0 = time.perf_counter()
    again = detect()
    second = time.perf_counter() - t0
    return {**hw.to_dict(), "same": again is hw, "second_s": second, "explicit": detect("xla").num_devices}


if __name__ == "__main__":
    run(main)
