"""`make demo`: the main job on the embedded default."""

from __future__ import annotations


def run_demo(out_dir: str = "reports") -> int:
    from workbench.smoke import run_smoke

    return 0 if run_smoke().ok else 1
