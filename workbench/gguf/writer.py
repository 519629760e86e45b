"""One GGUF file from a transformers model and its tokenizer, with the ``gguf`` package (pure Python).

`write_gguf` writes the hyperparameters (`workbench.gguf.families.metadata`), the tokenizer with its
special tokens and chat template (`workbench.gguf.vocab`) and every weight under llama.cpp's name,
in the type `OUTTYPES` names: ``f32``, ``f16``, ``bf16`` or ``q8_0`` for the matrices (a matrix whose
rows do not split into Q8_0's blocks of 32 stays f16), always f32 for norms, biases and rotary
factors, as llama.cpp's converter keeps them. The family and tokenizer are checked before any weight is
read (`check_writable`). The file appears complete or not at all: it is written beside its place under
a hidden name and renamed in.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.gguf.families import GGUFFamily, extra_tensors, family_of, metadata, tensor_name, transform
from workbench.gguf.vocab import GGUFVocab, vocab_of

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
"""The types a GGUF export's matrices take (``--outtype``)."""
_FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}
"""llama.cpp's ``general.file_type`` for each."""


class GGUFMissingError(ImportError):
    """The ``gguf`` package is not installed: the message is the pip line that installs it."""


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise GGUFMissingError(
            "GGUF export needs the gguf package (pure Python): pip install 'xla-workbench[gguf]' (or pip install gguf)"
        ) from None
    return gguf


def check_writable(config: Any, tokenizer: Any, outtype: str) -> tuple[GGUFFamily, GGUFVocab]:
    """The family and vocabulary a GGUF of this model would hold; an error naming what cannot be written
    (family, tokenizer, outtype, a missing ``gguf`` package), before any weight is read."""
    if outtype not in OUTTYPES:
        raise ValueError(f"--outtype {outtype!r} is not written: one of {', '.join(OUTTYPES)}")
    _gguf()
    family = family_of(config)
    metadata(family, config)  # refuses a rotary scaling it cannot write
    return family, vocab_of(tokenizer, int(config.vocab_size))


def write_gguf(
    model: Any,
    tokenizer: Any,
    path: str | Path,
    *,
    outtype: str = "f16",
    name: str | None = None,
    notice: Callable[[str], None] | None = None,
) -> Path:
    """Write `model` (a transformers causal LM, adapters merged) with `tokenizer` to the GGUF file `path`."""
    gguf = _gguf()
    config = model.config
    family, vocab = check_writable(config, tokenizer, outtype)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(handle)
    try:
        _write(gguf, model, family, vocab, Path(partial), outtype, name or path.stem, notice)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(partial, 0o666 & ~mask)  # mkstemp makes it private; the file is shared like any export
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return path


def _write(
    gguf: Any,
    model: Any,
    family: GGUFFamily,
    vocab: GGUFVocab,
    path: Path,
    outtype: str,
    name: str,
    notice: Callable[[str], None] | None,
) -> None:
    import torch

    config = model.config
    writer = gguf.GGUFWriter(str(path), family.arch, use_temp_file=True)
    writer.add_name(name)
    writer.add_file_type(_FILE_TYPE[outtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, vtype, value in [*metadata(family, config), *vocab.metadata()]:
        _add(writer, key, vtype, value)
    tied = bool(getattr(config, "tie_word_embeddings", False)) or family.model_type.startswith("gemma")
    kept_f16 = []
    with torch.no_grad():
        for hf_name, tensor in model.state_dict().items():
            gguf_name = tensor_name(family, hf_name)
            if gguf_name is None or (gguf_name == "output.weight" and tied):
                continue
            data = transform(family, hf_name, tensor.detach().to("cpu", torch.float32).numpy(), config)
            kind = _tensor_type(gguf, data, outtype)
            if outtype == "q8_0" and kind != gguf.GGMLQuantizationType.Q8_0 and data.ndim == 2:
                kept_f16.append(gguf_name)
            _add_tensor(gguf, writer, gguf_name, data, kind)
    for gguf_name, data in extra_tensors(family, config).items():
        _add_tensor(gguf, writer, gguf_name, data, gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if kept_f16 and notice is not None:
        notice(
            f"GGUF q8_0: {len(kept_f16)} matrices whose rows are not a multiple of 32 stay f16 "
            f"({', '.join(kept_f16[:3])}{', ...' if len(kept_f16) > 3 else ''})"
        )


def _tensor_type(gguf: Any, data: Any, outtype: str) -> Any:
    types = gguf.GGMLQuantizationType
    if data.ndim < 2 or outtype == "f32":
        return types.F32
    if outtype == "q8_0":
        return types.Q8_0 if data.shape[-1] % 32 == 0 else types.F16
    return {"f16": types.F16, "bf16": types.BF16}[outtype]


def _add_tensor(gguf: Any, writer: Any, name: str, data: Any, kind: Any) -> None:
    import numpy as np

    types = gguf.GGMLQuantizationType
    data = np.ascontiguousarray(data, dtype=np.float32)
    if kind == types.F32:
        writer.add_tensor(name, data)
    elif kind == types.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)


def _add(writer: Any, key: str, vtype: str, value: Any) -> None:
    if vtype == "array":
        writer.add_array(key, value)
    else:
        getattr(writer, f"add_{vtype}")(key, value)
