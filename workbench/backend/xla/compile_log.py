"""torch_xla's compile log: why each program was compiled, where, and what it needs in memory.

torch_xla writes two blocks per compiled program when ``PT_XLA_DEBUG_LEVEL`` is at least 1 and
``PT_XLA_DEBUG_FILE`` names a file: a "Compilation Analysis" before compiling (the cause, the
graph hash, the numbers of graph inputs and outputs, the Python frames that triggered it,
innermost first) and a "Post Compilation Analysis" after (the executable's memory). At level 1
it writes nothing per execution, so the log costs nothing per step; level 2 adds an "Execution
Analysis" per execution, which this module skips. torch_xla reads the variables once, at its
first compile, so they are set before any XLA work (`enable_compile_log`, or `start_run_log`
for a training run). This module only reads text: it never imports torch_xla.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import warnings

from workbench.backend.compile_records import CompiledMemory, CompileRecord, PythonFrame
from workbench.backend.xla import runtime

MAX_FRAMES = 32
"""Python frames torch_xla lists per compile (its default, 8, can stop inside transformers)."""


_POST_COMPILE_FIELDS = (
    ("argument_bytes", "Graph input size"),
    ("output_bytes", "Graph output size"),
    ("alias_bytes", "Aliased Input size"),
    ("temp_bytes", "Intermediate tensor size"),
    ("program_bytes", "Compiled program size"),
)
_COMPILE = "Compilation Analysis: "
_POST = "Post Compilation Analysis: "
_HASH = "Computation hash: "
_RULE = "=" * 80
_DASHES = "-" * 80
_FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")


# ---- switching the log on ------------------------------------------------------------------


def enable_compile_log(path: str | os.PathLike[str]) -> None:
    """Have torch_xla append each compiled program's analyses to `path`.

    Sets ``PT_XLA_DEBUG_LEVEL=1`` (compile analyses only, nothing per execution),
    ``PT_XLA_DEBUG_FILE`` and, unless set, ``PT_XLA_DEBUG_MAX_FRAME`` (`MAX_FRAMES`). torch_xla
    reads them once, at its first compile, so call this before any XLA work in the process.
    """
    if compile_memory_log_path() is None and _compiled_already():
        raise RuntimeError(
            "enable_compile_log() must run before the first XLA compile in this process "
            "(torch_xla reads PT_XLA_DEBUG_LEVEL/PT_XLA_DEBUG_FILE once); set them in the environment instead"
        )
    os.environ["PT_XLA_DEBUG_LEVEL"] = os.environ.get("PT_XLA_DEBUG_LEVEL", "1") or "1"
    os.environ["PT_XLA_DEBUG_FILE"] = str(path)
    os.environ.setdefault("PT_XLA_DEBUG_MAX_FRAME", str(MAX_FRAMES))


def start_run_log(xla: bool = True) -> list[str]:
    """Switch the compile log on for a training run on XLA (`xla`), if it is not on; returns notices.

    The log goes to ``compile.log`` in a temporary directory removed when the process exits
    (``PT_XLA_DEBUG_FILE`` set by the user is kept, and so is its file). When torch_xla has
    already compiled in this process without the log, it is too late: the notice says so and
    how to switch it on (recompilations are then reported without their frames).
    """
    if not xla or compile_memory_log_path() is not None:
        return []
    if _compiled_already():
        message = (
            f"compile log off: torch_xla compiled {runtime.compile_count()} program(s) in this process before the "
            "run could switch it on, so recompilations are reported without the frame that caused them. Call "
            "workbench.backend.xla.compile_log.enable_compile_log(path) (or set PT_XLA_DEBUG_LEVEL=1 and "
            "PT_XLA_DEBUG_FILE) before the first XLA work in the process"
        )
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        return [message]
    user_file = os.environ.get("PT_XLA_DEBUG_FILE")
    if user_file:  # a file without a level: keep the user's file, switch the level on
        enable_compile_log(user_file)
        return []
    directory = tempfile.mkdtemp(prefix="workbench-compile-log-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    enable_compile_log(os.path.join(directory, "compile.log"))
    return []


def _compiled_already() -> bool:
    return runtime.runtime_started() and runtime.compile_count() > 0


def compile_memory_log_path() -> str | None:
    """Where torch_xla's compile analyses go, or None when the log is off."""
    try:
        level = int(os.environ.get("PT_XLA_DEBUG_LEVEL", "0") or 0)
    except ValueError:
        level = 0
    path = os.environ.get("PT_XLA_DEBUG_FILE")
    return path if level >= 1 and path else None


# ---- reading it ------------------------------------------------------------------------------


def parse_compile_log(text: str, *, final: bool = True) -> tuple[list[CompileRecord], int]:
    """The compiled programs in `text` (a compile log), oldest first, and how many characters of
    `text` they span.

    A "Compilation Analysis" is joined with the "Post Compilation Analysis" that follows it. With
    ``final=False`` (the log is still being written) a trailing analysis whose post-compilation
    block has not arrived, and any half-written block, are left for the next read.
    """
    records: list[CompileRecord] = []
    consumed = 0
    pending: dict | None = None  # a compilation analysis waiting for its post-compilation block
    pending_end = 0
    computation_hash: str | None = None
    lines = text.splitlines(keepends=True)
    position, index = 0, 0
    while index < len(lines):
        line = lines[index].rstrip("\n")
        for prefix in (_COMPILE, _POST):
            if line == prefix + _RULE:
                block, end_index = _block(lines, index, prefix, final)
                if block is None:  # half-written: stop here
                    index = len(lines)
                    break
                end = position + sum(len(lines[i]) for i in range(index, end_index))
                if prefix == _COMPILE:
                    if pending is not None:  # its compile wrote no memory analysis (it failed)
                        records.append(_record(pending, None, None))
                        consumed = pending_end
                    pending, pending_end = _analysis(block), end
                else:
                    records.append(_record(pending or {}, computation_hash, _memory(block)))
                    pending, computation_hash, consumed = None, None, end
                position, index = end, end_index
                break
        else:
            if line.startswith(_HASH):
                computation_hash = line[len(_HASH) :].strip()
            position += len(lines[index])
            index += 1
    if pending is not None and final:
        records.append(_record(pending, None, None))
        consumed = pending_end
    return records, consumed


def _block(lines: list[str], start: int, prefix: str, final: bool) -> tuple[list[str] | None, int]:
    """The body of the block opening at `start` (prefix stripped) and the index after it.

    A block ends at its dashed rule, followed in torch_xla's output by a closing ``====`` rule
    (consumed when present). None when the block is not complete yet.
    """
    body: list[str] = []
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if not line.endswith("\n") or not line.startswith(prefix):
            return None, index  # half-written (or interleaved with other output)
        content = line[len(prefix) :].rstrip("\n")
        if content == _RULE:  # the next block's opening: this one had no dashed rule
            return body, index
        if content == _DASHES:
            after = index + 1
            if not final and (after == len(lines) or not lines[after].endswith("\n")):
                return None, after  # its closing rule may still be on its way
            if after < len(lines) and lines[after].rstrip("\n") == prefix + _RULE:
                after += 1
            return body, after
        body.append(content)
    return None, len(lines)


def _analysis(body: list[str]) -> dict:
    fields: dict = {"frames": [], "truncated": False}
    section = None
    for content in body:
        if not content.startswith("  "):
            section = content.strip()
            continue
        item = content.strip()
        if section == "Compilation Cause":
            fields["cause"] = f"{fields['cause']}; {item}" if "cause" in fields else item
        elif section == "Graph Info:":
            key, _, value = item.partition(": ")
            fields[key] = value
        elif section == "Python Frame Triggered Execution:":
            match = _FRAME.match(item)
            if match:
                fields["frames"].append(PythonFrame(match[1], match[2], int(match[3])))
            elif item.strip(".") == "":
                fields["truncated"] = True
    return fields


def _memory(body: list[str]) -> CompiledMemory | None:
    values: dict[str, int] = {}
    for name, label in _POST_COMPILE_FIELDS:
        for content in body:
            match = re.fullmatch(re.escape(label) + r": ([0-9.]+) GB", content.strip())
            if match:
                values[name] = round(float(match.group(1)) * 1024**3)
    return CompiledMemory(**values) if len(values) == len(_POST_COMPILE_FIELDS) else None


def _record(fields: dict, computation_hash: str | None, memory: CompiledMemory | None) -> CompileRecord:
    def number(key: str) -> int | None:
        value = fields.get(key)
        return int(value) if value is not None and str(value).isdigit() else None

    return CompileRecord(
        cause=fields.get("cause"),
        graph_hash=fields.get("Graph Hash"),
        graph_name=fields.get("Graph Name"),
        graph_inputs=number("Number of Graph Inputs"),
        graph_outputs=number("Number of Graph Outputs"),
        frames=tuple(fields.get("frames", ())),
        frames_truncated=bool(fields.get("truncated")),
        computation_hash=computation_hash,
        memory=memory,
    )


def compile_records(path: str | os.PathLike[str] | None = None) -> list[CompileRecord]:
    """Every compiled program logged so far, oldest first ([] when the log is off or empty)."""
    path = path or compile_memory_log_path()
    if not path or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as handle:
        return parse_compile_log(handle.read())[0]


def compiled_memory_records(path: str | os.PathLike[str] | None = None) -> list[CompiledMemory]:
    """Every compiled program's memory analysis logged so far, oldest first ([] when none)."""
    return [r.memory for r in compile_records(path) if r.memory is not None]


class CompileLogReader:
    """Reads the compile log as it grows: each `new_records()` returns the programs compiled since
    the last call (only the new bytes are read; a block still being written waits for the next).

    Starts at the log's current end: programs compiled before it was made are not its own.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = str(path) if path is not None else compile_memory_log_path()
        self._offset = 0
        self.skip()

    def new_records(self) -> list[CompileRecord]:
        """Programs compiled since the last call (or since `skip`)."""
        if self.path is None or not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size < self._offset:  # a new file under the same name
                self._offset = 0
            handle.seek(self._offset)
            # surrogateescape round-trips any byte, so the offset stays exact on non-UTF-8 paths
            text = handle.read().decode("utf-8", errors="surrogateescape")
        records, consumed = parse_compile_log(text, final=False)
        self._offset += len(text[:consumed].encode("utf-8", errors="surrogateescape"))
        return records

    def skip(self) -> None:
        """Forget what was logged up to now (e.g. programs compiled by a checkpoint save)."""
        if self.path is not None and os.path.exists(self.path):
            self._offset = os.path.getsize(self.path)
