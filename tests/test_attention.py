"""Memory-efficient attention (`workbench.models.attention`): chunked attention against eager (the
function, every model case, generation) on the CPU and on XLA (one device, a data x fsdp x model
mesh, the scanned stack, the compiler's memory analysis), its masks (`compact_mask`,
`model_inputs`' segment ids), the kernel choice (`resolve_attention`) and the TPU flash path's
routing and arguments (its kernels replaced: they only run on a TPU)."""

from __future__ import annotations

import types

import pytest
import torch

from tests.xla.attention_equality import CASES, batch_for, build, chunked_copy, compare, greedy_tokens
from workbench.backend.xla import tpu_attention
from workbench.models import attention
from workbench.models.attention import (
    CHUNKED,
    FLASH,
    chunked_attention,
    compact_mask,
    flash_attention,
    query_chunk,
    segment_ids_from_positions,
)
from workbench.models.attention_choice import (
    AUTO_CHUNKED_MIN_LENGTH,
    attn_implementation,
    choose_attention,
    kernel_of,
    resolve_attention,
    use_attention,
)
from workbench.models.inputs import model_inputs, packed_causal_mask

REL = 1e-5


@pytest.fixture
def small_blocks(monkeypatch):
    """Query blocks of 5 rows, so short rows span several blocks (the last one shorter)."""
    monkeypatch.setattr(attention, "QUERY_CHUNK", 5)


# ---- the function against eager ----------------------------------------------------------------


def reference(q, k, v, mask, *, scale, softcap=None):
    """transformers' eager attention (Gemma 2's: softcap, then the additive mask) for a 4-D mask."""
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    module = types.SimpleNamespace(
        num_key_value_groups=q.shape[1] // k.shape[1], training=False, head_dim=q.shape[-1]
    )
    return eager_attention_forward(module, q, k, v, mask, scaling=scale, softcap=softcap)[0]


def additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)


def positions_mask(tq: int, tk: int, window: int | None = None) -> torch.Tensor:
    """HF's causal (sliding) pattern, queries aligned to the last keys: key k seen iff q - window < k <= q."""
    q = torch.arange(tk - tq, tk)[:, None]
    k = torch.arange(tk)[None, :]
    allowed = k <= q
    if window:
        allowed &= k > q - window
    return allowed[None, None]


def qkv(b=2, heads=4, kv=2, tq=13, tk=13, d=8, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, tq, d, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(b, kv, tk, d, generator=gen).to(dtype).requires_grad_()
    v = torch.randn(b, kv, tk, d, generator=gen).to(dtype).requires_grad_()
    return q, k, v


def grads_of(out: torch.Tensor, tensors, seed: int = 3):
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out * weight).sum(), tensors)


def assert_close(a: torch.Tensor, b: torch.Tensor, rel: float = REL) -> None:
    err = (a - b).abs().max().item() / max(a.abs().max().item(), 1e-30)
    assert err < rel, err


SEGMENTS = torch.tensor([[1] * 4 + [2] * 6 + [3] * 3, [1] * 9 + [0] * 4])
"""Packed documents (row 0) and right padding (row 1) as compact segment ids."""

FUNCTION_CASES = {
    "causal_gqa": dict(mask=None),
    "window": dict(mask=None, window=4),
    "softcap": dict(mask=None, softcap=1.5),
    "softcap_window": dict(mask=None, softcap=1.5, window=6),
    "segments": dict(mask="segments"),
    "segments_window": dict(mask="segments", window=3),
    "additive_cached": dict(mask="additive", tq=4, tk=13),  # queries after 9 cached keys
    "bool_cached": dict(mask="bool", tq=1, tk=13),  # one decode step
    "per_head_additive": dict(mask="per_head"),
    "no_groups": dict(mask=None, kv=4),
}


@pytest.mark.parametrize("name", list(FUNCTION_CASES))
def test_function_matches_eager(name, small_blocks):
    spec = dict(FUNCTION_CASES[name])
    tq, tk, kv = spec.pop("tq", 13), spec.pop("tk", 13), spec.pop("kv", 2)
    window, softcap, kind = spec.get("window"), spec.get("softcap"), spec["mask"]
    q, k, v = qkv(kv=kv, tq=tq, tk=tk)
    allowed = positions_mask(tq, tk, window)
    mask = None
    if kind == "segments":
        mask = SEGMENTS[:, None, None, :].to(torch.int32)
        seg = SEGMENTS
        allowed = allowed & ((seg[:, None, :] == seg[:, :, None]) & (seg[:, None, :] != 0))[:, None]
    elif kind == "additive":
        mask = additive(allowed.expand(2, 1, tq, tk))
    elif kind == "bool":
        mask = allowed.expand(2, 1, tq, tk)
    elif kind == "per_head":
        per_head = allowed & (torch.rand(2, 4, tq, tk, generator=torch.Generator().manual_seed(5)) > 0.3)
        per_head |= torch.eye(tq, tk, dtype=torch.bool)  # every query sees a key
        allowed, mask = per_head, additive(per_head)
    scale = 0.3
    expected = reference(q, k, v, additive(allowed), scale=scale, softcap=softcap)
    module = types.SimpleNamespace(is_causal=True)
    out, weights = chunked_attention(
        module, q, k, v, mask, scaling=scale, sliding_window=window, softcap=softcap
    )
    assert weights is None and out.shape == expected.shape and out.is_contiguous()
    real = allowed.any(-1).transpose(1, 2)[..., None].expand_as(expected)  # rows that see some key
    assert_close(expected[real], out[real])
    for want, got in zip(grads_of(expected * real, (q, k, v)), grads_of(out * real, (q, k, v))):
        assert_close(want, got)


def test_rows_that_see_no_key_give_zero_and_finite_gradients(small_blocks):
    q, k, v = qkv()
    segments = torch.tensor([[0] * 3 + [1] * 10, [1] * 8 + [0] * 5], dtype=torch.int32)[:, None, None, :]
    out, _ = chunked_attention(types.SimpleNamespace(), q, k, v, segments)
    assert torch.isfinite(out).all()
    assert out[0, :3].abs().max() == 0 and out[1, 8:].abs().max() == 0  # padding queries: 0
    for grad in grads_of(out, (q, k, v)):
        assert torch.isfinite(grad).all()
    fully = additive(torch.zeros(2, 1, 13, 13, dtype=torch.bool))  # a full mask allowing nothing
    out, _ = chunked_attention(types.SimpleNamespace(), q, k, v, fully)
    assert out.abs().max() == 0 and all(torch.isfinite(g).all() for g in grads_of(out, (q, k, v)))


def test_bf16_inputs_keep_fp32_statistics(small_blocks):
    q, k, v = qkv(dtype=torch.bfloat16)
    out, _ = chunked_attention(types.SimpleNamespace(), q, k, v, None)
    assert out.dtype == torch.bfloat16
    expected = reference(q.float(), k.float(), v.float(), additive(positions_mask(13, 13)), scale=8**-0.5)
    assert_close(expected, out.float(), rel=2e-2)
    assert all(g.dtype == torch.bfloat16 for g in grads_of(out.float(), (q, k, v)))


def test_dropout_and_unsupported_inputs_are_refused():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="dropout"):
        chunked_attention(types.SimpleNamespace(), q, k, v, None, dropout=0.1)
    with pytest.raises(ValueError, match="as many queries as keys"):
        chunked_attention(types.SimpleNamespace(), q[:, :, :4], k, v, SEGMENTS[:, None, None, :].int())


def test_query_chunk_rule():
    assert (
        query_chunk(2048) == 512
        and query_chunk(512) == 512
        and query_chunk(100) == 100
        and query_chunk(0) == 1
    )


# ---- the models -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_model_matches_eager_on_cpu(name, small_blocks):
    eager = build(CASES[name])
    chunked = chunked_copy(eager)
    assert chunked.config._attn_implementation == CHUNKED and eager.config._attn_implementation == "eager"
    batch, real = batch_for(CASES[name], rows=4)
    result = compare(eager, chunked, batch, real)
    assert result["same_grad_names"]
    assert result["logits"] < REL and result["loss"] < REL and result["grads"] < REL, result
    if CASES[name].layout == "packed":
        assert result["mask"] == [[4, 1, 1, 24], "torch.int32"]  # segment ids, no T x T mask


@pytest.mark.parametrize("name", ["llama_gqa", "mistral_window", "gemma2_softcap"])
def test_greedy_generation_is_token_identical_on_cpu(name, small_blocks):
    eager = build(CASES[name], init=0.3)
    assert greedy_tokens(eager) == greedy_tokens(chunked_copy(eager))


def test_use_attention_switches_a_lora_model():
    from workbench.config import LoraConfig
    from workbench.train.lora import apply_lora

    model = apply_lora(build(CASES["llama_gqa"]), LoraConfig(rank=4, alpha=8), seed=0)
    use_attention(model, "chunked")
    assert model.get_base_model().config._attn_implementation == CHUNKED
    assert kernel_of(model.config._attn_implementation) == "chunked"
    with pytest.raises(ValueError, match=r"model.attention='sdpa'.*soft-cap"):
        use_attention(build(CASES["gemma2_softcap"]), "sdpa")


# ---- masks ------------------------------------------------------------------------------------


def test_model_inputs_gives_segment_ids_to_chunked_and_flash_models_only():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 0, 1, 2]])
    batch = {"input_ids": torch.ones_like(positions), "position_ids": positions}
    eager = types.SimpleNamespace(
        config=types.SimpleNamespace(_attn_implementation="eager"), dtype=torch.float32
    )
    mask = model_inputs(batch, eager)["attention_mask"]
    assert mask.shape == (2, 1, 9, 9) and torch.equal(mask, packed_causal_mask(positions))  # unchanged
    for name in (CHUNKED, FLASH):
        model = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation=name))
        ids = model_inputs(batch, model)["attention_mask"]
        assert ids.shape == (2, 1, 1, 9) and ids.dtype == torch.int32
        assert ids[:, 0, 0].tolist() == [[1, 1, 1, 2, 2, 3, 3, 3, 3], [1, 1, 1, 1, 1, 1, 2, 2, 2]]
        padded = {"input_ids": batch["input_ids"], "attention_mask": torch.ones(2, 9, dtype=torch.long)}
        assert model_inputs(padded, model)["attention_mask"] is padded["attention_mask"]
    assert torch.equal(segment_ids_from_positions(positions), model_inputs(batch, model)["attention_mask"])


def test_compact_mask_for_training_and_the_eager_mask_otherwise():
    from transformers import masking_utils as mu

    padding = torch.tensor([[True, True, False], [False, True, True]])
    ids = compact_mask(2, 3, 3, attention_mask=padding, mask_function=mu.causal_mask_function)
    assert (
        ids.dtype == torch.int32
        and ids.shape == (2, 1, 1, 3)
        and ids[:, 0, 0].tolist() == [[1, 1, 0], [0, 1, 1]]
    )
    assert compact_mask(2, 3, 3, mask_function=mu.causal_mask_function).shape == (2, 1, 1, 3)
    config = types.SimpleNamespace(sliding_window=2)
    window = mu.sliding_window_causal_mask_function(2)
    assert compact_mask(2, 3, 3, mask_function=window, local_size=2, config=config).dtype == torch.int32
    full = compact_mask(2, 3, 5, kv_offset=0, mask_function=mu.causal_mask_function, attention_mask=None)
    assert full.shape == (2, 1, 3, 5) and full.dtype == torch.float32  # past keys: the eager mask
    cached = compact_mask(2, 3, 3, q_offset=torch.tensor(0), mask_function=mu.causal_mask_function)
    assert cached.shape == (2, 1, 3, 3)  # a static cache's tensor offset is never read on the host
    packed = compact_mask(2, 3, 3, mask_function=mu.causal_mask_function, allow_is_causal_skip=False)
    assert packed.shape == (2, 1, 3, 3)


def test_registration_is_idempotent():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert attn_implementation("chunked") == CHUNKED and attn_implementation("flash") == FLASH
    assert attn_implementation("eager") == "eager" and attn_implementation("sdpa") == "sdpa"
    attention.register_attention()
    assert AttentionInterface._global_mapping[CHUNKED] is chunked_attention
    assert AttentionMaskInterface._global_mapping[FLASH] is compact_mask
    with pytest.raises(ValueError, match="attention kernel 'auto'"):
        attn_implementation("auto")
    assert [kernel_of(n) for n in (None, "eager", "sdpa", CHUNKED, FLASH, "flash_attention_2")] == [
        "eager",
        "eager",
        "sdpa",
        "chunked",
        "flash",
        "flash",
    ]


# ---- choosing the kernel ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device,tpu,seq_len,softcap,kernel",
    [
        ("xla", True, 2048, False, "flash"),
        ("xla", True, 2048, True, "chunked"),
        ("xla", False, 2048, False, "chunked"),
        ("xla", False, AUTO_CHUNKED_MIN_LENGTH, False, "chunked"),
        ("xla", False, AUTO_CHUNKED_MIN_LENGTH - 1, False, "eager"),
        ("xla", False, None, False, "chunked"),
        ("cuda", False, 2048, False, "sdpa"),
        ("cuda", False, 2048, True, "eager"),
        ("cpu", False, 2048, False, "eager"),
    ],
)
def test_auto_resolution(device, tpu, seq_len, softcap, kernel):
    got, reason = resolve_attention("auto", device_type=device, is_tpu=tpu, seq_len=seq_len, softcap=softcap)
    assert got == kernel and reason.startswith(f"model.attention=auto → {kernel} (")


def test_auto_reason_and_explicit_choices():
    _, reason = resolve_attention("auto", device_type="xla", is_tpu=False, seq_len=2048)
    assert reason == (
        "model.attention=auto → chunked (XLA device, 2048-token rows: scores in 512-query blocks, never 2048×2048)"
    )
    assert resolve_attention("chunked", device_type="cpu", is_tpu=False, seq_len=64)[0] == "chunked"
    assert resolve_attention("sdpa", device_type="xla", is_tpu=False, seq_len=64)[0] == "sdpa"
    assert resolve_attention("flash", device_type="xla", is_tpu=True, seq_len=64, softcap=True)[0] == "flash"
    with pytest.raises(
        ValueError, match=r"model.attention='flash' is not allowed on this XLA device.*'chunked'"
    ):
        resolve_attention("flash", device_type="xla", is_tpu=False, seq_len=2048)
    with pytest.raises(ValueError, match=r"model.attention='sdpa' is not allowed on this CUDA.*soft-cap"):
        resolve_attention("sdpa", device_type="cuda", is_tpu=False, seq_len=2048, softcap=True)
    with pytest.raises(ValueError, match=r"model.attention='fast' is not allowed: expected one of 'auto'"):
        resolve_attention("fast", device_type="cpu", is_tpu=False, seq_len=2048)
    heard = []
    hw = types.SimpleNamespace(device_string="xla", backend="cpu", via_xla=True)
    assert choose_attention("auto", hw, seq_len=4096, notice=heard.append) == "chunked"
    assert heard and "4096-token rows" in heard[0]
    assert choose_attention("eager", hw, seq_len=4096, notice=heard.append) == "eager" and len(heard) == 1


# ---- flash (TPU only): routing and arguments, the kernels replaced --------------------------------


class Kernels:
    """Stands in for `tpu_attention`'s kernels (the only mock here: they lower to a TPU custom call)."""

    def __init__(self, monkeypatch, mesh=None) -> None:
        self.calls: list[tuple[str, dict]] = []
        monkeypatch.setattr(tpu_attention, "current_mesh", lambda: mesh)
        monkeypatch.setattr(tpu_attention, "flash", self.kernel("flash"))
        monkeypatch.setattr(tpu_attention, "splash", self.kernel("splash"))

    def kernel(self, name):
        def run(q, k, v, **kwargs):
            self.calls.append((name, dict(kwargs, q=q, k=k, v=v)))
            return torch.zeros_like(q)

        return run


def test_flash_calls_the_kernel_with_repeated_heads_and_segment_ids(monkeypatch):
    kernels = Kernels(monkeypatch)
    q, k, v = qkv(tq=16, tk=16)
    segments = torch.tensor([[1] * 10 + [2] * 6, [1] * 12 + [0] * 4], dtype=torch.int32)[:, None, None, :]
    out, _ = flash_attention(types.SimpleNamespace(), q, k, v, segments, scaling=0.25)
    ((name, call),) = kernels.calls
    assert name == "flash" and out.shape == (2, 16, 4, 8)
    assert call["k"].shape == (2, 4, 16, 8) and torch.equal(
        call["k"][:, 1], k[:, 0]
    )  # kv head 0 serves q heads 0, 1
    assert call["segment_ids"].shape == (2, 16) and call["segment_ids"].dtype == torch.int32
    assert call["scale"] == 0.25 and call["mesh"] is None
    flash_attention(types.SimpleNamespace(), q, k, v, None)
    assert kernels.calls[-1][1]["segment_ids"] is None and kernels.calls[-1][1]["scale"] == 8**-0.5


def test_flash_falls_back_to_chunked_where_the_kernels_cannot(monkeypatch):
    kernels = Kernels(monkeypatch)
    q, k, v = qkv(tq=16, tk=16)
    module = types.SimpleNamespace()
    expected, _ = chunked_attention(module, q, k, v, None, softcap=2.0)
    out, _ = flash_attention(module, q, k, v, None, softcap=2.0)
    assert torch.equal(out, expected)
    flash_attention(module, q, k, v, additive(positions_mask(16, 16)))  # a full 4-D mask
    flash_attention(module, q, k, v, None, sliding_window=4)  # a window without a mesh
    odd = qkv(tq=600, tk=600, b=1)
    flash_attention(module, *odd, None)  # 600 is no multiple of the 512-token block
    assert kernels.calls == []
    route, why = attention.flash_plan(q[:, :, :3], k, None, sliding_window=None, softcap=None, mesh=None)
    assert route == "chunked" and "past keys" in why


def test_flash_takes_splash_for_a_window_under_a_mesh(monkeypatch):
    mesh = types.SimpleNamespace(axis_names=("data", "fsdp", "model"), mesh_shape=(2, 2, 2))
    kernels = Kernels(monkeypatch, mesh=mesh)
    q, k, v = qkv(b=4, tq=16, tk=16)
    flash_attention(types.SimpleNamespace(), q, k, v, None, sliding_window=4)
    ((name, call),) = kernels.calls
    assert name == "splash" and call["window"] == 4 and call["mesh"] is mesh


def test_partition_spec_over_the_mesh():
    mesh = types.SimpleNamespace(axis_names=("data", "fsdp", "model"), mesh_shape=(2, 2, 2))
    assert tpu_attention.partition_spec(mesh, 8, 4) == (("data", "fsdp"), "model", None, None)
    assert tpu_attention.partition_spec(mesh, 8, 3) == (("data", "fsdp"), None, None, None)
    assert tpu_attention.partition_spec(None, 8, 4) is None
    with pytest.raises(ValueError, match="batch of 6 rows"):
        tpu_attention.partition_spec(mesh, 6, 4)


# ---- on XLA ----------------------------------------------------------------------------------


def assert_cases(cases: dict) -> None:
    for name, result in cases.items():
        assert result["same_grad_names"], name
        assert max(result["logits"], result["loss"], result["grads"]) < REL, (name, result)


ONE_DEVICE_RUNS = {
    "padding_packing": dict(cases=["llama_gqa", "qwen2_padding", "llama_packed", "mistral_window"]),
    "window_softcap_generation": dict(
        cases=["qwen2_window_packed", "gemma2_softcap", "gpt2"], generation=["llama_gqa", "mistral_window"]
    ),
}
"""Every case on one device, in two processes of under a minute each."""


@pytest.mark.parametrize("run", list(ONE_DEVICE_RUNS))
def test_chunked_matches_eager_on_one_xla_device(xla_scenario, run):
    params = ONE_DEVICE_RUNS[run]
    result = xla_scenario("attention_equality", **params)
    assert set(result["cases"]) == set(params["cases"])
    assert_cases(result["cases"])
    for name in params["cases"]:
        if CASES[name].layout == "packed":
            assert result["cases"][name]["mask"] == [[8, 1, 1, 24], "torch.int32"], name
    assert set(result["generation"]) == set(params.get("generation", ()))
    for name, tokens in result["generation"].items():
        assert tokens["eager"] == tokens["chunked"], name


def test_chunked_matches_eager_on_a_mesh(xla_scenario):
    cases = ["qwen2_padding", "llama_packed", "gemma2_softcap"]  # padding, packing, softcap + sliding layers
    result = xla_scenario("attention_equality", mesh=True, cases=cases)
    assert set(result["cases"]) == set(cases)
    assert_cases(result["cases"])


def test_chunked_attention_inside_the_scanned_stack(xla_scenario):
    result = xla_scenario("attention_scan")
    assert set(result) == {"llama_packed/remat=False", "qwen2_padding/remat=True"}
    for name, r in result.items():
        assert r["scan_traces"] == 1 and r["grad_names"], name
        assert r["loss"] < REL and r["grads"] < REL, (name, r)


def test_chunked_attention_saves_the_scores_by_the_compilers_analysis(xla_scenario):
    result = xla_scenario("attention_memory", devices=1)
    temp, scores, block = result["temp_bytes"], result["scores_term"], result["block_term"]
    # eager saves every layer's scores; chunked saves none and holds about three blocks' at its peak
    assert temp["eager/2"] - temp["eager/1"] > 0.9 * scores
    assert temp["chunked/2"] - temp["chunked/1"] < 0.25 * scores
    assert temp["chunked/1"] < 4 * block
    assert temp["eager/1"] - temp["chunked/1"] > 2 * scores


def test_the_estimate_follows_the_compilers_step_memory_at_2048_and_4096_tokens(xla_scenario):
    """A real training step (forward, backward, AdamW) compiled on XLA:CPU: chunked attention drops
    the compiler's peak by every layer's scores, and the estimate follows the compiler within 15%
    for each kernel and for the drop itself."""
    rows = xla_scenario("attention_estimate", devices=1)
    for length in (2048, 4096):
        eager, chunked = rows[f"eager/{length}"], rows[f"chunked/{length}"]
        saved_scores = 2 * 4 * length * length * 4  # 2 layers x 4 heads x T x T fp32 probabilities
        assert eager["compiled"] - chunked["compiled"] > saved_scores
        for row in (eager, chunked):
            assert abs(row["estimate"] / row["compiled"] - 1) < 0.15, (length, row)
        drop = (eager["estimate"] - chunked["estimate"]) / (eager["compiled"] - chunked["compiled"])
        assert abs(drop - 1) < 0.15, (length, drop)
        assert chunked["scores"] < eager["scores"] / 4 and chunked["eager_scores"] == eager["scores"]


def test_a_model_switches_to_flash_without_transformers_fetching_a_kernel():
    """transformers takes any implementation named '...flash...' for a hub flash-attn kernel: the
    workbench's TPU kernel must switch on without one (its forward needs a TPU; this is the switch)."""
    from tests.tiny import tiny
    from workbench.models.build import build_model

    model = use_attention(build_model(tiny("llama"), seed=0), "flash")
    assert model.config._attn_implementation == FLASH and "flash" not in FLASH
    assert kernel_of(model.config._attn_implementation) == "flash"


def test_attention_dropout_keeps_auto_on_kernels_that_drop_weights():
    from tests.tiny import tiny
    from workbench.models.attention_choice import has_attention_dropout, has_softcap
    from workbench.models.build import build_model, hf_config

    qwen = hf_config(tiny("qwen2"))
    qwen.attention_dropout = 0.1
    assert has_attention_dropout(qwen) and not has_attention_dropout(hf_config(tiny("qwen2")))
    gpt2 = hf_config(tiny("gpt2"))
    gpt2.attn_pdrop = 0.1  # what a GPT-2 checkpoint keeps
    assert has_attention_dropout(gpt2)
    for is_tpu, device, expected in (
        (True, "xla", "eager"),
        (False, "xla", "eager"),
        (False, "cuda", "sdpa"),
    ):
        kernel, why = resolve_attention("auto", device_type=device, is_tpu=is_tpu, seq_len=4096, dropout=True)
        assert kernel == expected and "attention dropout" in why
    with pytest.raises(ValueError, match=r"model.attention='chunked' is not allowed .* attention dropout"):
        resolve_attention("chunked", device_type="xla", is_tpu=False, seq_len=4096, dropout=True)
    with pytest.raises(ValueError, match=r"--attention='flash' is not allowed .* needs a TPU"):
        resolve_attention("flash", device_type="xla", is_tpu=False, seq_len=4096, field="--attention")
    # a workbench ModelConfig is read through its transformers config: Gemma 2 soft-caps by default
    assert has_softcap(tiny("gemma2")) and not has_softcap(tiny("llama"))
    assert not has_attention_dropout(build_model(tiny("gpt2"), seed=0))  # built configs drop nothing


def test_the_estimate_prices_what_auto_runs_on_each_target():
    from tests.tiny import tiny
    from workbench.analysis.estimate import estimate_attention
    from workbench.backend.targets import TARGETS

    llama, gemma2 = tiny("llama"), tiny("gemma2")
    assert estimate_attention("auto", TARGETS["v5e-8"], seq_len=2048, model_config=llama) == "flash"
    assert estimate_attention("auto", TARGETS["v5e-8"], seq_len=2048, model_config=gemma2) == "chunked"
    assert estimate_attention("auto", TARGETS["H100"], seq_len=2048, model_config=llama) == "sdpa"
    assert estimate_attention("auto", TARGETS["H100"], seq_len=2048, model_config=gemma2) == "eager"
    assert estimate_attention("chunked", TARGETS["T4"], seq_len=512, model_config=llama) == "chunked"


def test_the_trainer_runs_chunked_attention_on_a_mesh_without_recompiles_or_host_reads(xla_scenario):
    """data 2 x fsdp 2 x model 2, bucketed and packed rows: chunked trains to eager's losses, with no
    compile after warm-up and no transfer between log steps; 'auto' says what it picked."""
    runs = xla_scenario("attention_training")
    for name in ("chunked", "packed_chunked"):
        assert runs[name]["implementation"] == CHUNKED
    assert runs["eager"]["implementation"] == runs["auto"]["implementation"] == "eager"
    for chunked, eager in (("chunked", "eager"), ("packed_chunked", "packed_eager")):
        assert runs[chunked]["losses"] == pytest.approx(runs[eager]["losses"], rel=REL)
    assert runs["packed_eager"]["losses"] != pytest.approx(runs["eager"]["losses"], rel=REL)  # packing ran
    for run in runs.values():
        assert run["compiles_after_warmup"] == 0 and not any(run["transfers"])
    (notice,) = runs["auto"]["attention"]
    assert notice.startswith("model.attention=auto → eager (XLA device, 32-token rows < 1024")
    assert runs["chunked"]["attention"] == []  # an explicit choice needs no notice
