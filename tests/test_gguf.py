"""``export --to gguf``: a LoRA adapter of each family the writer knows, merged and written as GGUF, read back.

Read back with transformers' own GGUF reader (``from_pretrained(dir, gguf_file=...)``, which needs the
``gguf`` package): the logits equal the merged model's, and the tokenizer transformers rebuilds from the
file encodes the same ids, chat template included. Figures (relative: ``‖Δlogits‖ / ‖logits‖``):

- f32: below 1e-5 (the same weights);
- f16: below 1e-5 against the merged model with its weights rounded to f16 (the writer adds nothing),
  below 1e-3 against the fp32 merged model (measured 4e-4 to 7e-4 on these models);
- bf16: below 1e-2 (measured 3e-3 to 6e-3); q8_0: below 5e-2 (measured 1e-2 to 2e-2).

transformers reads no ``gemma`` (Gemma 1) GGUF; that family is read back with the ``gguf`` package's own
reader into a ``GemmaForCausalLM`` built from the file's metadata. llama.cpp's Python binding, when
installed, reads every family's f32 file too: its tokenizer splits the prompt into the same ids, its
logits are within 1e-3 of the model's (measured 3.5e-5 to 4.3e-4 with llama-cpp-python 0.3.36, which
keeps its KV cache in f16) and its greedy tokens are equal (skipped without it: installing it compiles
llama.cpp, about 6 minutes on 2 cores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.gguf_models import TEXTS, tiny_model, tokenizer_for
from workbench.__main__ import main

pytest.importorskip("gguf")

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2")
PROMPT = "def f(x):\n    return x, the cat sat on the mat 42"


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _adapter(family: str, root: Path, cache_dir: Path) -> tuple[Any, Any, Path]:
    """(the LoRA model, its tokenizer, the adapter directory the workbench saved): what a LoRA run leaves,
    with random adapter weights in place of trained ones."""
    import transformers as tf

    from workbench.config import LoraConfig
    from workbench.train.adapter_files import save_model
    from workbench.train.lora import apply_lora

    tokenizer = tokenizer_for(family, str(cache_dir))
    base_dir = root / "base"
    tiny_model(family, len(tokenizer)).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    base = tf.AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager", dtype=torch.float32)
    model = apply_lora(base, LoraConfig(rank=4, alpha=8.0))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.05)
    return model.eval(), tokenizer, save_model(model, root / "adapter", tokenizer=tokenizer)


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def _export(adapter: Path, out: Path, outtype: str) -> Path:
    assert main(["export", "--model", str(adapter), "--to", "gguf", str(out), "--outtype", outtype]) == 0
    (written,) = out.glob("*.gguf")
    assert written.name == f"{out.name}-{outtype}.gguf"
    return written


def _load(path: Path, family: str) -> Any:
    """The GGUF file as a transformers model: transformers' reader, or for Gemma 1 the gguf package's."""
    import transformers as tf

    if family != "gemma":
        return tf.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
    return _gemma_from_gguf(path)


def _gemma_from_gguf(path: Path) -> Any:
    """A ``GemmaForCausalLM`` from the file alone: its metadata for the config, its tensors (the norms'
    stored ``1 + w`` back to ``w``) under transformers' names."""
    import gguf
    import transformers as tf

    from workbench.gguf.families import GGUF_FAMILIES, tensor_name

    reader = gguf.GGUFReader(str(path))

    def field(key: str) -> Any:
        value = reader.fields[key]
        return value.parts[value.data[0]][0].item()

    config = tf.GemmaConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=field("gemma.embedding_length"),
        intermediate_size=field("gemma.feed_forward_length"),
        num_hidden_layers=field("gemma.block_count"),
        num_attention_heads=field("gemma.attention.head_count"),
        num_key_value_heads=field("gemma.attention.head_count_kv"),
        head_dim=field("gemma.attention.key_length"),
        rms_norm_eps=field("gemma.attention.layer_norm_rms_epsilon"),
        rope_theta=field("gemma.rope.freq_base"),
        max_position_embeddings=field("gemma.context_length"),
    )
    model = tf.GemmaForCausalLM(config).eval()
    tensors = {
        t.name: gguf.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        for t in reader.tensors
    }
    state = {}
    for name in model.state_dict():
        gguf_name = tensor_name(GGUF_FAMILIES["gemma"], name)
        value = tensors["token_embd.weight" if gguf_name == "output.weight" else gguf_name]
        state[name] = torch.from_numpy(
            np.array(value, dtype=np.float32) - (1.0 if name.endswith("norm.weight") else 0.0)
        )
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lora_adapter_of_each_family_exports_to_gguf_f16_that_loads_with_the_same_logits(
    family, tmp_path, cache_dir
):
    model, tokenizer, adapter = _adapter(family, tmp_path, cache_dir)
    path = _export(adapter, tmp_path / "gguf", "f16")
    loaded = _load(path, family)
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    merged = model.merge_and_unload()
    reference = _logits(merged, ids)
    assert _relative(_logits(loaded, ids), reference) < 1e-3
    with torch.no_grad():  # what f16 storage keeps of the merged matrices (norms and biases stay f32)
        for parameter in merged.parameters():
            if parameter.dim() >= 2:
                parameter.copy_(parameter.to(torch.float16).to(torch.float32))
    assert _relative(_logits(loaded, ids), _logits(merged, ids)) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_the_tokenizer_special_tokens_and_chat_template_travel_in_the_file(family, tmp_path, cache_dir):
    import transformers as tf

    from workbench.gguf import write_gguf

    tokenizer = tokenizer_for(family, str(cache_dir))
    path = write_gguf(tiny_model(family, len(tokenizer)), tokenizer, tmp_path / "m.gguf", outtype="f32")
    # transformers builds no config from a Gemma 1 file, which AutoTokenizer reads first: its class directly
    loader = tf.GemmaTokenizer if family == "gemma" else tf.AutoTokenizer
    back = loader.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS:
        assert back(text)["input_ids"] == tokenizer(text)["input_ids"], text
    chat = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]
    assert back.chat_template == tokenizer.chat_template
    rendered = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)
    assert back.apply_chat_template(chat, tokenize=True, return_dict=False) == rendered
    assert (back.eos_token, back.bos_token) == (tokenizer.eos_token, tokenizer.bos_token)


@pytest.mark.parametrize("outtype, figure", [("f32", 1e-5), ("bf16", 1e-2), ("q8_0", 5e-2)])
def test_other_outtypes_stay_within_their_figures(outtype, figure, tmp_path, cache_dir):
    from workbench.gguf import write_gguf

    tokenizer = tokenizer_for("llama", str(cache_dir))
    model = tiny_model("llama", len(tokenizer))
    path = write_gguf(model, tokenizer, tmp_path / f"m-{outtype}.gguf", outtype=outtype)
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    assert _relative(_logits(_load(path, "llama"), ids), _logits(model, ids)) < figure


def _refusal_before_any_weight_is_read(model_dir: Path, out: Path, monkeypatch, capsys) -> str:
    """``export --to gguf`` of `model_dir`: exit 2 with one ``error:`` line, no weight loaded, nothing written;
    returns the line."""
    import workbench.train.start as start

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("weights were loaded before the export was checked")

    monkeypatch.setattr(start, "load_for_inference", never)
    capsys.readouterr()
    assert main(["export", "--model", str(model_dir), "--to", "gguf", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert not out.exists()
    return err


def test_a_family_gguf_cannot_hold_is_refused_by_name_before_any_weight_is_read(
    tmp_path, capsys, monkeypatch
):
    import transformers as tf

    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300))
    model.save_pretrained(tmp_path / "gpt2")
    tf.GPT2TokenizerFast(tokenizer_object=_tiny_bpe()).save_pretrained(tmp_path / "gpt2")
    err = _refusal_before_any_weight_is_read(tmp_path / "gpt2", tmp_path / "out", monkeypatch, capsys)
    assert "'gpt2' family" in err and "llama, mistral, qwen2, qwen3, gemma, gemma2" in err


def _tiny_bpe() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.train_from_iterator(
        TEXTS, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    return core


def test_a_gemma2_query_scale_llama_cpp_would_not_use_is_refused_before_any_weight_is_read(
    tmp_path, capsys, monkeypatch, cache_dir
):
    tokenizer = tokenizer_for("gemma2", str(cache_dir))
    model = tiny_model("gemma2", len(tokenizer))
    model.config.query_pre_attn_scalar = 144  # llama.cpp scales a 2-layer Gemma 2 by 1/sqrt(head_dim = 256)
    model.save_pretrained(tmp_path / "gemma2")
    tokenizer.save_pretrained(tmp_path / "gemma2")
    err = _refusal_before_any_weight_is_read(tmp_path / "gemma2", tmp_path / "out", monkeypatch, capsys)
    assert "query_pre_attn_scalar=144" in err and "1/sqrt(head_dim) = 1/sqrt(256)" in err


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_cpp_reads_the_file_and_decodes_the_same_greedy_tokens(family, tmp_path, cache_dir):
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed (it compiles llama.cpp)"
    )
    from workbench.gguf import write_gguf

    tokenizer = tokenizer_for(family, str(cache_dir))
    model = tiny_model(family, len(tokenizer))
    path = write_gguf(model, tokenizer, tmp_path / "m.gguf", outtype="f32")
    engine = llama_cpp.Llama(model_path=str(path), n_ctx=64, verbose=False, logits_all=True)
    ids = tokenizer(PROMPT)["input_ids"]
    # llama.cpp's tokenizer, rebuilt from the file alone, splits the prompt as the original does
    assert engine.tokenize(PROMPT.encode(), add_bos=ids[0] == tokenizer.bos_token_id, special=False) == ids
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].float()
        ours = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids) :].tolist()
    engine.eval(ids)
    theirs_logits = torch.from_numpy(np.array(engine.scores[: len(ids)], dtype=np.float32))
    assert _relative(theirs_logits, reference) < 1e-3
    engine.reset()
    theirs = [t for t, _ in zip(engine.generate(ids, temp=0.0, top_k=1), range(8))]
    assert theirs == ours
