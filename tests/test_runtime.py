"""The runtime seam's look-only checks: they must answer without importing torch_xla."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from workbench.backend.xla import presence, runtime, scan_support


def _pci_device(root: Path, name: str, vendor: str, device: str) -> None:
    entry = root / name
    entry.mkdir(parents=True)
    (entry / "vendor").write_text(vendor + "\n")
    (entry / "device").write_text(device + "\n")


def test_tpu_chips_are_counted_from_the_pci_bus(tmp_path: Path) -> None:
    _pci_device(tmp_path, "0000:00:04.0", "0x1ae0", "0x0063")  # a v5e chip
    _pci_device(tmp_path, "0000:00:05.0", "0x1ae0", "0x0063")
    _pci_device(tmp_path, "0000:00:06.0", "0x1ae0", "0x0042")  # gVNIC: Google's, but a network card
    _pci_device(tmp_path, "0000:00:07.0", "0x10de", "0x2330")  # an NVIDIA H100
    (tmp_path / "0000:00:08.0").mkdir()  # a device whose files cannot be read
    assert presence.tpu_pci_chips(tmp_path) == 2
    assert presence.tpu_pci_chips(tmp_path / "missing") == 0


def test_tpu_present_sees_chips_without_any_tpu_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("PJRT_DEVICE", "TPU_ACCELERATOR_TYPE", "TPU_NAME", "COLAB_TPU_ADDR", "TPU_WORKER_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)
    monkeypatch.setattr(runtime.os, "listdir", lambda path: [])
    monkeypatch.setattr(runtime.os.path, "isdir", lambda path: False)
    monkeypatch.setattr(presence, "tpu_pci_chips", lambda: 4)
    assert presence.tpu_present()
    monkeypatch.setattr(presence, "tpu_pci_chips", lambda: 0)
    assert not presence.tpu_present()


def test_looking_imports_no_torch_xla() -> None:
    code = (
        "import sys; from workbench.backend.xla import presence, runtime; "
        "presence.tpu_present(); presence.xla_installed(); presence.env_requests_xla(); "
        "runtime.xla_imported(); runtime.runtime_started(); print('torch_xla' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_notebook_saved_before_presence_moved_still_asks_runtime_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"runtime\.tpu_present moved to .*presence\.tpu_present"):
        assert runtime.tpu_present() == presence.tpu_present()
    with pytest.raises(AttributeError):
        runtime.no_such_function  # noqa: B018


# ---- scan on a mesh: torch_xla's JAX bridge or the plain backward ----------------------------


def test_the_scan_backward_without_the_jax_bridge_is_the_plain_backward() -> None:
    backward = scan_support.backward_without_shard_alike
    assert backward(1, 2, lambda carry, x: (carry + x, x), init=0, xs=[0]) == (3, 2)


def test_the_installed_torch_xla_has_what_the_scan_workaround_replaces() -> None:
    # Read, not imported: a rename in torch_xla would otherwise silently switch the workaround off.
    spec = importlib.util.find_spec("torch_xla")
    root = Path(spec.origin).parent
    scan_source = (root / "experimental" / "scan.py").read_text()
    probes_source = (root / "_internal" / "jax_workarounds.py").read_text()
    assert "def _backward_shard_alike(carry, x, backward, init, xs):" in scan_source
    assert "def maybe_get_torchax():" in probes_source and "def maybe_get_jax(" in probes_source
