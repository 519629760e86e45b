"""configs/grpo-*.yaml, GRPO recipes for the hardware users have, and ``python -m workbench plan``.

Each recipe is checked on its model's exact published shape (a config.json of `bench/real_shapes.py`,
no weights): it names that checkpoint's Hub id and loads with the path pointed at the shape; its estimate through the Python
API (`estimate` with `config_settings(cfg)`) fits the chip its header names with the estimator's
headroom, and the GiB figure the header quotes is the estimate's; `plan` on the command line says the
same and exits 0. The issue's shapes: Qwen2.5-0.5B at 2 prompts x 8 x 1024 completion tokens within
8 GiB of a v5e-1 chip, Gemma-2-2B at one prompt x 8 x 512 per chip on a v5e-8, Llama-3.1-8B int4 at one
prompt x 8 x 512 within 14.4 GiB of a v5e-1. docs/how-to/grpo.md's GRPO command fits the chip its
recipe names. And `plan` itself: its exit codes, every breakdown part printed, GRPO's two peaks, and
its count of warm-up programs against a real run's (tests/xla/grpo_early_stop.py's 8).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from bench.real_shapes import real_config
from tests.conftest import REPO
from workbench.analysis.estimate import config_settings, estimate, estimate_attention
from workbench.backend.targets import TARGETS
from workbench.config import WorkbenchConfig, load_config
from workbench.hub.ids import parse_hub_id
from workbench.parallel.mesh import MeshSpec
from workbench.units import GiB

# file -> (its shape in bench/real_shapes.py, the chip it is written for, the issue's bound in GiB)
RECIPES: dict[str, tuple[str, str, float]] = {
    "grpo-qwen2.5-0.5b-v5e-1.yaml": ("qwen2.5-0.5b", "v5e-1", 8.0),
    "grpo-gemma-2-2b-v5e-8.yaml": ("gemma-2-2b", "v5e-8", 14.4),
    "grpo-llama-3.1-8b-int4-v5e-1.yaml": ("llama-3.1-8b", "v5e-1", 14.4),
}
FIGURE = re.compile(r"^# (v5e-[18]) (\d+\.\d) GiB", re.MULTILINE)
PLAN_TOTAL = re.compile(r"^  total (\d+\.\d\d) GiB .*: (fits|DOES NOT FIT)$", re.MULTILINE)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grpo-shapes")
    out = {}
    for shape, _, _ in RECIPES.values():
        real_config(shape).save_pretrained(str(root / shape))
        out[shape] = root / shape
    return out


def _estimate(cfg: WorkbenchConfig, chip: str):
    """The step's estimate on `chip` through the Python API, as the trainer sets it up there."""
    target = TARGETS[chip]
    mesh = MeshSpec.from_config(cfg.mesh).resolve(target.num_devices) if cfg.mesh.enabled else None
    longest = cfg.data.max_length + cfg.grpo.max_completion_length
    return estimate(
        cfg.model,
        batch_size=cfg.train.batch_size,
        seq_len=cfg.data.max_length,
        mesh=mesh,
        memory_bytes=target.memory_per_device_bytes,
        attention=estimate_attention(cfg.model.attention, target, seq_len=longest, model_config=cfg.model),
        **config_settings(cfg),
    )


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_recipe_fits_its_chip_by_the_estimate_and_by_plan(name, shapes, capsys):
    from workbench.__main__ import main

    shape, chip, bound = RECIPES[name]
    path = REPO / "configs" / name
    text = path.read_text()
    hub_id = parse_hub_id(load_config(path).model.pretrained_path)  # as written: the published checkpoint
    assert hub_id is not None and hub_id.repo_id.split("/")[1].lower().startswith(shape), hub_id
    fill = f"model.pretrained_path={shapes[shape]}"  # the same shape, made here
    cfg = load_config(path, [fill])
    assert cfg.train.objective == "grpo" and cfg.lora.rank == 16 and cfg.train.gradient_checkpointing
    assert cfg.grpo.num_generations == 8
    est = _estimate(cfg, chip)
    memory = TARGETS[chip].memory_per_device_bytes
    assert est.fits(memory, headroom=0.1) and est.total_bytes <= bound * GiB, est.table()
    assert est.loss_chunk_positions is not None  # the logits a chunk of completion positions at a time
    assert dict(FIGURE.findall(text)) == {chip: f"{est.total_gib:.1f}"}, est.table()
    # the header's own commands: train and plan, each on this file
    commands = [shlex.split(c) for c in re.findall(r"^#\s+(python -m workbench .*)$", text, re.MULTILINE)]
    assert [c[3] for c in commands] == ["train", "plan"] and all(c[5] == f"configs/{name}" for c in commands)
    assert main(["plan", "--config", str(path), fill, "--chip", chip]) == 0
    out = capsys.readouterr().out
    assert PLAN_TOTAL.findall(out) == [(f"{est.total_bytes / GiB:.2f}", "fits")], out
    assert "GRPO: rollout peak" in out and "largest train.batch_size that fits: " in out


def test_the_issues_grpo_shapes_fit_their_chips(shapes):
    """The shapes of the issue as a new user would try them (bf16, LoRA r16, flash attention on a TPU,
    checkpointing, 256-token prompts, G = 8), on the defaults otherwise (train.loss_chunk_tokens auto)."""
    common = {
        "train.objective": "grpo",
        "train.precision": "bf16",
        "train.gradient_checkpointing": True,
        "lora.rank": 16,
        "data.max_length": 256,
        "grpo.num_generations": 8,
    }
    cases = [  # shape, prompts, completion tokens, base, mesh, chip, bound (GiB)
        ("qwen2.5-0.5b", 2, 1024, "none", {}, "v5e-1", 8.0),
        ("gemma-2-2b", 8, 512, "none", {"mesh.enabled": True, "mesh.data": 8}, "v5e-8", 14.4),
        ("llama-3.1-8b", 1, 512, "int4", {}, "v5e-1", 14.4),
    ]
    for shape, prompts, completion, base, mesh, chip, bound in cases:
        cfg = WorkbenchConfig().with_overrides(
            {
                **common,
                **mesh,
                "model.pretrained_path": str(shapes[shape]),
                "model.quantize": base,
                "train.batch_size": prompts,
                "grpo.max_completion_length": completion,
            }
        )
        est = _estimate(cfg, chip)
        assert est.per_device_batch == 1 if mesh else prompts
        assert est.total_bytes <= bound * GiB and est.fits(TARGETS[chip].memory_per_device_bytes), (
            shape,
            est.table(),
        )


def test_the_how_to_recipe_fits_the_chip_it_names(shapes):
    text = (REPO / "docs" / "how-to" / "grpo.md").read_text()
    commands = [
        shlex.split(line.rstrip("\\").strip())
        for line in re.findall(r"^(python -m workbench train --config configs/grpo-.*)$", text, re.MULTILINE)
    ]
    assert commands, "the how-to trains with a GRPO recipe"
    for words in commands:
        name = Path(words[5]).name
        shape, chip, _ = RECIPES[name]
        overrides = [
            f"model.pretrained_path={shapes[shape]}" if w.startswith("model.pretrained_path=") else w
            for w in words[6:]
            if "=" in w and not w.startswith("-")
        ]
        cfg = load_config(REPO / "configs" / name, overrides)
        assert _estimate(cfg, chip).fits(TARGETS[chip].memory_per_device_bytes), words


# ---- plan ------------------------------------------------------------------------------------------


def test_plan_reads_an_adapters_shape_from_its_base(shapes, tmp_path, capsys):
    """The how-to's GRPO command starts from an SFT adapter: plan prices its base's shape."""
    import json

    from workbench.__main__ import main

    adapter = tmp_path / "sft-adapter"
    adapter.mkdir()
    base = shapes["qwen2.5-0.5b"]
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 16, "base_model_name_or_path": str(base)}))
    recipe = str(REPO / "configs" / "grpo-qwen2.5-0.5b-v5e-1.yaml")
    totals = []
    for path in (adapter, base):
        assert main(["plan", "--config", recipe, f"model.pretrained_path={path}", "--chip", "v5e-1"]) == 0
        totals.append(PLAN_TOTAL.findall(capsys.readouterr().out))
    assert totals[0] == totals[1] and totals[0][0][1] == "fits"


def test_plan_prints_every_part_and_exits_by_the_fit(shapes, capsys):
    from workbench.__main__ import main
    from workbench.plan_command import plan_chip, plan_target

    small = ["train.objective=grpo", "data.max_length=64", "grpo.max_completion_length=64", "lora.rank=4"]
    assert main(["plan", *small, "--chip", "v5e-1", "--chip", "H100-80GB"]) == 0
    out = capsys.readouterr().out
    cfg = WorkbenchConfig().with_overrides(small)
    est = plan_chip(cfg, plan_target("v5e-1")).estimate
    for key, value in est.breakdown.items():  # every part the estimate has, whatever it is
        assert (f"  {key} " in out) == bool(value), key
    assert out.count("GRPO: rollout peak") == 2 and "\nH100 (1 × " in out
    # too big for a chip: exit 1, and the largest batch that would fit
    big = [f"model.pretrained_path={shapes['gemma-2-2b']}", "train.batch_size=64", "train.precision=bf16"]
    assert main(["plan", *big, "--chip", "v5e-1"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "largest train.batch_size that fits:" in out
    # a bad override, a bad chip: exit 2 with one line naming it
    assert main(["plan", "train.batch_size=0"]) == 2
    assert "train.batch_size" in capsys.readouterr().err
    assert main(["plan", "--chip", "v9z-1"]) == 2
    assert "--chip 'v9z-1' is not allowed: one of v5e-1" in capsys.readouterr().err


def test_plan_counts_the_programs_a_real_warm_up_compiled():
    """tests/xla/grpo_early_stop.py's run (2 devices, data=2, two micro-steps a rollout, one bucket, no
    eval) compiled 8 programs in warm-up: prefill, decode step, layout, the read's gather, the cut into
    micro-steps, the micro-step, the last with the update, and the state put back."""
    from workbench.plan_command import plan_target, warmup_programs

    cfg = WorkbenchConfig().with_overrides(
        {
            "train.objective": "grpo",
            "bucketing.max_buckets": 1,
            "data.max_length": 64,
            "grpo.max_completion_length": 128,
            "train.grad_accum": 2,
            "mesh.enabled": True,
            "mesh.data": 2,
            "train.device_type": "xla",
        }
    )
    programs, note = warmup_programs(cfg, plan_target("v5e-8"), sharded=True)
    assert programs == 8, note
    eager, note = warmup_programs(
        cfg.with_overrides({"train.device_type": "cpu"}), plan_target("cpu"), sharded=False
    )
    assert eager is None and "eagerly" in note
