"""Ctrl-C while the command starts: one ``error: interrupted`` line on stderr and exit status 130.

The first seconds of ``python -m workbench ...`` are imports: the package itself (`workbench/__init__.py`),
then torch, transformers and torch_xla as the command needs them. An interrupt there would end in
Python's traceback, or worse, in a second import of a module the first one left half done (torch_xla's
``NameError: name 'runtime' is not defined``). `exit_if_the_command` ends the package's own imports
cleanly; `workbench.__main__.main` catches what lands later, and the commands that handle an interrupt
themselves (``train``: where it stopped) do so without asking a runtime anything. A process that imports
the package for its own use (a notebook, a script) gets its KeyboardInterrupt as usual.
"""

from __future__ import annotations

import os
import sys

EXIT_INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C: 128 + SIGINT, what a shell reports for it."""

_COMMAND_MODULES = ("workbench", "workbench.__main__")


def started_as_the_command() -> bool:
    """Whether this process is ``python -m workbench`` or the ``workbench`` script, rather than a program
    that imports the package. Asked while the package itself is importing: ``sys.argv[0]`` is then
    ``-m`` (the module is still being located) and ``sys.orig_argv`` names it."""
    argv = list(getattr(sys, "orig_argv", ()))
    if sys.argv[:1] == ["-m"] and "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1] in _COMMAND_MODULES
    return bool(sys.argv) and os.path.basename(sys.argv[0]) == "workbench"


def interrupted_line(what: str = "interrupted") -> int:
    """Print the one line an interrupted command ends with; return its exit status."""
    print(f"error: {what}", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def exit_if_the_command() -> None:
    """For an interrupt caught while the package imports: exit with the line and 130 when this process is the
    command; return otherwise (the caller re-raises)."""
    if started_as_the_command():
        raise SystemExit(interrupted_line())
