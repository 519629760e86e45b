"""How ``python -m workbench train`` uses several GPUs: the torchrun line, or starting it itself.

One process drives one device. On a machine with several visible GPUs and no launcher
(`gpu_notice`), the run says so and prints the exact ``torchrun`` line that uses them all;
``--nproc N`` (`launch`) starts that launch itself, torchrun's ``--standalone`` rendezvous on a
free port, and returns its exit code. Under torchrun each rank runs the same command
(`workbench.train.ranks`).

A launch keeps the CLI's exit codes: what every rank would refuse (the config, ``--nproc`` itself,
the mesh against the ranks, a ``train.batch_size`` that does not split over them) is refused here
before any rank starts (`check_launch`: exit 2, one line); a configuration error a rank finds is
written to the launch's error directory (`LAUNCH_ERRORS_ENV`, `report_rank_error`) instead of its
stderr, and the launch exits 2 with one line per distinct message and no torchrun traceback. torchrun
runs as ``python -m workbench.launch`` (`run_torchrun`): its agent, whose failure report (a table, no
traceback) is printed only for failures that are not configuration errors.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.backend.native import process_group

LAUNCH_ERRORS_ENV = "WORKBENCH_LAUNCH_ERRORS"
"""Set by `launch` for its ranks: the directory a rank writes its configuration error to."""
_EXIT_CANNOT_START = 2  # `workbench.run`'s code for a run that could not start


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


def check_launch(nproc: int, cfg: Any) -> None:
    """`ValueError` naming what every rank of a launch of `nproc` ranks with `cfg` (the run's config, when
    known) would refuse: a count below 1, a launch inside torchrun, a mesh that does not fit the ranks,
    a batch that does not split over them (the ranks' own checks, `rank_mesh` and `check_global_batch`)."""
    if nproc < 1:
        raise ValueError(f"--nproc={nproc} is not allowed: must be >= 1")
    if process_group.launched_by_torchrun():
        raise ValueError("--nproc under torchrun: the launcher has started the ranks already")
    from workbench.parallel.torch_parallel import rank_mesh
    from workbench.train.ranks import check_global_batch

    if cfg is not None:
        refuse_what_torchtpu_cannot_run(cfg)
        check_global_batch(cfg, rank_mesh(cfg.mesh, nproc))


def refuse_what_torchtpu_cannot_run(cfg: Any) -> None:
    """On a host whose ranks would run on TorchTPU, its own refusals (``mesh.model > 1``, torch_xla beside
    it) before `rank_mesh`'s, which speak of GPUs and CPU ranks. Reads only what is installed: the
    launcher never imports TorchTPU, whose ranks are about to claim the chips."""
    from workbench.backend import routing
    from workbench.backend.hardware import machine_facts
    from workbench.backend.torchtpu.plan import refuse_unsupported_mesh

    try:
        route = routing.choose(cfg.train.device_type, machine_facts())
    except routing.BackendConflictError as err:
        raise ValueError(str(err)) from None
    if route.backend == "torchtpu":
        refuse_unsupported_mesh(cfg.mesh)


def launch(nproc: int, argv: Sequence[str], cfg: Any = None) -> int:
    """Start `nproc` ranks of ``python -m workbench <argv>`` under torchrun here (after `check_launch`
    when `cfg` is given); their exit code: 2 with each distinct configuration error the ranks found."""
    try:
        check_launch(nproc, cfg)
    except ValueError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return _EXIT_CANNOT_START
    command = torchrun_command(nproc, argv, executable=sys.executable)
    print(f"train: starting {nproc} ranks: {shlex.join(command)}", file=sys.stderr, flush=True)
    agent = [sys.executable, "-m", "workbench.launch", *command[3:]]  # torchrun's arguments, our agent
    with tempfile.TemporaryDirectory(prefix="workbench-launch-") as errors:
        try:
            code = subprocess.call(agent, env={**os.environ, LAUNCH_ERRORS_ENV: errors})
        except KeyboardInterrupt:
            return 130
        reported = _rank_errors(Path(errors), nproc)
    if code == _EXIT_CANNOT_START:
        print("\n".join(reported) or "error: a rank could not start (its lines above)", file=sys.stderr)
    elif reported:  # a rank could not start, another failed: both said so
        print("\n".join(reported), file=sys.stderr)
    return code


def report_rank_error(message: str) -> bool:
    """Under a `launch`: write this rank's configuration error for the launcher to print (once for
    all ranks that found it); False when not launched by `launch` (the rank prints it itself)."""
    where = os.environ.get(LAUNCH_ERRORS_ENV)
    if not where or not os.path.isdir(where):
        return False
    rank = os.environ.get("RANK", "0")
    (Path(where) / f"rank-{rank}.txt").write_text(message)
    return True


def _rank_errors(where: Path, nproc: int) -> list[str]:
    """One ``error:`` line per distinct message the ranks wrote, naming the ranks that wrote it."""
    by_message: dict[str, list[int]] = {}
    for path in sorted(where.glob("rank-*.txt"), key=lambda p: int(p.stem.split("-")[1])):
        by_message.setdefault(path.read_text().strip(), []).append(int(path.stem.split("-")[1]))
    lines = []
    for message, ranks in by_message.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        who = f"every rank ({nproc})" if len(ranks) == nproc > 1 else f"{who} of {nproc}"
        lines.append(f"error: {who}: {message}")
    return lines


def run_torchrun(torchrun_args: Sequence[str]) -> int:
    """torchrun's agent with `torchrun_args`; exit 2 when every failed rank exited 2 (a configuration
    error: the ranks' lines say it), 130 when one was interrupted, else 1 with torchrun's failure table."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
        lambda record: not str(record.msg).startswith("failed (exitcode")  # the table says it, or we do
    )
    try:
        run(parse_args(list(torchrun_args)))
    except ChildFailedError as err:
        codes = {failure.exitcode for failure in err.failures.values()}
        if codes == {_EXIT_CANNOT_START}:
            return _EXIT_CANNOT_START
        if 130 in codes:
            return 130
        print(err.format_msg(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(run_torchrun(sys.argv[1:]))
