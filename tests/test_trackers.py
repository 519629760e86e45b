"""``train.report_to``: what each tracker wrote, read back from its own files.

One training process reports to TensorBoard, trackio and W&B at once (`tracked_run`; no W&B key, so
offline, and nothing may prompt). Read back: TensorBoard's event files (the loss of every log step, each
metric of the contract that had a value, the config), trackio's SQLite store, W&B's offline run file
(its records, in W&B's own log format, decoded with W&B's protobuf classes). GRPO's completions go to a
table through `RunTrackers.log_completions`; a tracker that is not installed stops the run before
training with its pip line.
"""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from workbench.__main__ import main
from workbench.config import ConfigError, load_config
from workbench.trackers import RunTrackers, report_to_names, with_trackers
from workbench.trackers.base import TrackerMissingError, flatten, texts

STEPS = 4


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tracked")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_", "PJRT_", "CPU_NUM"))
    }
    env.update(
        PYTHONPATH=str(REPO), TRACKIO_DIR=str(root / "trackio"), HOME=str(root), NETRC=str(root / "netrc")
    )
    command = [
        sys.executable,
        "-m",
        "workbench",
        "train",
        "train.device_type=cpu",
        f"train.steps={STEPS}",
        "train.batch_size=2",
        "train.log_every=1",
        "train.eval_every=2",
        "model.num_layers=1",
        "data.max_examples=40",
        "data.max_length=64",
        "train.report_to=[tensorboard,trackio,wandb]",
        f"train.logging_dir={root / 'runs'}",
        "train.run_name=r1",
        "--metrics-out",
        str(root / "metrics.json"),
    ]
    proc = subprocess.run(
        command, cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    history = json.loads((root / "metrics.json").read_text())["history"]
    return {"root": root, "proc": proc, "history": history}


def _scalars(history: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [flatten(entry) for entry in history]


def test_tensorboard_has_the_loss_of_every_log_step_and_every_metric(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(
        str(tracked_run["root"] / "runs" / "r1"), size_guidance={"scalars": 0, "tensors": 0}
    )
    events.Reload()
    history = tracked_run["history"]
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, STEPS + 1))
    assert [pytest.approx(e.value) for e in events.Scalars("train/loss")] == [m["loss"] for m in history]
    assert [e.step for e in events.Scalars("eval/loss")] == [2, 4]
    for entry, scalars in zip(history, _scalars(history)):
        for key, value in scalars.items():
            logged = {e.step: e.value for e in events.Scalars(key)}
            assert logged[entry["step"]] == pytest.approx(value, rel=1e-6), key
    assert "config/text_summary" in events.Tags()["tensors"]


def test_trackio_keeps_every_interval_and_the_config_in_its_local_store(tracked_run):
    store = sqlite3.connect(tracked_run["root"] / "trackio" / "xla-workbench.db")
    rows = list(store.execute("select step, metrics from metrics where run_name = 'r1' order by step"))
    assert [step for step, _ in rows] == list(range(1, STEPS + 1))
    for (_, logged), scalars in zip(rows, _scalars(tracked_run["history"])):
        assert json.loads(logged) == pytest.approx(scalars)
    (config,) = store.execute("select config from configs where run_name = 'r1'")
    assert json.loads(config[0])["train"]["report_to"] == ["tensorboard", "trackio", "wandb"]


def _wandb_records(path: Path) -> list[Any]:
    """The records of a W&B run file: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
    chunks, each a CRC32, a length and a type (full, first, middle, last) before its bytes."""
    from wandb.proto import wandb_internal_pb2

    data, records, pending, block = path.read_bytes(), [], b"", 32768
    position = 7
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:  # a block's tail too short for a header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += room
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # full, or the last of a record split over blocks
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_runs_offline_without_a_key_and_keeps_every_interval(tracked_run):
    (run_file,) = (tracked_run["root"] / "runs" / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wandb_records(run_file)
    history = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            history[int(record.history.step.num)] = items
    assert sorted(history) == list(range(1, STEPS + 1))
    for entry, scalars in zip(tracked_run["history"], _scalars(tracked_run["history"])):
        assert {k: history[entry["step"]][k] for k in scalars} == pytest.approx(scalars)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    keys = {item.key for item in run.config.update}
    assert {"model", "data", "train", "lora"} <= keys
    err = tracked_run["proc"].stderr
    assert f"offline, no W&B key here: upload it with wandb sync {run_file.parent}" in err


def test_report_to_takes_transformers_names_and_refuses_others():
    assert load_config(None, ["train.report_to=[tensorboard,wandb]"]).train.report_to == [
        "tensorboard",
        "wandb",
    ]
    assert report_to_names("none") == [] and report_to_names(["trackio"]) == ["trackio"]
    with pytest.raises(ConfigError, match="'tensorbord' is not a tracker; did you mean 'tensorboard'"):
        load_config(None, ["train.report_to=tensorbord"])
    cfg = load_config(None, [])
    assert cfg.train.report_to == "none" and with_trackers(cfg, [print]) == [print]


def test_a_tracker_that_is_not_installed_stops_the_run_before_training_with_its_pip_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(TrackerMissingError, match=r"pip install 'xla-workbench\[wandb\]'"):
        RunTrackers(load_config(None, ["train.report_to=wandb"]))
    assert (
        main(
            [
                "train",
                "train.device_type=cpu",
                "train.report_to=wandb",
                "train.steps=1",
                "data.max_examples=16",
            ]
        )
        == 2
    )
    out = capsys.readouterr()
    assert "trained" not in out.out and out.err.strip().endswith("(or pip install wandb)")


def test_flatten_names_every_figure_as_transformers_trackers_do():
    metrics = {
        "step": 3,
        "loss": 1.5,
        "recompiled": True,
        "eval_loss": 1.25,
        "rewards": {"format": 0.5, "skip": None},
    }
    metrics |= {"mfu": None, "recompile_causes": ["x changed"], "recompile_steps": []}
    assert flatten(metrics) == {
        "train/step": 3.0,
        "train/loss": 1.5,
        "train/recompiled": 1.0,
        "eval/loss": 1.25,
        "train/rewards/format": 0.5,
    }
    assert texts(metrics) == {"train/recompile_causes": "x changed"}


def test_grpo_completions_reach_a_tracker_as_a_table(tmp_path):
    """An interval's ``completions`` rows (grpo.log_completions) go out as a table, not as text lines."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(
        None,
        ["train.report_to=tensorboard", f"train.logging_dir={tmp_path}", "train.run_name=g", "train.steps=2"],
    )
    (trackers,) = with_trackers(cfg, [])
    rows = [{"prompt": "1+1?", "completion": "2 | two", "reward": 1.0}]
    trackers({"step": 2, "loss": 0.5, "completions": rows})  # the last step: the run finishes
    events = EventAccumulator(str(tmp_path / "g"), size_guidance={"tensors": 0})
    events.Reload()
    (table,) = events.Tensors("train/completions/text_summary")
    text = table.tensor_proto.string_val[0].decode()
    assert (
        table.step == 2
        and "| prompt | completion | reward |" in text
        and "| 1+1? | 2 \\| two | 1.0 |" in text
    )
    assert [s.value for s in events.Scalars("train/loss")] == [0.5]
