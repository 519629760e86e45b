"""TorchTPU routing with stand-in packages: which ``torch_tpu`` is Google's, which backend a run takes,
what a TorchTPU run refuses, the doctor's pins and ``info``'s line. The one test that needs a chip is
marked ``tpu`` and skipped unless the host has a TPU and TorchTPU (without torch_xla).

The stand-ins are directories put on ``sys.path``: a ``torch_tpu`` package and its ``.dist-info`` as each
vendor's wheel writes it. TorchTPU's METADATA is torch-tpu 0.2.0's (PyPI, bazel-built: RECORD, no
top_level.txt); the other vendor's is SOPHGO's setup.py (also named ``torch_tpu``, with a top_level.txt).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from workbench import WorkbenchConfig
from workbench.backend import hardware, routing
from workbench.backend.hardware import HardwareError, HardwareInfo
from workbench.backend.native import process_group
from workbench.backend.routing import BackendConflictError, MachineFacts
from workbench.backend.torchtpu import plan
from workbench.backend.torchtpu.detect import find_torch_tpu, is_torchtpu_metadata, torchtpu_installed
from workbench.backend.xla import presence
from workbench.doctor.roots import InstalledPackages
from workbench.doctor.torchtpu_pins import torchtpu_checks
from workbench.doctor.versions import torch_checks

GOOGLE_METADATA = """\
Metadata-Version: 2.1
Name: torch_tpu
Version: 0.2.0
Summary: TPU/XLA support for PyTorch
Home-page: https://github.com/google-pytorch/torch_tpu
Author: torch team
License: Apache 2.0
Classifier: Development Status :: 4 - Beta
Requires-Python: >=3.11
Requires-Dist: numpy>=2
Requires-Dist: absl-py>=2
Requires-Dist: libtpu>=0.0.50
Requires-Dist: torch>=2.11.0,<=2.15.0
Description-Content-Type: text/markdown

TorchTPU
"""
SOPHGO_METADATA = """\
Metadata-Version: 2.1
Name: torch_tpu
Version: 2.1.0.post1
Summary: TPU bridge for PyTorch
Home-page: https://github.com/sophgo/torch-tpu
Author: sophgo
Author-email: dev@sophgo.com
"""


def _site(root: Path, metadata: str, *, version: str, top_level: bool) -> Path:
    """A site directory holding a ``torch_tpu`` package and the dist-info its wheel writes."""
    (root / "torch_tpu").mkdir(parents=True)
    (root / "torch_tpu" / "__init__.py").write_text("raise ImportError('a stand-in: never imported')\n")
    info = root / f"torch_tpu-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(metadata)
    files = ["torch_tpu/__init__.py", f"{info.name}/METADATA", f"{info.name}/RECORD"]
    if top_level:
        (info / "top_level.txt").write_text("torch_tpu\n")
        files.append(f"{info.name}/top_level.txt")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    return root


@pytest.fixture
def google_site(tmp_path: Path) -> Path:
    return _site(tmp_path / "google", GOOGLE_METADATA, version="0.2.0", top_level=False)


@pytest.fixture
def sophgo_site(tmp_path: Path) -> Path:
    return _site(tmp_path / "sophgo", SOPHGO_METADATA, version="2.1.0.post1", top_level=True)


@pytest.fixture(autouse=True)
def _fresh_detection(request):
    """`detect`'s cache empty on both sides of each test; off a TPU, no torch_tpu ever imported."""
    on_tpu = request.node.get_closest_marker("tpu") is not None
    hardware.detect.cache_clear()
    yield
    hardware.detect.cache_clear()
    assert on_tpu or "torch_tpu" not in sys.modules  # found from metadata, never imported


def _hw(backend: str, *, via_xla: bool = False, chip: str = "cpu") -> HardwareInfo:
    return HardwareInfo(
        backend,
        via_xla,
        "TPU v6e-8" if backend == "tpu" else backend.upper(),
        chip,  # type: ignore[arg-type]
        8 if backend == "tpu" else 1,
        8 if backend == "tpu" else 1,
        1,
        0,
        None,
        None,
        1,
        "local",
    )


def _facts(
    torch_tpu=None, *, xla: bool = False, tpu: bool = True, cuda: bool = False, pjrt=None
) -> MachineFacts:
    return MachineFacts(
        xla_installed=xla, torch_tpu=torch_tpu, tpu_present=tpu, cuda_available=cuda, pjrt_device=pjrt
    )


# ---- which torch_tpu is TorchTPU ------------------------------------------------------------------


def test_torchtpu_is_found_by_its_distribution_metadata_without_importing_it(google_site, monkeypatch):
    found = find_torch_tpu([str(google_site)])
    assert found is not None and found.is_torchtpu and found.notice() is None
    assert (found.distribution, found.version, found.author) == ("torch_tpu", "0.2.0", "torch team")
    assert found.home_page == "https://github.com/google-pytorch/torch_tpu"
    assert not torchtpu_installed()  # not on sys.path yet
    monkeypatch.syspath_prepend(str(google_site))
    assert torchtpu_installed()


def test_another_vendors_torch_tpu_is_not_torchtpu_and_a_notice_says_whose_it_is(sophgo_site):
    found = find_torch_tpu([str(sophgo_site)])
    assert found is not None and found.distribution == "torch_tpu" and not found.is_torchtpu
    assert "github.com/sophgo/torch-tpu" in found.notice() and "not from TorchTPU" in found.notice()
    assert "2.1.0.post1" in found.notice() and "sophgo" in found.notice()


def test_a_torch_tpu_module_without_metadata_is_not_torchtpu(tmp_path):
    (tmp_path / "torch_tpu").mkdir()
    (tmp_path / "torch_tpu" / "__init__.py").write_text("")
    found = find_torch_tpu([str(tmp_path)])
    assert (
        found is not None and not found.is_torchtpu and "no installed distribution metadata" in found.notice()
    )
    assert find_torch_tpu([str(tmp_path / "elsewhere")]) is None


def test_an_editable_torchtpu_is_found_by_the_metadata_it_left_in_site_packages(tmp_path, google_site):
    source = tmp_path / "checkout"
    (source / "torch_tpu").mkdir(parents=True)
    (source / "torch_tpu" / "__init__.py").write_text("")
    (google_site / "torch_tpu" / "__init__.py").unlink()
    (google_site / "torch_tpu").rmdir()
    info = google_site / "torch_tpu-0.2.0.dist-info"
    (info / "top_level.txt").write_text("torch_tpu\n")  # setuptools' editable install writes one
    found = find_torch_tpu([str(source), str(google_site)])
    assert found is not None and found.is_torchtpu and found.module_path == str(source / "torch_tpu")


@pytest.mark.parametrize(
    ("name", "url", "is_it"),
    [
        ("torch_tpu", "https://github.com/google-pytorch/torch_tpu", True),
        ("Torch-TPU", "http://GitHub.com/google-pytorch/torch_tpu.git/", True),
        ("torch_tpu", "https://github.com/google-pytorch/torch_tpu/issues", True),
        ("torch_tpu", "https://github.com/sophgo/torch-tpu", False),  # the same name, another vendor
        ("torch_tpu", "https://github.com/google-pytorch/torch_tpu_fork", False),
        ("tpu-tools", "https://github.com/google-pytorch/torch_tpu", False),
    ],
)
def test_the_name_and_the_home_page_together_identify_torchtpu(name, url, is_it):
    assert is_torchtpu_metadata(name, [url]) is is_it


# ---- routing -------------------------------------------------------------------------------------


def test_torchtpu_without_torch_xla_on_a_tpu_host_routes_to_torchtpu(google_site):
    route = routing.choose("auto", _facts(find_torch_tpu([str(google_site)])))
    assert (route.backend, route.device_type, route.label) == ("torchtpu", "tpu", "TorchTPU")
    assert "torch_xla is not" in route.rule and "process group 'tpu'" in route.rule
    assert routing.choose("tpu", _facts(find_torch_tpu([str(google_site)]))).backend == "torchtpu"


@pytest.mark.parametrize(
    ("facts", "backend", "device_type"),
    [
        (dict(xla=True), "torch_xla", "tpu"),  # torch_xla alone stays the TPU default
        (dict(xla=False, tpu=False), "native-cpu", "cpu"),  # TorchTPU installed, no TPU: nothing to drive
        (dict(xla=False, tpu=False, cuda=True), "native-cuda", "cuda"),
        (dict(xla=False, pjrt="CPU"), "native-cpu", "cpu"),  # PJRT_DEVICE=CPU without torch_xla
    ],
)
def test_the_other_routes_around_torchtpu(google_site, facts, backend, device_type):
    torch_tpu = find_torch_tpu([str(google_site)]) if not facts.get("xla") else None
    route = routing.choose("auto", _facts(torch_tpu, **facts))
    assert (route.backend, route.device_type) == (backend, device_type)


def test_torch_xla_beside_torchtpu_is_refused_naming_what_to_uninstall(google_site):
    both = _facts(find_torch_tpu([str(google_site)]), xla=True)
    for device_type in ("auto", "tpu", "xla"):
        with pytest.raises(BackendConflictError) as err:
            routing.choose(device_type, both)
        message = str(err.value)
        assert "pip uninstall -y torch-tpu" in message and "pip uninstall -y torch_xla" in message
        assert "torch-tpu 0.2.0" in message and "\n" not in message
    # a CUDA or CPU run touches neither
    assert routing.choose("cpu", both).backend == "native-cpu"
    assert (
        routing.choose("auto", _facts(both.torch_tpu, xla=True, tpu=False, cuda=True)).backend
        == "native-cuda"
    )


def test_another_vendors_torch_tpu_never_routes_a_run_and_is_noticed(sophgo_site):
    route = routing.choose("auto", _facts(find_torch_tpu([str(sophgo_site)])))
    assert route.backend == "native-cpu" and "sophgo" in route.notices[0]
    # with torch_xla it is no conflict: torch_xla drives the TPU
    assert routing.choose("auto", _facts(find_torch_tpu([str(sophgo_site)]), xla=True)).backend == "torch_xla"


def test_detect_takes_the_torchtpu_route_and_refuses_torch_xla_beside_it(google_site, monkeypatch):
    monkeypatch.syspath_prepend(str(google_site))
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.setattr(presence, "tpu_present", lambda: True)
    monkeypatch.setattr(hardware, "_cuda_available", lambda: False)
    # torch_xla is installed here: with TorchTPU beside it, a TPU run is refused before anything starts
    for device_type in ("auto", "tpu", "xla"):
        with pytest.raises(HardwareError, match=r"both installed.*pip uninstall -y torch-tpu"):
            hardware.detect(device_type)
        hardware.detect.cache_clear()
    # without torch_xla: TorchTPU's devices (what the chip query would answer stands in for it)
    monkeypatch.setattr(presence, "xla_installed", lambda: False)
    monkeypatch.setattr(plan, "local_devices", lambda: ("TPU v6e-8", 8))
    hw = hardware.detect("auto")
    assert (hw.backend, hw.via_xla, hw.device_string, hw.chip, hw.num_devices) == (
        "tpu",
        False,
        "tpu",
        "v6e",
        8,
    )
    assert routing.execution_backend(hw) == "torchtpu" and hardware.detect("tpu").backend == "tpu"


def test_a_torchtpu_run_uses_the_tpu_process_group_and_compile_backend():
    assert [process_group.group_backend(d) for d in ("tpu", "cuda", "cpu")] == ["tpu", "nccl", "gloo"]
    compile_backends = {
        "torchtpu": routing.compile_backend(_hw("tpu", chip="v6e")),
        "torch_xla": routing.compile_backend(_hw("tpu", via_xla=True, chip="v6e")),
        "native-cuda": routing.compile_backend(_hw("cuda", chip="h100")),
        "native-cpu": routing.compile_backend(_hw("cpu")),
    }
    assert compile_backends == {
        "torchtpu": "tpu",
        "torch_xla": None,
        "native-cuda": "inductor",
        "native-cpu": "inductor",
    }


def test_torchtpu_is_not_offered_torch_xla_s_pallas_flash_attention():
    from workbench.models.attention_choice import choose_attention

    assert choose_attention("auto", _hw("tpu", via_xla=True, chip="v6e"), seq_len=256) == "flash"
    assert choose_attention("auto", _hw("tpu", chip="v6e"), seq_len=2048) == "chunked"
    with pytest.raises(ValueError, match=r"model\.attention='flash' is not allowed"):
        choose_attention("flash", _hw("tpu", chip="v6e"), seq_len=256)


# ---- what a TorchTPU run refuses -----------------------------------------------------------------


def test_mesh_model_on_torchtpu_is_refused_in_one_line_naming_what_to_use(monkeypatch):
    from workbench.backend.protocol import OneProcess
    from workbench.backend.selection import backend_for
    from workbench.config import ConfigError
    from workbench.train.ranks import start_replicas

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    cfg = WorkbenchConfig()
    cfg.mesh.model = 2
    with pytest.raises(ConfigError) as err:
        start_replicas(cfg, backend_for(_hw("tpu", chip="v6e")))
    message = str(err.value)
    assert message.startswith("mesh.model=2 is not supported on TorchTPU") and "\n" not in message
    assert "mesh.fsdp" in message and "mesh.data" in message and "torch_xla" in message
    cfg.mesh.model = 1  # data and fsdp are TorchTPU's (DTensor meshes); one process without torchrun
    assert isinstance(start_replicas(cfg, backend_for(_hw("tpu", chip="v6e"))), OneProcess)


def test_a_launch_on_a_torchtpu_host_refuses_mesh_model_before_any_rank_starts(google_site, monkeypatch):
    from workbench import launch

    cfg = WorkbenchConfig()
    cfg.mesh.model, cfg.train.batch_size = 2, 8
    torchtpu_host = _facts(find_torch_tpu([str(google_site)]))
    monkeypatch.setattr(hardware, "machine_facts", lambda: torchtpu_host)
    with pytest.raises(ValueError, match=r"^mesh\.model=2 is not supported on TorchTPU"):
        launch.check_launch(4, cfg)
    monkeypatch.setattr(hardware, "machine_facts", lambda: _facts(torchtpu_host.torch_tpu, xla=True))
    with pytest.raises(ValueError, match="pip uninstall -y torch-tpu"):
        launch.check_launch(4, cfg)
    cfg.mesh.model, cfg.mesh.fsdp = 1, 4
    monkeypatch.setattr(hardware, "machine_facts", lambda: torchtpu_host)
    launch.check_launch(4, cfg)  # data and fsdp over TorchTPU's ranks are fine


# ---- the doctor's pins ---------------------------------------------------------------------------

HOME = {"torch-tpu": ["https://github.com/google-pytorch/torch_tpu"]}
PINS = {"torch-tpu": ["numpy>=2", "libtpu>=0.0.50", "torch>=2.11.0,<=2.15.0"]}


def _checks(versions: dict[str, str], *, tpu: bool = True, home=HOME, pins=PINS) -> dict[str, object]:
    packages = InstalledPackages(versions, pins, home)
    return {c.name: c for c in [*torch_checks(packages, tpu=tpu), *torchtpu_checks(packages, tpu=tpu)]}


def test_torchtpu_with_its_pins_passes_and_torch_xla_s_absence_is_fine():
    checks = _checks({"torch-tpu": "0.2.0", "torch": "2.15.0+cpu", "libtpu": "0.0.50"})
    assert all(c.status == "ok" for c in checks.values()), checks
    assert "TorchTPU drives the TPU" in checks["torch_xla"].saw
    assert "torch<=2.15.0,>=2.11.0" in checks["TorchTPU torch"].saw


@pytest.mark.parametrize(
    ("versions", "tpu", "name", "status", "words"),
    [
        ({"torch": "2.9.0"}, True, "TorchTPU torch", "fail", 'pip install "torch<=2.15.0,>=2.11.0"'),
        ({"torch": "2.16.0"}, True, "TorchTPU torch", "fail", "needs torch<=2.15.0,>=2.11.0"),
        ({"libtpu": "0.0.21.1"}, True, "TorchTPU libtpu", "fail", 'pip install "libtpu>=0.0.50"'),
        ({"libtpu": "0.0.21.1"}, False, "TorchTPU libtpu", "warn", "needs libtpu>=0.0.50"),
        ({"torch_xla": "2.9.0"}, True, "TorchTPU and torch_xla", "fail", "pip uninstall -y torch-tpu"),
    ],
)
def test_torchtpu_outside_its_pins_fails_with_the_pip_line(versions, tpu, name, status, words):
    check = _checks({"torch-tpu": "0.2.0", "torch": "2.12.0", "libtpu": "0.0.51", **versions}, tpu=tpu)[name]
    assert check.status == status and words in f"{check.saw} {check.fix}"


def test_the_pins_are_read_from_torch_tpu_s_own_requires_dist():
    newer = {"torch-tpu": ["libtpu>=0.0.60", "torch>=2.12,<=2.16"]}
    checks = _checks({"torch-tpu": "0.3.0", "torch": "2.16.0", "libtpu": "0.0.55"}, pins=newer)
    assert checks["TorchTPU torch"].status == "ok" and checks["TorchTPU libtpu"].status == "fail"


def test_another_vendors_torch_tpu_gets_one_warning_and_no_pins():
    sophgo = {"torch-tpu": ["https://github.com/sophgo/torch-tpu"]}
    checks = _checks({"torch-tpu": "2.1.0.post1", "torch": "2.1.0"}, home=sophgo)
    assert checks["TorchTPU"].status == "warn" and "not TorchTPU" in checks["TorchTPU"].saw
    assert (
        "TorchTPU torch" not in checks and checks["torch_xla"].status == "fail"
    )  # a TPU, nothing to drive it


def test_the_doctor_on_a_tpu_host_with_torchtpu_alone_passes_and_with_torch_xla_fails(tmp_path):
    from tests.test_doctor import REQUIREMENTS, _roots, _tpu
    from workbench.doctor import doctor

    for name in ("proc", "dev", "sys", "tmp", "fs", "work"):
        (tmp_path / name).mkdir()
    _tpu(tmp_path)
    alone = {"torch": "2.12.0+cpu", "torch_xla": None, "torch-tpu": "0.2.0", "libtpu": "0.0.51"}
    fields = dict(requirements={**REQUIREMENTS, **PINS}, home_pages=HOME)
    report = doctor(roots=_roots(tmp_path, versions=alone, **fields))
    assert report.ok, report.table()
    assert (
        report.check("TorchTPU torch").status == "ok" and "TorchTPU drives" in report.check("torch_xla").saw
    )
    both = doctor(roots=_roots(tmp_path, versions={**alone, "torch_xla": "2.9.0"}, **fields))
    assert both.check("TorchTPU and torch_xla").status == "fail" and not both.ok


def test_the_doctor_reads_torchtpu_s_metadata_from_the_installed_wheel(google_site, monkeypatch):
    monkeypatch.syspath_prepend(str(google_site))
    packages = InstalledPackages()
    assert packages.version("torch-tpu") == "0.2.0"
    assert packages.urls("torch-tpu") == ["https://github.com/google-pytorch/torch_tpu"]
    assert "torch>=2.11.0,<=2.15.0" in packages.requires("torch-tpu")
    names = {c.name: c for c in torchtpu_checks(packages, tpu=False)}
    assert names["TorchTPU and torch_xla"].status == "fail"  # this venv has torch_xla 2.9 and torch 2.9
    assert names["TorchTPU torch"].status == "fail" and "2.9.0" in names["TorchTPU torch"].saw


# ---- info ----------------------------------------------------------------------------------------


def test_info_says_which_backend_a_run_uses_and_why(google_site, monkeypatch, capsys):
    from workbench.__main__ import _info, main

    facts = _facts(find_torch_tpu([str(google_site)]))
    text = _info(_hw("tpu", chip="v6e"), as_json=False, facts=facts)
    line = next(row for row in text.splitlines() if row.startswith("execution"))
    assert line.endswith(
        "TorchTPU: torch_tpu 0.2.0 from https://github.com/google-pytorch/torch_tpu is installed and torch_xla "
        "is not; one process per chip on the tpu device, process group 'tpu'"
    )
    # on this machine, for real
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^execution +native CPU: no TPU, CUDA device or PJRT_DEVICE=CPU here$", out, re.M), out


# ---- on a TPU ------------------------------------------------------------------------------------

ON_TORCHTPU = torchtpu_installed() and not presence.xla_installed() and presence.tpu_present()


@pytest.mark.tpu
@pytest.mark.skipif(not ON_TORCHTPU, reason="needs a TPU host with TorchTPU installed and torch_xla not")
def test_on_a_tpu_a_step_runs_on_the_tpu_device_and_compiles_with_backend_tpu():  # pragma: no cover
    import torch

    hw = hardware.detect("auto")
    assert routing.execution_backend(hw) == "torchtpu" and hw.num_devices >= 1
    layer = torch.nn.Linear(8, 8).to(torch.device(hw.device_string))
    compiled = torch.compile(layer, backend=routing.compile_backend(hw), dynamic=False)
    x = torch.ones(2, 8, device=hw.device_string)
    assert torch.allclose(compiled(x).cpu(), layer(x).cpu(), atol=1e-5)


def test_a_bf16_mixed_step_on_torchtpu_autocasts_only_where_tpu_has_an_autocast():
    """torch without TorchTPU knows no device 'tpu': no autocast (fp32 compute), never an error."""
    import torch

    from workbench.backend.selection import backend_for

    backend = backend_for(_hw("tpu", chip="v6e"))
    with backend.autocast("bf16-mixed"):
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
