"""Profiling (analysis/flops.py, profiler.py, trace.py): FLOPs against hand calculations for
published configs, the profiler's intervals/exports on the plain CPU, and on XLA:CPU: no sync
between log intervals (transfer counts), compile counting, and each advice provoked by its cause."""

from __future__ import annotations

import csv
import dataclasses
import json
import time

import pytest
import transformers as tf

from workbench.analysis.advice import communication_finding, run_communication
from workbench.analysis.comm_model import predict_communication
from workbench.analysis.flops import mfu, training_flops_per_token
from workbench.analysis.metrics import INTERVAL_KEYS
from workbench.analysis.profiler import StepProfiler
from workbench.analysis.trace import trace
from workbench.backend.hardware import CHIPS, HardwareInfo
from workbench.config import WorkbenchConfig
from workbench.units import format_bytes


def test_flops_per_token_gpt2_124m_by_hand():
    """GPT-2 small: 124,439,808 parameters (tied wte, 1024x768 wpe). PaLM appendix B at T=1024:
    6 * (124,439,808 - 786,432) + 12 * 12 layers * 12 heads * 64 * 1024."""
    cfg = tf.GPT2Config()  # n_embd 768, n_layer 12, n_head 12, vocab 50257, n_positions 1024
    n_matmul = 124_439_808 - 1024 * 768
    expected = 6 * n_matmul + 12 * 12 * 12 * 64 * 1024
    assert expected == 855_166_464
    assert training_flops_per_token(cfg, 1024) == expected


def test_flops_per_token_llama2_7b_by_hand():
    """Llama-2-7B: 6,738,415,616 parameters, untied 32000x4096 input embedding (a lookup, not a
    matmul); 32 layers x 32 heads x 128 at T=4096."""
    cfg = tf.LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        tie_word_embeddings=False,
    )
    expected = 6 * (6_738_415_616 - 32000 * 4096) + 12 * 32 * 32 * 128 * 4096
    assert training_flops_per_token(cfg, 4096) == expected == 46_086_512_640
    with pytest.raises(ValueError, match="seq_len=0"):
        training_flops_per_token(cfg, 0)


def _hw(peak: float | None, devices: int = 1) -> HardwareInfo:
    return HardwareInfo(
        backend="cpu",
        via_xla=False,
        device_kind="CPU",
        chip="cpu",
        num_devices=devices,
        local_devices=devices,
        num_processes=1,
        process_index=0,
        memory_per_device_bytes=None,
        peak_bf16_flops_per_device=peak,
        host_memory_bytes=1,
        platform="local",
    )


def test_mfu_uses_all_devices_and_the_override():
    assert mfu(1000.0, 1e9, _hw(1e12, devices=4)) == pytest.approx(1000 * 1e9 / 4e12)
    assert mfu(1000.0, 1e9, _hw(None)) is None
    assert mfu(1000.0, 1e9, _hw(None), peak_flops=2e12) == pytest.approx(0.5)
    assert mfu(None, 1e9, _hw(1e12)) is None


def test_profiler_intervals_exports_and_advice_on_plain_cpu(tmp_path):
    prof = StepProfiler(_hw(None), flops_per_token=1e6, log_every=3, peak_flops=1e15, warmup_steps=0)
    out = []
    for i in range(7):
        time.sleep(0.002)
        out.append(prof.step(100, loss=2.0 - 0.1 * i, lr=1e-3, input_wait_s=0.01 if i >= 3 else 0.0))
    assert [m is not None for m in out] == [False, False, True, False, False, True, False]
    first, second = prof.history
    assert set(INTERVAL_KEYS) <= set(first)
    assert (first["step"], first["loss"], first["tokens_seen"], first["steps_in_interval"]) == (
        3,
        pytest.approx(1.8),
        300,
        3,
    )
    assert second["tokens_seen"] == 600 and second["elapsed_s"] > first["elapsed_s"]
    assert first["tokens_per_s"] == pytest.approx(300 / first["interval_s"])
    assert first["device_memory_bytes"] is None and first["host_rss_bytes"] > 10 * 2**20
    assert first["compiles"] == 0 and first["transfers"] == 0 and first["recompiled"] is False
    # waiting: 0.01 s of each ~0.012 s step in the second interval
    assert first["input_wait_fraction"] == 0 and second["input_wait_fraction"] > 0.5
    kinds = {a.kind for a in prof.advice()}
    assert kinds == {"low_mfu", "input_bound"}  # 1e6 FLOP/token at ~10k tokens/s against 1 PFLOP/s
    forced = prof.step(100, log=True)
    assert forced is not None and forced["steps_in_interval"] == 2

    fast = StepProfiler(_hw(None), flops_per_token=1e6, log_every=2, peak_flops=1.0, warmup_steps=0)
    for _ in range(4):
        with fast.input_wait():
            pass  # a batch that is ready at once
        time.sleep(0.005)  # the step's work
        fast.step(100)
    assert fast.advice() == []  # MFU far above the threshold, no waiting

    prof.to_json(tmp_path / "p.json")
    prof.to_csv(tmp_path / "p.csv")
    payload = json.loads((tmp_path / "p.json").read_text())
    assert len(payload["history"]) == 3 and {a["kind"] for a in payload["advice"]} == kinds
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert len(rows) == 3 and list(rows[0])[: len(INTERVAL_KEYS)] == list(INTERVAL_KEYS)
    assert rows[1]["step"] == "6" and rows[0]["device_memory_bytes"] == ""

    with pytest.raises(ValueError, match="log_every=0"):
        StepProfiler(None, log_every=0)


def test_a_loops_declared_reads_and_work_inside_its_input_stream_are_not_advised_against():
    """`step(expected_transfers=, input_work_s=)`: a loop that samples its batches on the device as it
    fetches them (GRPO's rollouts) reads by design and works inside its input stream."""

    def run(**declared):
        prof = StepProfiler(_hw(None), log_every=2, warmup_steps=0)
        reads = [0]
        prof.backend.transfer_count = lambda: reads[0]  # one device->host read per step
        for _ in range(4):
            reads[0] += 1
            prof.step(100, loss=1.0, input_wait_s=0.5, **declared)
        return prof

    plain = run()
    assert [m["expected_transfers"] for m in plain.history] == [None, None]  # declared none
    assert {"host_transfer", "input_bound"} <= {a.kind for a in plain.advice()}
    declared = run(expected_transfers=1, input_work_s=0.4)
    first = declared.history[0]
    assert first["transfers"] == first["expected_transfers"] == 2
    assert first["input_wait_s"] == pytest.approx(2 * (0.5 - 0.4))
    assert first["input_wait_fraction"] == pytest.approx(first["input_wait_s"] / first["interval_s"])
    assert "host_transfer" not in {a.kind for a in declared.advice()}
    working = run(expected_transfers=1, input_work_s=0.5)  # the whole "wait" was the step's own work
    assert working.history[0]["input_wait_s"] == 0.0
    assert not {"host_transfer", "input_bound"} & {a.kind for a in working.advice()}


def _chip(backend: str, chip: str, *, via_xla: bool = True, devices: int = 8) -> HardwareInfo:
    return dataclasses.replace(_hw(None, devices), backend=backend, chip=chip, via_xla=via_xla)


def test_profiler_advice_on_an_fsdp_mesh_names_the_reduce_scatter(tmp_path):
    cfg = WorkbenchConfig()  # the tiny llama: hidden 64, 4 heads (2 key/value), MLP 128, 2 layers
    assert run_communication(cfg.model, cfg, {"data": 1, "fsdp": 1}) is None  # one device: nothing moves
    predict = run_communication(cfg.model, cfg, {"fsdp": 8})
    calls = []
    prof = StepProfiler(_hw(None, 8), log_every=2, communication=lambda: calls.append(1) or predict())
    for _ in range(4):
        prof.step(100, loss=1.0)
    assert calls == []  # never per step: worked out from shapes at the first advice, once
    (found,) = [a for a in prof.advice() if a.kind == "communication"]
    prof.advice()
    prof.to_json(tmp_path / "p.json")
    assert calls == [1]
    assert found.message.startswith(
        "Each device sends per step on mesh fsdp=8 (predicted from shapes): fsdp "
    )
    assert "reduce-scatter" in found.message and "no published interconnect bandwidth" in found.message
    report = predict()
    assert found.evidence["wire_bytes_per_axis"] == {"fsdp": pytest.approx(report.tpu_wire_bytes)}

    # XLA:CPU runs each reduce-scatter as an all-reduce of the whole tensor and a slice, among them the
    # gradients of 7 projections x 2 layers: 64x64 + 2 x 32x64 + 64x64 + 3 x 128x64 fp32 each
    (cpu,) = communication_finding(report, _chip("cpu", "cpu"))
    scattered = [c for c in report.collectives if c.kind == "reduce-scatter"]
    grads = [c for c in scattered if c.name.startswith("layers.") and c.name.endswith(" gradient")]
    assert sum(c.size_bytes * c.count for c in grads) == 2 * (4096 + 2 * 2048 + 4096 + 3 * 8192) * 4
    whole = sum(c.size_bytes * c.count for c in scattered)
    wire = 2 * 7 / 8 * whole  # the all-reduce's ring bytes; a reduce-scatter moves half
    assert (
        f"{sum(c.count for c in scattered)} tensors ({format_bytes(whole)}) are all-reduced whole over fsdp "
        f"(up to 8 devices) and then sliced: a reduce-scatter moves half ({format_bytes(wire / 2)} instead of "
        f"{format_bytes(wire)} per device)"
    ) in cpu.message
    assert "as TPU's XLA compiles it" in cpu.message and "the CPU has no published" in cpu.message
    # what the run's backend says, not the machine: plain torch's ranks on the CPU leave it as predicted
    (gloo,) = communication_finding(report, _chip("cpu", "cpu", via_xla=False))
    assert "all-reduced whole" not in gloo.message and "as TPU's XLA" not in gloo.message

    # a TPU prices it: seconds per axis at the chip's collective bandwidth, and the share of the step
    (tpu,) = communication_finding(report, _chip("tpu", "v5e"))
    seconds = report.tpu_wire_bytes / CHIPS["v5e"].collective_bandwidth
    assert tpu.evidence["seconds_per_axis"] == {"fsdp": pytest.approx(seconds)}
    assert 0 < tpu.evidence["share"] < 1 and "On detected v5e: communication " in tpu.message
    assert "all-reduced whole" not in tpu.message  # TPU's XLA already runs the reduce-scatter
    assert (
        communication_finding(predict_communication(cfg.model, {"data": 1}, batch_size=8, seq_len=8), None)
        == []
    )


def test_trace_on_cpu_writes_a_tensorboard_trace(tmp_path):
    import torch

    model = torch.nn.Linear(32, 32)
    calls = []

    def step():
        calls.append(1)
        model(torch.randn(8, 32)).sum().backward()

    logdir = trace(step, steps=3, logdir=tmp_path / "tb", warmup=1)
    assert len(calls) == 4
    files = list(logdir.glob("*.pt.trace.json"))
    assert len(files) == 1
    events = json.loads(files[0].read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"train_step_0", "train_step_2"} <= names and "aten::addmm" in names


def test_trace_asks_the_run_backend_how_the_device_is_profiled(tmp_path):
    import torch

    from workbench.backend.native.torch_native import NativeTorch
    from workbench.backend.xla.spmd import XlaSpmd

    class OwnProfiler(NativeTorch):  # a device whose own profiler captures the steps (as a TPU's does)
        def __init__(self, hw: HardwareInfo) -> None:
            super().__init__(hw)
            self.waits, self.captured = 0, []

        def wait(self) -> None:
            self.waits += 1

        def capture_trace(self, step_fn, steps, logdir, *, step_s, port) -> bool:
            self.captured.append((steps, port, isinstance(step_s, float)))
            for _ in range(steps):
                step_fn()
            return True

    backend, calls = OwnProfiler(_chip("cpu", "cpu", via_xla=False)), []
    logdir = trace(lambda: calls.append(1), steps=2, logdir=tmp_path, warmup=1, port=9100, backend=backend)
    assert logdir == tmp_path and len(calls) == 3 and backend.captured == [(2, 9100, True)]
    assert backend.waits == 1 and not list(tmp_path.glob("*.pt.trace.json"))  # torch.profiler never ran
    # torch.profiler records CUDA's kernels on plain torch's CUDA only; XLA:CPU's trace is torch.profiler's
    cuda = torch.profiler.ProfilerActivity.CUDA
    assert cuda in NativeTorch(_chip("cuda", "h100", via_xla=False)).profiler_activities()
    assert cuda not in XlaSpmd(_chip("cuda", "h100")).profiler_activities()
    assert XlaSpmd(_chip("cpu", "cpu")).capture_trace(calls.append, 1, tmp_path, step_s=0.1, port=1) is False
    assert len(calls) == 3  # nothing run
    assert XlaSpmd(_chip("cpu", "cpu")).reduce_scatter_as_all_reduce
    assert not XlaSpmd(_chip("tpu", "v5e")).reduce_scatter_as_all_reduce


@pytest.fixture(scope="module")
def profiler_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("profiler")


@pytest.fixture(scope="module")
def profiled(xla_scenario, profiler_dir):
    """tests/xla/profiler_advice.py: StepProfiler around a hand-written loop on XLA:CPU; each kind
    of advice provoked in turn; its exports and a trace written under `profiler_dir`."""
    log = {"PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": str(profiler_dir / "compile.log")}
    return xla_scenario("profiler_advice", env=log, out_dir=str(profiler_dir))


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_on_xla_cpu_no_sync_between_logs(profiled):
    # no device->host transfer on the 8 non-log steps; one (the loss) on each log step
    assert profiled["clean"]["per_step"] == [[0, False]] * 4 + [[1, True]] + [[0, False]] * 4 + [[1, True]]


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_counts_no_transfers_in_a_clean_loop(profiled):
    first, second = profiled["clean"]["history"]
    assert first["transfers"] == 0 and second["transfers"] == 0  # the user's loop made none


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_counts_no_compiles_after_warmup(profiled):
    first, _second = profiled["clean"]["history"]
    assert first["compiles"] == 0 and first["recompiled"] is False and first["total_compiles"] >= 2


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_reports_the_loss_and_no_device_memory_or_mfu_on_cpu(profiled):
    first, _second = profiled["clean"]["history"]
    assert first["loss"] > 0 and first["device_memory_bytes"] is None and first["mfu"] is None  # no CPU peak


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_reports_the_compiled_program_size(profiled):
    first, _second = profiled["clean"]["history"]
    assert first["compiled_program_bytes"] > 0


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_gives_no_advice_for_a_clean_loop(profiled):
    assert profiled["clean"]["advice"] == []


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_advises_on_an_item_every_step(profiled):
    assert profiled["item"]["advice"] == ["host_transfer"] and profiled["item"]["transfers"] >= 5


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_advises_on_recompilation(profiled):
    rec = profiled["recompile"]
    assert rec["advice"] == ["recompilation"]
    last = rec["history"][-1]
    assert last["compiles"] == 5 and last["recompiled"] is True
    assert last["compile_time_s"] > 0 and last["recompile_steps"] == [1, 2, 3, 4, 5]


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_advises_on_input_wait(profiled):
    assert profiled["input"]["advice"] == ["input_bound"] and profiled["input"]["fraction"] > 0.1


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_advises_on_low_mfu(profiled):
    assert profiled["low_mfu"]["advice"] == ["low_mfu"] and profiled["low_mfu"]["mfu"] < 1e-6


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_gives_no_mfu_advice_against_a_tiny_peak(profiled):
    assert profiled["high_mfu"]["advice"] == [] and profiled["high_mfu"]["mfu"] > 1


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_advises_near_the_memory_limit(profiled):
    near = profiled["mem_near"]
    assert near["advice"] == ["memory_near_limit"] and near["compiled"] == near["peak"]


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_gives_no_memory_advice_far_below_the_limit(profiled):
    assert profiled["mem_far"]["advice"] == []


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_exports_json_and_csv(profiled, profiler_dir):
    assert json.loads((profiler_dir / "prof.json").read_text())["history"][0]["step"] == 5
    assert len(list(csv.DictReader((profiler_dir / "prof.csv").open()))) == 1


@pytest.mark.slow
@pytest.mark.xla
def test_trace_on_xla_cpu_writes_one_trace_file(profiled):
    assert len(profiled["trace_files"]) == 1
