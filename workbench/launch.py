"""How ``python -m workbench train`` uses several GPUs: the torchrun line, or starting it itself.

One process drives one device. On a machine with several visible GPUs and no launcher
(`gpu_notice`), the run says so and prints the exact ``torchrun`` line that uses them all;
``--nproc N`` (`launch`) starts that launch itself, torchrun's ``--standalone`` rendezvous on a
free port, and returns its exit code. Under torchrun each rank runs the same command
(`workbench.train.ranks`).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Sequence

from workbench.backend import process_group


def _is_nproc(option: str) -> bool:
    """``--nproc`` or an abbreviation argparse takes for it (``--np``): no other ``train`` option starts
    with ``--n``, and a rank handed one would try to start torchrun again."""
    return len(option) >= 3 and "--nproc".startswith(option)


def without_nproc(argv: Sequence[str]) -> list[str]:
    """`argv` with ``--nproc N`` / ``--nproc=N`` (or argparse's abbreviations of it) taken out (what
    every rank runs)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif _is_nproc(arg):
            skip = True
        elif not (arg.startswith("--n") and "=" in arg and _is_nproc(arg.split("=", 1)[0])):
            out.append(arg)
    return out


def torchrun_command(nproc: int, argv: Sequence[str], *, executable: str | None = None) -> list[str]:
    """The launch of `nproc` ranks each running ``python -m workbench <argv>`` (``--nproc`` dropped):
    ``torchrun`` by name for a person to type, or `executable` ``-m torch.distributed.run``."""
    head = [executable, "-m", "torch.distributed.run"] if executable else ["torchrun"]
    return [*head, "--standalone", f"--nproc_per_node={nproc}", "-m", "workbench", *without_nproc(argv)]


def gpu_notice(visible_gpus: int, argv: Sequence[str]) -> str | None:
    """What a single-process run on a machine with several GPUs says: the line that uses them all."""
    if visible_gpus < 2 or process_group.launched_by_torchrun():
        return None
    line = shlex.join(torchrun_command(visible_gpus, argv))
    return (
        f"{visible_gpus} GPUs are visible and this run uses one: `{line}` (or add --nproc "
        f"{visible_gpus}) trains on all of them; mesh.fsdp={visible_gpus} shards the model over them"
    )


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Start `nproc` ranks of ``python -m workbench <argv>`` under torchrun here; their exit code."""
    if nproc < 1:
        print(f"error: --nproc={nproc} is not allowed: must be >= 1", file=sys.stderr)
        return 2
    if process_group.launched_by_torchrun():
        print("error: --nproc under torchrun: the launcher has started the ranks already", file=sys.stderr)
        return 2
    command = torchrun_command(nproc, argv, executable=sys.executable)
    print(f"train: starting {nproc} ranks: {shlex.join(command)}", file=sys.stderr, flush=True)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
