"""Byte units and the one byte formatter, so every report and estimate prints sizes alike."""

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
