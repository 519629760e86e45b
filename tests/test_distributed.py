"""Training across processes started by torchrun, on the CPU with gloo (issue #25).

Every launch here is real: ``torchrun --standalone`` (a free port each time) starting 2 or 4 ranks of
the tiny default model on ``train.device_type=cpu``. What is checked:

- the loss curve (and grad norms, eval losses) of DDP, FSDP2 and HSDP, full fine-tune and LoRA, with
  and without gradient accumulation, equals one process's with the same global batch, and the
  ranks' slices of every micro-batch put together are the batch that process trained on
  (`tests/dist/losses.py` trains the configs in sequence in one launch);
- a checkpoint written by 2 ranks (started with ``--nproc 2``) holds exactly what they held, is
  complete, and resumes with 1, 2 and 4 processes, continuing the uninterrupted run's losses
  (`tests/dist/probe/sitecustomize.py` records, inside the CLI's processes, the state a save was
  handed and the state a resume loaded);
- a killed rank and a hung rank end the launch within 60 s, naming the rank; a config that differs
  between ranks, ``mesh.model=2`` and a mesh that does not fit the ranks are refused at start;
- the pieces without processes: `take_rows`, `differences`, the torchrun command line, the
  watchdog's bookkeeping, `rank_mesh`.

The launches cost most of the time (imports, on 2 cores): independent ones run side by side.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.conftest import REPO
from tests.dist import flat_state
from tests.dist.losses import REFERENCE
from workbench.backend.native import process_group
from workbench.backend.native.process_group import RankWatchdog
from workbench.launch import gpu_notice, torchrun_command, without_nproc
from workbench.parallel.torch_parallel import RankMesh, RankMeshError, rank_mesh
from workbench.train.checkpoint import CheckpointManager
from workbench.train.ranks import take_rows

PROBE = REPO / "tests" / "dist" / "probe"
TINY = [  # the default tiny model on a small slice of the embedded corpus
    "train.device_type=cpu",
    "train.batch_size=4",
    "train.log_every=1",
    "train.progress_bar=false",
    "data.max_examples=64",
    "data.max_length=64",
]
REL = 1e-5
"""Across different process counts fp32 sums are added in another order (the loss and token sums over
the ranks, DDP's all-reduce and FSDP2's reduce-scatter of the ranks' partial gradients, the global
grad norm from per-rank shards): the last bits differ, so losses agree to a relative 1e-5, not bitwise."""
LAUNCH_TIMEOUT = 300
_INHERITED = re.compile(
    r"^(PJRT_DEVICE|CPU_NUM_DEVICES|XLA_FLAGS|XLA_USE_SPMD|PT_XLA_.*|TPU_.*|RANK|LOCAL_RANK|WORLD_SIZE|"
    r"LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_.*|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_.*|"
    r"OMP_NUM_THREADS|WB_PROBE_.*)$"
)


# ---- launching -------------------------------------------------------------------------------------


def dist_env(extra: Mapping[str, str] | None = None, *, as_installed: bool = False) -> dict[str, str]:
    """The test process's environment without anything that would make a child an XLA process or a
    rank of some other launch (torchrun sets the rank variables itself).

    accelerate (imported with peft) imports torch_xla when it is installed, which costs each process
    seconds of its start and plays no part on ``train.device_type=cpu``: ``USE_TORCH_XLA=0`` (its own
    switch) leaves it out, except `as_installed`, for the run that checks the user's exact setting."""
    env = {k: v for k, v in os.environ.items() if not _INHERITED.match(k)}
    env.update({"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    if not as_installed:
        env["USE_TORCH_XLA"] = "0"
    env.update(extra or {})
    return env


def torchrun(nproc: int, *args: str) -> list[str]:
    """``torchrun --standalone --nproc_per_node=<nproc> <args>`` (the torchrun script is this module)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]


def workbench_train(*args: str) -> list[str]:
    return [sys.executable, "-m", "workbench", "train", *args]


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.strip().splitlines()[-lines:])


class Launch:
    """A process started in its own session, its output in files (no pipe to fill up)."""

    def __init__(self, command: Sequence[str], logs: Path, env: Mapping[str, str] | None = None) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.out, self.err = logs / "stdout.txt", logs / "stderr.txt"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                list(command),
                cwd=REPO,
                env=dict(env if env is not None else dist_env()),
                stdout=out,
                stderr=err,
                start_new_session=True,  # its torchrun agent and ranks form one process group
            )

    def output(self) -> str:
        return self.out.read_text(errors="replace") + "\n" + self.err.read_text(errors="replace")

    def wait(self, timeout: float = LAUNCH_TIMEOUT) -> Done:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.stop()
        return Done(code, self.out.read_text(errors="replace"), self.err.read_text(errors="replace"))

    def stop(self) -> None:
        """End whatever is left of this launch (its process group, which this test started)."""
        # the whole group, even when torchrun itself has ended: a rank it left behind would train on
        with contextlib.suppress(ProcessLookupError):  # nothing of it is left
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def run_together(*launches: Launch) -> list[Done]:
    """Wait for launches started side by side; stop them all if one wait fails."""
    try:
        return [launch.wait() for launch in launches]
    finally:
        for launch in launches:
            launch.stop()


def succeeded(done: Done, what: str) -> Done:
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.tail()}"
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def rank_pid(torchrun_pid: int, rank: int, timeout: float = 30.0) -> int:
    """The pid of torchrun's worker with ``RANK=<rank>`` in its environment."""
    wanted = f"RANK={rank}".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in children(torchrun_pid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if wanted in environ:
                return pid
        time.sleep(0.2)
    raise AssertionError(f"no child of torchrun (pid {torchrun_pid}) has RANK={rank}")


def wait_for(launch: Launch, pattern: str, timeout: float) -> re.Match:
    """Poll `launch`'s output until `pattern` appears; fail if it exits or the time runs out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, launch.output())
        if match:
            return match
        if launch.proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = "\n".join(launch.output().strip().splitlines()[-40:])
    pytest.fail(f"{pattern!r} never appeared (exit {launch.proc.poll()}):\n{tail}", pytrace=False)


def history(metrics: Path) -> list[dict[str, Any]]:
    return json.loads(metrics.read_text())["history"]


def close(values: Sequence[float], expected: Sequence[float]) -> bool:
    return len(values) == len(expected) > 0 and all(
        math.isclose(a, b, rel_tol=REL) for a, b in zip(values, expected)
    )


# ---- 1. the loss curve equals one process's ----------------------------------------------------------

SCENARIOS = {  # name in tests/dist/losses.py -> (processes, strategy the ranks must use)
    "ddp_full": (2, "ddp"),
    "fsdp_full": (2, "fsdp"),
    "ddp_lora": (2, "ddp"),
    "fsdp_lora": (2, "fsdp"),
    "ddp_accum": (2, "ddp"),
    "fsdp_accum": (2, "fsdp"),
    "fsdp_eval": (2, "fsdp"),
    "hsdp_accum_eval": (4, "hsdp"),
}


@pytest.fixture(scope="module")
def loss_runs(tmp_path_factory) -> dict[str, Any]:
    """`tests/dist/losses.py` under torchrun with 2 and with 4 ranks, and as one plain process for the
    references, the three side by side."""
    root = tmp_path_factory.mktemp("losses")
    env = dist_env()
    by_size: dict[int, list[str]] = {}
    for name, (nproc, _) in SCENARIOS.items():
        by_size.setdefault(nproc, []).append(name)
    module = ["-m", "tests.dist.losses"]
    launches = {
        1: Launch(
            [sys.executable, *module, str(root / "one.json"), *sorted(set(REFERENCE.values()))],
            root / "one",
            env,
        ),
        **{
            n: Launch(torchrun(n, *module, str(root / f"ranks{n}.json"), *names), root / f"ranks{n}", env)
            for n, names in by_size.items()
        },
    }
    for n, done in zip(launches, run_together(*launches.values())):
        succeeded(done, f"the {n}-process loss run")
    results: dict[str, Any] = {}
    for n in launches:
        results.update(json.loads((root / ("one.json" if n == 1 else f"ranks{n}.json")).read_text()))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_loss_curve_equals_one_process_with_the_same_global_batch(loss_runs, name):
    nproc, strategy = SCENARIOS[name]
    ours, ref = loss_runs[name], loss_runs[REFERENCE[name]]
    assert (ours["strategy"], ours["world_size"]) == (strategy, nproc)
    assert ref["strategy"] == "single" and len(ref["losses"]) == 4
    assert close(ours["losses"], ref["losses"]), (ours["losses"], ref["losses"])
    # the training moved the loss well beyond the tolerance: equal curves are not equal by accident
    assert abs(ref["losses"][-1] - ref["losses"][0]) > 100 * REL * ref["losses"][0]
    assert close(ours["grad_norms"], ref["grad_norms"]), (ours["grad_norms"], ref["grad_norms"])
    if name.endswith("eval"):
        assert len(ref["eval_losses"]) == 2  # train.eval_every=2 over 4 steps
        assert close(ours["eval_losses"], ref["eval_losses"]), (ours["eval_losses"], ref["eval_losses"])
        assert math.isclose(ours["final_eval_loss"], ref["final_eval_loss"], rel_tol=REL)
    # gradients are reduced on the last micro-batch of each step only
    accumulation = 2 if "accum" in name else 1
    assert ours["syncs"] == ([False] * (accumulation - 1) + [True]) * 4
    # every micro-batch: each rank fed its own equal, consecutive slice of the rows the one process fed
    ranks, (whole,) = ours["rows"], ref["rows"]
    assert len(ranks) == nproc and all(len(r) == len(whole) for r in ranks)
    for i, rows in enumerate(whole):
        assert all(len(r[i]) == len(rows) // nproc for r in ranks)
        assert [row for r in ranks for row in r[i]] == rows, f"micro-batch {i}"


# ---- 2 and 5. a checkpoint of 2 ranks (started with --nproc 2), resumed with 1, 2 and 4 --------------

CHECKPOINTED = [*TINY, "train.steps=6", "train.checkpoint_every=2", "train.keep_checkpoints=3"]
RESUMED_FROM = 4
RESUMES = {1: [], 2: ["mesh.fsdp=2"], 4: ["mesh.fsdp=4"]}  # processes -> their mesh


@dataclass
class CheckpointRuns:
    root: Path
    writer: Done
    resumed: dict[int, Done]

    def ckpt(self, who: str | int) -> Path:
        return self.root / f"ckpt-{who}"

    def probe(self, who: str | int) -> Path:
        return self.root / f"probe-{who}"

    def metrics(self, who: str | int) -> Path:
        return self.root / f"metrics-{who}.json"


@pytest.fixture(scope="module")
def checkpoint_runs(tmp_path_factory) -> CheckpointRuns:
    """``python -m workbench train --nproc 2 mesh.fsdp=2`` for 6 steps with a checkpoint every 2 (the
    uninterrupted run); then, each from a copy of its step-4 checkpoint, the same command resumed to
    step 6 by 1 process, 2 ranks and 4 ranks, side by side. Every process carries the probe."""
    runs = CheckpointRuns(tmp_path_factory.mktemp("checkpoints"), None, {})  # type: ignore[arg-type]

    def probed(who: str | int, single: bool = False) -> dict[str, str]:
        runs.probe(who).mkdir()
        extra = {"PYTHONPATH": f"{REPO}{os.pathsep}{PROBE}", "WB_PROBE_DIR": str(runs.probe(who))}
        # the --nproc run (the one whose printing and metrics are checked) as a user's would be
        return dist_env(extra | ({"WB_PROBE_SINGLE": "1"} if single else {}), as_installed=who == "writer")

    def args(who: str | int) -> list[str]:
        return [
            *CHECKPOINTED,
            f"train.checkpoint_dir={runs.ckpt(who)}",
            "--metrics-out",
            str(runs.metrics(who)),
        ]

    writer = Launch(
        workbench_train("--nproc", "2", *args("writer"), "mesh.fsdp=2"),
        runs.root / "writer",
        probed("writer"),
    )
    runs.writer = writer.wait()
    succeeded(runs.writer, "the 2-rank run started with --nproc 2")
    step_dir = CheckpointManager(runs.ckpt("writer")).path_for(RESUMED_FROM)
    launches = {}
    for n, mesh in RESUMES.items():
        shutil.copytree(step_dir, runs.ckpt(n) / step_dir.name)
        train = [*args(n), *mesh]
        command = workbench_train(*train) if n == 1 else torchrun(n, "-m", "workbench", "train", *train)
        launches[n] = Launch(command, runs.root / f"resumed-{n}", probed(n, single=n == 1))
    for n, done in zip(launches, run_together(*launches.values())):
        runs.resumed[n] = succeeded(done, f"the resume with {n} process(es)")
    return runs


@pytest.mark.slow
def test_nproc_starts_torchrun_and_only_rank_0_reports(checkpoint_runs):
    runs, done = checkpoint_runs, checkpoint_runs.writer
    assert "train: starting 2 ranks: " in done.stderr
    assert "-m torch.distributed.run --standalone --nproc_per_node=2 -m workbench train" in done.stderr
    started = done.stderr.split("train: starting 2 ranks: ", 1)[1].splitlines()[0]
    assert not re.search(r"--nproc[ =]", started)  # every rank runs the command without --nproc
    # one header, one summary, one metrics file, all from rank 0
    assert done.stdout.count("trained 6/6 steps") == 1, done.stdout
    assert done.stdout.count("2 processes: 6 steps") == 1
    assert (runs.probe("writer") / "metrics-writes").read_text().split() == ["0"]
    report = json.loads(runs.metrics("writer").read_text())
    assert report["status"] == "ok" and report["step"] == 6
    assert [m["step"] for m in report["history"]] == [1, 2, 3, 4, 5, 6]
    # both ranks wrote their shards of the checkpoint
    dcp_files = sorted(p.name for p in (runs.ckpt("writer") / "step-00000006" / "model.dcp").iterdir())
    assert [name for name in dcp_files if name.endswith(".distcp")] == ["__0_0.distcp", "__1_0.distcp"]


@pytest.mark.slow
@pytest.mark.parametrize("who", ["writer", 1, 2, 4])
def test_every_checkpoint_directory_is_complete(checkpoint_runs, who):
    root = checkpoint_runs.ckpt(who)
    names = sorted(p.name for p in root.iterdir())
    assert not [n for n in names if n.startswith(".tmp-")], names
    expected = (
        ["step-00000002", "step-00000004", "step-00000006"]
        if who == "writer"
        else ["step-00000004", "step-00000006"]
    )
    assert names == expected
    manager = CheckpointManager(root)
    for name in names:
        assert (root / name / "manifest.json").is_file()
        manager.verify(root / name)  # every file the manifest lists, with its size and digest


def tensor_state(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The entries a resume must restore exactly: model, optimizer, LR schedule, loop (step, data position)."""
    keep = ("model.", "optimizer.", "scheduler.", "loop.")
    return {k: v for k, v in flat.items() if k.startswith(keep)}


def assert_bitwise(ours: Mapping[str, Any], held: Mapping[str, Any]) -> None:
    assert ours.keys() == held.keys(), sorted(ours.keys() ^ held.keys())[:10]
    for key, value in held.items():
        got = ours[key]
        if isinstance(value, torch.Tensor):
            alike = isinstance(got, torch.Tensor) and (got.dtype, got.shape) == (value.dtype, value.shape)
            assert alike and torch.equal(got, value), key
        else:
            assert got == value, (key, got, value)


@pytest.fixture(scope="module")
def held_at_save(checkpoint_runs) -> dict[str, Any]:
    """What the 2 ranks held when they saved step 4, every tensor whole (the probe's record)."""
    held = tensor_state(
        torch.load(checkpoint_runs.probe("writer") / f"saved-{RESUMED_FROM}.pt", weights_only=False)
    )
    assert any(k.startswith("model.") for k in held) and any(k.endswith(".exp_avg") for k in held)
    return held


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP read in this one process
def test_the_checkpoint_holds_exactly_what_the_ranks_held(checkpoint_runs, held_at_save):
    manager = CheckpointManager(checkpoint_runs.ckpt("writer"))
    loaded = manager.load(manager.path_for(RESUMED_FROM))  # whole host tensors, read back through DCP
    assert_bitwise(tensor_state(dict(flat_state(loaded))), held_at_save)
    loop = loaded["loop"]
    # 4 steps of 4 sequences into the first epoch, and the tokens the run had reported by then
    assert (loop["step"], loop["epoch"], loop["batch_in_epoch"], loop["sequences_in_epoch"]) == (4, 0, 4, 16)
    reported = history(checkpoint_runs.metrics("writer"))[RESUMED_FROM - 1]
    assert reported["step"] == RESUMED_FROM and loop["tokens_seen"] == reported["tokens_seen"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("nproc", list(RESUMES))
def test_a_resume_loads_what_the_ranks_held(checkpoint_runs, held_at_save, nproc):
    loaded = torch.load(checkpoint_runs.probe(nproc) / f"loaded-{RESUMED_FROM}.pt", weights_only=False)
    assert_bitwise(tensor_state(loaded), held_at_save)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", list(RESUMES))
def test_a_resume_continues_the_uninterrupted_losses(checkpoint_runs, nproc):
    done = checkpoint_runs.resumed[nproc]
    assert done.stdout.count(f"trained steps 5-6 of 6 (resumed from step {RESUMED_FROM})") == 1, done.stdout
    uninterrupted = history(checkpoint_runs.metrics("writer"))[RESUMED_FROM:]
    resumed = history(checkpoint_runs.metrics(nproc))
    assert [m["step"] for m in resumed] == [m["step"] for m in uninterrupted] == [5, 6]
    # the same data position: the same batches (one process sees whole batches: the counts are global)
    assert [m["tokens_seen"] for m in resumed] == [m["tokens_seen"] for m in uninterrupted]
    ours, theirs = [m["loss"] for m in resumed], [m["loss"] for m in uninterrupted]
    if nproc == 2:  # the same ranks, shards and summation order as the run that wrote it
        assert ours == theirs
    else:
        assert close(ours, theirs), (ours, theirs)


# ---- 3. a rank that dies or hangs ends the launch, named ---------------------------------------------

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the ranks' pids in /proc")
LONG_RUN = [*TINY, "train.steps=100000", "train.progress_bar=true", "mesh.fsdp=2"]
TRAINING = r"\|\s*[1-9]\d*/100000 "
"""Rank 0's progress bar past its first step: the ranks are in the training loop."""


@pytest.fixture(scope="module")
def long_runs(tmp_path_factory) -> Iterator[dict[str, Launch]]:
    """Two launches of 2 ranks with far more steps than they will take, started side by side and
    returned once both train: one to kill a rank of, one (``train.rank_timeout=10s``) to hang one."""
    root = tmp_path_factory.mktemp("long")
    launches = {
        "kill": Launch(torchrun(2, "-m", "workbench", "train", *LONG_RUN), root / "kill"),
        "hang": Launch(
            torchrun(2, "-m", "workbench", "train", *LONG_RUN, "train.rank_timeout=10s"), root / "hang"
        ),
    }
    try:
        for launch in launches.values():
            wait_for(launch, TRAINING, timeout=LAUNCH_TIMEOUT)
        yield launches
    finally:
        for launch in launches.values():
            launch.stop()


@pytest.mark.slow
@LINUX
def test_a_killed_rank_ends_the_launch_within_60_s_naming_it(long_runs):
    launch = long_runs["kill"]
    os.kill(rank_pid(launch.proc.pid, 1), signal.SIGKILL)
    try:
        done = launch.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("torchrun was still running 60 s after rank 1 was killed", pytrace=False)
    assert done.returncode != 0
    # torchrun's agent sees the dead worker at once and stops the other (our watchdog, 60 s by
    # default, never gets to speak): its failure summary names the rank and the signal
    assert re.search(r"rank\s+: 1 \(local_rank: 1\)\s+exitcode\s+: -9", done.stderr), done.tail()
    assert "stopped answering" not in done.stderr


@pytest.mark.slow
@LINUX
def test_a_hung_rank_is_named_by_the_watchdog_and_the_launch_ends(long_runs):
    launch = long_runs["hang"]
    hung = rank_pid(launch.proc.pid, 1)
    # a stopped process is alive to torchrun's agent: only rank 0's watchdog can tell it stopped
    os.kill(hung, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(launch, r"error: rank 0 of 2: rank 1 stopped answering \(no heartbeat for 10 s", timeout=60)
        # rank 0 has exited 1, and the agent sends the stopped rank SIGTERM; let it be delivered (a rank
        # that stays stopped is SIGKILLed after torch's fixed 30 s grace: about 41 s in all, measured)
        os.kill(hung, signal.SIGCONT)
        done = launch.wait(timeout=max(1.0, 60 - (time.monotonic() - stopped)))
    except subprocess.TimeoutExpired:
        pytest.fail("torchrun was still running 60 s after rank 1 stopped", pytrace=False)
    assert done.returncode != 0
    assert "rank 0 stops too (train.rank_timeout sets the wait)" in done.stderr
    assert re.search(r"rank\s+: 0 \(local_rank: 0\)\s+exitcode\s+: 1 ", done.stderr), done.tail()


# ---- 4 and 6. what is refused at start ---------------------------------------------------------------


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> dict[str, Any]:
    """What must not start, side by side: two processes given the torchrun environment by hand, one
    learning rate each; torchrun with ``mesh.model=2``; torchrun with ``mesh.fsdp=3`` on 2 ranks."""
    root = tmp_path_factory.mktemp("refused")
    port = str(free_port())
    launches = []
    for rank, lr in enumerate(["3e-4", "2e-4"]):
        torchrun_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank)}
        env = dist_env(torchrun_env | {"LOCAL_RANK": str(rank), "WORLD_SIZE": "2"})
        command = workbench_train(*TINY, "train.steps=2", f"train.learning_rate={lr}")
        launches.append(Launch(command, root / f"rank{rank}", env))
    for mesh in ("mesh.model=2", "mesh.fsdp=3"):
        launches.append(Launch(torchrun(2, "-m", "workbench", "train", *TINY, mesh), root / mesh))
    rank0, rank1, model, fsdp = run_together(*launches)
    return {"ranks": [rank0, rank1], "mesh.model=2": model, "mesh.fsdp=3": fsdp}


@pytest.mark.slow
def test_ranks_started_with_different_configs_are_refused(refused):
    for rank, done in enumerate(refused["ranks"]):
        assert done.returncode == 2, done.tail()
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and errors[0].startswith(f"error: rank {rank} of 2: "), done.tail()
        assert "rank 1 differs from rank 0: train.learning_rate=0.0003 vs 0.0002" in errors[0]
        assert "Traceback" not in done.stderr


def _rank_errors(done: Done) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error: rank ")]


@pytest.mark.slow
def test_tensor_parallel_across_processes_is_refused(refused):
    done = refused["mesh.model=2"]
    assert done.returncode != 0
    # each rank exits 2 (a config the user must fix); torchrun reports the first and exits 1 itself
    assert re.search(r"exitcode\s+: 2 ", done.stderr), done.tail()
    errors = _rank_errors(done)
    assert sorted(e.split(":")[1] for e in errors) == [" rank 0 of 2", " rank 1 of 2"], done.tail()
    for line in errors:
        assert "mesh.model=2 is not supported across torchrun processes" in line
        assert "mesh.data (DDP), mesh.fsdp (FSDP2) or both (HSDP), with mesh.model=1" in line


@pytest.mark.slow
def test_a_mesh_that_does_not_fit_the_ranks_names_the_arithmetic(refused):
    done = refused["mesh.fsdp=3"]
    assert done.returncode != 0 and re.search(r"exitcode\s+: 2 ", done.stderr), done.tail()
    errors = _rank_errors(done)
    assert len(errors) == 2, done.tail()
    for line in errors:
        assert "2 devices are not divisible by fsdp(3) x model(1) = 3" in line
        assert "under torchrun each process is one device: 2 processes" in line


# ---- 7. without processes ------------------------------------------------------------------------------


def _batch(rows: int) -> dict[str, torch.Tensor]:
    ids = torch.arange(rows * 3).reshape(rows, 3)
    return {
        "input_ids": ids,
        "labels": ids + 100,
        "reference_logps": torch.arange(rows, dtype=torch.float32),
        "scale": torch.tensor(2.0),
    }


def test_take_rows_gives_each_rank_its_consecutive_equal_slice():
    batch = _batch(8)
    parts = [take_rows(batch, rank, 4) for rank in range(4)]
    for rank, part in enumerate(parts):
        assert part["input_ids"].tolist() == batch["input_ids"][2 * rank : 2 * rank + 2].tolist()
        assert torch.equal(part["labels"], part["input_ids"] + 100)  # every per-row tensor cut alike
        assert part["scale"] is batch["scale"]  # what is not per row stays whole
    assert torch.equal(torch.cat([p["reference_logps"] for p in parts]), batch["reference_logps"])


def test_take_rows_keeps_preference_pairs_together():
    batch = _batch(8)  # rows 2i and 2i+1 are pair i's chosen and rejected sides
    first, second = take_rows(batch, 0, 2, rows_per_example=2), take_rows(batch, 1, 2, rows_per_example=2)
    assert first["input_ids"].tolist() == batch["input_ids"][:4].tolist()
    assert second["input_ids"].tolist() == batch["input_ids"][4:].tolist()
    with pytest.raises(ValueError, match="a batch of 3 pairs does not split over 2 ranks"):
        take_rows(_batch(6), 0, 2, rows_per_example=2)


def test_take_rows_refuses_a_batch_that_does_not_split():
    with pytest.raises(ValueError, match=r"a batch of 6 rows does not split over 4 ranks: .*multiple of 4"):
        take_rows(_batch(6), 1, 4)


def test_differences_names_each_dotted_key_that_differs():
    ours = {"train": {"learning_rate": 3e-4, "steps": 4}, "mesh": {"fsdp": 2}, "name": "a"}
    theirs = {"train": {"learning_rate": 2e-4, "steps": 4}, "mesh": {"fsdp": 2, "data": 1}, "name": "a"}
    assert process_group.differences(ours, theirs) == [
        "mesh.data=None vs 1",
        "train.learning_rate=0.0003 vs 0.0002",
    ]
    assert process_group.differences(ours, ours) == []


def test_without_nproc_drops_both_spellings():
    argv = ["train", "--nproc", "4", "x=1", "--nproc=2", "--metrics-out", "m.json"]
    assert without_nproc(argv) == ["train", "x=1", "--metrics-out", "m.json"]
    # argparse takes an abbreviation for --nproc too: a rank handed one would start torchrun again
    from workbench.__main__ import parse_args

    abbreviated = ["train", "--npr", "2", "--n=2", "x=1"]
    assert parse_args(abbreviated).nproc == 2
    assert without_nproc(abbreviated) == ["train", "x=1"]


def test_torchrun_command_for_a_person_and_for_launching():
    argv = ["train", "--nproc", "2", "mesh.fsdp=2"]
    assert torchrun_command(2, argv) == [
        "torchrun", "--standalone", "--nproc_per_node=2", "-m", "workbench", "train", "mesh.fsdp=2"
    ]  # fmt: skip
    assert torchrun_command(2, argv, executable="/py")[:4] == [
        "/py",
        "-m",
        "torch.distributed.run",
        "--standalone",
    ]


def test_gpu_notice_only_when_several_gpus_and_no_launcher(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert gpu_notice(1, ["train"]) is None
    notice = gpu_notice(4, ["train", "x=1"])
    assert "4 GPUs are visible and this run uses one" in notice
    assert (
        "`torchrun --standalone --nproc_per_node=4 -m workbench train x=1`" in notice
        and "--nproc 4" in notice
    )
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert gpu_notice(4, ["train"]) is None  # torchrun started this process: it drives its own GPU


class FakeStore:
    """The two calls the watchdog makes of torchrun's store: ``add(key, n)`` returns the new count."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        self.counts[key] = self.counts.get(key, 0) + amount
        return self.counts[key]


def test_the_watchdog_names_a_peer_whose_heartbeat_stops():
    store = FakeStore()
    dog = RankWatchdog(store, rank=0, world_size=3, timeout_s=10.0)
    assert dog.lost_ranks(now=0.0) == []  # first look: every counter is new
    for t in (4.0, 8.0, 12.0):  # rank 1 beats on, rank 2 never beat
        store.add(dog._key("heartbeat", 1), 1)
        assert dog.lost_ranks(now=t) == ([] if t < 10 else [2])
    store.add(dog._key("heartbeat", 2), 1)  # rank 2 answers again: the clock starts over for it
    assert dog.lost_ranks(now=13.0) == []
    assert dog.lost_ranks(now=22.9) == [1]  # rank 1 silent since 12 s (10.9 s), rank 2 since 13 s (9.9 s)
    assert dog.lost_ranks(now=23.0) == [1, 2]


def test_the_watchdog_does_not_wait_for_a_peer_that_finished():
    store = FakeStore()
    peer = RankWatchdog(store, rank=1, world_size=2, timeout_s=5.0)
    dog = RankWatchdog(store, rank=0, world_size=2, timeout_s=5.0)
    assert dog.lost_ranks(now=0.0) == []
    assert dog.lost_ranks(now=6.0) == [1]
    peer.finished()
    assert dog.lost_ranks(now=60.0) == []


def test_a_peer_that_failed_stops_the_others_at_once(monkeypatch):
    """A rank whose run raised (``Trainer.close(failed=True)``) is named by the others' watchdogs on
    their next look, without waiting for ``train.rank_timeout``: they may sit in a collective it left."""
    monkeypatch.setattr(process_group, "HEARTBEAT_EVERY_S", 0.05)
    heard: list[str] = []
    told = threading.Event()
    store = FakeStore()
    peer = RankWatchdog(store, rank=1, world_size=2, timeout_s=3600.0)
    dog = RankWatchdog(
        store, rank=0, world_size=2, timeout_s=3600.0, on_lost=lambda m: (heard.append(m), told.set())
    ).start()
    peer.finished(failed=True)
    assert told.wait(10), "the watchdog never reported the failed rank"
    assert heard == ["rank 0 of 2: rank 1 failed (its own error line says why); rank 0 stops too"]
    assert dog.lost_ranks(now=1e9) == []  # a failed rank is not also 'lost'


def test_a_rank_whose_launcher_is_gone_stops(monkeypatch):
    """torchrun's agent killed (its store with it): the ranks it left must not train on forever."""
    monkeypatch.setattr(process_group, "HEARTBEAT_EVERY_S", 0.05)
    heard: list[str] = []
    told = threading.Event()
    store = FakeStore()
    dog = RankWatchdog(
        store, rank=1, world_size=2, timeout_s=3600.0, on_lost=lambda m: (heard.append(m), told.set())
    ).start()
    assert dog.lost_ranks(now=0.0) == []  # the store answers at first

    def gone(key: str, amount: int) -> int:
        raise RuntimeError("Connection reset by peer")

    store.add = gone  # type: ignore[method-assign]
    assert told.wait(10), "the watchdog never noticed the store was gone"
    assert heard == [
        "rank 1 of 2: the launcher's store stopped answering (RuntimeError): the launch is gone; rank 1 stops"
    ]


def test_the_watchdog_thread_reports_a_lost_peer_once(monkeypatch):
    monkeypatch.setattr(process_group, "HEARTBEAT_EVERY_S", 0.05)
    heard: list[str] = []
    told = threading.Event()

    def on_lost(message: str) -> None:
        heard.append(message)
        told.set()

    store = FakeStore()
    dog = RankWatchdog(
        store, rank=0, world_size=2, timeout_s=0.2, where=lambda: "step 7", on_lost=on_lost
    ).start()
    assert told.wait(10), "the watchdog never reported rank 1"
    dog._thread.join(5)
    assert heard == [
        "rank 0 of 2: rank 1 stopped answering (no heartbeat for 0 s, step 7): it died or hangs; rank 0 stops too "
        "(train.rank_timeout sets the wait)"
    ]
    assert store.counts[dog._key("heartbeat", 0)] >= 2  # this rank kept beating meanwhile


def test_each_trainer_of_a_launch_gets_a_watchdog_of_its_own(monkeypatch):
    """Two Trainers one after the other in the same ranks: the second's watchdog is not fooled by the
    'finished' marks the first left in the launch's store (which outlives them)."""
    from torch.distributed import distributed_c10d

    store = FakeStore()
    monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(process_group, "HEARTBEAT_EVERY_S", 3600.0)  # the threads stay out of the way
    rank0 = process_group.ProcessGroup(rank=0, world_size=2, local_rank=0, backend="gloo")
    first = RankWatchdog.for_group(rank0, 5.0)
    first.finished()
    store.add(first._key("finished", 1), 1)  # rank 1's first Trainer finished too
    second = RankWatchdog.for_group(rank0, 5.0)
    try:
        assert second.lost_ranks(now=0.0) == []
        assert second.lost_ranks(now=6.0) == [1]  # rank 1 never started its second: it is waited for
    finally:
        second.finished()


@pytest.mark.parametrize(
    ("mesh", "world", "expected", "strategy"),
    [
        ({}, 1, RankMesh(1, 1), "single"),
        ({}, 2, RankMesh(2, 1), "ddp"),  # the config's default: data=-1 takes every rank
        ({"fsdp": 2}, 2, RankMesh(1, 2), "fsdp"),
        ({"fsdp": -1, "data": 1}, 4, RankMesh(1, 4), "fsdp"),
        ({"data": 2, "fsdp": 2}, 4, RankMesh(2, 2), "hsdp"),
    ],
)
def test_rank_mesh_lays_data_and_fsdp_over_the_ranks(mesh, world, expected, strategy):
    layout = rank_mesh(SimpleNamespace(**({"data": -1, "fsdp": 1, "model": 1} | mesh)), world)
    assert layout == expected and layout.world_size == world and layout.strategy == strategy


def test_rank_mesh_refusals_are_config_errors_naming_the_fix():
    with pytest.raises(RankMeshError, match=r"mesh.model=2 is not supported.*mesh.fsdp \(FSDP2\)"):
        rank_mesh(SimpleNamespace(data=-1, fsdp=1, model=2), 2)
    with pytest.raises(
        RankMeshError, match=r"data\(2\) x fsdp\(2\) x model\(1\) = 4 != 2 devices.*2 processes"
    ):
        rank_mesh(SimpleNamespace(data=2, fsdp=2, model=1), 2)
    assert issubclass(RankMeshError, ValueError)  # what `python -m workbench train` exits 2 on


def test_a_precomputed_dpo_reference_is_every_pairs_own_on_every_rank(tmp_path):
    """The 'precompute' pass indexes its results by the whole batch's pairs: under torchrun it must run
    on every row (it once ran on the rank's rows only, and each pair got another pair's log-probs)."""
    from tests.preference_data import learnable_pairs, write_jsonl
    from workbench.backend.hardware import detect
    from workbench.backend.protocol import OneProcess
    from workbench.backend.selection import backend_for
    from workbench.config import WorkbenchConfig
    from workbench.data.records import build_datasets
    from workbench.objectives.dpo import REFERENCE_COLUMNS, precompute_reference
    from workbench.train.ranks import RankTraining
    from workbench.train.stream import TrainingData

    source = write_jsonl(learnable_pairs(12, seed=0), tmp_path / "pairs.jsonl")
    cfg = WorkbenchConfig().with_overrides(
        {"train.objective": "dpo", "data.source": str(source), "data.eval_fraction": 0, "train.batch_size": 4}
    )
    pairs, _, _ = build_datasets(cfg, cache_dir=tmp_path)
    # a stand-in policy: each row's "log-prob" is a fingerprint of its tokens
    objective = SimpleNamespace(
        logps=lambda model, batch: (batch["input_ids"] * batch["labels"].ne(-100)).sum(1).float()
    )
    backend = backend_for(detect("cpu"))
    # a process alone, and each of two ranks' shares (their process group is not needed to cut rows)
    replicas = {
        None: OneProcess(backend),
        **{
            (rank, 2): RankTraining(
                process_group.ProcessGroup(rank, 2, rank, "gloo"), RankMesh(2, 1), torch.device("cpu"), "fp32"
            )
            for rank in (0, 1)
        },
    }
    columns = {}
    for rows, replica in replicas.items():
        data = TrainingData(cfg, pairs, None, pad_token_id=0, dp_size=1, backend=backend, replicas=replica)
        precompute_reference(
            objective, torch.nn.Linear(1, 1), data, autocast=contextlib.nullcontext, notice=print
        )
        columns[rows] = [data.train_dataset[name] for name in REFERENCE_COLUMNS]
    assert columns[(0, 2)] == columns[(1, 2)] == columns[None]
    assert len(set(columns[None][0])) > 1  # distinct pairs, distinct figures: a mix-up would show


def test_the_global_batch_must_split_over_the_ranks():
    from workbench.config import WorkbenchConfig
    from workbench.train.ranks import check_global_batch

    cfg = WorkbenchConfig().with_overrides({"train.batch_size": 6})
    with pytest.raises(
        RankMeshError, match=r"train.batch_size=6 is the global batch.*multiple of 4.*4 ranks"
    ):
        check_global_batch(cfg, RankMesh(data=2, fsdp=2))
    check_global_batch(cfg, RankMesh(data=1, fsdp=2))  # 3 rows a rank
    # a token budget sizes each bucket's batch in multiples of the ranks itself
    check_global_batch(cfg.with_overrides({"bucketing.tokens_per_batch": 512}), RankMesh(data=2, fsdp=2))


@pytest.mark.slow
def test_fsdp2_ranks_start_from_rank_0s_weights(tmp_path):
    """FSDP2 shards what each rank holds (DDP would broadcast rank 0's): ranks that built different
    weights (an unseeded initialisation) train one model only after `wrap` makes them rank 0's."""
    launches = {
        name: Launch(
            torchrun(n, "-m", "tests.dist.same_start", str(tmp_path / f"{name}.json"), *mesh),
            tmp_path / name,
            dist_env(),
        )
        for name, n, mesh in (("fsdp", 2, ("1", "2")), ("hsdp", 4, ("2", "2")))
    }
    for name, done in zip(launches, run_together(*launches.values())):
        succeeded(done, f"the {name} launch")
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["strategy"] == name and result["parameters"] > 0
        assert result["mismatched"] == [[]] * len(result["mismatched"]), result


@pytest.fixture
def one_rank_group() -> Iterator[Any]:
    """A process group of this process alone (gloo) and its 1-D mesh: DTensors without launching."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    finally:
        dist.destroy_process_group()


def test_a_one_process_checkpoint_loads_into_fsdp2s_dtensors(tmp_path, one_rank_group):
    """A one-process run's checkpoint (safetensors parts) resumed under torchrun FSDP2: the whole tensors
    are cut to the live DTensors' placements (a plain tensor copied into a DTensor parameter fails)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    saved_model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    manager = CheckpointManager(tmp_path)  # not across ranks: the safetensors format a single process writes
    path = manager.save(3, {"model": saved_model.state_dict()})
    assert (path / "model.safetensors").is_file()
    live = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    fully_shard(live, mesh=one_rank_group)
    state = manager.load(path, into={"model": live.state_dict()})
    assert all(isinstance(t, DTensor) for t in state["model"].values())
    live.load_state_dict(state["model"])
    for name, value in saved_model.state_dict().items():
        assert torch.equal(live.state_dict()[name].full_tensor(), value), name


def test_ranks_write_their_live_shards_through_dcp_and_one_process_reads_them(tmp_path, one_rank_group):
    """Across torchrun's ranks (`RankTraining`) every part holding tensors goes to DCP as the live DTensors,
    on the training thread (the write is collective); one process reads it back whole, and the ranks into
    FSDP2's DTensors."""
    from torch.distributed.fsdp import fully_shard

    from workbench.config import WorkbenchConfig
    from workbench.train.ranks import RankTraining

    ranks = RankTraining(
        process_group.current(), rank_mesh(WorkbenchConfig().mesh, 1), torch.device("cpu"), "fp32"
    )
    torch.manual_seed(0)
    saved = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    fully_shard(saved, mesh=one_rank_group)
    manager = CheckpointManager(tmp_path, replicas=ranks)
    assert not manager.store.background
    path = manager.save(2, {"model": saved.state_dict(), "step": 2})
    assert (path / "model.dcp" / ".metadata").is_file() and not (path / "model.safetensors").exists()
    whole = {name: t.full_tensor() for name, t in saved.state_dict().items()}
    host = CheckpointManager(tmp_path).load(path)["model"]
    assert all(torch.equal(host[name], value) for name, value in whole.items())
    live = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    fully_shard(live, mesh=one_rank_group)
    manager.load(path, into={"model": live.state_dict()})
    assert all(torch.equal(live.state_dict()[name].full_tensor(), value) for name, value in whole.items())


def test_torchrun_ranks_on_an_xla_device_that_does_not_join_them_are_refused(monkeypatch):
    """torchrun with an XLA device ran every rank as a whole run of its own (all printing, all writing one
    checkpoint directory): refused, naming what works; one plain process on XLA is untouched."""
    from workbench.backend.hardware import HardwareError
    from workbench.backend.xla.spmd import refuse_lone_xla_ranks

    xla_cpu = SimpleNamespace(backend="cpu", via_xla=True, num_processes=1)
    refuse_lone_xla_ranks(xla_cpu)  # no launcher: the SPMD path as before
    launcher = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(HardwareError, match=r"torchrun started 2 ranks.*train.device_type=cuda or cpu"):
        refuse_lone_xla_ranks(xla_cpu)
    refuse_lone_xla_ranks(SimpleNamespace(backend="cuda", via_xla=True, num_processes=2))  # a joined runtime
