"""Multi-host helpers: process facts, batch and dataset splits, the pod launch command."""

from __future__ import annotations

import re
import shlex

import datasets
import pytest

from workbench.backend import multihost
from workbench.backend.hardware import GiB, HardwareInfo
from workbench.backend.multihost import (
    MultiHostError,
    config_overrides,
    host_shard_bounds,
    is_main,
    per_host_batch_size,
    pod_launch_command,
    print_on_main,
    process_count,
    process_index,
    shard_for_host,
)
from workbench.backend.xla import presence, runtime
from workbench.config import WorkbenchConfig
from workbench.parallel.mesh import MeshSpec


@pytest.fixture
def no_runtime(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Answer from the environment, as on a host where torch_xla is not in use."""
    for var in ("PJRT_DEVICE", "TPU_WORKER_ID", "RANK", "TPU_WORKER_COUNT", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(runtime, "runtime_started", lambda: False)
    monkeypatch.setattr(presence, "tpu_present", lambda: False)
    return monkeypatch


def pod(processes: int) -> HardwareInfo:
    return HardwareInfo(
        backend="tpu",
        via_xla=True,
        device_kind="TPU v4",
        chip="v4",
        num_devices=4 * processes,
        local_devices=4,
        num_processes=processes,
        process_index=0,
        memory_per_device_bytes=32 * GiB,
        peak_bf16_flops_per_device=275e12,
        host_memory_bytes=400 * GiB,
        platform="local",
    )


def test_single_process_defaults(no_runtime):
    assert (process_index(), process_count(), is_main()) == (0, 1, True)


def test_process_facts_from_the_launcher_environment(no_runtime, capsys):
    no_runtime.setenv("TPU_WORKER_ID", "3")
    no_runtime.setenv("TPU_WORKER_COUNT", "4")
    assert (process_index(), process_count(), is_main()) == (3, 4, False)
    print_on_main("only the main process prints this")
    assert capsys.readouterr().out == ""
    no_runtime.delenv("TPU_WORKER_ID")
    no_runtime.setenv("RANK", "0")  # torchrun
    print_on_main("hello", "pod")
    assert capsys.readouterr().out == "hello pod\n"
    no_runtime.setenv("RANK", "one")
    with pytest.raises(MultiHostError, match=r"RANK='one' is not an integer"):
        process_index()


def test_per_host_batch_size():
    assert per_host_batch_size(64, pod(4)) == 16
    assert per_host_batch_size(64, 8) == 8
    assert per_host_batch_size(32, pod(1)) == 32
    with pytest.raises(MultiHostError) as err:
        per_host_batch_size(30, pod(4))
    assert str(err.value) == (
        "global batch size 30 does not split over 4 hosts (processes): 30 % 4 = 2; "
        "use a multiple of 4 (e.g. 28 or 32)"
    )
    with pytest.raises(MultiHostError) as err:  # fewer sequences than hosts: no "e.g. 4 or 4"
        per_host_batch_size(3, pod(4))
    assert str(err.value).endswith("use a multiple of 4 (e.g. 4)")
    with pytest.raises(
        MultiHostError, match=re.escape("does not split over the data-parallel size 8 of mesh")
    ):
        per_host_batch_size(12, pod(2), mesh=MeshSpec(data=2, fsdp=4).resolve(8))
    with pytest.raises(MultiHostError, match="global_batch_size=0 is not allowed"):
        per_host_batch_size(0, pod(2))


def test_dataset_shards_are_equal_disjoint_and_cover_all_but_the_remainder():
    rows = list(range(103))
    shards = [shard_for_host(rows, 4, i) for i in range(4)]
    assert [len(s) for s in shards] == [25, 25, 25, 25]  # equal: no host runs an extra step
    assert sorted(x for s in shards for x in s) == list(range(100))
    table = datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(103)]})
    parts = [shard_for_host(table, 4, i) for i in range(4)]
    assert [len(p) for p in parts] == [25] * 4
    texts = [t for p in parts for t in p["text"]]
    assert len(set(texts)) == 100
    assert [host_shard_bounds(23, 4, i) for i in range(4)] == [(0, 5), (5, 10), (10, 15), (15, 20)]
    assert shard_for_host(table, 1, 0) is table
    with pytest.raises(MultiHostError, match=r"process_index=4 is not allowed: must be in \[0, 4\)"):
        host_shard_bounds(103, 4, 4)
    with pytest.raises(MultiHostError, match="num_processes=0 is not allowed"):
        shard_for_host(rows, num_processes=0, process_index=0)
    with pytest.raises(ValueError, match="3 examples cannot give each of 4 hosts at least one"):
        shard_for_host([1, 2, 3], 4, 0)  # a MultiHostError is a ValueError


def test_dataset_share_defaults_to_this_process(no_runtime):
    no_runtime.setenv("TPU_WORKER_ID", "2")
    no_runtime.setenv("TPU_WORKER_COUNT", "4")
    rows = list(range(103))
    assert shard_for_host(rows) == list(range(50, 75))
    assert shard_for_host(rows, process_index=0) == list(range(25))
    with pytest.raises(MultiHostError, match=r"process_index=2 is not allowed: must be in \[0, 2\)"):
        shard_for_host(rows, num_processes=2)


def test_pod_launch_command_is_quoted_for_both_shells():
    cfg = WorkbenchConfig().with_overrides(
        [
            "train.steps=100",
            "mesh.enabled=true",
            "mesh.fsdp=16",
            "mesh.data=1",
            "data.source=/data/it's here.jsonl",
        ]
    )
    command = pod_launch_command(
        cfg,
        tpu_name="my-v4-32",
        zone="us-central2-b",
        project="my-project",
        overrides=["train.batch_size=64"],
        env={"XLA_FLAGS": "--xla_dump_to=/tmp/dump here"},
    )
    local = shlex.split(command)
    assert local[:9] == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "my-v4-32",
        "--zone=us-central2-b",
        "--project=my-project",
        "--worker=all",
    ]
    assert local[9].startswith("--command=") and len(local) == 10
    remote = shlex.split(local[9][len("--command=") :])
    assert remote[:3] == ["cd", "~/xla-workbench", "&&"]
    assert remote[3:5] == ["PJRT_DEVICE=TPU", "XLA_FLAGS=--xla_dump_to=/tmp/dump here"]
    assert remote[5:9] == ["python3", "-m", "workbench", "train"]
    assert remote[9:] == [
        "data.source=/data/it's here.jsonl",
        "mesh.data=1",
        "mesh.fsdp=16",
        "mesh.enabled=true",
        "train.steps=100",
        "train.batch_size=64",
    ]
    # The generated overrides rebuild the same config on the workers.
    assert WorkbenchConfig().with_overrides(remote[9:-1]) == cfg


def test_pod_launch_command_with_a_config_file_and_echo(capsys):
    command = pod_launch_command(
        tpu_name="tpu-a", zone="europe-west4-a", config_path="configs/pod.yaml", worker="0", echo=True
    )
    assert capsys.readouterr().out.strip() == command
    remote = shlex.split(shlex.split(command)[-1][len("--command=") :])
    assert remote[-2:] == ["--config", "configs/pod.yaml"]
    assert "--worker=0" in command and "--project" not in command


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tpu_name": "My_TPU", "zone": "us-central2-b"}, "tpu_name='My_TPU' is not allowed"),
        ({"tpu_name": "tpu", "zone": "central"}, "zone='central' is not allowed"),
        ({"tpu_name": "tpu", "zone": "us-central2-b", "worker": "some"}, "worker='some' is not allowed"),
        (
            {"tpu_name": "tpu", "zone": "us-central2-b", "env": {"A B": "1"}},
            "variable name 'A B' is not allowed: letters, digits and '_', not starting with a digit",
        ),
        (
            {"tpu_name": "tpu", "zone": "us-central2-b", "env": {"1X": "1"}},
            "variable name '1X' is not allowed: letters, digits and '_', not starting with a digit",
        ),
    ],
)
def test_pod_launch_command_rejects_bad_input(kwargs, message):
    with pytest.raises(MultiHostError, match=re.escape(message)):
        pod_launch_command(**kwargs)


def test_the_remote_command_parses_as_python_m_workbench_train():
    from workbench.__main__ import parse_args

    cfg = WorkbenchConfig().with_overrides(
        ["data.source=/data/it's here.jsonl", "train.max_grad_norm=null", "train.learning_rate=1e-05"]
    )
    command = pod_launch_command(
        cfg,
        tpu_name="tpu",
        zone="us-central2-b",
        config_path="configs/my pod.yaml",
        overrides=["train.steps=7"],
    )
    remote = shlex.split(shlex.split(command)[-1][len("--command=") :])
    assert remote[4:8] == ["python3", "-m", "workbench", "train"]
    args = parse_args(remote[7:])  # what `python3 -m workbench` hands to its parser
    assert (args.command, args.config) == ("train", "configs/my pod.yaml")
    assert args.overrides == [*config_overrides(cfg), "train.steps=7"]
    assert WorkbenchConfig().with_overrides(args.overrides) == cfg.with_overrides(["train.steps=7"])


def test_config_overrides_only_lists_changes():
    assert config_overrides(WorkbenchConfig()) == []
    cfg = WorkbenchConfig().with_overrides(["model.pretrained_path=/m", "train.max_grad_norm=null"])
    assert config_overrides(cfg) == ["model.pretrained_path=/m", "train.max_grad_norm=null"]


def test_describe():
    assert multihost.describe(pod(4)) == "process 0 of 4 (main)"


@pytest.mark.xla
def test_runtime_answers_on_xla_and_leaves_spmd_possible(xla_scenario):
    result = xla_scenario("multihost_runtime")
    assert result == {"facts": [0, 1, True], "spmd": True, "mesh": [1, 8, 1]}
