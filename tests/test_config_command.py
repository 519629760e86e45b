"""``python -m workbench config``: the resolved config with each value's source, and ``--explain KEY``."""

from __future__ import annotations

import pytest

from workbench.__main__ import main
from workbench.config_reference import config_reference


def _lines(out: str) -> dict[str, tuple[str, str]]:
    """``{key: (value, source)}`` of the resolved table."""
    rows = {}
    for line in out.splitlines():
        if line and not line.startswith("#"):
            key, *value, source = line.split()
            rows[key] = (" ".join(value), source)
    return rows


def test_explain_covers_every_key(capsys):
    reference = config_reference()
    assert len(reference) >= 79
    for ref in reference:
        assert main(["config", "--explain", ref.key]) == 0, ref.key
        out = capsys.readouterr().out
        assert out.startswith(ref.key + "\n") and f"  what:     {ref.doc}" in out, ref.key
        assert "  type:     " in out and "  default:  " in out


def test_explain_names_the_choices_and_the_rules(capsys):
    assert main(["config", "--explain", "model.attention"]) == 0
    out = capsys.readouterr().out
    assert "  choices:  auto, eager, sdpa, flash, chunked" in out and "  default:  auto" in out
    assert main(["config", "--explain", "data.eval_fraction"]) == 0
    assert "  rule:     must be in [0, 0.5]" in capsys.readouterr().out


def test_each_value_says_where_it_came_from(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  steps: 7\n  seed: 1\ndata:\n  format: jsonl\nmodel:\n  hidden_size: 32\n")
    assert main(["config", "--config", str(config), "train.seed=5", "lora.rank=4"]) == 0
    rows = _lines(capsys.readouterr().out)
    assert len(rows) == len(config_reference())
    assert rows["train.steps"] == ("7", "file")
    assert rows["model.hidden_size"] == ("32", "file")
    assert rows["train.seed"] == ("5", "override")  # an override beats the file
    assert rows["lora.rank"] == ("4", "override")
    assert rows["train.batch_size"] == ("8", "default")
    assert rows["data.file_type"] == ("jsonl", "file")  # an old config's data.format moved onto it
    # overrides after an option are overrides too, and --explain shows the value here and its source
    assert main(["config", "--explain", "train.seed", "--config", str(config), "train.seed=9"]) == 0
    assert "  value:    9 (override)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--explain", "train.stpes"], "unknown key 'train.stpes'; did you mean 'train.steps'?"),
        (["--explain", "steps"], "did you mean 'train.steps'?"),
        (["--explain", "train"], "'train' is a section; explain one of its keys"),
        (["train.step=3"], "unknown key 'train.step' in section 'train'; did you mean 'train.steps'?"),
        (["train.steps=0"], "train.steps=0 is not allowed: must be >= 1"),
        (["--config", "missing.yaml"], "--config 'missing.yaml' is not allowed: no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["config", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err
