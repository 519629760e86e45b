"""Which other processes hold a file open, read from ``/proc`` the way ``lsof`` does.

A TPU is opened by one process at a time: while a forgotten notebook kernel or a crashed
training run keeps ``/dev/accel0`` (or ``/dev/vfio/<n>``) open, every new run fails with "TPU in
use" or ``/dev/accel0: Operation not permitted``. The same scan tells whether libtpu's lock file
is held or left behind. Each ``/proc/<pid>/fd/*`` entry is a symlink to what the process has
open; its ``/proc/<pid>/cmdline`` (NUL-separated arguments) says what the process is.

The process running the scan is left out (`DoctorRoots.self_pid`): a notebook kernel that
already started its own XLA runtime holds the TPU legitimately. Processes whose ``fd`` folder
cannot be read (another user's, without root) are counted, so a report can say it could not
see everything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CMDLINE_CHARS = 160
"""A command line is cut to this many characters in a report."""


@dataclass(frozen=True)
class Holder:
    """A process that has one of the watched files open."""

    pid: int
    cmdline: str
    path: str
    """The watched file it holds, as the link names it."""

    @property
    def is_notebook_kernel(self) -> bool:
        return "ipykernel" in self.cmdline or "colab_kernel_launcher" in self.cmdline


@dataclass(frozen=True)
class HolderScan:
    """What a scan of ``/proc`` found for a set of watched files."""

    others: tuple[Holder, ...]
    """Other processes holding a watched file, by pid."""
    self_holds: tuple[str, ...]
    """The watched files the scanning process itself holds."""
    unreadable: int
    """Processes whose open files could not be read (permissions)."""

    def note(self) -> str:
        """A clause on what the scan could not see ('' when it saw every process)."""
        if not self.unreadable:
            return ""
        processes = "process" if self.unreadable == 1 else "processes"
        return f"; {self.unreadable} {processes} could not be inspected (another user's: run as root to see them)"


def read_cmdline(proc: Path, pid: int) -> str:
    """The process's command line, arguments joined by spaces and cut to `CMDLINE_CHARS`."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "(command line unreadable)"
    text = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    if not text:
        return "(no command line: a kernel thread or a zombie)"
    return text if len(text) <= CMDLINE_CHARS else text[: CMDLINE_CHARS - 3] + "..."


def find_holders(proc: Path, watched: Iterable[str | os.PathLike[str]], *, self_pid: int) -> HolderScan:
    """Every process under `proc` with a file of `watched` open (links compared as absolute paths)."""
    wanted = {os.path.normpath(os.fspath(path)) for path in watched}
    others: list[Holder] = []
    self_holds: set[str] = set()
    unreadable = 0
    if not wanted:
        return HolderScan((), (), 0)
    try:
        pids = sorted(int(entry.name) for entry in os.scandir(proc) if entry.name.isdigit())
    except OSError:
        return HolderScan((), (), 0)
    for pid in pids:
        fd_dir = proc / str(pid) / "fd"
        try:
            links = list(os.scandir(fd_dir))
        except PermissionError:
            unreadable += 1
            continue
        except OSError:  # the process ended while we looked
            continue
        held: list[str] = []
        for link in links:
            try:
                target = os.path.normpath(os.readlink(link.path))
            except OSError:
                continue
            if target in wanted and target not in held:
                held.append(target)
        if pid == self_pid:
            self_holds.update(held)
        elif held:
            command = read_cmdline(proc, pid)
            others += [Holder(pid, command, path) for path in held]
    return HolderScan(tuple(others), tuple(sorted(self_holds)), unreadable)
