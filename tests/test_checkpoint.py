"""Checkpoints: round trip, keep-last-N, crash before rename, truncation/corruption, SPMD shards."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from workbench.train.checkpoint import CheckpointError, CheckpointManager
from workbench.train.state_io import capture_rng, flatten_state, restore_rng

from .conftest import REPO


def _state(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randn(8, 4, generator=gen)
    return {
        "model": {
            "embed.weight": shared,
            "lm_head.weight": shared,
            "norm.weight": torch.ones(4, dtype=torch.bfloat16),
        },
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(8, 4, generator=gen)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0]}],
        },
        "sampler": {"epoch": 1, "batches_in_epoch": 7},
        "rng": {"numpy": np.random.RandomState(seed).get_state()},
        "step": 12,
    }


def test_round_trip_keeps_structure_types_and_values(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    state = _state()
    path = manager.save(12, state)
    assert path.name == "step-00000012"
    assert (path / "model.safetensors").is_file() and (path / "state.json").is_file()
    loaded = manager.load()
    assert set(loaded) == set(state)
    for key, value in state["model"].items():
        assert torch.equal(loaded["model"][key], value) and loaded["model"][key].dtype == value.dtype
    assert list(loaded["optimizer"]["state"]) == [0]  # int keys survive
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert loaded["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert loaded["sampler"] == state["sampler"] and loaded["step"] == 12
    np_state = loaded["rng"]["numpy"]
    assert np_state[0] == "MT19937" and np.array_equal(np_state[1], state["rng"]["numpy"][1])


def test_model_file_is_plain_safetensors_weights(tmp_path):
    from safetensors.torch import load_file

    path = CheckpointManager(tmp_path).save(1, _state())
    weights = load_file(str(path / "model.safetensors"))
    assert sorted(weights) == ["embed.weight", "lm_head.weight", "norm.weight"]


def test_keeps_only_the_newest_n(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (5, 10, 15):
        manager.save(step, _state(step))
    assert [p.name for p in manager.checkpoints()] == ["step-00000010", "step-00000015"]
    assert manager.latest().name == "step-00000015"


def test_a_restarted_run_keeps_and_resumes_its_own_lower_steps(tmp_path):
    # An abandoned run left steps 100 and 200; a new run (resume=False) saves step 10.
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (100, 200, 10):
        manager.save(step, _state(step))
    # the one just written survives, the oldest written goes, and resuming picks the new run
    assert [p.name for p in manager.checkpoints()] == ["step-00000200", "step-00000010"]
    assert manager.latest().name == "step-00000010"


def test_crash_while_resaving_a_step_puts_the_moved_aside_copy_back(tmp_path):
    manager = CheckpointManager(tmp_path, keep=1)
    manager.save(4, _state(4))
    # _commit moves step-4 aside before renaming the new step-4 in; a crash in between leaves:
    (tmp_path / "step-00000004").rename(tmp_path / ".tmp-old-step-00000004-0123abcd")
    assert manager.latest().name == "step-00000004"  # listing the checkpoints puts the copy back
    (tmp_path / "step-00000004").rename(tmp_path / ".tmp-old-step-00000004-0123abcd")
    manager.save(5, _state(5))  # so does the next save, which then prunes by keep
    assert manager.latest().name == "step-00000005"
    manager = CheckpointManager(tmp_path, keep=2)
    (tmp_path / "step-00000005").rename(tmp_path / ".tmp-old-step-00000005-0123abcd")
    manager.save(6, _state(6))
    assert [p.name for p in manager.checkpoints()] == ["step-00000005", "step-00000006"]
    assert manager.load(tmp_path / "step-00000005")["step"] == 12


def test_state_that_is_not_a_dict_of_string_keys_is_named(tmp_path):
    manager = CheckpointManager(tmp_path)
    with pytest.raises(CheckpointError, match=r"state is a list: it must be a dict with string keys"):
        manager.save(1, [1, 2])
    with pytest.raises(CheckpointError, match=r"state key 3 \(int\) is not allowed: keys must be strings"):
        manager.save(1, {3: torch.zeros(1)})


def test_a_sharded_manager_without_the_runs_backend_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(
        ValueError, match=r"sharded=True needs the run's backend.*replicas=OneProcess\(backend\)"
    ):
        CheckpointManager(tmp_path, sharded=True)


def test_rng_written_on_one_backend_resumes_on_another(tmp_path):
    """The device's RNG state sits beside the host's under its backend's own key (torch_xla's seed as
    "xla"): a checkpoint written on another backend restores the host's RNGs and leaves that key alone."""
    from workbench.backend.hardware import detect
    from workbench.backend.selection import backend_for

    host = backend_for(detect("cpu"))
    torch.manual_seed(5)
    state = capture_rng(host)
    assert set(state) <= {"python", "numpy", "torch", "cuda"}
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"rng": {**state, "xla": 12345}})  # as torch_xla's backend writes it
    expected = torch.rand(3)
    torch.manual_seed(0)
    restore_rng(manager.load()["rng"], host)
    assert torch.equal(torch.rand(3), expected)


def test_rng_capture_restore_replays_the_same_numbers(tmp_path):
    manager = CheckpointManager(tmp_path)
    torch.manual_seed(3)
    manager.save(1, {"rng": capture_rng()})
    expected = (torch.rand(3), np.random.rand(2), __import__("random").random())
    torch.manual_seed(99)
    restore_rng(manager.load()["rng"])
    again = (torch.rand(3), np.random.rand(2), __import__("random").random())
    assert (
        torch.equal(expected[0], again[0])
        and np.array_equal(expected[1], again[1])
        and expected[2] == again[2]
    )


def test_crash_between_write_and_rename_leaves_previous_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, _state(1))
    # A real crash: the process dies (no cleanup runs) at the moment of the rename.
    script = textwrap.dedent(f"""
        import os, torch
        from workbench.train import checkpoint
        def die(*args, **kwargs):
            os._exit(17)
        checkpoint.os.replace = die
        checkpoint.CheckpointManager({str(tmp_path)!r}).save(2, {{"model": {{"w": torch.zeros(4)}}, "step": 2}})
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 17, proc.stderr
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers, "the crashed save should have left its temporary directory behind"
    assert manager.latest().name == "step-00000001"
    assert manager.load()["step"] == 12
    manager.save(3, _state(3))  # the next save clears the crash's leftovers
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_truncated_checkpoint_fails_clearly(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = manager.save(1, _state())
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated"):
        manager.load(path)


def test_corrupted_checkpoint_fails_clearly(tmp_path):
    manager = CheckpointManager(tmp_path)
    path = manager.save(1, _state())
    weights = path / "optimizer.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors is corrupted"):
        manager.load(path)


def test_incomplete_and_missing_checkpoints_fail_clearly(tmp_path):
    manager = CheckpointManager(tmp_path)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        manager.load()
    path = manager.save(1, _state())
    (path / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        manager.load(path)
    assert manager.latest() is None  # a directory without manifest is not offered for resume


def test_unsupported_values_are_named():
    with pytest.raises(CheckpointError, match=r"cannot checkpoint a object at sampler/bad"):
        flatten_state({"sampler": {"bad": object()}})


@pytest.fixture(scope="module")
def dcp_checkpoint(xla_scenario, tmp_path_factory):
    """tests/xla/dcp_checkpoint.py: save and load SPMD-sharded tensors (fsdp over 8 devices), and a
    sharded *and* partially replicated one (data x fsdp)."""
    root = tmp_path_factory.mktemp("dcp")
    return xla_scenario("dcp_checkpoint", checkpoint_dir=str(root), hsdp_dir=str(root / "hsdp"))


@pytest.mark.xla
def test_sharded_checkpoint_through_dcp_under_spmd(dcp_checkpoint):
    assert any(f.startswith("model.dcp/") for f in dcp_checkpoint["files"]), dcp_checkpoint["files"]


@pytest.mark.xla
def test_sharded_checkpoint_restores_the_values(dcp_checkpoint):
    assert dcp_checkpoint["b_ok"] and dcp_checkpoint["w_ok"] and dcp_checkpoint["step"] == 4


@pytest.mark.xla
def test_sharded_checkpoint_loads_in_place_keeping_the_sharding(dcp_checkpoint):
    assert dcp_checkpoint["w_in_place"] and dcp_checkpoint["spec_kept"]


@pytest.mark.xla
def test_a_manager_outside_a_run_loads_sharded_xla_tensors_in_place(dcp_checkpoint):
    """`CheckpointManager(root)` with no run's backend reads a DCP part through the planner of the
    device its targets are on (torch_xla's SPMD planner for XLA tensors)."""
    assert dcp_checkpoint["w_ok_without_a_backend"]


@pytest.mark.xla
def test_partially_replicated_tensors_fall_back_to_full_tensors(dcp_checkpoint):
    assert "model.safetensors" in dcp_checkpoint["hsdp_files"] and dcp_checkpoint["hsdp_ok"]


@pytest.mark.xla
def test_finiteness_check_reads_a_shard_without_its_padding(dcp_checkpoint):
    """A save refuses a state holding inf or nan (`first_non_finite`), reading each local shard as it is
    written: the padding of an uneven split is not the state, a value inside the shard is."""
    assert dcp_checkpoint["padding_rows"] > 0 and dcp_checkpoint["padding_ignored"]
    assert dcp_checkpoint["non_finite_found"] == ["model/u", float("inf")]


@pytest.mark.xla
def test_the_xla_seed_is_captured_under_its_own_key_and_restored(dcp_checkpoint):
    assert dcp_checkpoint["rng_seed_is_an_int"] and dcp_checkpoint["rng_seed_restored"]
    assert dcp_checkpoint["rng_seed_kept_by_a_host_state"]
