"""Chunked attention inside the scanned decoder stack (tests/test_attention.py).

A tiny 3-layer model, eager and chunked (same weights), each with ``install_scan``
(`workbench.models.scan`: the stack as one scanned layer, with and without remat), one forward
and backward of the model's loss on one XLA:CPU device. Reported per (case, remat) pair:
the relative differences of the loss and of every stacked gradient, and whether the scan really
ran (its traced layer cached). Cases: packed rows through `model_inputs` (the chunked model gets
``[B, 1, 1, T]`` segment ids, carried through the scan as float and cast back) and padded rows.
"""

from __future__ import annotations

from typing import Any

from tests.xla import run
from tests.xla.attention_equality import CASES, CHUNK, batch_for, build, chunked_copy, relative, step


def main(
    cases: tuple[tuple[str, bool], ...] = (("llama_packed", False), ("qwen2_padding", True)),
    chunk: int = CHUNK,
) -> dict[str, Any]:
    from workbench.backend.xla import runtime
    from workbench.models import attention
    from workbench.models.scan import install_scan, scanned_layers

    attention.QUERY_CHUNK = chunk
    dev = runtime.device()
    results: dict[str, Any] = {}
    for name, remat in cases:
        eager = build(CASES[name], num_layers=3)
        chunked = chunked_copy(eager)
        batch, _ = batch_for(CASES[name])
        batch = {k: v.to(dev) for k, v in batch.items()}
        outs = {}
        for label, model in (("eager", eager), ("chunked", chunked)):
            install_scan(model, remat=remat)
            model.to(dev)
            _, loss, grads, _ = step(model, batch)
            runtime.sync()
            outs[label] = (loss, grads, len(scanned_layers(model).__dict__.get("_scan_traces", {})))
        (loss_e, grads_e, _), (loss_c, grads_c, traces) = outs["eager"], outs["chunked"]
        results[f"{name}/remat={remat}"] = {
            "loss": relative(loss_e, loss_c),
            "grads": max(relative(grads_e[n], grads_c[n]) for n in grads_e),
            "grad_names": sorted(grads_e) == sorted(grads_c),
            "scan_traces": traces,
        }
    return results


if __name__ == "__main__":
    run(main)
