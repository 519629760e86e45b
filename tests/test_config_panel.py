"""The config panel, driven from Python the way a browser drives it: values set on the widgets."""

from __future__ import annotations

import ast
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from widgets.config_controls import TOOLTIP
from widgets.config_panel import ConfigPanel, measure_redraw
from workbench.analysis.estimate import estimate, model_shape
from workbench.backend.hardware import CHIPS, HardwareInfo
from workbench.backend.targets import TARGETS, mesh_factorisations
from workbench.config import ConfigError, ModelConfig, WorkbenchConfig
from workbench.models.presets import MODEL_PRESETS

GiB = 1024**3

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture(scope="module")
def lengths():
    """Token lengths of the real default corpus (the tokenizer is trained once and cached)."""
    from workbench.data.records import build_datasets

    cfg = WorkbenchConfig().with_overrides({"data.max_examples": 600})
    train_ds, _, _ = build_datasets(cfg)
    return list(train_ds["length"])


@pytest.fixture
def panel(lengths):
    return ConfigPanel(WorkbenchConfig(), target="v5e-8", lengths=lengths)


def test_mesh_factorisations():
    assert mesh_factorisations(1) == [(1, 1, 1)]
    eight = mesh_factorisations(8)
    assert len(eight) == 10 and len(set(eight)) == 10
    assert all(d * f * m == 8 for d, f, m in eight)
    assert eight[0] == (8, 1, 1)
    with pytest.raises(ValueError, match="num_devices"):
        mesh_factorisations(0)


def test_only_factorisations_of_the_device_count_are_offered(panel):
    offered = [value for _, value in panel.mesh.options]
    assert offered == mesh_factorisations(8)
    panel.set(mesh=(2, 2, 2))
    with pytest.raises(ValueError, match="not allowed on 8 devices"):
        panel.set(mesh=(2, 2, 1))
    panel.set(target="v4-8")  # 4 megacore chips = 4 devices
    offered = [value for _, value in panel.mesh.options]
    assert offered == mesh_factorisations(4) and all(d * f * m == 4 for d, f, m in offered)
    panel.set(target="v5e-1")
    assert [value for _, value in panel.mesh.options] == [(1, 1, 1)]
    assert panel.config.mesh.enabled is False and panel.config.mesh.data == 1


def test_estimate_changes_when_the_batch_changes(panel):
    before_bytes = panel.estimate.total_bytes
    before_text = panel.estimate_html.value
    panel.batch_size.value = 64
    assert panel.estimate.total_bytes > before_bytes
    assert panel.estimate_html.value != before_text
    # The panel shows exactly what the estimator says for that config on that mesh.
    cfg = panel.config
    direct = estimate(
        cfg.model,
        batch_size=64,
        seq_len=cfg.data.max_length,
        optimizer=cfg.train.optimizer,
        precision=cfg.train.precision,
        mesh={"data": 8, "fsdp": 1, "model": 1},
        attention="flash",  # model.attention=auto on the panel's TPU target
    )
    assert panel.estimate.total_bytes == direct.total_bytes
    bars = {t.name: t.x[0] for t in panel.memory_figure.figure.data}
    assert sum(bars.values()) == pytest.approx(direct.total_bytes / 1024**3)


def test_the_attention_kernel_prices_the_scores_for_the_target(panel):
    panel.set(batch_size=8, seq_len=2048)
    assert panel.estimate.attention == "flash" and panel.estimate.scores_bytes == 0  # auto on a v5e-8
    assert "Attention <b>flash</b> (auto): no scores instead of" in panel.attention_html.value
    flash_total = panel.estimate.total_bytes
    panel.set(attention="eager")
    assert panel.config.model.attention == "eager"
    eager = panel.estimate
    assert eager.scores_bytes == eager.eager_scores_bytes > 0
    # eager adds its saved scores, and its backward temporaries beyond the (freed) logits
    assert flash_total < eager.total_bytes <= flash_total + eager.scores_bytes
    assert "Attention <b>eager</b>: scores" in panel.attention_html.value
    panel.set(attention="chunked")  # every layer's T x T scores → one query block's
    chunked = panel.estimate
    assert 0 < chunked.scores_bytes < eager.scores_bytes
    assert "one query block's scores" in panel.attention_html.value
    panel.set(target="H100", attention="auto")  # a GPU: torch's fused kernels
    assert panel.estimate.attention == "sdpa"
    panel.set(attention="flash")  # Pallas kernels need a TPU: the panel says so instead of an estimate
    assert "model.attention='flash' is not allowed" in panel.error
    assert panel.estimate.attention == "sdpa"  # the last valid estimate stands


def test_browser_style_state_change_fires_callbacks(panel):
    seen = []
    panel.on_change(seen.append)
    panel.batch_size.set_state({"value": 24})  # what a slider move in the page sends
    assert seen and seen[-1].train.batch_size == 24
    panel.set(optimizer="sgd")
    assert seen[-1].train.optimizer == "sgd"
    assert (
        panel.estimate.breakdown["optimizer"]
        < estimate(
            panel.config.model,
            batch_size=24,
            seq_len=panel.config.data.max_length,
            mesh={"data": 8, "fsdp": 1, "model": 1},
        ).breakdown["optimizer"]
    )


def test_a_batch_that_does_not_split_is_refused_not_crashed(panel):
    good = panel.config
    seen = []
    panel.on_change(seen.append)
    panel.batch_size.value = 12  # data=8 cannot split 12 sequences
    assert panel.error and "multiple of 8" in panel.error
    assert "multiple of 8" in panel.error_html.value
    assert panel.config is good and not seen
    panel.batch_size.value = 16
    assert panel.error is None and panel.config.train.batch_size == 16 and seen


def test_fits_sign_and_largest_batch(lengths):
    panel = ConfigPanel(WorkbenchConfig(), target="T4", lengths=lengths)
    assert "✔ fits" in panel.fits_html.value
    panel.set(model_size="Llama-2-7B shape", seq_len=4096, precision="fp32")
    assert "does not fit" in panel.fits_html.value and panel.largest_batch == 0
    panel.set(model_size="~125M (llama, 768×12)", seq_len=1024, precision="bf16-mixed")
    cfg, limit = panel.config, TARGETS["T4"].memory_per_device_bytes
    largest = panel.largest_batch
    assert largest > 0 and f"<b>{largest}</b>" in panel.max_batch_html.value
    kwargs = dict(
        seq_len=1024,
        optimizer="adamw",
        precision="bf16-mixed",
        mesh={"data": 1, "fsdp": 1, "model": 1},
        attention="sdpa",  # model.attention=auto on a GPU
    )
    assert estimate(cfg.model, batch_size=largest, **kwargs).fits(limit, 0.1)
    assert not estimate(cfg.model, batch_size=largest + 1, **kwargs).fits(limit, 0.1)


def test_bucket_preview_follows_the_bucket_count(panel, lengths):
    from workbench.data.buckets import plan_buckets

    panel.set(buckets=2)
    two = panel.plan
    expected = plan_buckets(
        [min(n, 256) for n in lengths], 2, multiple_of=8, max_length=256, strategy="optimal"
    )
    assert two.boundaries == expected.boundaries
    assert len(panel.length_figure.figure.layout.shapes) == len(two.boundaries)
    panel.set(buckets=6)
    six = panel.plan
    assert len(six.boundaries) > len(two.boundaries) and six.efficiency >= two.efficiency
    assert [s.x0 for s in panel.length_figure.figure.layout.shapes] == six.boundaries
    assert f"{100 * six.efficiency:.1f}%" in panel.buckets_html.value
    assert sum(panel.length_figure.figure.data[0].y) == len(lengths)  # binned in Python: 60 bars


def test_config_and_yaml_round_trip(panel):
    panel.set(
        batch_size=32, seq_len=512, grad_accum=4, gradient_checkpointing=True, buckets=5, mesh=(2, 4, 1)
    )
    cfg = panel.config
    assert (cfg.train.batch_size, cfg.data.max_length, cfg.train.grad_accum) == (32, 512, 4)
    assert (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.model, cfg.mesh.enabled) == (2, 4, 1, True)
    assert cfg.train.gradient_checkpointing and cfg.bucketing.max_buckets == 5
    assert WorkbenchConfig.from_yaml(panel.yaml).to_dict() == cfg.to_dict()
    assert "batch_size: 32" in panel.yaml_html.value


def test_the_panel_builds_on_the_ipywidgets_it_finds(panel):
    # ipywidgets 7.7 (Colab's, which its frontend draws) and 8 name a control's hover text
    # differently; the YAML folds in plain HTML, which every widget manager draws.
    hover = [getattr(control, TOOLTIP) for control in panel.memory_saving.widgets]
    assert all("(model." in text or "(train." in text for text in hover), hover
    assert panel.yaml_html.value.startswith("<details><summary>Config YAML</summary>")
    assert panel.yaml_html in panel.widget.children


def test_bad_names_are_refused(panel):
    with pytest.raises(ValueError, match="v5e-8"):
        ConfigPanel(WorkbenchConfig(), target="tpu-v99", lengths=[10, 20])
    with pytest.raises(ValueError, match="unknown control"):
        panel.set(batchsize=3)
    with pytest.raises(ValueError, match="positive"):
        ConfigPanel(WorkbenchConfig(), target="v5e-1", lengths=[0, 5])


def test_one_change_redraws_in_under_100_ms(panel):
    panel.refresh()  # first draw done; what is measured is a user's change
    changes = [
        {"batch_size": 16},
        {"batch_size": 32},
        {"seq_len": 512},
        {"grad_accum": 2},
        {"optimizer": "adafactor"},
        {"precision": "bf16"},
        {"gradient_checkpointing": True},
        {"mesh": (2, 2, 2)},
        {"buckets": 6},
        {"buckets": 3},
        {"model_size": "Llama-3.2-1B shape"},
        {"target": "v6e-1"},
    ]
    # The redraw's own CPU time: the suite runs in parallel workers, so wall time on a busy machine
    # measures the scheduler as much as the panel.
    times = measure_redraw(panel, changes, clock=time.thread_time)
    ARTIFACTS.mkdir(exist_ok=True)
    record = {
        "changes": [next(iter(c)) for c in changes],
        "ms": [round(t, 2) for t in times],
        "median_ms": round(statistics.median(times), 2),
        "max_ms": round(max(times), 2),
    }
    (ARTIFACTS / "config_panel_redraw.json").write_text(json.dumps(record, indent=2))
    print("config panel redraw (ms):", record)
    assert statistics.median(times) < 100, record


def _hardware(backend: str, via_xla: bool, chip: str, num_devices: int) -> HardwareInfo:
    spec = CHIPS.get(chip)  # None for "cpu": no device memory figure
    return HardwareInfo(
        backend=backend,
        via_xla=via_xla,
        device_kind=chip,
        chip=chip,
        num_devices=num_devices,
        local_devices=num_devices,
        num_processes=1,
        process_index=0,
        memory_per_device_bytes=None if spec is None else spec.hbm_bytes // spec.devices_per_chip,
        peak_bf16_flops_per_device=None,
        host_memory_bytes=32 * GiB,
        platform="kaggle",
    )


def test_detected_gpus_without_xla_are_planned_as_one_device(lengths):
    # Kaggle T4 x2 without torch_xla: the trainer applies no mesh and runs the batch on one GPU.
    t4x2 = _hardware("cuda", via_xla=False, chip="t4", num_devices=2)
    panel = ConfigPanel(WorkbenchConfig(), target=t4x2, lengths=lengths)
    assert panel.target.num_devices == 1 and "1 of 2" in panel.target.label
    assert [value for _, value in panel.mesh.options] == [(1, 1, 1)]
    assert panel.config.mesh.enabled is False
    # ... so the estimate is for the whole batch on one device.
    cfg = panel.config
    alone = estimate(
        cfg.model,
        batch_size=cfg.train.batch_size,
        seq_len=cfg.data.max_length,
        precision=cfg.train.precision,
        attention="sdpa",  # model.attention=auto on a GPU
    )
    assert panel.estimate.total_bytes == alone.total_bytes
    assert panel.config_for(t4x2).to_dict() == cfg.to_dict()
    # Under XLA every device is in the mesh.
    v5e4 = _hardware("tpu", via_xla=True, chip="v5e", num_devices=4)
    assert ConfigPanel(WorkbenchConfig(), target=v5e4, lengths=lengths).target.num_devices == 4


def test_config_for_adapts_the_mesh_and_refuses_an_invalid_panel(panel):
    panel.set(mesh=(2, 4, 1), batch_size=16)
    on_slice = panel.config_for(_hardware("tpu", via_xla=True, chip="v5e", num_devices=8))
    assert (on_slice.mesh.enabled, on_slice.mesh.data, on_slice.mesh.fsdp) == (True, 2, 4)
    # Trained on another machine than the panel planned for: the mesh follows that machine.
    on_cpu = panel.config_for(_hardware("cpu", via_xla=False, chip="cpu", num_devices=1))
    assert on_cpu.mesh.enabled is False and on_cpu.train.batch_size == 16
    on_v4 = panel.config_for(_hardware("tpu", via_xla=True, chip="v4", num_devices=4))
    assert (on_v4.mesh.enabled, on_v4.mesh.data, on_v4.mesh.fsdp, on_v4.mesh.model) == (True, -1, 1, 1)
    panel.batch_size.value = 12  # does not split over data x fsdp = 8
    with pytest.raises(ConfigError, match="multiple of 8"):
        panel.config_for(_hardware("tpu", via_xla=True, chip="v5e", num_devices=8))


def test_a_failing_redraw_keeps_config_and_yaml_and_shows_the_error(panel, monkeypatch):
    before, yaml_before, shown_before = panel.config, panel.yaml, panel.yaml_html.value
    seen = []
    panel.on_change(seen.append)

    def broken_draw(*args, **kwargs):
        raise RuntimeError("plotly went away")

    monkeypatch.setattr(panel, "_draw", broken_draw)
    panel.set(batch_size=32)  # no exception escapes the observer
    assert panel.config is before and panel.yaml == yaml_before and panel.yaml_html.value == shown_before
    assert panel.error == "RuntimeError: plotly went away"
    assert "plotly went away" in panel.error_html.value and not seen
    monkeypatch.undo()
    panel.set(batch_size=24)
    assert panel.error is None and panel.config.train.batch_size == 24 and seen


def test_an_unreadable_pretrained_path_is_shown_not_raised(tmp_path, lengths):
    cfg = WorkbenchConfig().with_overrides({"model.pretrained_path": str(tmp_path / "no-such-checkpoint")})
    panel = ConfigPanel(cfg, target="v5e-1", lengths=lengths)
    assert panel.error and panel.error.startswith("OSError: ")
    assert "no-such-checkpoint" in panel.error_html.value
    with pytest.raises(ConfigError, match="no-such-checkpoint"):
        panel.config_for(_hardware("tpu", via_xla=True, chip="v5e", num_devices=1))


def test_presets_leave_the_vocabulary_to_the_tokenizer(panel):
    assert all("vocab_size" not in preset for preset in MODEL_PRESETS.values())
    base_vocab = panel.config.model.vocab_size
    panel.set(model_size="Llama-3.2-1B shape")
    assert panel.config.model.hidden_size == 2048 and panel.config.model.vocab_size == base_vocab


def test_a_pretrained_model_fixes_the_model_size(tmp_path, lengths):
    import transformers as tf

    checkpoint = tmp_path / "checkpoint"
    tf.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=1000,
    ).save_pretrained(checkpoint)  # fmt: skip
    cfg = WorkbenchConfig().with_overrides({"model.pretrained_path": str(checkpoint)})
    panel = ConfigPanel(cfg, target="v5e-1", lengths=lengths)
    assert panel.error is None and panel.model_size.disabled
    with pytest.raises(ValueError, match="pretrained_path"):
        panel.set(model_size="Llama-2-7B shape")
    assert panel.config.model.hidden_size == cfg.model.hidden_size
    # The estimate is the checkpoint's own shape (its vocabulary), not the config's size fields.
    own = tf.LlamaConfig.from_pretrained(checkpoint)
    assert panel.estimate.num_parameters == model_shape(own).num_parameters
    logits = estimate(
        own, batch_size=cfg.train.batch_size, seq_len=cfg.data.max_length, precision=cfg.train.precision
    ).breakdown["logits"]
    assert panel.estimate.breakdown["logits"] == logits


def test_redraw_times_are_bounded(panel):
    for _ in range(120):
        panel.refresh()
    assert len(panel.redraw_ms) == 100


def test_targets_and_presets_are_headless():
    # Scripts and the CLI plan with them: importing them must not pull in the UI stack.
    code = (
        "import sys\n"
        "import workbench.backend.targets, workbench.models.presets\n"
        "ui = sorted(m for m in sys.modules if m.split('.')[0] in ('ipywidgets', 'plotly', 'widgets'))\n"
        "print(ui)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_presets_are_model_config_fields():
    fields = set(ModelConfig.__dataclass_fields__)
    for name, preset in MODEL_PRESETS.items():
        assert set(preset) <= fields, name
        cfg = WorkbenchConfig().with_overrides({f"model.{k}": v for k, v in preset.items()})
        assert cfg.model.hidden_size == preset["hidden_size"]


def _public_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_no_widgets_name_is_defined_twice():
    # Each public name has one home: a widgets module neither re-exports nor shadows another's.
    root = Path(__file__).resolve().parent.parent
    homes: dict[str, list[str]] = {}
    for package in ("workbench", "widgets"):
        for path in sorted((root / package).rglob("*.py")):
            for name in _public_names(path):
                homes.setdefault(name, []).append(str(path.relative_to(root)))
    twice = {n: h for n, h in homes.items() if len(h) > 1 and any(p.startswith("widgets") for p in h)}
    assert not twice, twice


def test_lora_rank_makes_a_7b_model_fit_a_v5e_1(lengths):
    """Llama-2-7B's shape (vocabulary 32000) on one v5e chip, bf16 weights, AdamW, gradient
    checkpointing, 512 tokens, batch 1: full fine-tuning does not fit; LoRA rank 16 does (the checkpoints
    kept on the chip: tests/test_offload.py has the panel with them offloaded)."""
    cfg = WorkbenchConfig().with_overrides({"model.vocab_size": 32000, "train.offload_activations": "off"})
    panel = ConfigPanel(cfg, target="v5e-1", lengths=lengths)
    assert panel.lora_rank.value == 0 and 0 in [v for _, v in panel.lora_rank.options]
    panel.set(
        model_size="Llama-2-7B shape",
        precision="bf16",
        gradient_checkpointing=True,
        seq_len=512,
        batch_size=1,
        optimizer="adamw",
    )
    assert panel.error is None
    assert "does not fit" in panel.fits_html.value and panel.largest_batch == 0
    assert "Full fine-tuning" in panel.trainable_html.value
    panel.set(lora_rank=16)
    assert panel.error is None and panel.config.lora.rank == 16 and "rank: 16" in panel.yaml
    assert "✔ fits" in panel.fits_html.value and panel.largest_batch == 2
    assert (
        panel.estimate.lora_rank == 16
        and panel.estimate.trainable_parameters < 0.01 * panel.estimate.num_parameters
    )
    assert "LoRA rank 16: <b class='wb-trainable-value'>39.98M</b>" in panel.trainable_html.value
    # the panel shows what the estimator says for that config
    direct = estimate(
        panel.config.model,
        batch_size=1,
        seq_len=512,
        precision="bf16",
        gradient_checkpointing=True,
        lora_rank=16,
        attention="flash",  # model.attention=auto on a TPU
    )
    assert panel.estimate.total_bytes == direct.total_bytes
    panel.set(lora_rank=0)
    assert "does not fit" in panel.fits_html.value


# ---- the memory bar's scale ----------------------------------------------------------
def _memory_bar(fig) -> dict:
    """What the page draws (the view's synced look): axis end, estimate, the marks named "limit"."""
    layout, data = fig.look["layout"], fig.look["styles"]
    return {
        "top": layout["xaxis"]["range"][1],
        "segments": [t["x"][0] for t in data],
        "limit_shapes": [s for s in layout.get("shapes", []) if s.get("name") == "limit"],
        "over_zone": [s for s in layout.get("shapes", []) if s.get("name") == "over the limit"],
        "limit_labels": [a for a in layout.get("annotations", []) if a.get("name") == "limit"],
        "ticks": layout["xaxis"].get("ticktext"),
    }


def test_a_100_mib_estimate_on_a_16_gib_chip_is_readable(lengths):
    """The issue's case: the axis zooms to the estimate, which fills most of it (not 0.6%),
    every segment of note is wide enough to see, and an arrow points to the 16 GiB limit."""
    panel = ConfigPanel(WorkbenchConfig(), target="v5e-1", lengths=lengths)
    panel.set(batch_size=16)
    total, limit = panel.estimate.total_bytes, TARGETS["v5e-1"].memory_per_device_bytes
    assert 60 * 2**20 < total < 150 * 2**20 and limit == 16 * GiB
    bar = _memory_bar(panel.memory_figure)
    assert sum(bar["segments"]) == pytest.approx(total / GiB)
    assert sum(bar["segments"]) / bar["top"] == pytest.approx(0.8)  # it was 0.006 on a 0..17.3 axis
    for part, size in panel.estimate.breakdown.items():
        if size >= 0.05 * total:
            assert size / GiB / bar["top"] > 0.04, part
    assert bar["top"] < limit / GiB and not bar["limit_shapes"]  # the limit is off the axis ...
    (label,) = bar["limit_labels"]  # ... and named at its right edge
    assert label["text"] == "axis zoomed · limit 16.00 GiB →"
    assert (label["xref"], label["x"], label["xanchor"]) == ("paper", 1, "right")
    assert bar["ticks"][0] == "0" and all(t.endswith(" MiB") for t in bar["ticks"][1:])
    assert panel.memory_figure.figure.data[0].hovertemplate.startswith("params: ")


@pytest.mark.parametrize("share", [0.001, 0.05, 0.5, 0.71, 0.75, 0.79, 0.81, 0.9, 1.0, 1.3, 4.0])
def test_the_estimate_spans_most_of_the_axis_and_the_limit_is_always_marked(share):
    """At any estimate / limit ratio: zoomed (the estimate fills 80%, the limit named at the
    edge, the usable memory dotted once it is inside the axis) below 80% of the limit; from there
    the full scale with the limit drawn where it is, the usable memory dotted, past it shaded."""
    from widgets.config_figures import FULL_MARGIN, ZOOM_FILL, draw_memory, new_memory_figure

    est = estimate(WorkbenchConfig().model, batch_size=16, seq_len=256)
    limit = int(est.total_bytes / share)
    fig = new_memory_figure()
    draw_memory(fig, est, limit, headroom=0.1)
    bar = _memory_bar(fig)
    assert sum(bar["segments"]) / bar["top"] >= ZOOM_FILL / FULL_MARGIN - 1e-9
    (label,) = bar["limit_labels"]
    assert (
        f"limit {limit / GiB:.2f} GiB" in label["text"] or f"limit {limit / 2**20:.2f} MiB" in label["text"]
    )
    usable = [s for s in fig.figure.layout.shapes if s.name == "usable"]
    # the usable memory (90% of the limit) is on a zoomed axis from 72% of the limit on
    assert bool(usable) == (share > 0.72) and all(u.x0 == pytest.approx(0.9 * limit / GiB) for u in usable)
    if share < 0.8:
        assert label["text"].endswith("→") and bar["top"] < limit / GiB and not bar["limit_shapes"]
        assert not bar["over_zone"]
    else:
        (line,) = bar["limit_shapes"]
        assert line["x0"] == line["x1"] == pytest.approx(limit / GiB) and line["x0"] < bar["top"]
        assert label["x"] == pytest.approx(limit / GiB) and label["xref"] == "x"
        (zone,) = bar["over_zone"]
        assert (zone["x0"], zone["x1"]) == (pytest.approx(limit / GiB), pytest.approx(bar["top"]))
    assert ("over" in label["text"]) == (share > 1)


def test_a_7b_model_on_a_v5e_1_shows_the_oom(lengths):
    """Full fine-tuning of Llama-2-7B's shape on one 16 GiB chip: full scale, the limit line
    inside the bar, the memory past it shaded, and by how much it is over."""
    panel = ConfigPanel(
        WorkbenchConfig().with_overrides({"model.vocab_size": 32000}), target="v5e-1", lengths=lengths
    )
    panel.set(
        model_size="Llama-2-7B shape",
        precision="bf16",
        gradient_checkpointing=True,
        seq_len=512,
        batch_size=1,
    )
    total, limit = panel.estimate.total_bytes, 16 * GiB
    assert total > limit
    bar = _memory_bar(panel.memory_figure)
    (line,) = bar["limit_shapes"]
    assert line["x0"] == pytest.approx(limit / GiB) and line["x0"] < sum(bar["segments"]) <= bar["top"]
    assert bar["over_zone"] and bar["ticks"][-1].endswith(" GiB")
    (label,) = bar["limit_labels"]
    over = (total - limit) / GiB
    assert label["text"] == f"limit 16.00 GiB · ✘ {over:.2f} GiB over"


def test_without_a_memory_figure_the_axis_fits_the_estimate(lengths):
    """Memory unknown (a plain CPU): no limit to mark, the estimate fills the axis to 1/1.08."""
    from widgets.config_figures import draw_memory

    panel = ConfigPanel(WorkbenchConfig(), target="v5e-1", lengths=lengths)
    draw_memory(panel.memory_figure, panel.estimate, None, 0.1)
    bar = _memory_bar(panel.memory_figure)
    assert sum(bar["segments"]) / bar["top"] == pytest.approx(1 / 1.08)
    assert not bar["limit_labels"] and not bar["limit_shapes"]


def test_auto_bucket_count_draws_the_trade_off_and_marks_the_choice(panel, lengths):
    from workbench.data.bucket_choice import choose_buckets
    from workbench.data.loader import training_epochs

    panel.set(buckets_auto=True, measure_costs=False, compile_seconds=5.0, token_us=20.0)
    cfg = panel.config
    assert cfg.bucketing.max_buckets == "auto" and cfg.bucketing.compile_seconds == 5.0
    assert cfg.bucketing.seconds_per_padded_token == pytest.approx(20e-6)
    assert WorkbenchConfig.from_yaml(panel.yaml) == cfg and "max_buckets: auto" in panel.yaml
    expected = choose_buckets(
        lengths,
        compile_seconds=5.0,
        seconds_per_padded_token=20e-6,
        epochs=training_epochs(lengths, cfg),
        multiple_of=8,
        max_length=256,
    )
    assert panel.plan.boundaries == expected.boundaries and panel.buckets.disabled
    assert [s.x0 for s in panel.length_figure.figure.layout.shapes] == expected.boundaries
    compile_bar, steps_bar, star, slider_mark = panel.tradeoff_figure.figure.data
    assert list(compile_bar.y) == pytest.approx([5.0 * k for k in compile_bar.x])
    totals = [c + s for c, s in zip(compile_bar.y, steps_bar.y)]
    assert list(star.x) == [expected.num_shapes] and star.y[0] == pytest.approx(min(totals))
    assert list(slider_mark.x) == []  # 'auto': no slider count to compare with
    assert f"picks <b>{expected.num_shapes}</b> shapes" in panel.tradeoff_html.value
    # dearer compiles never ask for more shapes; a browser moving the cost redraws the choice
    before = panel.plan.num_shapes
    panel.auto_buckets.compile_seconds.set_state({"value": 500.0})
    assert panel.plan.num_shapes <= before and panel.bucket_choice.compile_seconds == 500.0
    assert list(panel.tradeoff_figure.figure.data[2].x) == [panel.plan.num_shapes]


def test_a_fixed_bucket_count_is_compared_with_the_auto_choice(panel):
    panel.set(buckets_auto=False, buckets=12, measure_costs=True, compile_seconds=30.0, token_us=1.0)
    cfg = panel.config
    assert cfg.bucketing.max_buckets == 12 and not panel.buckets.disabled
    # "measure at run start": the config leaves both costs to the trainer
    assert cfg.bucketing.compile_seconds is None and cfg.bucketing.seconds_per_padded_token is None
    choice = panel.bucket_choice
    mark = panel.tradeoff_figure.figure.data[3]
    assert list(mark.x) == [12] and mark.y[0] == pytest.approx(choice.predicted_seconds(12))
    assert mark.y[0] >= choice.predicted_total_s  # the choice is the least predicted time
    assert "would pick" in panel.tradeoff_html.value and "measures them" in panel.tradeoff_html.value


# ---- a quantized base and a chunked loss ---------------------------------------------------
def test_quantize_and_loss_chunk_controls_change_the_estimate_and_the_config(lengths):
    """Llama-3.1-8B's shape (vocabulary 128256) on one v5e chip at 2048 tokens, bf16, checkpointing,
    LoRA rank 16: a bf16 base does not fit; int8 (and the 'auto' chunked loss) fits batch 5 (with
    flash attention, 'auto' on a TPU), the checkpoints kept on the chip."""
    cfg = WorkbenchConfig().with_overrides({"model.vocab_size": 128256, "train.offload_activations": "off"})
    panel = ConfigPanel(cfg, target="v5e-1", lengths=lengths)
    assert panel.memory_saving.quantize.value == "none" and panel.memory_saving.loss_chunk.value == "auto"
    seen = []
    panel.on_change(seen.append)
    panel.set(
        model_size="Llama-3.1-8B shape",
        precision="bf16",
        gradient_checkpointing=True,
        seq_len=2048,
        batch_size=2,
        lora_rank=16,
    )
    assert panel.error is None and "does not fit" in panel.fits_html.value and panel.largest_batch == 0
    assert "Base weights: <b>14.96 GiB</b>" in panel.quantize_html.value
    before = panel.estimate
    panel.memory_saving.quantize.set_state({"index": 1})  # what choosing 'int8' in the page sends
    assert panel.error is None and seen[-1].model.quantize == "int8" and "quantize: int8" in panel.yaml
    assert panel.estimate.total_bytes < before.total_bytes - 6 * GiB
    assert "✔ fits" in panel.fits_html.value and panel.largest_batch == 5  # flash: no scores
    assert (
        "<b>int8</b> base: 14.96 GiB → <b class='wb-quantized-value'>7.97 GiB</b>"
        in panel.quantize_html.value
    )
    # the panel shows what the estimator says for that config on that device
    kwargs = dict(
        seq_len=2048,
        precision="bf16",
        gradient_checkpointing=True,
        lora_rank=16,
        memory_bytes=16 * GiB,
        attention="flash",  # model.attention=auto on a TPU
    )
    direct = estimate(panel.config.model, batch_size=2, quantize="int8", **kwargs)
    assert panel.estimate.total_bytes == direct.total_bytes and panel.estimate.quantize == "int8"
    assert "Loss in chunks of <b>128</b> positions × 2 rows" in panel.loss_chunk_html.value
    panel.set(loss_chunk_tokens=0)  # never chunk: the whole [4096 x 128256] fp32 logits x 4
    assert panel.config.train.loss_chunk_tokens == 0 and seen[-1].train.loss_chunk_tokens == 0
    assert panel.estimate.breakdown["logits"] == 2 * 2048 * 128256 * 16 and panel.largest_batch == 1
    assert "does not fit" in panel.fits_html.value
    assert "Loss over the whole batch" in panel.loss_chunk_html.value
    panel.set(loss_chunk_tokens=512, quantize="int4")
    assert panel.config.train.loss_chunk_tokens == 512 and panel.config.model.quantize == "int4"
    assert panel.estimate.loss_chunk_positions == 256 and panel.estimate.breakdown["dequant"] > 0
    assert "dequant" in [t.name for t in panel.memory_figure.figure.data]
    assert WorkbenchConfig.from_yaml(panel.yaml).to_dict() == panel.config.to_dict()


def test_quantize_without_lora_shows_a_message_not_a_crash(panel):
    good = panel.config
    seen = []
    panel.on_change(seen.append)
    panel.set(lora_rank=0, quantize="int4")
    assert panel.error and "model.quantize='int4'" in panel.error and "lora.rank >= 1" in panel.error
    assert "lora.rank &gt;= 1" in panel.error_html.value and "fix the setting" in panel.fits_html.value
    assert panel.config.model.quantize == good.model.quantize == "none"
    panel.set(lora_rank=8)
    assert panel.error is None and panel.config.model.quantize == "int4" and seen[-1].lora.rank == 8


def test_a_grpo_config_shows_its_rows_and_rollout_cache(lengths):
    cfg = WorkbenchConfig().with_overrides(
        {"train.objective": "grpo", "grpo.num_generations": 4, "grpo.max_completion_length": 100}
    )
    panel = ConfigPanel(cfg, target="v5e-1", lengths=lengths)
    est = panel.estimate
    assert (
        est.objective_report is not None and est.seq_len == cfg.data.max_length + 112
    )  # completion budget 112
    text = panel.memory_saving.rollout_html.value
    assert f"<b class='wb-rollout-rows'>{4 * cfg.train.batch_size}</b> rows" in text and "KV cache" in text
    assert panel.memory_saving.rollout_html in panel.widget.children[0].children[1].children
    # the same batch of supervised rows needs less: a prompt brings its 4 completions
    sft = ConfigPanel(WorkbenchConfig(), target="v5e-1", lengths=lengths)
    assert sft.memory_saving.rollout_html.value == "" and sft.estimate.total_bytes < est.total_bytes
    assert panel.largest_batch is not None and panel.largest_batch < sft.largest_batch
