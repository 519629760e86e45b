"""The generated reference pages against the code: every config key, every CLI argument, every metric.

The pages are what docs/_ext/workbench_reference.py writes at each Sphinx build; here its page
functions are called directly (no Sphinx run) and compared with the dataclasses, the argparse
parsers and the metrics contract, so a key added to any of them without reaching the docs fails.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import get_type_hints

import pytest

from tests.conftest import REPO
from workbench.config import WorkbenchConfig
from workbench.config_reference import config_reference, config_sections, validation_rules

sys.path.insert(0, str(REPO / "docs" / "_ext"))
import workbench_reference  # docs/_ext is not a package: imported from its path


def _dataclass_keys() -> list[str]:
    hints = get_type_hints(WorkbenchConfig)
    return [
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(WorkbenchConfig)
        for f in dataclasses.fields(hints[section.name])
    ]


def test_the_config_page_lists_every_key_of_the_dataclasses_and_no_other():
    page = workbench_reference.config_markdown()
    headed = re.findall(r"^### `([a-z_]+\.[a-z_]+)`$", page, flags=re.MULTILINE)
    assert headed == _dataclass_keys()  # every key once, in declaration order, nothing extra
    assert f"Every key of a run's config: {len(headed)} keys" in page


def test_every_key_has_its_type_default_and_an_explanation():
    reference = config_reference()
    assert [r.key for r in reference] == _dataclass_keys()
    for ref in reference:
        assert ref.type and len(ref.doc) > 10, ref
        cls = config_sections()[ref.section]
        field = {f.name: f for f in dataclasses.fields(cls)}[ref.key.split(".", 1)[1]]
        assert ref.default == getattr(cls(), field.name), ref.key  # the dataclass's own default
    by_key = {r.key: r for r in reference}
    assert by_key["model.attention"].choices == ("auto", "eager", "sdpa", "flash", "chunked")
    assert by_key["bucketing.max_buckets"].type == "int or one of 'auto'"


def test_the_validation_rules_land_on_real_keys():
    """Each ``require`` in workbench/config.py is read from the source and filed under the key it names."""
    rules = validation_rules()
    keys = set(_dataclass_keys())
    sections = {f"{s}.*" for s in config_sections()}
    assert set(rules) <= keys | sections, set(rules) - keys - sections
    by_key = {r.key: r for r in config_reference()}
    assert "must be >= 1" in by_key["train.steps"].rules
    assert "must divide hidden_size" in by_key["model.num_heads"].rules  # the interpolated value dropped
    assert "must be in [0, 0.5]" in by_key["data.eval_fraction"].rules  # a check on one field
    assert any("must be <= model.max_position_embeddings" in r for r in by_key["data.max_length"].rules)
    assert any("lora.rank >= 1" in r for r in by_key["train.dpo_reference"].rules)  # a cross-section check
    assert rules["mesh.*"] == ["at most one axis may be -1"]  # 'axes' is no field: kept with its section
    # a key the validation checks for range shows it; the loops over names reach every one of them
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
        assert "must be >= 1" in by_key[f"model.{name}"].rules, name


def test_the_cli_page_lists_every_command_and_argument():
    from workbench.__main__ import build_parser

    page = workbench_reference.cli_markdown()
    commands = workbench_reference._subcommands(build_parser())
    assert {name for name, _, _ in commands} >= {"train", "eval", "generate", "doctor", "config", "info"}
    for name, _, parser in commands:
        section = page.split(f"## `{name}`\n", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in section or f", {flag}" in section, (name, flag)


def test_the_metrics_page_lists_every_documented_key():
    from workbench.analysis.metrics import INTERVAL_KEYS, METRIC_KEYS, IntervalMetrics, RunMetrics
    from workbench.config_reference import attribute_docs

    page = workbench_reference.metrics_markdown()
    rows = re.findall(r"^\| `([a-z_]+)` \|", page, flags=re.MULTILINE)
    assert rows == list(METRIC_KEYS)
    docs = {**attribute_docs(IntervalMetrics), **attribute_docs(RunMetrics)}
    assert set(docs) == set(METRIC_KEYS), set(METRIC_KEYS) - set(docs)  # the contract documents every key
    assert f"## Per interval: `IntervalMetrics`\n\n{len(INTERVAL_KEYS)} keys" in page


def test_the_pages_are_written_only_when_they_change(tmp_path):
    written = workbench_reference.write_reference(tmp_path)
    assert sorted(p.name for p in written) == ["cli.md", "config.md", "metrics.md"]
    assert workbench_reference.write_reference(tmp_path) == []
    assert (tmp_path / "reference" / "config.md").read_text() == workbench_reference.config_markdown()


@pytest.mark.parametrize("page", workbench_reference.PAGES)
def test_the_generated_pages_are_ignored_by_git(page):
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert f"docs/reference/{page}.md" in ignored
