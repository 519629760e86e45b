"""Units and message helpers shared by every layer: byte units, the one byte formatter, nearby multiples.

`format_bytes` makes every report and estimate print sizes alike; `nearby_multiples` makes every
"use a multiple of N" error suggest the same sizes. Plain Python that imports nothing from the
workbench, so the bottom layer (`workbench.backend`) can use it too.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 1000**3
"""Decimal gigabyte: the unit chip vendors quote memory in."""


def format_bytes(n: float) -> str:
    """``1.50 GiB``, ``12.00 MiB``, ``512 B``: binary units, two decimals above a KiB."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def nearby_multiples(value: int, divisor: int) -> str:
    """The multiples of `divisor` either side of `value` ("28 or 32"); only the upper one when
    the lower would be 0, which is no batch at all ("4", not "4 or 4")."""
    lower = value - value % divisor
    return f"{lower} or {lower + divisor}" if lower else str(divisor)
