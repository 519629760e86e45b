"""`python -m workbench train`: a real run with a checkpoint, its resume, and the exit codes of what goes wrong."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_cli import _plain_env
from workbench.__main__ import main, parse_args
from workbench.train import Trainer

TINY = """\
model: {family: llama, hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1,
        intermediate_size: 64, max_position_embeddings: 128}
data: {source: embedded, tokenizer_vocab_size: 256, max_length: 64, max_examples: 48}
bucketing: {max_buckets: 2}
train: {device_type: cpu, steps: 4, batch_size: 4, log_every: 2, warmup_steps: 1}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def test_a_real_process_trains_and_leaves_a_checkpoint(tiny, tmp_path):
    checkpoints = tmp_path / "ckpt"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "workbench",
            "train",
            "--config",
            str(tiny),
            f"train.checkpoint_dir={checkpoints}",
        ],
        cwd=REPO,
        env=_plain_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (checkpoints / "step-00000004" / "manifest.json").is_file()
    assert proc.stdout.startswith(f"train: {tiny} + 1 override on cpu (cpu, 1 device): 4 steps")
    assert "trained 4/4 steps" in proc.stdout and "step-00000004" in proc.stdout
    assert "tokens/s" in proc.stdout and "0 after warm-up" in proc.stdout


def test_a_second_run_with_more_steps_resumes_from_the_last_checkpoint(tiny, tmp_path, capsys):
    checkpoints, metrics = tmp_path / "ckpt", tmp_path / "out" / "metrics.json"
    assert main(["train", "--config", str(tiny), "train.steps=2", f"train.checkpoint_dir={checkpoints}"]) == 0
    assert "trained 2/2 steps" in capsys.readouterr().out and (checkpoints / "step-00000002").is_dir()
    # the same directory, more steps (options and overrides mixed): continues from step 2
    args = [
        "train",
        "--config",
        str(tiny),
        "--metrics-out",
        str(metrics),
        f"train.checkpoint_dir={checkpoints}",
    ]
    save = hasattr(Trainer, "save_pretrained")
    if save:
        args += ["--save-pretrained", str(tmp_path / "model")]
    assert main([*args, "train.steps=4"]) == 0
    out = capsys.readouterr().out
    assert "trained steps 3-4 of 4 (resumed from step 2)" in out
    assert f"notice      resumed from {checkpoints / 'step-00000002'} at step 2" in out
    assert f"checkpoint  {checkpoints / 'step-00000004'}" in out and (checkpoints / "step-00000004").is_dir()
    report = json.loads(metrics.read_text())
    assert report["status"] == "ok" and report["step"] == 4 and report["result"]["steps"] == 4
    assert [m["step"] for m in report["history"]] == [4] and report["config"]["train"]["steps"] == 4
    if save:
        assert (tmp_path / "model" / "config.json").is_file() and "saved model" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["train.steps=zero"], "error: train.steps='zero' is not allowed"),
        (["train.step=5"], "error: unknown key 'train.step'"),
        (["train.steps"], "error: override 'train.steps' must look like section.field=value"),
        (["train.device_type=cuda"], "error: device_type='cuda' requested"),
    ],
)
def test_what_the_user_must_fix_exits_2_with_one_line(tiny, capsys, args, message):
    assert main(["train", "--config", str(tiny), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_a_missing_config_exits_2(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "nope.yaml"), "train.steps=2"]) == 2
    assert capsys.readouterr().err == f"error: config file {str(tmp_path / 'nope.yaml')!r} does not exist\n"


def test_save_pretrained_without_the_trainer_method_exits_2_before_training(
    tiny, tmp_path, capsys, monkeypatch
):
    monkeypatch.delattr(Trainer, "save_pretrained", raising=False)
    assert main(["train", "--config", str(tiny), "--save-pretrained", str(tmp_path / "m")]) == 2
    assert "--save-pretrained needs Trainer.save_pretrained" in capsys.readouterr().err


def test_a_crash_in_training_prints_the_traceback_and_exits_1(tiny, tmp_path, capsys, monkeypatch):
    def crash(self):
        raise RuntimeError("device lost")

    monkeypatch.setattr(Trainer, "fit", crash)
    metrics = tmp_path / "m.json"
    assert main(["train", "--config", str(tiny), "--metrics-out", str(metrics)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith(
        "error: training failed at step 0: RuntimeError: device lost\n"
    )
    assert json.loads(metrics.read_text())["status"] == "failed"


def test_overrides_may_come_before_between_and_after_the_options():
    args = parse_args(["train", "a.b=1", "--config", "c.yaml", "d.e=2", "--metrics-out", "m.json", "f.g=3"])
    assert (args.config, args.overrides, args.metrics_out) == (
        "c.yaml",
        ["a.b=1", "d.e=2", "f.g=3"],
        "m.json",
    )
    with pytest.raises(SystemExit):
        parse_args(["train", "a.b=1", "--bogus"])


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("out", "is a directory: give the file to write the JSON to, e.g. --metrics-out"),
        ("file.txt/metrics.json", "cannot be written: {file} is a file, not a directory"),
    ],
)
def test_a_metrics_out_that_cannot_be_written_exits_2_before_the_run(
    tiny, tmp_path, capsys, monkeypatch, where, message
):
    (tmp_path / "out").mkdir()
    (tmp_path / "file.txt").write_text("in the way")

    def no_run(*args, **kwargs):
        raise AssertionError("the run started before --metrics-out was checked")

    monkeypatch.setattr(Trainer, "__init__", no_run)
    value = str(tmp_path / where)
    assert main(["train", "--config", str(tiny), "--metrics-out", value]) == 2
    err = capsys.readouterr().err
    expected = message.format(file=repr(str(tmp_path / "file.txt")))
    assert err.startswith(f"error: --metrics-out {value!r} {expected}") and err.count("\n") == 1


IMPORT_MARKS = """\
import os, sys

_watched = set(os.environ["WORKBENCH_TEST_IMPORT_MARKS"].split(","))


class _Marks:  # says on stderr when a watched module starts importing (the test sends Ctrl-C then)
    def find_spec(self, name, path=None, target=None):
        if name in _watched:
            _watched.discard(name)
            sys.stderr.write(f"@@importing {name}\\n")
            sys.stderr.flush()
        return None


sys.meta_path.insert(0, _Marks())
"""
"""A sitecustomize for the child: a line on stderr as a module starts importing, so the interrupt lands
inside that import whatever the machine's speed."""


@pytest.mark.parametrize(
    ("moment", "mark", "args"),
    [
        ("importing the package", "@@importing workbench.backend.hardware", []),
        ("importing torch", "@@importing torch", []),
        # half way through torch_xla's __init__ (its C extension loaded): where the old NameError came from
        ("importing torch_xla", "@@importing torch_xla.stablehlo", ["train.device_type=xla"]),
        ("training", r"\| *[1-9][0-9]*/100000 ", ["train.steps=100000"]),  # the bar shows a step done
    ],
)
def test_ctrl_c_at_any_moment_of_start_up_exits_130_with_one_line(tiny, tmp_path, moment, mark, args):
    """Ctrl-C while torch_xla imported used to end in `NameError: name 'runtime' is not defined`, exit 1 (the
    interrupt's handler imported the half-loaded torch_xla again); while the package imported, in a traceback."""
    import signal
    import threading

    from tests.conftest import xla_env

    (tmp_path / "sitecustomize.py").write_text(IMPORT_MARKS)
    watched = "workbench.backend.hardware,torch,torch_xla.stablehlo"
    env = xla_env(1, {"WORKBENCH_TEST_IMPORT_MARKS": watched, "PYTHONPATH": f"{tmp_path}:{REPO}"})
    child = subprocess.Popen(
        [sys.executable, "-m", "workbench", "train", "--config", str(tiny), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    seen = b""

    def read_until_the_mark() -> None:  # then interrupt, and read the rest
        nonlocal seen
        while chunk := child.stderr.read1(65536):
            seen += chunk
            if re.search(mark.encode(), seen) and child.returncode is None:
                child.send_signal(signal.SIGINT)
                mark_sent.set()
                seen += child.stderr.read()
                return

    mark_sent = threading.Event()
    reader = threading.Thread(target=read_until_the_mark)
    reader.start()
    try:
        child.wait(timeout=300)
    finally:
        child.kill()
        reader.join()
    assert mark_sent.is_set(), f"{mark!r} never came: {seen.decode()[-2000:]}"
    err = seen.decode().replace("\r", "\n")
    after = err[re.search(mark, err).end() :].partition("\n")[2]  # what came after the mark's line
    lines = [line for line in after.splitlines() if line.strip() and not re.search(r"^@@|\d+/\d+ \[", line)]
    assert child.returncode == 130 and "Traceback" not in err, (
        f"{moment}: exit {child.returncode}\n{err[-3000:]}"
    )
    assert len(lines) == 1 and lines[0].startswith("error: interrupted"), f"{moment}: {lines}"
