"""configs/ for the checkpoints people start from: Qwen2.5-0.5B, Llama-3.2-1B and Gemma-2-2B with LoRA,
SmolLM2-135M fully fine-tuned. Each file names its checkpoint by Hub id and runs as written.

Checked here, for every file, on a checkpoint of the family's exact published shape made here
(`bench/real_shapes.py`; a config.json and a model on the meta device, no weights, where the test
only needs the shape): it loads with the path pointed there; the shape is the published one; the
memory estimate fits a v5e-1 as written and a v5e-8 with the override its header documents (both
read from the file's own comments, so the file and this test cannot drift apart), with the
estimator's 10% headroom and the GiB figures the header quotes; gradient checkpointing, which each
file turns on, is needed to fit. As written, offline with the Hub id not in the cache, the CLI stops
with one line naming the id and the fix. The SmolLM2-135M config trains two steps on the plain CPU through
``python -m workbench train`` on a whole random-weight checkpoint of its shape (the others' checkpoints,
0.5B to 2.6B parameters, would take minutes here). And why the Gemma 2 file trains on text by default:
its chat template refuses the system turns of the shipped chat records.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bench.real_shapes import make_checkpoint, real_config
from tests.conftest import REPO
from tests.test_cli import _plain_env
from workbench.analysis.estimate import MemoryEstimate, config_settings, estimate, estimate_attention
from workbench.analysis.shape import model_shape
from workbench.backend.targets import TARGETS
from workbench.config import WorkbenchConfig, load_config
from workbench.families import FAMILIES
from workbench.hub.ids import parse_hub_id
from workbench.parallel.mesh import MeshSpec

# file -> (its shape in bench/real_shapes.py, transformers model_type, published parameter count)
FAMILY_CONFIGS: dict[str, tuple[str, str, int]] = {
    "qwen2.5-0.5b-lora.yaml": ("qwen2.5-0.5b", "qwen2", 494_032_768),
    "llama-3.2-1b-lora.yaml": ("llama-3.2-1b", "llama", 1_235_814_400),
    "gemma-2-2b-lora.yaml": ("gemma-2-2b", "gemma2", 2_614_341_888),
    "smollm2-135m-full.yaml": ("smollm2-135m", "llama", 134_515_008),
}
FILES = list(FAMILY_CONFIGS)
HEADROOM = 0.1
"""The share of a chip `MemoryEstimate.fits` keeps free by default (XLA's buffers, fragmentation)."""
COMMAND = re.compile(r"^#\s+(python -m workbench train .*)$", re.MULTILINE)
FIGURE = re.compile(r"(v5e-[18]) (\d+\.\d) GiB")


def _path(name: str) -> Path:
    return REPO / "configs" / name


def _commands(name: str) -> dict[str, list[str]]:
    """The header's overrides by target: the command without a mesh is the v5e-1 run, the other the v5e-8's."""
    found = COMMAND.findall(_path(name).read_text())
    assert len(found) == 2, f"{name}: expected a v5e-1 and a v5e-8 command in the header, found {found}"
    by_target = {}
    for line in found:
        words = shlex.split(line)
        assert words[:5] == ["python", "-m", "workbench", "train", "--config"], line
        assert words[5] == f"configs/{name}", f"{name}'s command runs another file: {line}"
        by_target["v5e-8" if any(w.startswith("mesh.") for w in words) else "v5e-1"] = words[6:]
    assert set(by_target) == {"v5e-1", "v5e-8"}, found
    return by_target


def _overrides(name: str, target: str, checkpoint: Path) -> list[str]:
    """The documented command's overrides for `target`, the file's Hub id pointed at `checkpoint`."""
    words = _commands(name)[target]
    assert not any(w.startswith("model.pretrained_path=") for w in words), f"{name}: the file names it"
    assert all(re.fullmatch(r"[a-z_]+\.[a-z_]+=\S+", w) for w in words), words
    return [f"model.pretrained_path={checkpoint}", *words]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, Path]:
    """A checkpoint directory holding only config.json, per family: the exact published shape,
    which is all `load_config` and the estimate read (no weights: a 2.6B model is 5 GB)."""
    root = tmp_path_factory.mktemp("shapes")
    out = {}
    for shape, _, _ in FAMILY_CONFIGS.values():
        real_config(shape).save_pretrained(str(root / shape))
        out[shape] = root / shape
    return out


def _load(name: str, target: str, shapes: dict[str, Path]) -> WorkbenchConfig:
    return load_config(_path(name), _overrides(name, target, shapes[FAMILY_CONFIGS[name][0]]))


def _estimate(cfg: WorkbenchConfig, target: str, **changes) -> MemoryEstimate:
    """The trainer's step on `target` as `cfg` sets it up: its mesh over the slice's devices (none
    when the mesh is off: one chip), batch, length, precision, LoRA, quantization and loss chunks."""
    chip = TARGETS[target]
    mesh = MeshSpec.from_config(cfg.mesh).resolve(chip.num_devices) if cfg.mesh.enabled else None
    settings = dict(
        config_settings(cfg),
        batch_size=cfg.train.batch_size,
        seq_len=cfg.data.max_length,
        mesh=mesh,
        memory_bytes=chip.memory_per_device_bytes,
        # the kernel model.attention runs there: flash on a TPU (chunked for Gemma 2's softcap)
        attention=estimate_attention(
            cfg.model.attention, chip, seq_len=cfg.data.max_length, model_config=cfg.model
        ),
    )
    return estimate(cfg.model, **{**settings, **changes})


@pytest.mark.parametrize("name", FILES)
def test_the_config_runs_as_written_from_its_hub_id(name, shapes):
    shape, _, _ = FAMILY_CONFIGS[name]
    cfg = _load(name, "v5e-1", shapes)
    assert cfg.model.pretrained_path == str(shapes[shape])
    assert cfg.data.tokenizer_path is None  # the checkpoint's own tokenizer, nothing to fill in
    assert _commands(name)["v5e-1"] == [], "on a v5e-1 the file runs as written"
    # as written the checkpoint is the family's published Hub id, read through the Hub's cache
    written = load_config(_path(name)).model.pretrained_path
    ref = parse_hub_id(written)
    assert ref is not None and ref.revision is None, written
    assert ref.repo_id.split("/")[1].lower().startswith(shape), f"{name} names {written}, not {shape}"
    assert ref.repo_id.endswith(("-Instruct", "-it")), f"{name}: the chat-tuned checkpoint its chats need"
    full = name.endswith("-full.yaml")
    assert (cfg.lora.rank == 0) == full and cfg.train.precision == ("bf16-mixed" if full else "bf16")
    assert cfg.train.learning_rate == (2e-5 if full else 2e-4)
    assert 0 < cfg.train.warmup_steps < cfg.train.steps and 0 < cfg.train.eval_every < cfg.train.steps


@pytest.mark.parametrize("name", FILES)
def test_the_made_checkpoint_has_the_published_shape(name, shapes):
    import torch
    import transformers as tf

    _, model_type, published = FAMILY_CONFIGS[name]
    cfg = _load(name, "v5e-1", shapes)
    config = tf.AutoConfig.from_pretrained(cfg.model.pretrained_path)
    assert config.model_type == model_type and model_type in FAMILIES
    with torch.device("meta"):  # the real module tree, no memory
        model = tf.AutoModelForCausalLM.from_config(config)
    estimated = model_shape(cfg.model)  # what the estimate reads: the checkpoint's config on disk
    assert model_shape(model).num_parameters == estimated.num_parameters == published
    assert estimated.tied


@pytest.mark.parametrize("target", ["v5e-1", "v5e-8"])
@pytest.mark.parametrize("name", FILES)
def test_the_estimate_fits_the_target_with_headroom(name, target, shapes):
    cfg = _load(name, target, shapes)
    chip = TARGETS[target]
    est = _estimate(cfg, target)
    capacity = chip.memory_per_device_bytes
    # at most 90% of the chip: the rest is the estimator's headroom for XLA's own buffers
    assert est.fits(capacity, headroom=HEADROOM), f"{name} on {target}:\n{est.table()}"
    # the header's figure for this target is the estimate's, to 0.1 GiB
    figures = dict(FIGURE.findall(_path(name).read_text()))
    assert figures.get(target) == f"{est.total_gib:.1f}", (
        f"{name}: header says {figures}, estimate\n{est.table()}"
    )
    assert cfg.model.quantize == "none" and cfg.train.gradient_checkpointing  # what the headers say
    if target == "v5e-8":
        # the override spreads the run over the whole slice, with each chip's batch as on a v5e-1
        assert math.prod(est.mesh.values()) == chip.num_devices
        assert est.per_device_batch == _estimate(_load(name, "v5e-1", shapes), "v5e-1").per_device_batch


@pytest.mark.parametrize("name", FILES)
def test_gradient_checkpointing_is_what_makes_it_fit(name, shapes):
    cfg = _load(name, "v5e-1", shapes)
    assert not _estimate(cfg, "v5e-1", gradient_checkpointing=False).fits(
        TARGETS["v5e-1"].memory_per_device_bytes
    )


@pytest.mark.parametrize("name", FILES)
def test_offline_without_the_checkpoint_cached_a_run_as_written_names_the_id_and_the_fix(
    name, tmp_path, capsys, monkeypatch
):
    from huggingface_hub import constants

    from workbench.__main__ import main
    from workbench.hub import resolve

    monkeypatch.chdir(tmp_path)  # nothing the attempt might write lands in the repository
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # never the network, whatever this machine has
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    resolve.forget_resolved()
    try:
        # the plain CPU keeps the attempt cheap (no XLA runtime); nothing else is overridden
        assert main(["train", "--config", str(_path(name)), "train.device_type=cpu"]) == 2
    finally:
        resolve.forget_resolved()
    err = capsys.readouterr().err.strip().splitlines()
    hub_id = load_config(_path(name)).model.pretrained_path
    assert len(err) == 1 and hub_id in err[0] and "HF_HUB_OFFLINE" in err[0], err


def test_the_smollm2_config_trains_on_the_cpu(tmp_path):
    """The file as written but for a short, small run: 2 steps of 2 rows of at most 128 tokens on the
    plain CPU, an eval and a checkpoint, on a whole SmolLM2-135M-shaped checkpoint (random weights)."""
    checkpoint = make_checkpoint("smollm2-135m", tmp_path / "smollm2-135m")
    metrics, saved = tmp_path / "metrics.json", tmp_path / "ckpt"
    overrides = [
        *_overrides("smollm2-135m-full.yaml", "v5e-1", checkpoint),
        "train.device_type=cpu",
        "train.steps=2",
        "train.batch_size=2",
        "data.max_length=128",
        "data.max_examples=64",
        "bucketing.multiple_of=8",
        "train.eval_every=2",
        f"train.checkpoint_dir={saved}",
    ]
    command = ["-m", "workbench", "train", "--config", "configs/smollm2-135m-full.yaml", *overrides]
    proc = subprocess.run(
        [sys.executable, *command, "--metrics-out", str(metrics)],
        cwd=REPO,
        env=_plain_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "trained 2/2 steps" in proc.stdout
    report = json.loads(metrics.read_text())
    config, result = report["config"], report["result"]
    assert (config["lora"]["rank"], config["train"]["precision"]) == (0, "bf16-mixed")
    assert config["train"]["gradient_checkpointing"] is True
    # random weights over the checkpoint's 49152-row vocabulary: a loss near ln(49152), not that of a
    # model built from the config's defaults
    vocab = real_config("smollm2-135m").vocab_size
    assert (
        abs(result["final_loss"] - math.log(vocab)) < 1.0 and abs(result["eval_loss"] - math.log(vocab)) < 1.0
    )
    assert Path(result["checkpoint_path"]) == saved / "step-00000002"
    assert (saved / "step-00000002" / "manifest.json").is_file()


# google/gemma-2-2b-it's chat template (tokenizer_config.json): no system turn, strictly alternating roles
GEMMA_2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)


def test_the_gemma_config_trains_on_chats_whose_system_turn_its_template_refuses(shapes):
    """Gemma 2's own template refuses a system turn, which many shipped chat records open with: the
    data layer folds it into the first user turn, so gemma-2-2b-lora.yaml trains on chat-sample too."""
    from workbench.data.chat import IGNORE_INDEX
    from workbench.data.records import build_datasets
    from workbench.data.tokenizer import get_tokenizer

    cfg = _load("gemma-2-2b-lora.yaml", "v5e-1", shapes).with_overrides(["data.max_examples=64"])
    tokenizer = get_tokenizer(WorkbenchConfig().data)  # the workbench's own, given a Gemma template
    tokenizer.chat_template = GEMMA_2_CHAT_TEMPLATE
    assert cfg.data.source == "chat-sample" and cfg.data.chat
    train, _, _ = build_datasets(cfg, tokenizer)
    assert len(train) > 0 and all(any(x != IGNORE_INDEX for x in r["labels"]) for r in train)
    import datasets

    from workbench.data.records import tokenize_records

    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
    ]
    (row,) = tokenize_records(datasets.Dataset.from_list([{"messages": chat}]), tokenizer, cfg.data)
    text = tokenizer.decode(row["input_ids"])
    assert "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello." in text
