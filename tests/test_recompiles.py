"""Recompile forensics (backend/xla/compile_log.py, analysis/recompiles.py, the profiler's advice).

The parser is checked on compile logs torch_xla 2.9 wrote on XLA:CPU (tests/data: level 1 from
tests/xla/recompile_loop.py, level 2 from a two-shape script); the signature diff on real
tensors; and on XLA:CPU, a hand-written loop and a `Trainer` run provoke recompiles at lines
this test finds in their sources, and the causes and advice must name those lines and the
changed shapes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from workbench.analysis.recompiles import (
    InputChange,
    InputSignature,
    RecompileTracker,
    closest_changes,
    describe_changes,
    display_path,
    input_signatures,
    trigger_frame,
)
from workbench.backend.compile_records import PythonFrame
from workbench.backend.xla import compile_log

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
CAPTURED_ROOT = "/work/main"  # where the fixtures were captured: rewritten to a temp root below


def captured_log(tmp_path: Path, name: str = "compile_log_recompiles.log") -> Path:
    """A captured log with its paths moved under `tmp_path` (so paths display the same anywhere)."""
    path = tmp_path / name
    path.write_text((DATA / name).read_text().replace(CAPTURED_ROOT, str(tmp_path)))
    return path


# ---- the compile log parser ---------------------------------------------------------------------


def test_parser_reads_every_compile_of_a_real_level1_log(tmp_path):
    records = compile_log.compile_records(captured_log(tmp_path))
    assert len(records) == 4
    assert len(compile_log.compiled_memory_records(captured_log(tmp_path))) == 4
    first = records[0]
    assert first.cause == "user torch_xla.sync"
    assert first.graph_hash == "75f71a6080a4dbc2a5a72a87af5eb757" and first.graph_name is None
    assert (first.graph_inputs, first.graph_outputs) == (32, 21)
    assert first.computation_hash and first.memory is not None and first.memory.peak_bytes > 0
    assert not first.frames_truncated
    assert first.frames[0] == PythonFrame(
        "sync", f"{tmp_path}/.venv/lib/python3.11/site-packages/torch_xla/torch_xla.py", 87
    )
    assert first.frames[2] == PythonFrame("main", f"{tmp_path}/tests/xla/recompile_loop.py", 55)
    assert [r.frames[2].line for r in records] == [55, 62, 73, 79]
    assert len({r.graph_hash for r in records}) == 4


def test_parser_skips_level2_execution_analyses():
    text = (DATA / "compile_log_level2.log").read_text()
    assert text.count("Execution Analysis: Execution Cause") == 7  # one per execution at level 2
    records, _ = compile_log.parse_compile_log(text)
    assert len(records) == 2 and all(r.cause == "user torch_xla.sync" for r in records)
    assert [r.frames[-1].line for r in records] == [15, 18]  # the script's two shapes


def test_parser_leaves_a_half_written_block_for_the_next_read(tmp_path):
    text = (DATA / "compile_log_recompiles.log").read_text()
    log = tmp_path / "compile.log"
    log.write_text("")
    reader = compile_log.CompileLogReader(log)
    seen = []
    for cut in [*range(0, len(text), 37), len(text)]:  # cut anywhere, mid-line included
        log.write_text(text[:cut])
        seen += reader.new_records()
    assert [r.graph_hash for r in seen] == [r.graph_hash for r in compile_log.parse_compile_log(text)[0]]
    assert all(r.memory is not None for r in seen)
    log.write_text(text + text)
    reader.skip()  # programs logged before now are not the reader's
    assert reader.new_records() == []


def test_a_compile_without_memory_analysis_is_still_a_record():
    text = (DATA / "compile_log_recompiles.log").read_text()
    first_post = text.index("\nComputation hash: ")
    second_compile = text.index("\nCompilation Analysis: " + "=" * 80, first_post)
    failed = text[:first_post] + text[second_compile:]  # the first compile wrote no post analysis
    records, _ = compile_log.parse_compile_log(failed)
    assert len(records) == 4 and records[0].memory is None and records[0].frames[2].line == 55
    assert all(r.memory is not None for r in records[1:])
    # while the log grows, the second compile waits for its post analysis; the first cannot get one
    growing, _ = compile_log.parse_compile_log(failed[: failed.index("Computation hash")], final=False)
    assert len(growing) == 1 and growing[0].memory is None


def test_start_run_log_switches_the_log_on_before_any_compile(monkeypatch):
    for name in ("PT_XLA_DEBUG_LEVEL", "PT_XLA_DEBUG_FILE", "PT_XLA_DEBUG_MAX_FRAME"):
        monkeypatch.setenv(name, "")  # recorded, so what start_run_log sets is undone after the test
        monkeypatch.delenv(name)
    assert compile_log.start_run_log(xla=False) == [] and compile_log.compile_memory_log_path() is None
    assert compile_log.start_run_log(xla=True) == []  # torch_xla has not compiled in this process
    path = compile_log.compile_memory_log_path()
    assert path is not None and Path(path).parent.is_dir() and path.endswith("compile.log")
    assert os.environ["PT_XLA_DEBUG_LEVEL"] == "1" and os.environ["PT_XLA_DEBUG_MAX_FRAME"] == "32"
    assert compile_log.start_run_log(xla=True) == [] and compile_log.compile_memory_log_path() == path


# ---- frames -----------------------------------------------------------------------------------


def test_the_trigger_frame_is_the_first_one_in_user_or_workbench_code(tmp_path):
    records = compile_log.compile_records(captured_log(tmp_path))
    frame = trigger_frame(records[1].frames)
    assert frame == PythonFrame("main", f"{tmp_path}/tests/xla/recompile_loop.py", 62)
    assert display_path(frame.file, root=str(tmp_path)) == "tests/xla/recompile_loop.py"
    # a sync wrapper in workbench code is skipped for its caller; libraries and the seam always
    engine = [
        PythonFrame("sync", "/venv/lib/python3.11/site-packages/torch_xla/torch_xla.py", 87),
        PythonFrame("sync", "/repo/workbench/backend/xla/runtime.py", 222),
        PythonFrame("sync", "/repo/workbench/train/step.py", 100),
        PythonFrame("_step", "/repo/workbench/train/trainer.py", 358),
    ]
    assert trigger_frame(engine) == engine[3]
    assert trigger_frame(engine[:3]) == engine[2]
    assert trigger_frame(engine[:2]) == engine[0]  # only library frames: the innermost
    assert trigger_frame([]) is None
    assert (
        display_path("/venv/lib/python3.11/site-packages/transformers/x.py", root="/repo")
        == "transformers/x.py"
    )


# ---- signatures ---------------------------------------------------------------------------------


def batch(length: int, rows: int = 4, dtype: torch.dtype = torch.long, **extra) -> dict:
    ids = torch.zeros(rows, length, dtype=dtype)
    return {"input_ids": ids, "labels": ids.clone(), "lengths": [length] * rows, **extra}


def test_signature_reads_shapes_and_dtypes_of_tensors_only():
    sig = InputSignature.of(batch(32))
    assert sig.as_dict() == {"input_ids": ((4, 32), "int64"), "labels": ((4, 32), "int64")}
    assert str(sig) == "input_ids (4, 32) int64, labels (4, 32) int64"
    assert input_signatures(None) == ()
    assert input_signatures([batch(32), batch(32)]) == (sig,)  # accumulation: one per distinct shape
    with pytest.raises(TypeError, match=r"inputs=str is not allowed: a dict of tensors"):
        input_signatures("input_ids")
    with pytest.raises(TypeError, match=r"inputs must be a dict of tensors .* got int"):
        input_signatures([3])


def test_changes_against_the_closest_compiled_signature():
    known = [InputSignature.of(batch(32)), InputSignature.of(batch(64))]
    longer = closest_changes(InputSignature.of(batch(48)), known)
    assert describe_changes(longer) == "input_ids, labels (4, 64) → (4, 48) int64"  # tie: the latest
    assert describe_changes(closest_changes(InputSignature.of(batch(40)), known)) == (
        "input_ids, labels (4, 32) → (4, 40) int64"
    )
    # a dtype-only change beats a length change of the same number of inputs
    int32 = {
        "input_ids": torch.zeros(4, 32, dtype=torch.int32),
        "labels": torch.zeros(4, 32, dtype=torch.long),
    }
    assert [str(c) for c in closest_changes(InputSignature.of(int32), known)] == [
        "input_ids (4, 32) int64 → int32"
    ]
    mask = closest_changes(
        InputSignature.of(batch(32, attention_mask=torch.ones(4, 32, dtype=torch.bool))), known
    )
    assert [str(c) for c in mask] == ["attention_mask new (4, 32) bool"]
    gone = closest_changes(InputSignature.of({"input_ids": torch.zeros(4, 32, dtype=torch.long)}), known)
    assert [str(c) for c in gone] == ["labels gone (was (4, 32) int64)"]
    assert (
        str(InputChange("x", ((2,), "float32"), ((3, 1), "bfloat16"))) == "x (2,) float32 → (3, 1) bfloat16"
    )
    assert closest_changes(InputSignature.of(batch(8)), []) is None


def test_tracker_describes_each_recompile_in_one_line(tmp_path, monkeypatch):
    records = compile_log.compile_records(captured_log(tmp_path))
    monkeypatch.chdir(tmp_path)
    tracker = RecompileTracker()
    tracker.remember(input_signatures(batch(32)))
    r = tracker.observe(3, input_signatures(batch(48)), 1, records[1:2])
    assert r.describe() == (
        "step 3: input_ids, labels (4, 32) → (4, 48) int64; compiled at tests/xla/recompile_loop.py:62 (main)"
    )
    again = tracker.observe(9, input_signatures(batch(48)), 2, records[2:4])
    assert again.describe() == (
        "step 9: no input changed shape or dtype (the graph itself changed: a Python value or branch in the "
        "step); 2 programs compiled at tests/xla/recompile_loop.py:73 (main), tests/xla/recompile_loop.py:79 (main)"
    )
    assert tracker.observe(10, (), 1, records[:1]).describe().startswith("step 10: input shapes not recorded")
    silent = tracker.observe(11, input_signatures(batch(64)), 1, ())  # the log is on but holds no analysis
    assert "input_ids, labels (4, 48) → (4, 64) int64; compiled with no frame in torch_xla's compile log" in (
        silent.describe()
    )
    off = RecompileTracker().observe(2, input_signatures(batch(16)), 1, log_on=False)
    assert off.describe() == (
        "step 2: first step seen, inputs input_ids (4, 16) int64, labels (4, 16) int64; compiled at an unknown "
        "frame (compile log off: compile_log.enable_compile_log before the first compile)"
    )


# ---- on XLA:CPU ---------------------------------------------------------------------------------


def marked_line(path: Path, marker: str) -> int:
    """The 1-based number of the one line of `path` containing `marker`."""
    (number,) = [i for i, text in enumerate(path.read_text().splitlines(), start=1) if marker in text]
    return number


@pytest.fixture(scope="module")
def loop_run(xla_scenario, tmp_path_factory):
    """tests/xla/recompile_loop.py with the compile log on."""
    log = tmp_path_factory.mktemp("recompiles") / "compile.log"
    return xla_scenario(
        "recompile_loop", env={"PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": str(log)}, timeout=300
    )


@pytest.mark.slow
@pytest.mark.xla
def test_loop_recompile_names_the_line_and_the_changed_shape(loop_run):
    scenario = REPO / "tests" / "xla" / "recompile_loop.py"
    longer = marked_line(scenario, "# compiles: input_ids (4, 32) -> (4, 48)")
    int32 = marked_line(scenario, "# compiles: input_ids int64 -> int32")
    same = marked_line(scenario, "# compiles: same inputs, a new graph")
    assert loop_run["compiles_after_warmup"] == 3 and loop_run["recompile_steps"] == [3, 5, 6]
    causes = loop_run["recompile_causes"]
    assert causes == [
        f"step 3: input_ids (4, 32) → (4, 48) int64; compiled at tests/xla/recompile_loop.py:{longer} (main)",
        f"step 5: input_ids (4, 32) int64 → int32; compiled at tests/xla/recompile_loop.py:{int32} (main)",
        "step 6: no input changed shape or dtype (the graph itself changed: a Python value or branch in the "
        f"step); compiled at tests/xla/recompile_loop.py:{same} (main)",
    ]
    assert loop_run["advice_causes"] == causes
    assert f"tests/xla/recompile_loop.py:{longer} (main)" in loop_run["advice"]
    assert "input_ids (4, 32) → (4, 48) int64" in loop_run["advice"]
    assert (
        "Bucket sequence lengths" in loop_run["advice"]
        and "pass such values as device tensors" in (loop_run["advice"])
    )
    # the full stack stays in the record: torch_xla's sync, the seam, the loop
    assert [f.rsplit(" ", 1)[1] for f in loop_run["frames"][0][:3]] == ["(sync)", "(sync)", "(main)"]


@pytest.mark.slow
@pytest.mark.xla
def test_too_late_for_the_log_says_so_and_causes_still_name_the_shape(xla_scenario):
    off = xla_scenario("recompile_loop", env={"PT_XLA_DEBUG_LEVEL": "0"}, log=False, timeout=300)
    assert off["late_notice"] and "compile log off" in off["late_notice"][0]
    assert "enable_compile_log" in off["late_notice"][0]
    assert off["recompile_causes"][0] == (
        "step 3: input_ids (4, 32) → (4, 48) int64; compiled at an unknown frame (compile log off: "
        "compile_log.enable_compile_log before the first compile)"
    )


@pytest.mark.slow
@pytest.mark.xla
def test_trainer_switches_the_log_on_and_explains_its_recompiles(xla_scenario):
    run = xla_scenario("recompile_trainer", timeout=300)
    assert run["env_before"] == {"PT_XLA_DEBUG_LEVEL": None, "PT_XLA_DEBUG_FILE": None}
    assert run["log_path"] and run["records"] >= 1 + len(run["recompile_steps"])
    assert not [n for n in run["notices"] if "compile log" in n]  # on in time: no notice
    trainer_py = REPO / "workbench" / "train" / "trainer.py"
    source = trainer_py.read_text().splitlines()
    step_def = next(i for i, text in enumerate(source) if "def _step(" in text)
    sync_line = next(i for i in range(step_def, len(source)) if "self.engine.sync()" in source[i]) + 1
    causes = run["recompile_causes"]
    assert causes and len(causes) == len(run["recompile_steps"])
    after = []
    for step, cause in zip(run["recompile_steps"], causes):
        match = re.fullmatch(
            rf"step {step}: attention_mask, input_ids, labels \(4, (\d+)\) → \(4, (\d+)\) int64; "
            rf"compiled at workbench/train/trainer\.py:{sync_line} \(_step\)",
            cause,
        )
        assert match, cause
        after.append(int(match[2]))
    assert len(set(after)) == len(after) and all(n % 8 == 0 for n in after)  # each bucket compiles once
    assert causes[0] in run["advice"][0]
