"""`workbench.doctor`: every branch on made-up trees (fake /proc, /dev, /content, /kaggle, versions),
the command line's exit status and JSON, the widget, and the notebooks' preflight cell."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import ipywidgets as ipw
import pytest

from tests.build_notebooks import NOTEBOOKS, build
from tests.conftest import REPO
from widgets.doctor_view import STATUS_COLORS, doctor_html, doctor_view
from workbench import WorkbenchConfig, doctor
from workbench.doctor.checks import Check, DoctorError, DoctorReport
from workbench.doctor.roots import DoctorRoots, _pyproject_requirements
from workbench.units import GB, GiB, MiB

SELF_PID = 1
Usage = namedtuple("Usage", "total used free")

VERSIONS = {
    "torch": "2.9.0+cu128",
    "torch_xla": "2.9.0",
    "transformers": "5.23.0",
    "peft": "0.21.2",
    "datasets": "3.0.0",
    "ipykernel": "7.4.0",
    "ipywidgets": "8.1.9",
    "anywidget": "0.11.0",
    "plotly": "7.1.0",
}
REQUIREMENTS = {
    "torch_xla": ["absl-py>=1.0.0", 'libtpu==0.0.21; extra == "tpu"', 'jax==0.7.1; extra == "pallas"'],
    "xla-workbench": [
        "transformers<6,>=4.57",
        "peft<1,>=0.21",
        "datasets>=2.20",
        'torch==2.9.0; extra == "xla-cpu"',
        'ipywidgets>=7.7; extra == "widgets"',
        'anywidget>=0.9; extra == "widgets"',
        'plotly>=5.20; extra == "widgets"',
        'ipykernel>=6.29; extra == "notebook"',
    ],
}


@pytest.fixture(autouse=True)
def _machine_folders(tmp_path):
    """The fake machine's top folders, there before a test adds devices, processes or files."""
    for name in ("proc", "dev", "sys", "tmp", "fs", "work"):
        (tmp_path / name).mkdir()


def _roots(
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    versions: dict[str, str | None] | None = None,
    free: int = 500 * GiB,
    available: int = 64 * GiB,
    **changes: object,
) -> DoctorRoots:
    """A made-up machine: no TPU, a good install, a roomy disk, plenty of memory."""
    (tmp_path / "proc" / "meminfo").write_text(
        f"MemTotal:       {128 * GiB // 1024} kB\nMemAvailable:   {available // 1024} kB\n"
    )
    installed = {k: v for k, v in {**VERSIONS, **(versions or {})}.items() if v is not None}
    fields: dict[str, object] = dict(
        proc=tmp_path / "proc",
        dev=tmp_path / "dev",
        sys=tmp_path / "sys",
        tmp=tmp_path / "tmp",
        fs_root=tmp_path / "fs",
        cwd=tmp_path / "work",
        env=env or {},
        versions=installed,
        requirements=REQUIREMENTS,
        disk_usage=lambda path: Usage(1000 * GiB, 1000 * GiB - free, free),
        self_pid=SELF_PID,
    )
    fields.update(changes)
    return DoctorRoots(**fields)  # type: ignore[arg-type]


def _tpu(tmp_path: Path, *names: str) -> list[Path]:
    """TPU device files under the fake /dev (regular files stand in for the character devices)."""
    paths = []
    for name in names or ("accel0",):
        path = tmp_path / "dev" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        paths.append(path)
    return paths


def _process(tmp_path: Path, pid: int, argv: list[str], holds: list[Path]) -> None:
    """A fake /proc/<pid>: its command line and one fd link per held file."""
    root = tmp_path / "proc" / str(pid)
    (root / "fd").mkdir(parents=True)
    (root / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (root / "fd" / "0").symlink_to("/dev/null")
    for fd, path in enumerate(holds, start=3):
        (root / "fd" / str(fd)).symlink_to(path)


def _config(**overrides: object) -> WorkbenchConfig:
    return WorkbenchConfig().with_overrides(overrides)


# ---- the accelerator ------------------------------------------------------------------------


def test_a_tpu_held_by_another_process_fails_naming_its_pid_and_command_line(tmp_path):
    (accel,) = _tpu(tmp_path)
    _process(tmp_path, 4242, ["python", "train.py", "--config", "run.yaml"], [accel])
    _process(tmp_path, SELF_PID, ["python", "-m", "workbench", "doctor"], [])
    report = doctor(roots=_roots(tmp_path))
    check = report.check("TPU in use")
    assert check.status == "fail" and not report.ok
    assert f"PID 4242 holds {accel}: python train.py --config run.yaml" in check.saw
    assert check.fix.startswith("kill 4242")
    assert report.check("accelerator").status == "ok" and str(accel) in report.check("accelerator").saw


def test_the_doctor_s_own_process_does_not_count_as_holding_the_tpu(tmp_path):
    (accel,) = _tpu(tmp_path, "vfio/0")
    _process(tmp_path, SELF_PID, ["python", "-m", "ipykernel_launcher"], [accel])
    check = doctor(roots=_roots(tmp_path)).check("TPU in use")
    assert check.status == "ok" and "this process holds" in check.saw and check.fix is None


def test_a_notebook_kernel_holding_the_tpu_gets_the_restart_fix(tmp_path):
    accels = _tpu(tmp_path, "accel0", "accel1")
    _process(tmp_path, 77, ["/usr/bin/python3", "-m", "colab_kernel_launcher", "-f", "k.json"], accels)
    check = doctor(roots=_roots(tmp_path)).check("TPU in use")
    assert check.status == "fail" and check.saw.count("PID 77 holds") == 2
    assert check.fix.startswith("kill 77, then run again") and "Restart session" in check.fix


def test_the_generic_vfio_container_is_not_a_tpu(tmp_path):
    _tpu(tmp_path, "vfio/vfio")
    report = doctor(roots=_roots(tmp_path))
    assert "the CPU only" in report.check("accelerator").saw
    with pytest.raises(KeyError, match="no check named 'TPU in use'"):
        report.check("TPU in use")


def test_tpu_chips_on_the_pci_bus_without_device_files_warn(tmp_path):
    chip = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:04.0"
    chip.mkdir(parents=True)
    (chip / "vendor").write_text("0x1ae0\n")
    (chip / "device").write_text("0x0063\n")
    check = doctor(roots=_roots(tmp_path)).check("accelerator")
    assert (
        check.status == "warn" and "1 TPU chip(s) on the PCI bus" in check.saw and "--privileged" in check.fix
    )


def test_a_stale_libtpu_lock_warns_with_the_rm_fix(tmp_path):
    lock = tmp_path / "tmp" / "libtpu_lockfile"
    lock.write_text("")
    _process(tmp_path, 10, ["sleep", "100"], [])
    check = doctor(roots=_roots(tmp_path)).check("libtpu lock")
    assert check.status == "warn" and "stale" in check.saw and check.fix == f"rm {lock}"


def test_a_libtpu_lock_held_by_another_process_fails_and_is_not_stale(tmp_path):
    lock = tmp_path / "tmp" / "libtpu_lockfile"
    lock.write_text("")
    _process(tmp_path, 321, ["python", "old_run.py"], [lock])
    check = doctor(roots=_roots(tmp_path)).check("libtpu lock")
    assert check.status == "fail" and "PID 321" in check.saw and "old_run.py" in check.saw
    assert check.fix.startswith("kill 321") and "stale" not in check.saw


def test_a_libtpu_lock_held_by_the_doctor_s_process_is_fine(tmp_path):
    lock = tmp_path / "tmp" / "libtpu_lockfile"
    lock.write_text("")
    _process(tmp_path, SELF_PID, ["python"], [lock])
    check = doctor(roots=_roots(tmp_path)).check("libtpu lock")
    assert check.status == "ok" and "this process" in check.saw


def test_a_lock_nobody_visible_holds_while_some_processes_are_unreadable_is_only_maybe_stale(
    tmp_path, monkeypatch
):
    from workbench.doctor import processes

    lock = tmp_path / "tmp" / "libtpu_lockfile"
    lock.write_text("")
    _process(tmp_path, 99, ["python", "someone_elses.py"], [lock])
    real_scandir = os.scandir

    def scandir(path):  # another user's process, as a non-root doctor sees it
        if str(path).endswith(f"{os.sep}99{os.sep}fd"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(processes.os, "scandir", scandir)
    check = doctor(roots=_roots(tmp_path)).check("libtpu lock")
    assert check.status == "warn" and "1 process could not be inspected" in check.saw
    assert check.fix == f"sudo lsof {lock}; if nothing holds it: rm {lock}"


def test_no_lock_file_no_lock_check(tmp_path):
    names = [c.name for c in doctor(roots=_roots(tmp_path)).checks]
    assert "libtpu lock" not in names and "TPU in use" not in names


@pytest.mark.parametrize(
    ("env", "tpu", "name", "status", "words"),
    [
        ({"PJRT_DEVICE": "TPU"}, False, "PJRT_DEVICE", "fail", "no TPU is attached"),
        ({"PJRT_DEVICE": "tpu"}, True, "PJRT_DEVICE", "ok", "a TPU is attached"),
        ({"PJRT_DEVICE": "CPU"}, True, "PJRT_DEVICE", "warn", "the TPU stays idle"),
        ({"PJRT_DEVICE": "CPU"}, False, "PJRT_DEVICE", "ok", "XLA runs on the CPU"),
        ({"PJRT_DEVICE": "CUDA"}, False, "PJRT_DEVICE", "fail", "deprecated and no GPU is attached"),
        ({"PJRT_DEVICE": "TPUv4"}, False, "PJRT_DEVICE", "fail", "is not allowed: TPU, CPU, CUDA"),
        (
            {"CPU_NUM_DEVICES": "8"},
            False,
            "CPU_NUM_DEVICES",
            "warn",
            "does nothing while PJRT_DEVICE is unset",
        ),
        (
            {"CPU_NUM_DEVICES": "eight", "PJRT_DEVICE": "CPU"},
            False,
            "CPU_NUM_DEVICES",
            "fail",
            "'eight' is not",
        ),
        ({"TPU_NUM_DEVICES": "4"}, False, "TPU_NUM_DEVICES", "warn", "no TPU here"),
        ({"TPU_NUM_DEVICES": "0"}, True, "TPU_NUM_DEVICES", "fail", "not a positive whole number"),
        ({"XLA_USE_BF16": "1"}, False, "XLA_USE_BF16", "warn", "deprecated"),
    ],
)
def test_xla_environment_against_the_hardware(tmp_path, env, tpu, name, status, words):
    if tpu:
        _tpu(tmp_path)
    check = doctor(roots=_roots(tmp_path, env=env)).check(name)
    assert check.status == status and words in check.saw
    assert (check.fix is None) == (status == "ok")


# ---- versions --------------------------------------------------------------------------------


def test_torch_and_torch_xla_of_different_minor_versions_fail_with_the_pip_line(tmp_path):
    report = doctor(roots=_roots(tmp_path, versions={"torch": "2.10.0+cu128", "torch_xla": "2.9.0"}))
    check = report.check("torch_xla")
    assert check.status == "fail" and "_XLAC" in check.saw and "torch 2.10.0+cu128" in check.saw
    assert check.fix.startswith('pip install torch==2.9.0 "torch_xla==2.9.0", then restart')


def test_the_mismatch_fix_on_a_tpu_installs_torch_xla_with_its_libtpu(tmp_path):
    _tpu(tmp_path)
    versions = {"torch": "2.8.0", "torch_xla": "2.9.0", "libtpu": "0.0.21"}
    check = doctor(roots=_roots(tmp_path, versions=versions)).check("torch_xla")
    assert check.fix.startswith('pip install torch==2.9.0 "torch_xla[tpu]==2.9.0"')


def test_matching_versions_with_local_build_tags_pass(tmp_path):
    check = doctor(roots=_roots(tmp_path)).check("torch_xla")
    assert check.status == "ok" and "matches torch 2.9.0+cu128" in check.saw


def test_a_tpu_without_torch_xla_fails(tmp_path):
    _tpu(tmp_path)
    check = doctor(roots=_roots(tmp_path, versions={"torch_xla": None})).check("torch_xla")
    assert check.status == "fail" and check.fix.startswith('pip install "torch_xla[tpu]==2.9.*"')


def test_libtpu_other_than_torch_xla_s_pin_fails_on_a_tpu(tmp_path):
    _tpu(tmp_path)
    check = doctor(roots=_roots(tmp_path, versions={"libtpu": "0.0.17"})).check("libtpu")
    assert check.status == "fail" and "libtpu 0.0.17" in check.saw and "libtpu==0.0.21" in check.saw
    assert check.fix.startswith('pip install "libtpu==0.0.21"')


def test_libtpu_missing_on_a_tpu_fails_and_matching_passes(tmp_path):
    _tpu(tmp_path)
    assert doctor(roots=_roots(tmp_path)).check("libtpu").status == "fail"
    check = doctor(roots=_roots(tmp_path, versions={"libtpu": "0.0.21"})).check("libtpu")
    assert check.status == "ok" and "what torch_xla 2.9.0 pins" in check.saw


def test_a_libtpu_nightly_pin_names_where_its_wheels_are(tmp_path):
    _tpu(tmp_path)
    requirements = {**REQUIREMENTS, "torch_xla": ['libtpu-nightly==0.1.dev20240612; extra == "tpu"']}
    roots = _roots(tmp_path, versions={"libtpu-nightly": "0.1.dev20240101"}, requirements=requirements)
    check = doctor(roots=roots).check("libtpu")
    assert check.status == "fail" and "-f https://storage.googleapis.com/libtpu-releases" in check.fix


def test_libtpu_does_not_matter_without_a_tpu(tmp_path):
    check = doctor(roots=_roots(tmp_path, versions={"libtpu": "0.0.1"})).check("libtpu")
    assert check.status == "ok" and "only a TPU needs it" in check.saw


# The hosted TPU images' versions (Colab's pip-freeze.tpu.txt of 2026-08-19, Kaggle's tpu/config.txt of
# 2026-08-12) with what `pip install "xla-workbench[widgets]"` adds (peft), and torch_xla's real
# Requires-Dist (2.9.0 and 2.8.0 wheels' METADATA).
COLAB_TPU = {
    "torch": "2.9.0+cpu",
    "torch_xla": "2.9.0",
    "libtpu": "0.0.21.1",
    "jax": "0.7.2",
    "jaxlib": "0.7.2",
    "transformers": "5.15.0",
    "peft": "0.21.2",
    "datasets": "4.8.5",
    "ipykernel": "6.17.1",
    "ipython": "7.34.0",
    "notebook": "6.5.7",
    "ipywidgets": "7.7.1",
    "anywidget": "0.9.21",
    "plotly": "5.24.1",
}
KAGGLE_TPU = {
    **{k: v for k, v in COLAB_TPU.items() if k not in ("ipython", "notebook")},
    "torch": "2.8.0+cpu",
    "torch_xla": "2.8.0",
    "libtpu": "0.0.17",
    "jax": "0.6.2",
    "jaxlib": "0.6.2",
    "transformers": "5.12.1",
}
TORCH_XLA_REQUIRES = {
    "2.9.0": ['libtpu==0.0.21; extra == "tpu"', 'tpu-info; extra == "tpu"', 'jax==0.7.1; extra == "pallas"'],
    "2.8.0": ['libtpu==0.0.17; extra == "tpu"', 'tpu-info; extra == "tpu"', 'jax==0.6.2; extra == "pallas"'],
}


def _hosted_tpu_vm(tmp_path: Path, image: dict[str, str], folder: str) -> DoctorRoots:
    """A hosted TPU VM: /dev/accel0, the platform's folder, the image's versions, the project's real pins."""
    _tpu(tmp_path)
    (tmp_path / "fs" / folder).mkdir(parents=True)
    requirements = {
        "xla-workbench": _pyproject_requirements(),
        "torch_xla": TORCH_XLA_REQUIRES[image["torch_xla"]],
    }
    installed = {name: image.get(name) for name in {*VERSIONS, *image}}
    return _roots(tmp_path, versions=installed, requirements=requirements)


@pytest.mark.parametrize(("image", "folder"), [(COLAB_TPU, "content"), (KAGGLE_TPU, "kaggle/working")])
def test_the_hosted_tpu_images_as_they_are_report_no_failure(tmp_path, image, folder):
    report = doctor(roots=_hosted_tpu_vm(tmp_path, image, folder))
    assert report.ok, report.table()
    assert report.check("accelerator").status == "ok" and report.check("libtpu").status == "ok"
    notebook = report.check("notebook libraries")
    assert notebook.status == "ok" and "ipykernel 6.17.1" in notebook.saw and "left as it is" in notebook.saw


def test_a_libtpu_hotfix_of_the_pinned_release_passes_and_another_release_fails(tmp_path):
    hotfix = doctor(roots=_hosted_tpu_vm(tmp_path, COLAB_TPU, "content")).check("libtpu")
    assert hotfix.status == "ok"
    assert "libtpu 0.0.21.1: a hotfix of the libtpu==0.0.21 torch_xla 2.9.0 pins" in hotfix.saw
    for other in ("0.0.22", "0.0.2", "0.0.211", "0.0.21.1rc1", "0.0.20.1"):
        check = doctor(roots=_roots(tmp_path, versions={"libtpu": other})).check("libtpu")
        assert check.status == "fail", other
        assert "needs libtpu==0.0.21 or a 0.0.21.x hotfix of it" in check.saw
        assert check.fix.startswith('pip install "libtpu==0.0.21"')
    exact = doctor(roots=_roots(tmp_path, versions={"libtpu": "0.0.21"})).check("libtpu")
    assert exact.status == "ok" and "what torch_xla 2.9.0 pins" in exact.saw


def test_a_libtpu_range_pin_is_read_as_pip_reads_it(tmp_path):
    _tpu(tmp_path)
    requirements = {**REQUIREMENTS, "torch_xla": ['libtpu>=0.0.21,<0.0.23; extra == "tpu"']}
    for version, status in (("0.0.22", "ok"), ("0.0.23.1", "fail"), ("0.0.20", "fail")):
        roots = _roots(tmp_path, versions={"libtpu": version}, requirements=requirements)
        check = doctor(roots=roots).check("libtpu")
        assert check.status == status and "hotfix" not in check.saw, version


@pytest.mark.parametrize(
    ("jax", "torchax", "words"),
    [
        ("0.7.2", None, "torch_xla 2.9.0, jax 0.7.2 (torchax only as torch_xla's own copy, if any)"),
        (None, None, "torch_xla 2.9.0, no jax (torchax only"),
        ("0.7.2", "0.0.13", "torch_xla 2.9.0, jax 0.7.2, torchax 0.0.13"),
    ],
)
def test_the_scan_check_names_the_backward_a_mesh_runs_and_why(tmp_path, jax, torchax, words):
    check = doctor(roots=_roots(tmp_path, versions={"jax": jax, "torchax": torchax})).check("scan on a mesh")
    assert check.status == "ok" and words in check.saw and check.fix is None
    assert "runs the workbench's plain backward" in check.saw and "torch_xla 2.8" in check.saw


def test_a_hosted_runtime_checks_the_widgets_extra_and_never_its_kernel(tmp_path):
    (tmp_path / "fs" / "content").mkdir(parents=True)
    old_kernel = {"ipykernel": "6.17.1", "ipywidgets": "7.7.1", "anywidget": None}
    hosted = doctor(roots=_roots(tmp_path, versions=old_kernel)).check("notebook libraries")
    assert hosted.status == "warn" and hosted.fix == 'pip install "anywidget>=0.9"'
    assert "ipykernel 6.17.1" in hosted.saw and "ipykernel>=" not in hosted.saw + hosted.fix
    (tmp_path / "fs" / "content").rmdir()  # the same versions on a local machine: the notebook extra's pins
    local = doctor(roots=_roots(tmp_path, versions=old_kernel)).check("notebook libraries")
    assert local.status == "warn" and local.fix == 'pip install "ipykernel>=6.29" "anywidget>=0.9"'


def test_libraries_outside_the_project_s_pins_fail_and_notebook_libraries_warn(tmp_path):
    report = doctor(
        roots=_roots(tmp_path, versions={"transformers": "4.40.0", "peft": None, "anywidget": None})
    )
    transformers, peft, notebook = (report.check(n) for n in ("transformers", "peft", "notebook libraries"))
    assert transformers.status == "fail" and transformers.fix.startswith(
        'pip install "transformers<6,>=4.57"'
    )
    assert peft.status == "fail" and peft.fix == 'pip install "peft<1,>=0.21"'
    assert notebook.status == "warn" and notebook.fix == 'pip install "anywidget>=0.9"'


# ---- the session ---------------------------------------------------------------------------


def test_colab_without_drive_warns_with_the_mount_fix(tmp_path):
    (tmp_path / "fs" / "content").mkdir(parents=True)
    report = doctor(roots=_roots(tmp_path, env={"COLAB_RELEASE_TAG": "release-colab_20250101"}))
    assert report.check("session").saw == "Google Colab"
    drive = report.check("Drive")
    assert (
        drive.status == "warn"
        and drive.fix == "from google.colab import drive; drive.mount('/content/drive')"
    )
    assert report.ok  # a warning does not stop the run


def test_colab_with_drive_and_checkpoints_on_the_runtime_disk(tmp_path):
    (tmp_path / "fs" / "content" / "drive" / "MyDrive").mkdir(parents=True)
    roots = _roots(tmp_path)  # no variables: the /content folder says Colab
    report = doctor(
        _config(**{"train.checkpoint_dir": str(tmp_path / "fs" / "content" / "ckpt")}), roots=roots
    )
    assert report.check("Drive").status == "ok"
    disk = report.check("checkpoint disk")
    assert disk.status == "warn" and "deleted with the runtime" in disk.saw
    assert "train.checkpoint_dir=/content/drive/MyDrive/" in disk.fix
    on_drive = _config(
        **{"train.checkpoint_dir": str(tmp_path / "fs" / "content" / "drive" / "MyDrive" / "run")}
    )
    assert doctor(on_drive, roots=roots).check("checkpoint disk").status == "ok"


def test_kaggle_output_room_counts_the_20_gb_limit(tmp_path):
    working = tmp_path / "fs" / "kaggle" / "working"
    working.mkdir(parents=True)
    with (working / "old-checkpoint.bin").open("wb") as handle:
        handle.truncate(int(19.5 * GB))  # sparse: its apparent size counts against the limit, no disk is used
    roots = _roots(tmp_path, env={"KAGGLE_KERNEL_RUN_TYPE": "Interactive"})
    report = doctor(_config(**{"train.checkpoint_dir": str(working / "ckpt")}), roots=roots)
    kaggle = report.check("Kaggle output")
    assert report.check("session").saw == "Kaggle"
    assert kaggle.status == "warn" and "476.84 MiB left" in kaggle.saw and "of the 20 GB" in kaggle.saw
    assert report.check("checkpoint disk").status == "ok"  # the default tiny model fits in what is left


def test_kaggle_with_little_free_disk(tmp_path):
    (tmp_path / "fs" / "kaggle" / "working").mkdir(parents=True)
    roots = _roots(tmp_path, free=1 * MiB)
    cfg = _config(**{"train.checkpoint_dir": str(tmp_path / "fs" / "kaggle" / "working" / "ckpt")})
    report = doctor(cfg, roots=roots)
    assert (
        report.check("Kaggle output").status == "warn"
        and "1.00 MiB left" in report.check("Kaggle output").saw
    )
    assert report.check("checkpoint disk").status == "fail" and not report.ok


def test_checkpoints_on_a_nearly_full_disk_fail_and_a_tight_one_warns(tmp_path):
    cfg = _config(**{"train.checkpoint_dir": "ckpt/run1"})  # relative: under the working directory
    needs = 106_816 * 4 * 3  # the default model in fp32: weights and AdamW's two moments
    full = doctor(cfg, roots=_roots(tmp_path, free=needs - 1)).check("checkpoint disk")
    assert full.status == "fail" and "it does not fit" in full.saw and str(tmp_path / "work") in full.saw
    tight = doctor(cfg, roots=_roots(tmp_path, free=2 * needs)).check("checkpoint disk")
    assert (
        tight.status == "warn"
        and "keeping 2 checkpoints" in tight.saw
        and "train.keep_checkpoints=1" in tight.fix
    )
    roomy = doctor(cfg, roots=_roots(tmp_path, free=3 * needs)).check("checkpoint disk")
    assert roomy.status == "ok"


def test_the_model_check_sizes_a_lora_run(tmp_path):
    cfg = _config(**{"lora.rank": 8, "train.precision": "bf16"})
    check = doctor(cfg, roots=_roots(tmp_path)).check("model")
    assert check.status == "ok" and "106.8K parameters" in check.saw and "LoRA r8" in check.saw


def test_the_model_check_counts_a_dpo_reference_copy_in_what_loads(tmp_path):
    sft = doctor(_config(), roots=_roots(tmp_path)).check("model")
    dpo = doctor(_config(**{"train.objective": "dpo"}), roots=_roots(tmp_path)).check("model")
    assert "dpo with a frozen reference copy (+417.25 KiB)" in dpo.saw  # 106,816 fp32 weights again
    assert "loading 834.50 KiB" in dpo.saw and "loading 417.25 KiB" in sft.saw
    lora = doctor(_config(**{"train.objective": "dpo", "lora.rank": 8}), roots=_roots(tmp_path)).check(
        "model"
    )
    assert "reference copy" not in lora.saw  # the adapters switched off are the reference


def _safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(offset))


def test_a_pretrained_checkpoint_is_sized_from_its_files(tmp_path):
    model = tmp_path / "work" / "model"
    model.mkdir(parents=True)
    config = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 32, "tie_word_embeddings": True,
              "max_position_embeddings": 64}  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    _safetensors(model / "model.safetensors", {"embed": [32, 8], "layer": [16, 8]})
    roots = _roots(tmp_path, available=1 * MiB)
    report = doctor(_config(**{"model.pretrained_path": "model"}), roots=roots)
    weights = (model / "model.safetensors").stat().st_size
    assert report.check("model").status == "ok" and "1 weight file(s)" in report.check("model").saw
    ram = report.check("host RAM")
    assert ram.status == "ok" and f"{weights / 1024:.2f} KiB" in ram.saw
    missing = doctor(_config(**{"model.pretrained_path": "nowhere"}), roots=roots).check("model")
    assert missing.status == "fail" and "no config.json" in missing.saw


def test_a_checkpoint_of_a_family_the_registry_lacks_is_counted_from_its_tensors(tmp_path):
    model = tmp_path / "work" / "mamba"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "mamba", "d_model": 8}))
    _safetensors(model / "model.safetensors", {"a": [10, 10], "b": [5]})
    report = doctor(_config(**{"model.pretrained_path": str(model)}), roots=_roots(tmp_path))
    assert report.check("model").status == "ok" and "105 parameters" in report.check("model").saw
    lora = doctor(_config(**{"model.pretrained_path": str(model), "lora.rank": 4}), roots=_roots(tmp_path))
    assert lora.check("model").status == "warn" and "cannot size the model" in lora.check("model").saw
    assert lora.check("checkpoint disk").status == "ok"  # no checkpoint_dir: nothing to compare


def test_low_host_ram_fails_for_the_model_and_warns_without_one(tmp_path):
    low = doctor(_config(), roots=_roots(tmp_path, available=100 * 1024)).check("host RAM")
    assert low.status == "fail" and "it does not fit" in low.saw
    tight = doctor(_config(), roots=_roots(tmp_path, available=600 * 1024)).check("host RAM")
    assert tight.status == "warn" and "tight" in tight.saw  # 417 KiB to load, 586 KiB available
    no_model = doctor(roots=_roots(tmp_path, available=1 * GiB)).check("host RAM")
    assert no_model.status == "warn" and "little room" in no_model.saw


def test_an_explicit_compile_cache_on_a_small_disk(tmp_path):
    cfg = _config(**{"train.compile_cache_dir": "cache"})
    roots = _roots(tmp_path, env={"PJRT_DEVICE": "CPU"}, free=50 * MiB)
    check = doctor(cfg, roots=roots).check("compile cache disk")
    assert check.status == "fail" and str(tmp_path / "work" / "cache") in check.saw
    off = doctor(roots=_roots(tmp_path)).check("compile cache disk")
    assert off.status == "ok" and "does not use XLA" in off.saw


def test_auto_compile_cache_on_a_colab_tpu_goes_to_drive(tmp_path):
    _tpu(tmp_path)
    (tmp_path / "fs" / "content" / "drive" / "MyDrive").mkdir(parents=True)
    check = doctor(roots=_roots(tmp_path, versions={"libtpu": "0.0.21"})).check("compile cache disk")
    assert (
        check.status == "ok"
        and str(tmp_path / "fs" / "content" / "drive" / "MyDrive" / "xla_cache") in check.saw
    )


# ---- the report, the runtime ---------------------------------------------------------------


def test_the_report_as_table_dict_json_and_error():
    report = DoctorReport(
        (Check("a", "ok", "fine"), Check("b", "warn", "meh", "do x"), Check("c", "fail", "broken", "run y"))
    )
    assert not report.ok and report.counts() == {"ok": 1, "warn": 1, "fail": 1}
    table = report.table()
    assert (
        "FAIL   c" in table
        and "fix: run y" in table
        and table.endswith("1 fail: not ready: apply the fixes of the failed checks")
    )
    assert (
        json.loads(report.to_json()) == report.to_dict() and report.to_dict()["checks"][2]["fix"] == "run y"
    )
    with pytest.raises(DoctorError, match=r"(?s)1 preflight check\(s\) failed.*- c: broken\n  fix: run y"):
        report.raise_on_fail()
    with pytest.raises(ValueError, match="status='bad' is not allowed"):
        Check("x", "bad", "?")  # type: ignore[arg-type]


def test_start_runtime_reports_the_devices_or_is_skipped_after_a_failure(tmp_path, monkeypatch):
    import workbench.backend.hardware as hardware

    def fake_detect():
        return hardware.HardwareInfo("cpu", True, "CPU", "cpu", 8, 8, 1, 0, None, None, 1, "local")

    monkeypatch.setattr(hardware, "detect", fake_detect)
    check = doctor(roots=_roots(tmp_path), start_runtime=True).check("runtime")
    assert check.status == "ok" and check.saw == "8 x CPU (chip cpu, through XLA)"
    broken = _roots(tmp_path, versions={"torch": "2.8.0"})
    skipped = doctor(roots=broken, start_runtime=True).check("runtime")
    assert skipped.status == "warn" and "not started: torch_xla failed" in skipped.saw


# ---- this machine, the command line ----------------------------------------------------------


def test_this_machine_passes_without_importing_torch_or_torch_xla():
    code = (
        "import sys, json; from workbench import doctor; r = doctor(); "
        "print(json.dumps([r.ok, 'torch' in sys.modules, 'torch_xla' in sys.modules, r.to_dict()]))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "CPU_NUM_DEVICES")}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    ok, torch_imported, xla_imported, report = json.loads(proc.stdout)
    assert ok, [c for c in report["checks"] if c["status"] == "fail"]
    assert not torch_imported and not xla_imported


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "CPU_NUM_DEVICES")}
    return subprocess.run(
        [sys.executable, "-m", "workbench", "doctor", *args],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_cli_exits_0_here_and_prints_parseable_json():
    proc = _cli("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and {"python", "torch_xla", "host RAM"} <= {
        c["name"] for c in report["checks"]
    }
    table = _cli()
    assert table.returncode == 0 and "doctor:" in table.stdout and "0 fail: ready" in table.stdout


def test_the_cli_exits_1_on_a_failed_check_and_2_on_a_bad_config():
    failed = _cli("--json", PJRT_DEVICE="TPU")
    assert failed.returncode == 1
    (pjrt,) = [c for c in json.loads(failed.stdout)["checks"] if c["name"] == "PJRT_DEVICE"]
    assert pjrt["status"] == "fail" and "unset PJRT_DEVICE" in pjrt["fix"]
    bad = _cli("--config", "configs/quickstart.yaml", "train.stepz=3")
    assert bad.returncode == 2 and "train.stepz" in bad.stderr


def test_the_cli_sizes_the_model_of_a_config_with_overrides():
    proc = _cli("train.checkpoint_dir=/nonexistent/ckpt", "--json", "model.hidden_size=128")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert (
        checks["model"]["status"] == "ok"
        and "train.checkpoint_dir='/nonexistent/ckpt'" in checks["checkpoint disk"]["saw"]
    )


# ---- the widget and the notebooks ---------------------------------------------------------


def test_doctor_view_draws_each_status_in_its_colour():
    report = DoctorReport(
        (Check("torch", "ok", "2.9.0"), Check("Drive", "warn", "<not mounted>", "drive.mount('/content/drive')"),
         Check("TPU in use", "fail", "PID 7 holds /dev/accel0", "kill 7"))
    )  # fmt: skip
    view = doctor_view(report)
    assert isinstance(view, ipw.HTML) and "wb-doctor" in view._dom_classes
    assert view.value == doctor_html(report)
    for status, color in STATUS_COLORS.items():
        assert f"wb-doctor-{status}" in view.value and color in view.value
    assert (
        "&lt;not mounted&gt;" in view.value
        and "<code style='white-space:pre-wrap'>kill 7</code>" in view.value
    )
    assert report.summary() in view.value


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_every_notebook_runs_the_doctor_right_after_its_parameters(name):
    cells = [c for c in build(name).cells if c.cell_type == "code"]
    assert "parameters" in cells[1].metadata.get("tags", [])
    assert "report = doctor()" in cells[2].source and "report.raise_on_fail()" in cells[2].source
