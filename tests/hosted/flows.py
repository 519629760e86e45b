"""What a user runs on a hosted TPU runtime, run inside one of the tier's environments (tests/test_hosted.py).

Started as a script by the environment's own Python, from a directory outside the checkout, so every
``import workbench`` is the installed distribution (the wheel the notebooks' install cell would get),
never the checkout::

    <venv>/bin/python tests/hosted/flows.py <part> '<params as JSON>'

Each part is one process, so its imports are paid once:

- ``session`` (one XLA:CPU device): the doctor on a simulated Colab TPU VM and a simulated Kaggle one
  (``/dev/accel0`` with ``/content`` or ``/kaggle/working``, the environment's real package versions),
  ``info``, ``smoke``, and the quickstart's training (its config, a few steps) for the loss comparison;
- ``mesh`` (eight devices): ``train`` on an fsdp=8 mesh with LoRA on an int8 base and the decoder stack
  scanned, then ``generate`` from the adapter it saved and from the base; with ``without_torchax``, the
  training alone with torchax unimportable (jax alone: the case torch_xla's scan backward cannot bridge);
- ``quickstart``: the quickstart's training alone (the main environment's run, for comparison).

The result is one JSON line after ``RESULT_MARK`` on stdout. This file imports only the standard library
and ``workbench``: it must run in any of the environments.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULT_MARK = "__HOSTED_RESULT__"
QUICKSTART_PROMPT = "How do I open a file?"


def _command(argv: list[str]) -> dict[str, Any]:
    """``python -m workbench <argv>`` run in this process: its exit code and what it printed."""
    from workbench.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse and friends
            code = exit_.code if isinstance(exit_.code, int) else 1
        except Exception as error:  # the test shows it; the next flow still runs
            import traceback

            traceback.print_exc()
            code = f"raised {type(error).__name__}: {error}"
    return {"argv": argv, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _simulated_tpu_vm(root: Path, hosted: str) -> Any:
    """Doctor roots of a TPU VM (``/dev/accel0``) on Colab (``/content``) or Kaggle (``/kaggle/working``),
    with this environment's installed packages as the versions."""
    from workbench.doctor import DoctorRoots

    for name in ("proc", "dev", "sys", "tmp", "fs"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "dev" / "accel0").write_text("")
    (root / "proc" / "meminfo").write_text("MemTotal:       348000000 kB\nMemAvailable:   340000000 kB\n")
    work = root / "fs" / ("content" if hosted == "colab" else "kaggle/working")
    work.mkdir(parents=True, exist_ok=True)
    return DoctorRoots(
        proc=root / "proc",
        dev=root / "dev",
        sys=root / "sys",
        tmp=root / "tmp",
        fs_root=root / "fs",
        cwd=work,
        env={},
    )


def doctor_on(hosted: str, root: Path) -> dict[str, Any]:
    from workbench.doctor import doctor

    report = doctor(roots=_simulated_tpu_vm(root, hosted))
    return {
        "ok": report.ok,
        "checks": [{"name": c.name, "status": c.status, "saw": c.saw, "fix": c.fix} for c in report.checks],
        "table": report.table(),
    }


def quickstart(steps: int = 10, batch_size: int = 8, log_every: int = 5, max_examples: int = 400) -> dict:
    """The quickstart notebook's training at its test parameters: the logged losses, and hashes of the
    corpus and of the training token ids (the same data on every Python)."""
    from workbench import WorkbenchConfig, detect
    from workbench.data import build_datasets
    from workbench.data.corpus import embedded_corpus
    from workbench.train import Trainer

    hw = detect("auto")
    cfg = WorkbenchConfig().with_overrides(
        {
            "train.steps": steps,
            "train.batch_size": batch_size,
            "train.log_every": log_every,
            "train.progress_bar": False,
            "data.max_examples": max_examples,
        }
    )
    train_ds, eval_ds, tokenizer = build_datasets(cfg)

    def sha256(value: Any) -> str:
        return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()

    result = Trainer(
        cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, hardware=hw
    ).fit()
    return {
        "losses": [float(m["loss"]) for m in result.history],
        "device": f"{hw.device_kind} x{hw.num_devices}",
        "train_sequences": len(train_ds),
        "corpus_sha256": sha256(embedded_corpus()),
        "vocab_sha256": sha256(tokenizer.get_vocab()),
        "tokens_sha256": sha256([list(map(int, row)) for row in train_ds["input_ids"]]),
        "python": sys.version.split()[0],
    }


def _versions() -> dict[str, str]:
    """Every installed distribution's version, by canonical name."""
    import importlib.metadata
    import re

    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[re.sub(r"[-_.]+", "-", name).lower()] = dist.version
    return found


def _jax_bridge() -> dict[str, bool]:
    """What torch_xla's own probes find: jax and torchax importable (torch_xla's wheel carries torchax, which
    imports or not depending on the jax beside it)."""
    from torch_xla._internal import jax_workarounds

    found = {}
    for name, probe in (
        ("torchax", jax_workarounds.maybe_get_torchax),
        ("jax", jax_workarounds.maybe_get_jax),
    ):
        try:
            found[name] = probe() is not None
        except Exception:
            found[name] = False
    return found


def session(work: str) -> dict[str, Any]:
    root = Path(work)
    return {
        "doctor": {hosted: doctor_on(hosted, root / f"{hosted}-vm") for hosted in ("colab", "kaggle")},
        "quickstart": quickstart(),  # first: its run is the process's first XLA work, as in the notebook
        "info": _command(["info", "--json"]),
        "smoke": _command(["smoke", "--steps", "3"]),
        "versions": _versions(),
        "jax_bridge": _jax_bridge(),
    }


def _tiny_base(path: Path) -> None:
    """A tiny llama with the default tokenizer beside it: what a user downloads as a base model."""
    from workbench.config import WorkbenchConfig
    from workbench.data.tokenizer import get_tokenizer
    from workbench.models.build import build_model

    sizes = WorkbenchConfig().with_overrides(
        ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2", "model.num_heads=2",
         "model.num_kv_heads=1"]
    )  # fmt: skip
    tokenizer = get_tokenizer(sizes.data)
    build_model(sizes.model, vocab_size=len(tokenizer), seed=1).save_pretrained(path)
    tokenizer.save_pretrained(path)


def _watch_scan() -> list[dict[str, Any]]:
    """Record each decoder stack the run scans (the real `install_scan` still does the work): the command
    line prints nothing about ``model.scan_layers=true``, and a run that silently unrolled would pass."""
    from workbench.models.scan import scanned_layers
    from workbench.train import model_setup

    installs: list[dict[str, Any]] = []
    install_scan = model_setup.install_scan

    def recording(model: Any, **kwargs: Any) -> Any:
        out = install_scan(model, **kwargs)
        stack = scanned_layers(model)
        installs.append({"scanned": stack is not None, "layers": len(stack) if stack is not None else 0})
        return out

    model_setup.install_scan = recording
    return installs


def mesh(work: str, steps: int = 3, without_torchax: bool = False, generate: bool = True) -> dict[str, Any]:
    """`without_torchax`: torchax made unimportable (what torch_xla's probe sees where its wheel's torchax
    cannot import, e.g. without flax): jax alone, the case torch_xla's scan backward cannot bridge."""
    if without_torchax:
        sys.modules["torchax"] = None  # type: ignore[assignment]  # `import torchax` raises ImportError
    root = Path(work)
    base, adapter, metrics = root / "base", root / "adapter", root / "metrics.json"
    _tiny_base(base)
    scans = _watch_scan()
    train = _command(
        [
            "train",
            f"model.pretrained_path={base}",
            "mesh.enabled=true",
            "mesh.fsdp=8",
            "lora.rank=4",
            "lora.alpha=8",
            "model.quantize=int8",
            "model.scan_layers=true",
            "data.max_length=64",
            "data.max_examples=64",
            f"train.steps={steps}",
            "train.batch_size=8",
            "train.log_every=1",
            "train.progress_bar=false",
            f"train.checkpoint_dir={root / 'checkpoints'}",
            "--save-pretrained",
            str(adapter),
            "--metrics-out",
            str(metrics),
        ]
    )
    generated = {
        which: _command(["generate", "--model", str(path), "--max-new-tokens", "6", QUICKSTART_PROMPT])
        for which, path in (("adapter", adapter), ("base", base))
        if generate
    }
    return {
        "train": train,
        "scans": scans,
        "jax_bridge": _jax_bridge(),
        "metrics": json.loads(metrics.read_text()) if metrics.is_file() else None,
        "adapter_files": sorted(p.name for p in adapter.iterdir()) if adapter.is_dir() else [],
        "generate": generated,
    }


PARTS: dict[str, Callable[..., dict[str, Any]]] = {
    "session": session,
    "mesh": mesh,
    "quickstart": lambda work: quickstart(),
}


def main(argv: list[str]) -> int:
    part, params = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    with tempfile.TemporaryDirectory(prefix="wb-hosted-cache-") as cache:
        os.environ["XLA_WORKBENCH_CACHE"] = cache  # a fresh runtime: the tokenizer is trained here
        result = PARTS[part](**params)
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
