"""How the runtime's `scan` is set up: the backward partition, and the backward without torch_xla's JAX bridge.

`workbench.backend.xla.runtime.scan` calls torch_xla's ``scan``; this module holds the decisions
around that call that need no torch_xla import, so they are tested on their own:

- `scan_partition`: AOTAutograd's min-cut partition of a scanned body, at full activation budget
  (saves less than the plain partition) or at budget 0 (``remat``: gradient checkpointing).
- `backward_without_shard_alike`: under SPMD, torch_xla's scan backward (2.8 and 2.9) ties each
  gradient's sharding to its input's with jax's ``shard_alike``, reached through ``call_jax``
  (``shard_as`` in ``torch_xla.distributed.spmd.xla_sharding``). The runtime always replaces that step
  with the plain backward, and XLA's sharding propagation shards the gradients, as it does for every
  other op. Three stacks decide it: without jax, or with jax but no importable torchax (Colab's TPU
  image where flax is missing), ``call_jax`` raises ``Jax is required for this feature``; with both
  importable on torch_xla 2.8 and jax 0.7.2 (Kaggle's TPU image: torch_xla's wheel carries its own
  torchax), the step emits an ``xla.sdy.ShardingGroup`` that 2.8's partitioner refuses (``Side-effect
  HLO must have sharding``); where it runs (torch_xla 2.9 with jax and torchax) the losses equal the
  plain backward's to the last digit. One path on every stack, the one every test runs. A torch_xla
  without ``_backward_shard_alike`` is left alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


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
