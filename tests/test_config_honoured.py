"""Functions that take a config honour the fields they document, rather than a separate argument's default.

Each case failed before: the estimate priced eager attention and a full-precision base for a
`ModelConfig` that said chunked and int8; the compiler probes' model ran eager whatever
``model.attention`` said (their XLA case is tests/xla/attention_estimate.py, run by
tests/test_attention.py); torchrun's ranks ignored ``mesh.num_slices``.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.tiny import tiny
from workbench.analysis.estimate import estimate
from workbench.analysis.shape import model_shape
from workbench.config import MeshConfig


def test_the_estimate_reads_the_attention_a_model_config_names():
    chunked, eager = tiny("llama", attention="chunked"), tiny("llama", attention="eager")
    assert model_shape(chunked).attention == "chunked" and model_shape(eager).attention == "eager"
    assert model_shape(tiny("llama", attention="auto")).attention == "eager"  # 'auto' is the device's
    kwargs = dict(batch_size=1, seq_len=128, precision="fp32")
    from_config = estimate(chunked, **kwargs)
    assert from_config.total_bytes == estimate(eager, **kwargs, attention="chunked").total_bytes
    assert from_config.scores_bytes < estimate(eager, **kwargs).scores_bytes
    # an explicit argument still decides
    assert estimate(chunked, **kwargs, attention="eager").total_bytes == estimate(eager, **kwargs).total_bytes


def test_the_estimate_reads_the_quantized_base_a_model_config_names():
    int8 = tiny("llama", quantize="int8")
    kwargs = dict(batch_size=1, seq_len=32, precision="fp32", lora_rank=4)
    assert (
        estimate(int8, **kwargs).total_bytes == estimate(tiny("llama"), **kwargs, quantize="int8").total_bytes
    )
    assert estimate(int8, **kwargs).total_bytes < estimate(tiny("llama"), **kwargs).total_bytes
    assert (
        estimate(int8, **kwargs, quantize="none").total_bytes == estimate(tiny("llama"), **kwargs).total_bytes
    )
    with pytest.raises(ValueError, match="quantize='int8' needs lora_rank >= 1"):
        estimate(int8, batch_size=1, seq_len=32)


def test_the_probes_refuse_a_quantized_base_instead_of_measuring_a_full_one():
    from workbench.analysis.probe import step_model

    with pytest.raises(ValueError, match=r"model.quantize='int4' is not allowed here: .* only under LoRA"):
        step_model(tiny("llama", quantize="int4"), seq_len=16)


def test_torchrun_ranks_refuse_slices_they_cannot_join():
    from workbench.parallel.torch_parallel import RankMeshError, rank_mesh

    assert rank_mesh(MeshConfig(fsdp=2), 4).fsdp == 2
    with pytest.raises(RankMeshError, match=r"mesh.num_slices=2 is not supported across torchrun"):
        rank_mesh(dataclasses.replace(MeshConfig(fsdp=2), num_slices=2), 4)
