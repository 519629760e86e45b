"""How the runtime's `scan` is set up: the backward partition, and whether torch_xla's JAX bridge can run.

`workbench.backend.runtime.scan` calls torch_xla's ``scan``; this module holds the decisions
around that call that need no torch_xla import, so they are tested on their own:

- `scan_partition`: AOTAutograd's min-cut partition of a scanned body, at full activation budget
  (saves less than the plain partition) or at budget 0 (``remat``: gradient checkpointing).
- `jax_bridge_usable`: under SPMD, torch_xla 2.9's scan backward ties each gradient's sharding to
  its input's with jax's ``shard_alike``, reached through ``call_jax`` (``shard_as`` in
  ``torch_xla.distributed.spmd.xla_sharding``). ``call_jax`` raises ``Jax is required for this
  feature`` unless torch_xla's own probes (``maybe_get_torchax`` and ``maybe_get_jax`` in
  ``torch_xla/_internal/jax_workarounds.py``) both return a module: jax alone is not enough.
  Where they do not (XLA:CPU here without jax; Colab's TPU image, jax 0.7.2 without torchax), the
  runtime replaces that step with the plain backward (`backward_without_shard_alike`) and XLA's
  sharding propagation shards the gradients, as it does for every other op. torch_xla 2.8 (Kaggle's
  TPU image) has the same step and the same test; its ``maybe_get_jax`` takes no ``log`` argument
  (`quiet_probe`). A torch_xla without ``_backward_shard_alike`` is left alone.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

Probe = Callable[[], Any]
"""One of torch_xla's import probes: the module, or None when it cannot be imported."""


def jax_bridge_usable(probe_torchax: Probe, probe_jax: Probe) -> bool:
    """Whether torch_xla's ``call_jax`` can run: both probes return a module (``call_jax``'s own test).

    torchax is probed first: when it is missing, jax is never imported for nothing. A probe that
    raises rather than returning None (an install whose import fails with another error, e.g. a
    jaxlib of another jax) counts as not importable: ``call_jax`` would fail the same way.
    """
    try:
        return probe_torchax() is not None and probe_jax() is not None
    except Exception:
        return False


def quiet_probe(maybe_get_jax: Callable[..., Any]) -> Probe:
    """torch_xla's jax probe without its "requires jax/pallas" log line where it can be silenced
    (``log=False``, torch_xla 2.9); torch_xla 2.8's takes no argument."""
    if "log" in inspect.signature(maybe_get_jax).parameters:
        return functools.partial(maybe_get_jax, log=False)
    return maybe_get_jax


def backward_without_shard_alike(carry: Any, x: Any, backward: Callable[..., Any], init: Any, xs: Any) -> Any:
    """torch_xla's ``_backward_shard_alike`` without the ``shard_as`` ties: the plain backward."""
    return backward(carry, x)


@functools.cache
def scan_partition(remat: bool) -> Callable[..., Any]:
    """AOTAutograd's min-cut partition of a scanned body: at full activation budget it recomputes
    only cheap element-wise work (saves less than the plain partition); with ``remat``, budget 0:
    only each iteration's inputs are saved (gradient checkpointing). One object per setting:
    torch_xla keys its cached traces on the partition function's id."""
    return functools.partial(_min_cut_partition, budget=0.0 if remat else 1.0)


def _min_cut_partition(*args: Any, budget: float, **kwargs: Any) -> Any:
    import torch._functorch.config as functorch_config
    from functorch.compile import min_cut_rematerialization_partition

    with functorch_config.patch(activation_memory_budget=budget):
        return min_cut_rematerialization_partition(*args, **kwargs)
