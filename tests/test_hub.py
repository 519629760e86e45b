"""Hub ids in, pushes out, without a network: a hand-built Hub cache (`tests.hub_cache`) under
``HF_HUB_OFFLINE``, and a stand-in for the Hub's HTTP API on 127.0.0.1 (`tests.hub_standin`).

The issue's "done when": from the cache, ``train model.pretrained_path=org/tiny data.source=org/data
data.subset=chat --save-pretrained out --push-to-hub me/out`` trains, uploads the adapter and its card
to the stand-in and exits 0 (one process, `pushed_run`); an id the cache lacks is one line and exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.hub_cache import CHAT_ROWS, DATA_COMMIT, MODEL_COMMIT, build_hub_cache
from tests.hub_standin import StandIn
from workbench.__main__ import main
from workbench.hub import HubError, HubRef, parse_hub_id
from workbench.hub import resolve as hub_resolve

TOKEN = "hf_standin_token_never_printed"
SAVED = {
    "README.md",
    "adapter_config.json",
    "adapter_model.safetensors",
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer_config.json",
    "workbench_base_model.json",
    "workbench_card.json",
    "workbench_export.json",
}
"""What a LoRA run's --save-pretrained directory pushes: the adapter, its tokenizer, the card, the records."""


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tokenizer) -> Path:
    return build_hub_cache(tmp_path_factory.mktemp("hub"), tokenizer)


@pytest.fixture
def offline_hub(monkeypatch, hub_cache) -> Path:
    """``HF_HUB_OFFLINE`` with `hub_cache` as ``HF_HUB_CACHE``, in this process."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    hub_resolve.forget_resolved()
    yield hub_cache
    hub_resolve.forget_resolved()


@pytest.fixture
def online_hub(monkeypatch, hub_cache) -> StandIn:
    """The stand-in as ``HF_ENDPOINT`` (reads answered from `hub_cache`), a token in ``HF_TOKEN``."""
    from huggingface_hub import constants

    with StandIn(hub_cache, gated=("org/gated",)) as standin:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
        monkeypatch.setattr(constants, "ENDPOINT", standin.endpoint)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        hub_resolve.forget_resolved()
        yield standin
        hub_resolve.forget_resolved()


# ---- ids and tokens --------------------------------------------------------------------------------


def test_a_hub_id_is_told_from_a_local_path(tmp_path, monkeypatch):
    from workbench.hub.ids import hub_ref_of_snapshot

    assert parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct") == HubRef("Qwen/Qwen2.5-0.5B-Instruct")
    assert parse_hub_id("openai/gsm8k@refs/convert/parquet") == HubRef("openai/gsm8k", "refs/convert/parquet")
    for local in (
        "/models/qwen",
        "./org/name",
        "~/org/name",
        "data/train.jsonl",
        "embedded",
        "a/b/c",
        "org/",
    ):
        assert parse_hub_id(local) is None, local
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert parse_hub_id("org/name") is None  # a local directory of the same name wins
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / MODEL_COMMIT
    assert hub_ref_of_snapshot(snapshot / "config.json") == ("model", HubRef("org/tiny", MODEL_COMMIT))


def test_the_token_comes_from_hf_token_then_colab_then_kaggle(monkeypatch):
    from workbench.hub.auth import hub_token, token_source

    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert hub_token() is None and token_source() is None
    kaggle = types.ModuleType("kaggle_secrets")
    kaggle.UserSecretsClient = lambda: types.SimpleNamespace(get_secret=lambda name: f"kaggle-{name}")
    monkeypatch.setitem(sys.modules, "kaggle_secrets", kaggle)
    assert hub_token() == "kaggle-HF_TOKEN" and token_source() == "Kaggle's secret HF_TOKEN"
    userdata = types.ModuleType("google.colab.userdata")
    userdata.get = lambda name: f"colab-{name}"
    colab = types.ModuleType("google.colab")
    colab.userdata = userdata
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab.userdata", userdata)
    assert hub_token() == "colab-HF_TOKEN"
    monkeypatch.setenv("HF_TOKEN", "from-env")
    assert hub_token() == "from-env" and token_source() == "the HF_TOKEN environment variable"


# ---- reads from the cache ----------------------------------------------------------------------------


def test_model_and_tokenizer_ids_resolve_from_the_cache_offline(offline_hub):
    from workbench.config import DataConfig
    from workbench.data.tokenizer import get_tokenizer
    from workbench.model_dirs import resolve_model_dir
    from workbench.train.start import load_for_inference

    snapshot = offline_hub / "models--org--tiny" / "snapshots" / MODEL_COMMIT
    assert hub_resolve.local_dir("org/tiny") == snapshot
    assert hub_resolve.local_dir(f"org/tiny@{MODEL_COMMIT}") == snapshot
    found = resolve_model_dir("org/tiny", field="--model")
    assert found.kind == "transformers" and "'org/tiny' (the Hub" in found.describe()
    tokenizer = get_tokenizer(DataConfig(tokenizer_path="org/tiny"))
    assert tokenizer.chat_template and tokenizer.name_or_path == str(snapshot)
    model, _ = load_for_inference("org/tiny")
    assert model.config.hidden_size == 32


def test_a_dataset_id_reads_its_subset_and_split_files_through_the_loaders(offline_hub):
    from workbench.config import DataConfig
    from workbench.data.records import load_records
    from workbench.hub.dataset_files import dataset_files

    ref = HubRef("org/data")
    train = dataset_files(ref, "chat", "train")
    assert [p.name for p in train.files] == [
        "train-00000.jsonl"
    ] and train.describe() == "org/data (subset chat, split train)"
    assert len(load_records(DataConfig(source="org/data", subset="chat"))) == CHAT_ROWS
    assert len(load_records(DataConfig(source="org/data", subset="chat", split="test"))) == 8  # parquet
    assert len(load_records(DataConfig(source="org/data", subset="plain"))) == 12
    layout = DataConfig(source="org/layout")  # no card: the splits are the files' names
    assert (
        len(load_records(layout)) == 6
        and len(load_records(DataConfig(source="org/layout", split="test"))) == 2
    )


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"source": "org/data"},
            "data.source='org/data': the repo has several subsets: set data.subset to one of chat, plain",
        ),
        (
            {"source": "org/data", "subset": "main"},
            "has no subset 'main': set data.subset to one of chat, plain",
        ),
        (
            {"source": "org/data", "subset": "chat", "split": "validation"},
            "subset 'chat' has no split 'validation': set data.split to one of test, train",
        ),
        (
            {"source": "org/layout", "split": "validation"},
            "has no split 'validation': its splits are test, train",
        ),
        ({"source": "org/nothing"}, "the dataset repo org/nothing is not in the local Hub cache"),
    ],
)
def test_what_a_dataset_repo_lacks_is_one_line_naming_it(offline_hub, data, message):
    from workbench.config import DataConfig
    from workbench.data.records import load_records

    with pytest.raises(HubError) as raised:
        load_records(DataConfig(**data))
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_bad_record_in_a_hub_dataset_is_named_by_its_file_and_line(offline_hub):
    from workbench.config import DataConfig
    from workbench.data.file_errors import DataFileError
    from workbench.data.records import load_records

    with pytest.raises(DataFileError) as raised:
        load_records(DataConfig(source="org/bad"))
    assert f"datasets--org--bad/snapshots/{DATA_COMMIT}/train.jsonl line 3" in str(raised.value)


def test_an_id_the_cache_lacks_is_one_line_and_exit_2(offline_hub, capsys):
    args = ["train", "model.pretrained_path=org/missing", "data.source=org/data", "data.subset=chat"]
    assert main([*args, "train.device_type=cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: model.pretrained_path='org/missing': the model repo org/missing is not in the local Hub cache"
    )
    assert "HF_HUB_OFFLINE is set: unset HF_HUB_OFFLINE to download it" in err


@pytest.mark.parametrize(
    "value, message",
    [
        ("org/absent", "no model repo 'org/absent' on the Hub and no local directory of that name"),
        (
            "org/gated",
            "org/gated is a gated model repo: accept its terms at https://huggingface.co/org/gated",
        ),
        ("org/tiny@v9", "org/tiny has no revision 'v9'"),
    ],
)
def test_the_hubs_refusals_are_one_line_with_the_fix(online_hub, value, message):
    with pytest.raises(HubError) as raised:
        hub_resolve.local_dir(value)
    assert message in str(raised.value) and "\n" not in str(raised.value) and TOKEN not in str(raised.value)


def test_online_a_cached_repo_is_read_without_downloading(online_hub):
    snapshot = hub_resolve.local_dir("org/tiny")
    assert snapshot.name == MODEL_COMMIT
    assert "GET /api/models/org/tiny/revision/main" in online_hub.requests
    assert not any("/resolve/" in r for r in online_hub.requests)  # every file the patterns take is cached


# ---- pushes ------------------------------------------------------------------------------------------


def _saved_adapter(folder: Path, hub_cache: Path) -> Path:
    snapshot = hub_cache / "models--org--tiny" / "snapshots" / MODEL_COMMIT
    folder.mkdir()
    (folder / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(snapshot), "r": 4})
    )
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "README.md").write_text("peft's template")
    for junk in ("optimizer.pt", "state.json", "trainer_state.json", ".hidden.json", "rng_state.pth"):
        (folder / junk).write_text("training state")
    (folder / "step-00000004").mkdir()
    return folder


def test_a_push_uploads_the_model_files_and_never_training_state(online_hub, hub_cache, tmp_path, capsys):
    folder = _saved_adapter(tmp_path / "out", hub_cache)
    assert main(["push", str(folder), "me/out", "--private", "--branch", "v1"]) == 0
    files = online_hub.pushed["me/out"]["v1"]
    assert set(files) == {
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
        "workbench_card.json",
    }
    config = json.loads(files["adapter_config.json"])
    assert config["base_model_name_or_path"] == "org/tiny" and config["revision"] == MODEL_COMMIT
    card = files["README.md"].decode()
    assert card.startswith("---\nbase_model: org/tiny\nlibrary_name: peft\n") and "# out" in card
    assert online_hub.created["me/out"].get("visibility") == "private" or online_hub.created["me/out"].get(
        "private"
    )
    assert online_hub.validated == 1 and f"Bearer {TOKEN}" in online_hub.tokens
    out = capsys.readouterr()
    assert TOKEN not in out.out + out.err and "pushed 5 files to me/out (v1)" in out.out
    (folder / "manifest.json").write_text("{}")  # with state.json: a training checkpoint, never pushed
    assert main(["push", str(folder), "me/out"]) == 2
    assert (
        "is a training checkpoint (weights with optimizer state), which is never pushed"
        in capsys.readouterr().err
    )


def test_a_failed_upload_leaves_the_output_and_says_what_to_run_again(
    online_hub, hub_cache, tmp_path, capsys
):
    folder = _saved_adapter(tmp_path / "out", hub_cache)
    online_hub.fail_commits = 1
    assert main(["push", str(folder), "me/out"]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and f"the local copy in {folder} is intact: push it again with: python -m workbench push {folder} me/out"
        in err
    )
    assert (
        folder / "adapter_model.safetensors"
    ).read_bytes() == b"weights" and "me/out" not in online_hub.pushed
    assert (
        main(["push", str(folder), "me/out"]) == 0
        and "adapter_model.safetensors" in online_hub.pushed["me/out"]["main"]
    )


@pytest.mark.parametrize(
    "extra, env, message",
    [
        ([], {}, "--push-to-hub me/out needs --save-pretrained DIR"),
        (
            ["--save-pretrained", "OUT"],
            {"HF_HUB_OFFLINE": True},
            "HF_HUB_OFFLINE is set, so nothing can be uploaded",
        ),
        (
            ["--save-pretrained", "OUT"],
            {"HF_TOKEN": None},
            "--push-to-hub me/out needs a Hub token with write access",
        ),
        (
            ["--save-pretrained", "OUT", "--push-to-hub", "me/out@v2"],
            {},
            "--push-to-hub='me/out@v2' is not a Hub repo id",
        ),
    ],
)
def test_a_push_that_cannot_happen_is_refused_before_training(
    tmp_path, monkeypatch, capsys, extra, env, message
):
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", bool(env.get("HF_HUB_OFFLINE")))
    if "HF_TOKEN" in env:
        monkeypatch.delenv("HF_TOKEN")
        monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    args = [a.replace("OUT", str(tmp_path / "out")) for a in extra]
    if "--push-to-hub" not in args:
        args += ["--push-to-hub", "me/out"]
    assert main(["train", "train.device_type=cpu", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and not (tmp_path / "out").exists()


# ---- the run: train from the cache, push to the stand-in -------------------------------------


@pytest.fixture(scope="module")
def pushed_run(hub_cache, tmp_path_factory) -> dict[str, Any]:
    """One ``train ... --save-pretrained out --push-to-hub me/out`` process against the stand-in."""
    root = tmp_path_factory.mktemp("pushed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PJRT_", "CPU_NUM"))}
    with StandIn(hub_cache) as standin:
        env.update(
            HF_HUB_CACHE=str(hub_cache), HF_ENDPOINT=standin.endpoint, HF_TOKEN=TOKEN, PYTHONPATH=str(REPO)
        )
        command = [
            sys.executable,
            "-m",
            "workbench",
            "train",
            "model.pretrained_path=org/tiny",
            "data.source=org/data",
            "data.subset=chat",
            "lora.rank=4",
            "data.max_length=64",
            "train.device_type=cpu",
            "train.steps=4",
            "train.batch_size=4",
            "train.log_every=2",
            "train.eval_every=2",
            "data.eval_fraction=0.1",
            "--save-pretrained",
            str(root / "out"),
            "--push-to-hub",
            "me/out",
        ]
        proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    return {"proc": proc, "standin": standin, "out": root / "out"}


def test_train_from_hub_ids_pushes_the_adapter_and_its_card(pushed_run):
    proc, standin = pushed_run["proc"], pushed_run["standin"]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "trained 4/4 steps" in proc.stdout and "pushed 9 files to me/out (main)" in proc.stdout
    files = standin.pushed["me/out"]["main"]
    assert set(files) == SAVED
    assert {name: files[name] for name in files} == {
        name: (pushed_run["out"] / name).read_bytes()
        for name in SAVED
        if name not in ("adapter_config.json",)
    } | {"adapter_config.json": files["adapter_config.json"]}
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == "org/tiny"
    assert json.loads(files["workbench_base_model.json"])["name_or_path"] == f"org/tiny@{MODEL_COMMIT}"
    assert f"Bearer {TOKEN}" in standin.tokens and TOKEN not in proc.stdout + proc.stderr
    assert not any("/resolve/" in r for r in standin.requests)  # model and data came from the cache


def test_the_card_has_what_a_hub_user_expects(pushed_run):
    from workbench import __version__
    from workbench.hub.card import read_header

    card = pushed_run["standin"].pushed["me/out"]["main"]["README.md"].decode()
    header = read_header(card)
    assert (
        header["base_model"] == "org/tiny"
        and header["library_name"] == "peft"
        and header["datasets"] == ["org/data"]
    )
    assert {"xla-workbench", "sft", "lora", "base_model:adapter:org/tiny"} <= set(header["tags"])
    for part in (
        "supervised fine-tuning (next-token cross-entropy)",
        "[org/data](https://huggingface.co/datasets/org/data) (subset chat, split train)",
        "| final train loss |",
        "| eval loss |",
        "| eval perplexity |",
        "## Hardware\n\ncpu (cpu, 1 device)",
        f"XLA Workbench {__version__}",
        'AutoPeftModelForCausalLM.from_pretrained("me/out")',
        "## Config (as resolved)",
        "pretrained_path: org/tiny",
        "rank 4, alpha 16.0, on",
    ):
        assert part in card, part
    assert pushed_run["standin"].validated == 1


def test_the_pushed_runs_adapter_exports_to_gguf_with_the_merged_logits(pushed_run, offline_hub, tmp_path):
    import torch
    import transformers as tf

    from workbench.train.start import load_for_inference

    assert pushed_run["proc"].returncode == 0
    out = tmp_path / "gguf"
    assert (
        main(["export", "--model", str(pushed_run["out"]), "--to", "gguf", str(out), "--outtype", "f32"]) == 0
    )
    model, tokenizer = load_for_inference(pushed_run["out"])
    loaded = tf.AutoModelForCausalLM.from_pretrained(out, gguf_file="gguf-f32.gguf", dtype=torch.float32)
    ids = torch.tensor([tokenizer("What is 3 plus 3?")["input_ids"]])
    with torch.no_grad():
        reference, written = model(ids).logits, loaded(ids).logits
    assert float((written - reference).norm() / reference.norm()) < 1e-5
    assert "base_model: org/tiny\nlibrary_name: gguf" in (out / "README.md").read_text()


def test_the_doctor_sizes_a_cached_hub_model_and_only_warns_for_one_not_downloaded_yet(offline_hub):
    from workbench.config import load_config
    from workbench.doctor.roots import DoctorRoots
    from workbench.doctor.sizing import model_check

    check, needs = model_check(load_config(None, ["model.pretrained_path=org/tiny"]), DoctorRoots())
    assert (
        check.status == "ok"
        and f"models--org--tiny/snapshots/{MODEL_COMMIT}" in check.saw
        and needs is not None
    )
    for later in ("org/later", "org/planned"):  # not cached; only the JSON files a plan fetched
        check, _ = model_check(load_config(None, [f"model.pretrained_path={later}"]), DoctorRoots())
        assert (
            check.status == "warn"
            and "is a Hub id not in the local Hub cache yet: the run downloads it" in check.saw
        ), (later, check)


def test_offline_a_snapshot_with_only_the_json_files_a_plan_fetched_is_one_line_naming_it(offline_hub):
    assert main(["plan", "model.pretrained_path=org/planned", "--chip", "v5e-1"]) == 0  # the shape is there
    with pytest.raises(HubError) as raised:
        hub_resolve.local_dir("org/planned")  # a run's load needs the weights
    message = str(raised.value)
    assert "org/planned" in message and "no weights" in message and "unset HF_HUB_OFFLINE" in message
    assert "\n" not in message


def test_plan_on_a_hub_id_asks_for_its_json_files_never_its_weights(offline_hub, monkeypatch, capsys):
    """An 8B model's plan on Colab must not download 16 GB: the shape comes from config.json alone."""
    import huggingface_hub

    asked: list[list[str]] = []
    real = huggingface_hub.snapshot_download

    def recording(*args: Any, **kwargs: Any) -> str:
        asked.append(list(kwargs.get("allow_patterns") or []))
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", recording)
    assert main(["plan", "model.pretrained_path=org/tiny", "--chip", "v5e-1"]) == 0
    assert "fits" in capsys.readouterr().out
    assert asked and all(patterns == list(hub_resolve.CONFIG_PATTERNS) for patterns in asked), asked
    hub_resolve.forget_resolved()
    asked.clear()
    hub_resolve.local_dir("org/tiny")  # what a run loads asks for the weights too
    assert asked == [list(hub_resolve.MODEL_PATTERNS)]


def test_push_to_hub_from_python_writes_the_card_and_uploads(online_hub, hub_cache, tmp_path):
    from workbench.publish import push_to_hub

    folder = _saved_adapter(tmp_path / "out", hub_cache)
    result = push_to_hub(folder, "me/from-python")
    assert result.repo_id == "me/from-python" and "README.md" in result.files
    assert (folder / "README.md").read_text() == online_hub.pushed["me/from-python"]["main"][
        "README.md"
    ].decode()
