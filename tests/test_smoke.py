"""The smoke loop on plain CPU: the loss must fall and the result says so."""

from __future__ import annotations

from workbench.smoke import run_smoke


def test_smoke_loss_falls_on_cpu() -> None:
    result = run_smoke("cpu", steps=6, echo=False)
    assert result.ok
    assert len(result.losses) == 6 and result.losses[-1] < result.losses[0] - 0.3
    assert result.compiles == 0 and result.steps_per_s > 0
