"""Bad inputs through the real command line (issue 35): each is refused or stopped with the exit code
the CLI promises (2: could not start, 1: failed after starting) and one ``error:`` line naming what the
user typed and a fix; nothing the user wrote is overwritten. A test per case and one per class of fault.

Every case is a real ``python -m workbench ...`` process (`run_cli`) on ``train.device_type=cpu``
unless the behaviour is XLA's own; cases that share a setup share a module fixture.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

TINY_RUN = [  # a one-layer llama on a slice of the embedded corpus: a run takes a few seconds
    "train.device_type=cpu",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "data.tokenizer_vocab_size=256",
    "data.max_length=64",
    "data.max_examples=32",
    "train.batch_size=4",
    "train.steps=2",
    "train.log_every=1",
    "train.progress_bar=false",
]
_INHERITED = re.compile(
    r"^(PJRT_DEVICE|CPU_NUM_DEVICES|XLA_FLAGS|XLA_USE_SPMD|PT_XLA_.*|TPU_.*|RANK|LOCAL_RANK|WORLD_SIZE|"
    r"LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_.*|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_.*)$"
)


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without XLA or torchrun settings (a plain CPU process); ``USE_TORCH_XLA=0``
    keeps accelerate (imported with peft) from importing torch_xla, which costs seconds per process."""
    env = {k: v for k, v in os.environ.items() if not _INHERITED.match(k)}
    env.update({"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    env["USE_TORCH_XLA"] = "0"
    env.update(extra or {})
    return env


def run_cli(
    *args: str | Path, cwd: str | Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[int, str, str]:
    """``python -m workbench <args>`` in a subprocess: (exit code, stdout, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", *map(str, args)],
        cwd=cwd or REPO,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr


def error_lines(stderr: str) -> list[str]:
    """The ``error:`` lines of a command's stderr."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def one_error(code: int, stderr: str, expected_code: int = 2) -> str:
    """The one ``error:`` line of a command that exited `expected_code` without a traceback."""
    errors = error_lines(stderr)
    assert code == expected_code and len(errors) == 1 and "Traceback" not in stderr, (code, stderr[-3000:])
    return errors[0]


# ---- saves never destroy what they did not write (item 3) -------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A tiny base model with its tokenizer beside it (what a user downloads), the same base with a
    tokenizer that has no chat template, and a LoRA adapter trained on the base (``train
    --save-pretrained`` over a directory of the user's own files, with ``--overwrite``)."""
    from workbench.config import WorkbenchConfig
    from workbench.data.tokenizer import get_tokenizer
    from workbench.models.build import build_model

    root = tmp_path_factory.mktemp("models")
    sizes = WorkbenchConfig().with_overrides([o for o in TINY_RUN if o.startswith(("model.", "data.tok"))])
    tokenizer = get_tokenizer(sizes.data)
    model = build_model(sizes.model, vocab_size=len(tokenizer), seed=1)
    for name in ("base", "no-template"):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    (root / "no-template" / "chat_template.jinja").unlink()
    return {"root": root, "base": root / "base", "no-template": root / "no-template"}


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_save_refuses_the_users_files_and_the_runs_base_before_training(models, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "own"}')
    (mine / "notes.txt").write_text("keep me")
    before, base_before = _tree(mine), _tree(models["base"])

    code, out, err = run_cli("train", *TINY_RUN, "--save-pretrained", mine)
    line = one_error(code, err)
    assert f"cannot save into {str(mine)!r}" in line and "config.json, notes.txt" in line, line
    assert "new or empty directory" in line and "--overwrite" in line, line
    assert "trained" not in out  # refused before training, not after

    base = models["base"]
    code, out, err = run_cli(
        "train",
        *TINY_RUN,
        f"model.pretrained_path={base}",
        "lora.rank=4",
        "--save-pretrained",
        base,
        "--overwrite",
    )
    line = one_error(code, err)
    assert f"cannot save into {str(base)!r}: it is the run's base model (model.pretrained_path)" in line, line
    assert "overwriting is refused here too" in line and "save into a new directory" in line, line
    assert _tree(mine) == before and _tree(models["base"]) == base_before


@pytest.fixture(scope="module")
def adapter(models) -> Path:
    """An adapter trained on the base, saved with --overwrite over a directory of the user's files."""
    out = models["root"] / "adapter"
    out.mkdir()
    (out / "config.json").write_text('{"my": "own"}')
    code, _, stderr = run_cli(
        "train", *TINY_RUN, f"model.pretrained_path={models['base']}", "lora.rank=4",
        "--save-pretrained", out, "--overwrite",
    )  # fmt: skip
    assert code == 0, stderr[-3000:]
    return out


def test_save_overwrites_on_purpose_and_marks_its_output(adapter):
    from workbench.train.export_dir import EXPORT_MARKER

    assert not (adapter / "config.json").exists()  # the user's file went with --overwrite, as asked
    assert (adapter / "adapter_config.json").is_file() and (adapter / EXPORT_MARKER).is_file()
    assert [p.name for p in adapter.parent.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_save_every_path_goes_through_the_same_guard(models, adapter, tmp_path):
    """The class: `save_model` (every export) and `Trainer.save_pretrained` refuse the user's files, the
    model's own base (even with overwrite), the run's checkpoints and a directory holding one of them;
    a save that fails part-way leaves the earlier export whole and nothing beside it."""
    from workbench.config import WorkbenchConfig
    from workbench.train import Trainer
    from workbench.train.adapter_files import save_model
    from workbench.train.export_dir import ExportDirError, check_export_dir, run_protected_dirs
    from workbench.train.start import load_for_inference

    model, tokenizer = load_for_inference(str(adapter))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "weights.bin").write_text("mine")
    with pytest.raises(ExportDirError, match=r"holds files the workbench did not write \(weights.bin\)"):
        save_model(model, mine)
    for target in (models["base"], models["root"]):  # its base, and a directory holding it
        with pytest.raises(ExportDirError, match="weights were loaded from"):
            save_model(model, target, merged=True, overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportDirError, match="it is a file"):
        save_model(model, tmp_path / "file")

    cfg = WorkbenchConfig().with_overrides([*TINY_RUN, f"train.checkpoint_dir={tmp_path / 'ckpt'}"])
    trainer = Trainer(cfg, model=model, tokenizer=tokenizer)
    with pytest.raises(ExportDirError, match=r"the run's checkpoint directory \(train.checkpoint_dir\)"):
        trainer.save_pretrained(tmp_path / "ckpt", overwrite=True)
    with pytest.raises(ExportDirError, match="overwrite=True in Python"):
        trainer.save_pretrained(mine)
    assert check_export_dir(tmp_path / "new") == tmp_path / "new"
    continuing = WorkbenchConfig().with_overrides([f"model.pretrained_path={adapter}"])  # the CLI's check
    with pytest.raises(
        ExportDirError, match=r"it is the base model of the adapter in model\.pretrained_path"
    ):
        check_export_dir(models["base"], overwrite=True, protected=run_protected_dirs(continuing))

    export = trainer.save_pretrained(tmp_path / "export", merged=True)
    assert trainer.save_pretrained(export, merged=True) == export  # its own output: saved again, no flag
    saved = _tree(export)

    class BrokenTokenizer:  # a write that fails after the weights are written
        def save_pretrained(self, path: str) -> None:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_model(model, export, merged=True, tokenizer=BrokenTokenizer())
    assert _tree(export) == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "file", "mine"]


def test_save_through_a_symlink_writes_where_it_points_and_keeps_the_link(tmp_path):
    """``--save-pretrained out`` where ``out`` links to a folder elsewhere (a Drive mount): the export goes
    there, an earlier one there is replaced whole, and the link stays a link."""
    from workbench.train.export_dir import EXPORT_MARKER, check_export_dir, staged_export

    elsewhere = tmp_path / "drive" / "out"
    elsewhere.mkdir(parents=True)
    (elsewhere / EXPORT_MARKER).write_text("{}")
    (elsewhere / "model.safetensors").write_text("old")
    link = tmp_path / "local" / "out"
    link.parent.mkdir()
    link.symlink_to(elsewhere, target_is_directory=True)
    for _ in range(2):  # over an earlier export, then over its own
        with staged_export(check_export_dir(link), kind="transformers") as staging:
            (staging / "model.safetensors").write_text("new")
        assert link.is_symlink() and link.resolve() == elsewhere.resolve()
        assert (elsewhere / "model.safetensors").read_text() == "new"
        assert (elsewhere / EXPORT_MARKER).is_file()
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["drive", "out", "local", "out", EXPORT_MARKER, "model.safetensors"]
    )  # nothing left beside either


def test_save_never_replaces_a_checkpoint_even_with_overwrite(tmp_path):
    """``--save-pretrained ckpt/step-N --overwrite`` (the run's checkpoint directory holds it, it does not
    hold the directory): a complete checkpoint is refused like the directory itself, and stays whole."""
    import torch

    from workbench.train.checkpoint import CheckpointManager
    from workbench.train.export_dir import ExportDirError, check_export_dir

    manager = CheckpointManager(tmp_path / "ckpt")
    step = manager.save(10, {"model": {"w": torch.ones(2)}})
    with pytest.raises(ExportDirError, match=r"it is a training checkpoint \(its manifest.json is there\)"):
        check_export_dir(step, overwrite=True)
    manager.verify(step)
    assert check_export_dir(tmp_path / "ckpt" / "my-adapter") == tmp_path / "ckpt" / "my-adapter"


# ---- exit codes through --nproc (item 5) --------------------------------------------------------------


def test_nproc_refuses_what_every_rank_would_refuse_before_launching(tmp_path):
    for settings, words in [
        (["mesh.model=2"], "mesh.model=2 is not supported across torchrun processes"),
        (["train.batch_size=3"], "train.batch_size=3 is the global batch, not divisible by"),
        (
            ["train.time_limit=0.5", f"train.checkpoint_dir={tmp_path / 'ckpt'}"],
            "train.time_limit=0.5 (0.5s) cannot hold one step and its save",
        ),
    ]:
        code, _, err = run_cli("train", "--nproc", "2", *TINY_RUN, *settings)
        assert words in one_error(code, err), err[-3000:]
        assert "starting 2 ranks" not in err  # no rank was started


@pytest.mark.slow
def test_nproc_a_configuration_error_in_the_ranks_exits_2_with_one_line(tmp_path):
    missing = tmp_path / "no-such-tokenizer"
    code, _, err = run_cli("train", "--nproc", "2", *TINY_RUN, f"data.tokenizer_path={missing}")
    line = one_error(code, err)
    assert line.startswith("error: ") and f"data.tokenizer_path={str(missing)!r} is not a directory" in line
    assert "rank" in line and "ChildFailedError" not in err and "exitcode" not in err, err[-3000:]


def test_nproc_1_a_ranks_configuration_error_is_one_line(tmp_path, monkeypatch, capsys):
    """``--nproc 1``: the one rank's configuration error goes to the launch's error directory like any
    rank's (the launch prints it), not to stderr beside the launch's own line."""
    from workbench.launch import LAUNCH_ERRORS_ENV, _rank_errors
    from workbench.run import _fail

    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(LAUNCH_ERRORS_ENV, str(tmp_path))
    assert _fail("train.steps=0 is not allowed: must be >= 1", 2) == 2
    assert "error:" not in capsys.readouterr().err
    assert _rank_errors(tmp_path, 1) == ["error: rank 0 of 1: train.steps=0 is not allowed: must be >= 1"]


# ---- messages that name what the user typed and a fix (item 6) -----------------------------------------


def test_message_a_quoted_number_is_called_a_quoted_string(tmp_path):
    code, _, err = run_cli("train", *TINY_RUN, 'train.checkpoint_every="5"')
    line = one_error(code, err)
    assert "train.checkpoint_every='\"5\"' is not allowed: it is a quoted string, not a number" in line
    assert "drop the quotes (train.checkpoint_every=5)" in line and "steps >= 0" in line


def test_message_every_quoted_value_of_a_typed_field_gets_the_quoted_string_message():
    """The class: any field whose type is not a plain string (int, float, bool, a choice, a number or a
    duration) given a quoted value, on the command line or as a YAML string that must be a number."""
    from workbench.config import ConfigError, WorkbenchConfig

    cases = {
        "train.steps": ('"5"', "a number", "5"),
        "train.learning_rate": ("'1e-4'", "a number", "1e-4"),
        "train.checkpoint_every": ('"5"', "a number", "5"),
        "train.time_limit": ('"0"', "a number", "0"),
        "mesh.fsdp": ('"2"', "a number", "2"),
        "train.resume": ('"false"', "true/false", "false"),
        "train.device_type": ('"cpu"', "the choice cpu", "cpu"),
    }
    for key, (typed, kind, bare) in cases.items():
        with pytest.raises(ConfigError) as caught:
            WorkbenchConfig().with_overrides([f"{key}={typed}"])
        assert f"it is a quoted string, not {kind}: drop the quotes ({key}={bare})" in str(caught.value), key
    with pytest.raises(
        ConfigError, match=r"train.steps='5' is not allowed: it is a quoted string, not a number"
    ):
        WorkbenchConfig.from_yaml('train: {steps: "5"}\n')


def test_message_a_number_the_user_did_not_quote_is_never_called_quoted():
    """The class: an unquoted value that is not of the field's type (2.5 for an int, 1e3 for an int, inf
    where a duration goes) gets the plain message, never 'drop the quotes' with the same text as the
    fix; a YAML float that YAML 1.1 reads as text (1e-4) is told how to write it so it reads a number."""
    from workbench.config import ConfigError, WorkbenchConfig

    for override in (
        "train.steps=2.5",
        "train.batch_size=8.0",
        "train.steps=1e3",
        "train.checkpoint_every=2.5",
    ):
        with pytest.raises(ConfigError) as caught:
            WorkbenchConfig().with_overrides([override])
        message = str(caught.value)
        assert "quoted" not in message, message
        assert "is not allowed: expected int" in message or "must be steps >= 0" in message, message
    for typed in ("inf", '"inf"', "1e999"):  # without quotes it is refused all the same: no such advice
        with pytest.raises(ConfigError) as caught:
            WorkbenchConfig().with_overrides([f"train.checkpoint_every={typed}"])
        assert "quoted" not in str(caught.value) and "must be steps >= 0" in str(caught.value), typed
    with pytest.raises(ConfigError) as caught:
        WorkbenchConfig.from_yaml("train: {learning_rate: 1e-4}\n")
    message = str(caught.value)
    assert "train.learning_rate='1e-4' is not allowed: YAML reads 1e-4 as text" in message, message
    assert "write 0.0001" in message and "quoted" not in message
    assert WorkbenchConfig.from_yaml("train: {learning_rate: 0.0001}\n").train.learning_rate == 1e-4
    with pytest.raises(ConfigError, match=r"YAML reads 3e-05 as text.*write 3.0e-05"):
        WorkbenchConfig.from_yaml("train: {learning_rate: 3e-05}\n")
    assert WorkbenchConfig.from_yaml("train: {learning_rate: 3.0e-05}\n").train.learning_rate == 3e-05


def test_message_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path):
    bad = tmp_path / "run.yaml"
    bad.write_text("train:\n  steps: [1\n  x: 2\n")
    code, _, err = run_cli("train", "--config", bad)
    line = one_error(code, err)
    assert f"config file {str(bad)!r} is not valid YAML: line 3, column 4" in line, line
    assert "<unicode string>" not in line


def test_message_an_adapter_whose_base_moved_gets_the_fix_of_each_command(models, adapter, tmp_path):
    moved = tmp_path / "adapter"
    moved.mkdir()
    for path in adapter.iterdir():
        (moved / path.name).write_bytes(path.read_bytes())
    gone = str(tmp_path / "moved-base")
    for name, key in (
        ("adapter_config.json", "base_model_name_or_path"),
        ("workbench_base_model.json", "name_or_path"),
    ):
        record = json.loads((moved / name).read_text())
        (moved / name).write_text(json.dumps(record | {key: gone}))
    code, _, err = run_cli("train", *TINY_RUN, f"model.pretrained_path={moved}", "lora.rank=4")
    line = one_error(code, err)
    assert f"records its base as {gone!r}, which is not a directory here" in line, line
    assert "--base" not in line and f"{str(moved / 'adapter_config.json')!r}" in line, line
    code, _, err = run_cli("generate", "--model", moved, "hi")
    assert "add --base DIR" in one_error(code, err)
    code, _, err = run_cli(
        "generate", "--model", moved, "--base", models["base"], "--max-new-tokens", "2", "hi"
    )
    assert code == 0, err[-3000:]  # the fix it gives works


def test_message_a_tokenizer_without_a_chat_template_is_named_with_the_fix(models, tmp_path):
    chat = tmp_path / "chat.json"
    turns = [{"role": "user", "content": "Sort a list."}, {"role": "assistant", "content": "Use sorted()."}]
    chat.write_text(json.dumps([{"messages": turns}] * 4))
    no_template = models["no-template"]
    code, _, err = run_cli("generate", "--model", no_template, "--chat", "hi")
    line = one_error(code, err)
    assert f"the tokenizer in {str(no_template)!r}" in line and "has none" in line, line
    assert (
        "chat_template.jinja" in line and "leave out --chat" in line and "chat_template is not set" not in err
    )

    code, _, err = run_cli("train", *TINY_RUN, f"model.pretrained_path={no_template}", f"data.source={chat}")
    line = one_error(code, err)
    assert f"the tokenizer in {str(no_template)!r}" in line and "data.tokenizer_path=None" not in line, line
    assert "data.tokenizer_path=DIR" in line and "data.format=text" in line
    # the notice data loading gave on the way is one workbench line, not a Python warning with its source
    assert "notice: data.format='auto': read 4 records as messages" in err, err[-3000:]
    assert "RuntimeWarning" not in err and "records.py" not in err


def test_message_a_file_read_as_the_wrong_type_blames_data_file_type(tmp_path):
    lines = tmp_path / "records.jsonl"
    lines.write_text('{"text": "hello world"}\n{"text": "more words"}\n')
    code, _, err = run_cli("train", *TINY_RUN, f"data.source={lines}", "data.file_type=csv")
    line = one_error(code, err)
    assert f"data.file_type='csv' reads {str(lines)!r} as csv, but it looks like JSON lines" in line, line
    assert "set data.file_type=jsonl" in line and "data.format" not in line


def test_message_every_file_type_that_does_not_fit_the_file_is_named(tmp_path):
    """The class: a file whose first bytes say JSON, JSON lines or Parquet, read as another type."""
    from workbench.config import WorkbenchConfig
    from workbench.data.records import load_records

    files = {
        "a.jsonl": ('{"text": "x"}\n', "JSON lines"),
        "b.json": ('[{"text": "x"}]', "JSON (it opens with '[')"),
        "c.json": ('{\n  "text": "x"\n}\n', "JSON"),
        "d.parquet": ("PAR1....", "Parquet"),
    }
    for name, (content, looks) in files.items():
        (tmp_path / name).write_text(content)
        for file_type in ("csv", "parquet", "json"):
            if file_type == ("json" if looks.startswith("JSON") else "parquet"):  # the type it is
                continue
            cfg = WorkbenchConfig().with_overrides(
                [f"data.source={tmp_path / name}", f"data.file_type={file_type}"]
            )
            with pytest.raises(
                ValueError,
                match=rf"data.file_type='{file_type}' reads .*{name}.* it looks like {re.escape(looks)}",
            ):
                load_records(cfg.data)
    cfg = WorkbenchConfig().with_overrides([f"data.source={tmp_path / 'a.jsonl'}", "data.file_type=text"])
    assert len(load_records(cfg.data)) == 1  # text reads any file, on purpose


# ---- numbers that are not finite (item 1) ----------------------------------------------------------------


def _float_fields() -> list[str]:
    """Every config key whose type takes a float, in every section."""
    import dataclasses
    import typing

    from workbench.config import WorkbenchConfig

    keys = []
    for section, cls in typing.get_type_hints(WorkbenchConfig).items():
        for f in dataclasses.fields(cls):
            hint = typing.get_type_hints(cls)[f.name]
            if float in (typing.get_args(hint) or (hint,)):
                keys.append(f"{section}.{f.name}")
    return keys


def test_nonfinite_numbers_are_refused_wherever_the_config_takes_one():
    """The class: every key that takes a float refuses inf and nan, typed as an override (``inf``, ``nan``,
    ``1e999``) or in YAML (``.inf``, ``.nan``), naming the key, the value and the range allowed."""
    from workbench.config import ConfigError, WorkbenchConfig

    code, out, err = run_cli("train", *TINY_RUN, "train.learning_rate=inf")
    line = one_error(code, err)
    assert "train.learning_rate=inf is not allowed: not a finite number; must be > 0" in line, line
    assert "trained" not in out

    keys = _float_fields()
    assert {"train.learning_rate", "train.max_grad_norm", "train.time_limit", "lora.alpha"} <= set(keys)
    for key in keys:
        for typed in ("inf", "nan", "-inf", "1e999"):
            with pytest.raises(
                ConfigError, match=rf"^{re.escape(key)}=-?(inf|nan) is not allowed: not a finite"
            ):
                WorkbenchConfig().with_overrides([f"{key}={typed}"])
    with pytest.raises(
        ConfigError, match=r"^train.min_lr_ratio=nan is not allowed: not a finite number; must be in"
    ):
        WorkbenchConfig.from_yaml("train:\n  min_lr_ratio: .nan\n")
    with pytest.raises(
        ConfigError, match=r"^lora.alpha=inf is not allowed: not a finite number; must be > 0"
    ):
        WorkbenchConfig.from_yaml("lora:\n  alpha: .inf\n")


def _checkpoints_on_disk(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_nonfinite_loss_stops_the_run_with_exit_1_and_the_last_good_checkpoint_kept(tmp_path):
    """A learning rate that passes validation but blows the weights up: the log read that sees nan stops
    the run (exit 1, one line: the step, the last finite loss, the causes); a save due after the weights
    went non-finite is refused, so every checkpoint on disk is finite and the one the line names stands."""
    import torch

    from workbench.train.checkpoint import CheckpointManager

    root = tmp_path / "ckpt"
    run = [*TINY_RUN, "train.steps=6", "train.checkpoint_every=1", f"train.checkpoint_dir={root}"]
    code, out, err = run_cli(
        "train", *run, "train.learning_rate=1e30", "train.warmup_steps=3", "train.max_grad_norm=null"
    )
    line = one_error(code, err, expected_code=1)
    found = re.search(
        r"error: step (\d+): the loss is (nan|inf), not a finite number \(the last finite loss was "
        r"\d+\.\d+ at step (\d+)\); training stopped and checkpoint (\S+) is the last good state",
        line,
    )
    assert found, line
    assert "learning rate too high (train.learning_rate=1e+30" in line and "fp16 overflow" in line
    assert "bad data" in line and "trained" not in out
    stopped, last_finite, kept = int(found.group(1)), int(found.group(3)), Path(found.group(4))
    assert last_finite < stopped and kept.parent == root
    manager = CheckpointManager(root)
    on_disk = manager.checkpoints()
    assert on_disk and on_disk[-1] == kept and _checkpoints_on_disk(root) == [p.name for p in on_disk]
    for path in on_disk:  # the last good one was never replaced by a state holding inf or nan
        weights = manager.load(path, parts=("model",))["model"]
        assert all(bool(torch.isfinite(t).all()) for t in weights.values()), path


def test_nonfinite_state_is_never_written_over_the_last_good_checkpoint(tmp_path):
    """The class: any save (due at a step between log reads, or the final one) of a state holding inf or
    nan writes nothing, raises the package's `NonFiniteLossError` naming the last good checkpoint, and
    leaves that checkpoint the newest."""
    import torch

    from tests.test_train import tiny_cfg
    from workbench.train import NonFiniteLossError
    from workbench.train.checkpoint import CheckpointManager
    from workbench.train.finite import FiniteGuard
    from workbench.train.run_checkpoints import RunCheckpoints

    cfg = tiny_cfg(**{"train.checkpoint_dir": str(tmp_path)})
    for bad in (float("nan"), float("inf"), float("-inf")):
        saves = RunCheckpoints(cfg.train, sharded=False)
        good = saves.save(1, lambda: {"model": {"w": torch.ones(3)}}, wait=True)
        weights = torch.tensor([1.0, bad, 2.0])
        saves.save(2, lambda w=weights: {"model": {"w": w}})  # in the background, as the loop saves
        with pytest.raises(
            NonFiniteLossError, match=rf"step 2: the state to checkpoint \(model/w\) is {bad}"
        ) as caught:
            saves.wait()
        assert caught.value.checkpoint == str(good) and saves.path == str(good)
        assert [p.name for p in CheckpointManager(tmp_path).checkpoints()] == ["step-00000001"]
        assert _checkpoints_on_disk(tmp_path) == ["step-00000001"]

    guard = FiniteGuard(learning_rate=3e-3, precision="bf16")  # what the loop reads at each log step
    guard.check({"step": 10, "loss": 2.5, "grad_norm": 1.0}, lambda: None)
    for key, what in (("loss", "loss"), ("grad_norm", "gradient norm")):
        with pytest.raises(NonFiniteLossError, match=rf"^step 20: the {what} is inf, ") as caught:
            guard.check(
                {"step": 20, "loss": 2.5, "grad_norm": 1.0, key: float("inf")}, lambda: "ckpt/step-10"
            )
        error = caught.value
        assert (error.step, error.what, error.last_finite_loss, error.last_finite_step) == (20, what, 2.5, 10)
        assert "checkpoint ckpt/step-10 is the last good state" in str(error)
        assert "train.learning_rate=0.003" in str(error) and "train.precision=bf16" in str(error)


@pytest.mark.xla
def test_nonfinite_loss_on_xla_is_caught_at_the_log_read(tmp_path):
    """On XLA the loss reaches the host only at the log step's read: the same stop, exit 1, one line."""
    env = cli_env({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"})
    run = [o for o in TINY_RUN if not o.startswith(("train.device_type", "train.log_every"))]
    code, _, err = run_cli(
        "train", *run, "train.device_type=xla", "train.steps=4", "train.log_every=2", "train.learning_rate=1e30",
        "train.max_grad_norm=null", env=env,
    )  # fmt: skip
    line = one_error(code, err, expected_code=1)
    assert re.search(r"error: step (2|4): the loss is (nan|inf), not a finite number", line), line
    assert "no checkpoint was written" in line and "Likely causes" in line


# ---- a time limit that holds no step (item 2) ----------------------------------------------------------


def test_time_limit_no_save_fits_in_exits_2_before_loading_and_writes_nothing(tmp_path):
    """``train.time_limit=0.5`` with a checkpoint directory: refused from the config alone, so a re-run,
    finding nothing written, is refused the same way (it used to stop at step 0 and exit 0, every time)."""
    root = tmp_path / "ckpt"
    code, out, err = run_cli("train", *TINY_RUN, "train.time_limit=0.5", f"train.checkpoint_dir={root}")
    line = one_error(code, err)
    assert "train.time_limit=0.5 (0.5s) cannot hold one step and its save" in line, line
    assert "Give train.time_limit the session's length" in line and "null for no limit" in line
    assert not root.exists() and "train:" not in out  # refused before the header, the data, the model


def test_time_limit_that_holds_no_step_is_an_error_before_the_first_step_and_after_it(tmp_path):
    """The class, on the Trainer: no room for the first step is `TimeLimitError` (the CLI's exit 2), a
    first step whose measured time leaves no room for its save is `TimeLimitExceededError` (exit 1);
    neither writes anything, and neither returns a result as if it had trained."""
    from tests.test_train import tiny_cfg, token_dataset
    from workbench.train import TimeLimitError, TimeLimitExceededError, Trainer

    data = token_dataset(16)
    cfg = tiny_cfg(**{"train.time_limit": 100, "train.checkpoint_dir": str(tmp_path / "ckpt")})
    now = [0.0]

    def trainer(**kwargs) -> Trainer:
        built = Trainer(cfg, train_dataset=data, **kwargs)
        built.budget.clock, built.budget.start = (lambda: now[0]), 0.0  # the session's clock, by hand
        return built

    now[0] = 99.0  # loading took 99 s of 100: no save fits any more
    with pytest.raises(
        TimeLimitError,
        match=r"train.time_limit=100.0 leaves no room for one step: loading, data and warm-up took 1m39s",
    ):
        trainer().fit()
    assert not (tmp_path / "ckpt").exists()

    now[0] = 0.0

    def slow_step(metrics: dict) -> None:  # the first step takes 98 s of the 100
        now[0] += 98.0

    with pytest.raises(
        TimeLimitExceededError,
        match=r"a step took 1m38s .* the run stopped at step 1 with none of its steps checkpointed",
    ) as caught:
        trainer(callbacks=[slow_step]).fit()
    assert "Raise train.time_limit above" in str(caught.value) and "train.batch_size" in str(caught.value)
    assert not (tmp_path / "ckpt").exists()


# ---- resume from the newest checkpoint that verifies (item 4) -------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """A tiny run's checkpoint root holding step-1 and step-2, both complete."""
    root = tmp_path_factory.mktemp("resume") / "ckpt"
    code, _, err = run_cli("train", *TINY_RUN, "train.checkpoint_every=1", f"train.checkpoint_dir={root}")
    assert code == 0 and _checkpoints_on_disk(root) == ["step-00000001", "step-00000002"], err[-3000:]
    return root


def _damaged_copy(root: Path, into: Path, **damage: str) -> Path:
    """A copy of `root` with ``step_N=<how>`` damage: truncated, missing, corrupted or manifest."""
    import shutil

    shutil.copytree(root, into)
    for step, how in damage.items():
        directory = into / f"step-{int(step.removeprefix('step_')):08d}"
        weights = directory / "model.safetensors"
        if how == "truncated":
            weights.write_bytes(weights.read_bytes()[:100])
        elif how == "missing":
            (directory / "state.json").unlink()
        elif how == "corrupted":  # same size, one byte changed: only the hash sees it
            data = bytearray(weights.read_bytes())
            data[-1] ^= 0xFF
            weights.write_bytes(bytes(data))
        else:
            (directory / "manifest.json").write_text("{not json")
    return into


def test_resume_every_kind_of_damage_is_told_apart_from_other_errors(checkpoints, tmp_path):
    """The class: a missing, truncated or corrupted file and an unreadable manifest are damage (a resume
    steps back over it); a checkpoint of another format is not (it is refused, never moved)."""
    import json

    from workbench.train.checkpoint import CheckpointManager
    from workbench.train.state_io import CheckpointError, DamagedCheckpointError

    for how in ("truncated", "missing", "corrupted", "manifest"):
        root = _damaged_copy(checkpoints, tmp_path / how, step_2=how)
        with pytest.raises(DamagedCheckpointError) as caught:
            CheckpointManager(root).verify(root / "step-00000002")
        assert caught.value.reason == {"manifest": "bad-manifest"}.get(how, how)
        notices: list[str] = []
        assert CheckpointManager(root).newest_verified(notices.append) == root / "step-00000001"
        (aside,) = [p for p in root.iterdir() if p.name.startswith("step-00000002.damaged-")]
        assert aside.name.startswith(f"step-00000002.damaged-{caught.value.reason}-") and any(aside.iterdir())
        assert len(notices) == 1 and "moved aside as step-00000002.damaged-" in notices[0]
    other = tmp_path / "other-format"
    _damaged_copy(checkpoints, other)
    manifest = json.loads((other / "step-00000002" / "manifest.json").read_text())
    (other / "step-00000002" / "manifest.json").write_text(json.dumps(manifest | {"format_version": 99}))
    with pytest.raises(CheckpointError, match="checkpoint format 99") as caught:
        CheckpointManager(other).newest_verified(print)
    assert not isinstance(caught.value, DamagedCheckpointError) and (other / "step-00000002").is_dir()


def test_resume_generate_reads_past_a_damaged_newest_checkpoint_without_moving_it(checkpoints, tmp_path):
    root = _damaged_copy(checkpoints, tmp_path / "ckpt", step_2="truncated")
    before = (root / "step-00000002" / "model.safetensors").read_bytes()
    code, _, err = run_cli("generate", "--model", root, "--device-type", "cpu", "--max-new-tokens", "2", "hi")
    assert code == 0 and "Traceback" not in err, err[-3000:]
    assert (
        f"notice: --model={str(root)!r}: skipped damaged step-00000002 (model.safetensors is truncated or "
        "overwritten (100 bytes on disk"
        in err
        and "; using step-00000001" in err
    ), err[-3000:]
    assert _checkpoints_on_disk(root) == ["step-00000001", "step-00000002"]  # read-only: nothing moved
    assert (root / "step-00000002" / "model.safetensors").read_bytes() == before


def test_resume_train_moves_a_damaged_checkpoint_aside_and_continues_from_the_one_before(
    checkpoints, tmp_path
):
    from workbench.train.checkpoint import CheckpointManager

    root = _damaged_copy(checkpoints, tmp_path / "ckpt", step_2="missing")
    run = [*TINY_RUN, "train.steps=3", "train.checkpoint_every=1", f"train.checkpoint_dir={root}"]
    code, out, err = run_cli("train", *run)
    assert code == 0 and "Traceback" not in err, err[-3000:]
    assert "trained steps 2-3 of 3 (resumed from step 1)" in out, out
    notice = next(line for line in err.splitlines() if "moved aside" in line)
    assert notice.startswith(
        f"notice: checkpoint {str(root / 'step-00000002')!r}: state.json is missing: moved aside as step-00000002.damaged-missing-"
    ), notice
    assert f"notice: resumed from {root / 'step-00000001'} at step 1" in err
    (aside,) = [p for p in root.iterdir() if ".damaged-" in p.name]
    assert (aside / "model.safetensors").is_file()  # kept whole, never deleted
    assert CheckpointManager(root).latest() == root / "step-00000003"
    CheckpointManager(root).verify(root / "step-00000003")


def test_resume_when_no_checkpoint_verifies_each_command_says_error_in_one_line(checkpoints, tmp_path):
    root = _damaged_copy(checkpoints, tmp_path / "ckpt", step_1="manifest", step_2="corrupted")
    expected = [
        f"--model={str(root)!r}: no checkpoint there verifies against its manifest: ",
        "step-00000002 (model.safetensors is corrupted (its SHA-256 does not match the manifest))",
        "step-00000001 (manifest.json is unreadable: JSONDecodeError",
        "Point it at another model directory",
    ]
    code, _, err = run_cli("generate", "--model", root, "--device-type", "cpu", "hi")
    line = one_error(code, err)
    assert all(words in line for words in expected), line
    code, _, err = run_cli(
        "eval", "--model", root, "--data", tmp_path / "none.jsonl", "train.device_type=cpu"
    )
    line = one_error(code, err)
    assert all(words in line for words in expected), line
    assert _checkpoints_on_disk(root) == [
        "step-00000001",
        "step-00000002",
    ]  # the read-only commands moved nothing

    code, out, err = run_cli("train", *TINY_RUN, "train.steps=3", f"train.checkpoint_dir={root}")
    line = one_error(code, err)
    assert f"error: no checkpoint under {str(root)!r} verifies: each was moved aside and kept" in line, line
    assert "Re-run to start from step 0" in line and "trained" not in out
    names = _checkpoints_on_disk(root)
    assert len(names) == 2 and re.fullmatch(r"step-00000001\.damaged-bad-manifest-\d{8}T\d{6}", names[0]), (
        names
    )
    assert re.fullmatch(r"step-00000002\.damaged-corrupted-\d{8}T\d{6}", names[1]), names


def test_message_data_notices_are_workbench_lines_in_eval_too(models, tmp_path):
    """The class: every command that reads data (train above, eval here) prints its notices as
    ``notice:`` lines, never as Python warnings with a file and line."""
    records = tmp_path / "held_out.json"
    records.write_text(json.dumps([{"instruction": "Sort a list.", "output": "Use sorted()."}] * 3))
    code, out, err = run_cli("eval", "--model", models["base"], "--data", records, "train.device_type=cpu")
    assert code == 0 and "eval loss" in out, err[-3000:]
    assert "notice: data.format='auto': read 3 records as alpaca" in err, err[-3000:]
    assert "Warning:" not in err and ".py:" not in err, err[-3000:]
