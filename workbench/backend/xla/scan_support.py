"""How the runtime's `scan` is set up: the backward partition (with host offload), and the backward without torch_xla's JAX bridge.

`workbench.backend.xla.runtime.scan` calls torch_xla's ``scan``; this module holds the decisions
around that call that need no torch_xla import, so they are tested on their own:

- `scan_partition`: AOTAutograd's min-cut partition of a scanned body, at full activation budget
  (saves less than the plain partition) or at budget 0 (``remat``: gradient checkpointing).
- `offload_partition`: the ``remat`` partition whose saved carries (each layer's input) leave the
  forward graph through a host placement and come back through a device one
  (`workbench.backend.xla.host_offload`: ``train.offload_activations``).
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


@functools.cache
def offload_partition(
    num_carry: int, to_host: Callable[..., Any] | None, to_device: Callable[..., Any] | None
) -> Callable[..., Any]:
    """The ``remat`` partition with host offload: every iteration's inputs are all it saves, and those
    that enter as the carry (the layer's input and what rides with it: the rotary cos and sin, the
    mask) leave the forward graph through `to_host` and enter the backward graph through `to_device`
    (torch_xla's ``place_to_host``/``place_to_device``; None: saved as they are). The saved values
    that are the scanned weights stay: torch_xla's scan passes those back as the inputs themselves.
    One object per ``(num_carry, to_host, to_device)``: torch_xla keys its cached traces on its id."""
    return functools.partial(_offloading_partition, num_carry=num_carry, to_host=to_host, to_device=to_device)


def _offloading_partition(
    joint: Any,
    inputs: Any,
    *,
    num_fwd_outputs: int,
    num_carry: int,
    to_host: Callable[..., Any] | None,
    to_device: Callable[..., Any] | None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    fwd, bwd = _min_cut_partition(joint, inputs, num_fwd_outputs=num_fwd_outputs, budget=0.0, **kwargs)
    if to_host is None or to_device is None:
        return fwd, bwd
    return offload_saved_carries(fwd, bwd, num_fwd_outputs=num_fwd_outputs, num_carry=num_carry,
                                 to_host=to_host, to_device=to_device)  # fmt: skip


def offload_saved_carries(
    fwd: Any,
    bwd: Any,
    *,
    num_fwd_outputs: int,
    num_carry: int,
    to_host: Callable[..., Any],
    to_device: Callable[..., Any],
) -> tuple[Any, Any]:
    """Rewrite a partition's forward and backward FX graphs so each saved value that is one of the
    forward's first `num_carry` inputs leaves through ``to_host(value)`` and comes back, at the
    backward's start, through ``to_device(value)``. AOTAutograd's forward returns its outputs, then
    the saved values; its backward takes the saved values first, in that order."""
    placeholders = [node for node in fwd.graph.nodes if node.op == "placeholder"]
    carries = set(placeholders[:num_carry])
    output = next(node for node in fwd.graph.nodes if node.op == "output")
    returned = list(output.args[0])
    offloaded = [i for i, value in enumerate(returned[num_fwd_outputs:]) if value in carries]
    with fwd.graph.inserting_before(output):
        for i in offloaded:
            returned[num_fwd_outputs + i] = fwd.graph.call_function(to_host, (returned[num_fwd_outputs + i],))
    output.args = (tuple(returned), *output.args[1:])
    fwd.recompile()
    saved_inputs = [node for node in bwd.graph.nodes if node.op == "placeholder"]
    for i in offloaded:
        arrived = saved_inputs[i]
        with bwd.graph.inserting_after(saved_inputs[-1]):
            on_device = bwd.graph.call_function(to_device, (arrived,))
        arrived.replace_all_uses_with(on_device, delete_user_cb=lambda user, new=on_device: user is not new)
    bwd.recompile()
    return fwd, bwd
