"""Processes started by torchrun: the process group, which rank this is, and what the ranks share.

``torchrun`` (or ``python -m workbench train --nproc N``, which starts it) gives each process
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. `init_from_env` joins
them into one ``torch.distributed`` process group: nccl on CUDA, TorchTPU's ``tpu`` on its ``tpu``
device, gloo on the CPU. The helpers beside it (`all_reduce_sum`, `gather_objects`, `agree`) are what
the trainer needs across ranks: sums of losses and token counts, and a config every rank must share.

`RankWatchdog` is why a rank that dies never leaves the others hanging: each rank bumps a counter in
the launcher's key-value store every second; a peer whose counter stops for the timeout is named
and this rank exits, whatever collective it is stuck in.

Plain ``torch.distributed`` only: a TPU pod's processes belong to the XLA runtime (`multihost`).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from workbench.backend.torchtpu.plan import DEVICE_TYPE as TORCHTPU_DEVICE
from workbench.backend.torchtpu.plan import PROCESS_GROUP_BACKEND as TORCHTPU_GROUP

_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
HEARTBEAT_EVERY_S = 1.0
"""How often a rank says it is alive."""
STORE_LOST_BEATS = 3
"""Heartbeats in a row the launcher's store may fail before a rank takes the launch for gone."""
EXIT_PEER_LOST = 1
"""The exit code of a rank that stops because a peer died (a failed run, as `workbench.run` says)."""


class DistributedError(RuntimeError):
    """Ranks that cannot work together: a peer that died, or a process group that would not form."""


class RankConfigError(ValueError):
    """The ranks of one launch were given different configs; the message names the ranks and settings."""


PER_PROCESS_SETTINGS = (("train", "progress_bar"),)
"""Settings that may differ between ranks: how one process shows itself, not what the ranks compute."""


@dataclass(frozen=True)
class ProcessGroup:
    """This process's place in a torchrun launch."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    """'nccl' (CUDA), 'tpu' (TorchTPU) or 'gloo' (CPU)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by torchrun (or a launcher setting the same variables)."""
    env = os.environ if environ is None else environ
    return all(env.get(name, "").strip() for name in _ENV_VARS)


def current() -> ProcessGroup | None:
    """The process group this process has joined, or None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return ProcessGroup(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        backend=str(dist.get_backend()),
    )


def group_backend(device_type: str) -> str:
    """The ``torch.distributed`` backend for ranks on `device_type`: nccl (cuda), tpu (TorchTPU's tpu), gloo."""
    return {"cuda": "nccl", TORCHTPU_DEVICE: TORCHTPU_GROUP}.get(device_type, "gloo")


def init_from_env(device_type: str, timeout_s: float = 600.0) -> ProcessGroup | None:
    """Join the launch's process group (`group_backend`), pinning a CUDA rank to its ``LOCAL_RANK``
    GPU; None when torchrun did not start this process. Idempotent.

    `timeout_s` bounds each collective: a rank that never arrives fails the others' call then
    (`RankWatchdog` names a dead one sooner)."""
    if not launched_by_torchrun():
        return None
    group = current()
    if group is not None:
        return group
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = group_backend(device_type)
    if device_type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise DistributedError(
                f"LOCAL_RANK={local_rank} but this machine shows {torch.cuda.device_count()} GPU(s): "
                "start at most one process per GPU (torchrun --nproc_per_node)"
            )
        torch.cuda.set_device(local_rank)
    kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)}
    if device_type == "cuda":
        kwargs["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(backend, **kwargs)
    if backend == "gloo":
        # a gloo group still alive when the interpreter finalizes aborts the process now and then
        # ("terminate called without an active exception", exit -6) after a run that trained, and
        # torchrun reports the launch failed: leave it first. At exit, not when a Trainer is done: a
        # second Trainer in the same process reuses the group (joining again under the same store hangs)
        atexit.register(destroy)
    return current()


def destroy() -> None:
    """Leave the process group (at the end of a run), if one was joined."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """`tensor` summed over the ranks of `group` (default: all), in place; returned for chaining."""
    import torch.distributed as dist

    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested mappings, as ``key=ours vs theirs``."""
    out = []
    for key in sorted(set(ours) | set(theirs), key=str):
        a, b = ours.get(key), theirs.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += differences(a, b, prefix=f"{name}.")
        elif a != b:
            out.append(f"{name}={a!r} vs {b!r}")
    return out


def agree(value: Mapping[str, Any], what: str = "config") -> None:
    """Raise `RankConfigError` on every rank unless every rank holds the same `value` (a config as a
    dict; `PER_PROCESS_SETTINGS` aside), naming each rank that differs from rank 0 and the settings."""
    shared = {k: dict(v) if isinstance(v, Mapping) else v for k, v in value.items()}
    for section, name in PER_PROCESS_SETTINGS:
        if isinstance(shared.get(section), dict):
            shared[section].pop(name, None)
    values = gather_objects(shared)
    problems = []
    for rank, theirs in enumerate(values[1:], start=1):
        diff = differences(values[0], theirs)
        if diff:
            shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
            problems.append(f"rank {rank} differs from rank 0: {shown} (rank 0's value first)")
    if problems:
        raise RankConfigError(
            f"the ranks were started with different {what}s: "
            + " | ".join(problems)
            + ": every process must get the same config file and overrides"
        )


_GENERATIONS = itertools.count()
"""Numbers this process's watchdogs in order (`RankWatchdog.for_group`); every rank creates its Trainers
in the same order, so the n-th watchdog of each rank watches the others' n-th."""


class RankWatchdog:
    """Stops this rank, naming the peer, when a peer rank stops answering for `timeout_s`.

    Each rank bumps ``workbench/<generation>/heartbeat/<rank>`` in the launch's key-value store (the
    launcher holds it, so it outlives any worker) every `HEARTBEAT_EVERY_S`; a background thread
    watches the others' counters. A counter that has not moved for `timeout_s` means that rank died
    or hangs: the watchdog prints one ``error:`` line naming it (and `where`, e.g. the step) and
    exits this process, which would otherwise wait in a collective for the process group's timeout.
    A rank that ends says so first (`finished`): cleanly, and it is not waited for; failed, and the
    others stop at once, naming it, instead of waiting in a collective it will never join.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        timeout_s: float,
        *,
        where: Callable[[], str] = lambda: "",
        on_lost: Callable[[str], None] | None = None,
        generation: int = 0,
    ) -> None:
        self.store, self.rank, self.world_size, self.timeout_s = store, rank, world_size, timeout_s
        self.generation = generation
        """Which of this process's watchdogs this is: the n-th of every rank share their store keys."""
        self.where, self.on_lost = where, on_lost or _exit_with
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workbench-rank-watchdog", daemon=True)
        self._seen: dict[int, tuple[int, float]] = {}

    @classmethod
    def for_group(cls, group: ProcessGroup, timeout_s: float, **kwargs: Any) -> RankWatchdog | None:
        """A started watchdog on the default process group's store; None for a single rank."""
        if group.world_size < 2:
            return None
        from torch.distributed.distributed_c10d import _get_default_store

        # every Trainer of a launch gets keys of its own: the store outlives a Trainer, and a second one
        # reading the first one's 'finished' marks would never watch its peers again
        generation = next(_GENERATIONS)
        return cls(
            _get_default_store(), group.rank, group.world_size, timeout_s, generation=generation, **kwargs
        ).start()

    def start(self) -> RankWatchdog:
        self._beat()
        self._thread.start()
        return self

    def _key(self, kind: str, rank: int) -> str:
        return f"workbench/{self.generation}/{kind}/{rank}"

    def _beat(self) -> None:
        self.store.add(self._key("heartbeat", self.rank), 1)

    def lost_ranks(self, now: float | None = None) -> list[int]:
        """Peers whose heartbeat has not moved for `timeout_s` and that did not finish."""
        now = time.monotonic() if now is None else now
        lost = []
        for peer in range(self.world_size):
            ended = self.store.add(self._key("finished", peer), 0) or self.store.add(
                self._key("failed", peer), 0
            )
            if peer == self.rank or ended:
                continue
            count = self.store.add(self._key("heartbeat", peer), 0)  # adding 0 reads without blocking
            last_count, since = self._seen.get(peer, (-1, now))
            if count != last_count:
                self._seen[peer] = (count, now)
            elif now - since >= self.timeout_s:
                lost.append(peer)
        return lost

    def failed_ranks(self) -> list[int]:
        """Peers that ended with an error (`finished(failed=True)`)."""
        return [
            peer
            for peer in range(self.world_size)
            if peer != self.rank and self.store.add(self._key("failed", peer), 0)
        ]

    def _run(self) -> None:
        unreachable = 0
        while not self._stop.wait(HEARTBEAT_EVERY_S):
            me = f"rank {self.rank} of {self.world_size}: "
            try:
                self._beat()
                failed, lost = self.failed_ranks(), self.lost_ranks()
                unreachable = 0
            except Exception as err:
                # the store lives in the launcher (torchrun's agent, or rank 0 launched by hand): gone for
                # a few beats, the launch is gone, and a rank left on its own would train on forever
                unreachable += 1
                if unreachable >= STORE_LOST_BEATS and not self._stop.is_set():
                    self.on_lost(
                        f"{me}the launcher's store stopped answering ({type(err).__name__}): the launch "
                        f"is gone; rank {self.rank} stops"
                    )
                    return
                continue
            where = self.where()
            where = f", {where}" if where else ""
            if failed:
                names = ", ".join(f"rank {r}" for r in failed)
                self.on_lost(
                    f"{me}{names} failed{where} (its own error line says why); rank {self.rank} stops too"
                )
                return
            if lost:
                names = ", ".join(f"rank {r}" for r in lost)
                self.on_lost(
                    f"{me}{names} stopped answering (no heartbeat for {self.timeout_s:.0f} s{where}): "
                    f"it died or hangs; rank {self.rank} stops too (train.rank_timeout sets the wait)"
                )
                return

    def finished(self, *, failed: bool = False) -> None:
        """This rank ends: stop beating; the others stop waiting for it (cleanly) or stop too (`failed`)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            # not left inside a store call when the interpreter exits (a C++ client torn down under a
            # running daemon thread can abort the process after a clean run)
            self._thread.join(timeout=5 * HEARTBEAT_EVERY_S)
        with contextlib.suppress(Exception):  # the store is gone: nobody is left to wait for this rank
            self.store.add(self._key("failed" if failed else "finished", self.rank), 1)


def _exit_with(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    os._exit(EXIT_PEER_LOST)
