"""Programs `tests/test_distributed.py` runs under torchrun (and as one plain process for reference).

Each is a module run as ``python -m tests.dist.<name>`` or ``torchrun ... -m tests.dist.<name>``;
``probe/`` is put on the path of the CLI runs the test watches (its ``sitecustomize``). This package
imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def flat_state(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf) for every leaf of a nested checkpoint state (dicts, lists; keys as strings)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from flat_state(item, f"{prefix}{key}.")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from flat_state(item, f"{prefix}{i}.")
    else:
        yield prefix[:-1], value
