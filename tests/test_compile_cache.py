"""The persistent compilation cache (workbench.backend.compile_cache): where 'auto' puts it, what a bad
path says, and, on XLA:CPU for real, two sessions sharing one directory and a cache switched on too late."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, xla_env
from workbench.backend.compile_cache import (
    CacheRoots,
    cache_key,
    describe_compile_cache,
    enable_compile_cache,
    prepare_cache_dir,
    resolve_cache_dir,
    xla_version,
)
from workbench.backend.hardware import HardwareInfo
from workbench.config import ConfigError

VERSION = "2.9.0"


def _hw(backend: str = "tpu", *, via_xla: bool = True, chip: str = "v5e") -> HardwareInfo:
    return HardwareInfo(
        backend=backend,  # type: ignore[arg-type]
        via_xla=via_xla,
        device_kind=chip,
        chip=chip,
        num_devices=1,
        local_devices=1,
        num_processes=1,
        process_index=0,
        memory_per_device_bytes=None,
        peak_bf16_flops_per_device=None,
        host_memory_bytes=1,
        platform="local",
    )


def _roots(tmp_path: Path, *, drive: bool = False, kaggle: bool = False) -> CacheRoots:
    """Roots under tmp_path; the Drive and Kaggle folders exist only when asked for."""
    roots = CacheRoots(
        drive=tmp_path / "drive" / "MyDrive", kaggle=tmp_path / "kaggle" / "working", workdir=tmp_path / "cwd"
    )
    for wanted, path in ((drive, roots.drive), (kaggle, roots.kaggle)):
        if wanted:
            path.mkdir(parents=True)
    return roots


def _resolve(setting: str | None, roots: CacheRoots, hw: HardwareInfo | None = None) -> Path | None:
    hw = hw or _hw()
    return resolve_cache_dir(
        setting, backend=hw.backend, via_xla=hw.via_xla, chip=hw.chip, version=VERSION, roots=roots
    )


# ---- 'auto', None and explicit paths -------------------------------------------------------


def test_auto_on_colab_with_drive_mounted_goes_to_drive(tmp_path: Path) -> None:
    roots = _roots(tmp_path, drive=True, kaggle=True)  # Drive wins where both are there
    assert _resolve("auto", roots) == roots.drive / "xla_cache" / "torch_xla-2.9.0-v5e"


def test_auto_on_kaggle_goes_to_kaggle_working(tmp_path: Path) -> None:
    roots = _roots(tmp_path, kaggle=True)
    assert _resolve("auto", roots) == roots.kaggle / "xla_cache" / "torch_xla-2.9.0-v5e"


def test_auto_on_a_plain_tpu_vm_goes_under_the_working_directory(tmp_path: Path) -> None:
    roots = _roots(tmp_path)
    assert _resolve("auto", roots, _hw(chip="v6e")) == tmp_path / "cwd" / ".xla_cache" / "torch_xla-2.9.0-v6e"


@pytest.mark.parametrize(
    "hw",
    [
        _hw("cpu", chip="cpu"),
        _hw("cuda", chip="a100-40gb"),
        _hw("cuda", via_xla=False, chip="l4"),
        _hw("cpu", via_xla=False, chip="cpu"),
    ],
    ids=["xla-cpu", "xla-gpu", "cuda", "cpu"],
)
def test_auto_off_a_tpu_is_off(tmp_path: Path, hw: HardwareInfo) -> None:
    assert _resolve("auto", _roots(tmp_path, drive=True, kaggle=True), hw) is None


def test_none_is_off_even_on_a_tpu(tmp_path: Path) -> None:
    assert _resolve(None, _roots(tmp_path, drive=True)) is None


def test_an_explicit_path_is_used_on_any_xla_run_and_keyed_by_version_and_chip(tmp_path: Path) -> None:
    roots = _roots(tmp_path)
    on_cpu = _resolve(str(tmp_path / "c"), roots, _hw("cpu", chip="cpu"))
    on_tpu = _resolve(str(tmp_path / "c"), roots, _hw("tpu", chip="v5e"))
    assert on_cpu == tmp_path / "c" / "torch_xla-2.9.0-cpu"
    assert on_tpu == tmp_path / "c" / "torch_xla-2.9.0-v5e"  # another chip never reads the CPU's entries
    assert _resolve("rel/cache", roots) == tmp_path / "cwd" / "rel" / "cache" / "torch_xla-2.9.0-v5e"
    assert (
        _resolve(str(tmp_path / "c"), roots, _hw("cuda", via_xla=False, chip="l4")) is None
    )  # no XLA, no cache
    assert cache_key("2.10.0", "v5e") != cache_key("2.9.0", "v5e")  # an upgrade starts a fresh folder


@pytest.mark.parametrize("bad", ["", "   ", 5])
def test_a_setting_that_is_not_a_path_is_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        _resolve(bad, _roots(tmp_path))  # type: ignore[arg-type]
    assert f"train.compile_cache_dir={bad!r} is not allowed" in str(err.value)
    assert "'auto'" in str(err.value) and "None" in str(err.value)


# ---- directories that cannot be used -------------------------------------------------------


def test_a_file_where_the_directory_goes_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    for setting in (str(blocker), str(blocker / "below")):
        with pytest.raises(ConfigError) as err:
            enable_compile_cache(setting, _hw("cpu", chip="cpu"), roots=_roots(tmp_path))
        message = str(err.value)
        assert message.startswith(f"train.compile_cache_dir={setting!r} is not allowed")
        assert f"{blocker} is a file, not a directory" in message
        assert "a directory this process can create and write" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_directory_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=r"train.compile_cache_dir=.* cannot be created or written"):
            prepare_cache_dir(locked / "cache", str(locked))
    finally:
        locked.chmod(0o700)


@pytest.mark.skipif(
    not Path("/sys/kernel").is_dir(), reason="needs Linux's sysfs, which nobody can write into"
)
def test_a_read_only_filesystem_is_a_clear_error_even_for_root() -> None:
    with pytest.raises(ConfigError) as err:
        enable_compile_cache("/sys/workbench-cache", _hw("cpu", chip="cpu"))
    message = str(err.value)
    assert message.startswith(
        "train.compile_cache_dir='/sys/workbench-cache' is not allowed: /sys/workbench-cache/"
    )
    assert (
        "cannot be created or written" in message
        and "a directory this process can create and write" in message
    )


def test_prepare_creates_the_directory_and_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert prepare_cache_dir(target, str(tmp_path / "a")) == target
    assert target.is_dir() and list(target.iterdir()) == []


def test_auto_with_an_unusable_directory_turns_the_cache_off_with_a_notice(tmp_path: Path) -> None:
    roots = _roots(tmp_path, drive=True)
    (roots.drive / "xla_cache").write_text("in the way")
    with pytest.warns(RuntimeWarning, match="compile cache off"):
        cache = enable_compile_cache("auto", _hw("tpu"), roots=roots)
    assert not cache.active and cache.directory is None
    assert len(cache.notices) == 1 and "is a file, not a directory" in cache.notices[0]
    assert cache.run_notices() == []


def test_no_cache_without_xla_and_nothing_said(tmp_path: Path) -> None:
    cache = enable_compile_cache(str(tmp_path / "c"), _hw("cuda", via_xla=False, chip="l4"))
    assert not cache.active and cache.notices == () and cache.run_notices() == []
    assert not (tmp_path / "c").exists()


# ---- `python -m workbench info` -------------------------------------------------------------


def test_describe_says_where_the_cache_goes_and_why_not(tmp_path: Path) -> None:
    roots = _roots(tmp_path, kaggle=True)
    directory = roots.kaggle / "xla_cache" / cache_key(xla_version(), "v5e")
    directory.mkdir(parents=True)
    (directory / "123").write_bytes(b"entry")
    assert describe_compile_cache("auto", _hw("tpu"), roots=roots) == f"{directory} (1 entry)"
    assert "TPU only" in describe_compile_cache("auto", _hw("cpu", chip="cpu"), roots=roots)
    assert describe_compile_cache(None, _hw("tpu"), roots=roots) == "off (train.compile_cache_dir=None)"
    on_cpu = describe_compile_cache(str(tmp_path / "x"), _hw("cpu", chip="cpu"), roots=roots)
    assert "cannot read them back" in on_cpu


def test_info_shows_the_compile_cache() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "CPU_NUM_DEVICES")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "info"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].split() == [
        "compile_cache",
        "off",
        "(the",
        "run",
        "does",
        "not",
        "use",
        "XLA)",
    ]


@pytest.mark.xla
def test_train_command_with_a_file_for_the_cache_dir_cannot_start(tmp_path: Path) -> None:
    blocker = tmp_path / "cache"
    blocker.write_text("x")
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "train", f"train.compile_cache_dir={blocker}", "train.steps=1"],
        cwd=REPO,
        env=xla_env(1),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: train.compile_cache_dir='{blocker}' is not allowed: {blocker} is a file" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- on XLA:CPU for real: two sessions, one directory ----------------------------------------


@pytest.fixture(scope="module")
def two_sessions(xla_scenario, tmp_path_factory) -> tuple[Path, dict, dict]:
    cache_dir = tmp_path_factory.mktemp("xla_cache")
    first = xla_scenario("compile_cache", devices=1, cache_dir=str(cache_dir))
    second = xla_scenario("compile_cache", devices=1, cache_dir=str(cache_dir))
    return cache_dir, first, second


def _cache_notices(notices: list[str]) -> list[str]:
    return [n for n in notices if n.startswith("compile cache")]


@pytest.mark.xla
def test_the_first_session_writes_its_programs_into_the_directory(two_sessions) -> None:
    cache_dir, first, _ = two_sessions
    directory = Path(first["directory"])
    assert first["active"] and directory.parent == cache_dir and directory.name.endswith("-cpu")
    written = first["lookups"]["not_found"]
    assert written >= 2  # the warm-up's step programs at least
    assert len(first["files"]) == written and all(f.startswith(directory.name + "/") for f in first["files"])
    assert first["lookups"]["unreadable"] == 0 and first["lookups"]["loaded"] == 0
    (said,) = _cache_notices(first["notices"])
    assert (
        said
        == f"compile cache: 0 of {written} programs loaded from {directory}, {written} compiled and written to it"
    )


@pytest.mark.xla
def test_the_second_session_cannot_read_them_back_on_xla_cpu_and_says_so_once(two_sessions) -> None:
    _, first, second = two_sessions
    programs = first["lookups"]["not_found"]
    # every program was found on disk, failed to load (PersistentCacheDeserializeFailure) and compiled again
    assert second["lookups"] == {"loaded": 0, "not_found": 0, "unreadable": programs}
    assert second["compiles"] == first["compiles"]
    assert second["files"] == first["files"]  # rewritten under the same keys
    (said,) = _cache_notices(second["notices"])
    assert (
        "XLA:CPU" in said and "cannot read them back" in said and f"{programs} of {programs} failed" in said
    )
    assert "no compile time is saved" in said and "loaded from" not in said
    assert second["final_loss"] == first["final_loss"] and second["steps"] == first["steps"]


@pytest.mark.xla
def test_a_cache_asked_for_after_xla_compiled_says_it_is_too_late(xla_scenario, tmp_path: Path) -> None:
    result = xla_scenario("compile_cache", devices=1, cache_dir=str(tmp_path / "late"), compile_first=True)
    assert not result["active"] and result["files"] == [] and result["steps"] == 2
    (said,) = _cache_notices(result["notices"])
    assert said.startswith("compile cache not enabled: XLA already compiled programs in this process")
    assert "enable_compile_cache(cfg.train.compile_cache_dir, hw)" in said and "restart the runtime" in said
