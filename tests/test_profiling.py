"""Tests for workbench/profiling.py: FLOPs against hand calculations for published configs,
the profiler's intervals/exports on the plain CPU, and on XLA:CPU: no sync between log
intervals (transfer counts), compile counting, and each advice provoked by its cause."""

from __future__ import annotations

import csv
import json
import time

import pytest
import transformers as tf

from workbench.analysis.flops import mfu, training_flops_per_token
from workbench.analysis.metrics import INTERVAL_KEYS
from workbench.analysis.profiler import StepProfiler
from workbench.analysis.trace import trace
from workbench.backend.hardware import HardwareInfo


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


@pytest.mark.slow
@pytest.mark.xla
def test_profiler_on_xla_cpu_no_sync_between_logs_and_each_advice(xla, tmp_path):
    out = xla(
        f"""
        import time, torch
        from workbench.backend import runtime
        from workbench.config import ModelConfig
        from workbench.backend.hardware import detect
        from workbench.models.build import build_model
        from workbench.analysis.profiler import StepProfiler
        from workbench.analysis.flops import training_flops_per_token
        from workbench.analysis.trace import trace

        hw = detect("xla")
        dev = runtime.device()
        cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=256)
        model = build_model(cfg).to(dev)
        model.tie_weights()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        B, T = 4, 32
        ids = torch.randint(0, 256, (B, T)).to(dev)
        fpt = training_flops_per_token(model, T)

        def step(batch=ids):
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            runtime.sync()
            return loss

        for _ in range(2):  # warm-up: the first step and the steady-state step compile
            step()
        runtime.wait_device_ops()
        res = {{}}

        # clean loop: the profiler reads the loss tensor only at its log steps
        prof = StepProfiler(hw, flops_per_token=fpt, log_every=5, warmup_steps=0)
        per_step = []
        for i in range(10):
            loss = step()
            before = runtime.transfer_count()
            m = prof.step(B * T, loss=loss, lr=1e-3)
            per_step.append([runtime.transfer_count() - before, m is not None])
        res["clean"] = dict(per_step=per_step, history=prof.history, advice=[a.kind for a in prof.advice()])

        # .item() every step
        prof = StepProfiler(hw, log_every=5, warmup_steps=0)
        for i in range(5):
            loss = step()
            loss.item()
            prof.step(B * T, loss=loss)
        res["item"] = dict(advice=[a.kind for a in prof.advice()], transfers=prof.history[-1]["transfers"])

        # new shapes after warm-up
        prof = StepProfiler(hw, log_every=5, warmup_steps=0)
        for t in (16, 24, 40, 48, 56):
            prof.step(B * t, loss=step(ids[:, :t].contiguous() if t < T else torch.randint(0, 256, (B, t)).to(dev)))
        res["recompile"] = dict(advice=[a.kind for a in prof.advice()], history=prof.history)

        # input wait
        prof = StepProfiler(hw, log_every=5, warmup_steps=0)
        for i in range(5):
            with prof.input_wait():
                time.sleep(0.05)
            prof.step(B * T, loss=step())
        res["input"] = dict(advice=[a.kind for a in prof.advice()], fraction=prof.history[-1]["input_wait_fraction"])

        # MFU against a peak: far too high a peak -> low MFU; a tiny one -> none
        for name, peak in (("low_mfu", 1e18), ("high_mfu", 1.0)):
            prof = StepProfiler(hw, flops_per_token=fpt, log_every=5, warmup_steps=0, peak_flops=peak)
            for i in range(5):
                prof.step(B * T, loss=step())
            res[name] = dict(advice=[a.kind for a in prof.advice()], mfu=prof.history[-1]["mfu"])

        # memory: the compiled program's own figure against a limit just above / far above it
        peak = max(r.peak_bytes for r in runtime.compiled_memory_records())
        for name, limit in (("mem_near", int(peak * 1.05)), ("mem_far", peak * 3)):
            prof = StepProfiler(hw, log_every=5, warmup_steps=0, memory_limit_bytes=limit)
            for i in range(5):
                prof.step(B * T, loss=step())
            res[name] = dict(advice=[a.kind for a in prof.advice()], compiled=prof.history[-1]["compiled_program_bytes"], peak=peak)
        prof.to_json({str(tmp_path / "prof.json")!r})
        prof.to_csv({str(tmp_path / "prof.csv")!r})

        logdir = trace(step, steps=2, logdir={str(tmp_path / "tb")!r}, warmup=1, hw=hw)
        res["trace_files"] = [p.name for p in logdir.glob("*.pt.trace.json")]
        emit(res)
        """,
        env={"PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": str(tmp_path / "compile.log")},
    )
    clean = out["clean"]
    # no device->host transfer on the 8 non-log steps; one (the loss) on each log step
    assert clean["per_step"] == [[0, False]] * 4 + [[1, True]] + [[0, False]] * 4 + [[1, True]]
    first, second = clean["history"]
    assert first["transfers"] == 0 and second["transfers"] == 0  # the user's loop made none
    assert first["compiles"] == 0 and first["recompiled"] is False and first["total_compiles"] >= 2
    assert first["loss"] > 0 and first["device_memory_bytes"] is None and first["mfu"] is None  # no CPU peak
    assert first["compiled_program_bytes"] > 0
    assert clean["advice"] == []

    assert out["item"]["advice"] == ["host_transfer"] and out["item"]["transfers"] >= 5
    rec = out["recompile"]
    assert rec["advice"] == ["recompilation"]
    assert rec["history"][-1]["compiles"] == 5 and rec["history"][-1]["recompiled"] is True
    assert rec["history"][-1]["compile_time_s"] > 0 and rec["history"][-1]["recompile_steps"] == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert out["input"]["advice"] == ["input_bound"] and out["input"]["fraction"] > 0.1
    assert out["low_mfu"]["advice"] == ["low_mfu"] and out["low_mfu"]["mfu"] < 1e-6
    assert out["high_mfu"]["advice"] == [] and out["high_mfu"]["mfu"] > 1
    assert (
        out["mem_near"]["advice"] == ["memory_near_limit"]
        and out["mem_near"]["compiled"] == out["mem_near"]["peak"]
    )
    assert out["mem_far"]["advice"] == []
    assert json.loads((tmp_path / "prof.json").read_text())["history"][0]["step"] == 5
    assert len(list(csv.DictReader((tmp_path / "prof.csv").open()))) == 1
    assert len(out["trace_files"]) == 1
