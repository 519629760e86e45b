"""Pushing what a command saved to the Hub: ``--push-to-hub ORG/NAME`` (``--private``, ``--branch``) on
``train`` and ``export``, and ``python -m workbench push DIR ORG/NAME`` for a directory saved earlier.

What is pushed is the local output the command wrote (``train --save-pretrained DIR``, ``export ...
OUT``): the adapter or whole model with its tokenizer, or the GGUF file, and a model card
(`workbench.hub.card`) written into that directory first as its ``README.md``, so a push that fails
can be run again from the directory alone (the error line says how) and the local copy is the
pushed one. A push is checked before any work (a repo id, ``HF_HUB_OFFLINE`` unset, a token), and
never uploads training checkpoints or optimizer state (`workbench.hub.push.plan_upload`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from workbench.hub.card import Kind, ModelCard
from workbench.hub.ids import HubError, hub_ref_of_snapshot, parse_hub_id
from workbench.hub.push import PushResult, check_can_push, push_folder

_BUILT_IN_DATA = {
    "embedded": "the workbench's embedded corpus (Python's own documentation)",
    "chat-sample": "the workbench's chat sample",
    "preference-sample": "the workbench's preference sample",
    "math-sample": "the workbench's arithmetic word problems",
}


def add_push_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--push-to-hub ORG/NAME``, ``--private``, ``--branch NAME`` for a command that saves `what`."""
    parser.add_argument(
        "--push-to-hub",
        metavar="ORG/NAME",
        help=f"upload {what} with a model card to this Hub repo at the end (a token from HF_TOKEN or the "
        "notebook's secrets); a failed upload leaves the local copy and says how to push it again",
    )
    parser.add_argument("--private", action="store_true", help="make a new --push-to-hub repo private")
    parser.add_argument(
        "--branch", metavar="NAME", help="push to this branch of the repo (made when missing; default main)"
    )


def check_push(args: argparse.Namespace, *, local_flag: str | None) -> None:
    """Refuse a push that cannot happen, before any work: `HubError` (a ValueError) with the fix."""
    repo = getattr(args, "push_to_hub", None)
    if not repo:
        if getattr(args, "private", False) or getattr(args, "branch", None):
            raise HubError("--private and --branch go with --push-to-hub ORG/NAME")
        return
    if local_flag is not None and not getattr(args, local_flag.lstrip("-").replace("-", "_"), None):
        raise HubError(
            f"--push-to-hub {repo} needs {local_flag} DIR: the local copy it uploads, kept when an upload fails"
        )
    check_can_push(repo)


# ---- the card's facts ----------------------------------------------------------------------------


def base_model_id(value: str | None) -> str | None:
    """The Hub id (without revision) a base named by `value` is: an id, or a Hub cache snapshot path."""
    if not value:
        return None
    ref = parse_hub_id(value)
    if ref is not None:
        return ref.repo_id
    hub = hub_ref_of_snapshot(value) if Path(value).is_dir() else None
    return hub[1].repo_id if hub is not None and hub[0] == "model" else None


def saved_kind(folder: Path) -> Kind:
    if any(folder.glob("*.gguf")):
        return "gguf"
    return "adapter" if (folder / "adapter_config.json").is_file() else "transformers"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _recorded_base(folder: Path) -> str | None:
    for name, key in (
        ("workbench_base_model.json", "name_or_path"),
        ("adapter_config.json", "base_model_name_or_path"),
    ):
        value = _read_json(folder / name).get(key)
        if value:
            return str(value)
    return None


def data_facts(data: Any) -> tuple[list[str], str]:
    """(Hub dataset ids, the data in words) of a run's `data` section."""
    source = str(data.source)
    ref = parse_hub_id(source)
    if ref is not None:
        subset = f"subset {data.subset}, " if data.subset else ""
        return [ref.repo_id], f"[{ref}]({ref.dataset_url}) ({subset}split {data.split})"
    return [], _BUILT_IN_DATA.get(source, f"a local dataset ({Path(source).name})")


def run_card(trainer: Any, result: Any, folder: Path, repo_id: str) -> ModelCard:
    """The card of a `Trainer` run whose model was saved into `folder`."""
    from workbench import __version__

    cfg = trainer.cfg
    kind = saved_kind(folder)
    recorded = _recorded_base(folder) or cfg.model.pretrained_path
    base = base_model_id(recorded)
    datasets, described = data_facts(cfg.data)
    metrics: dict[str, Any] = {
        "steps": result.steps,
        "final train loss": result.final_loss,
        "tokens/s": result.tokens_per_s,
    }
    stats = getattr(result.eval_loss, "stats", None) or {}
    if "reward_mean" in stats:
        metrics["eval reward (greedy)"] = stats["reward_mean"]
    elif result.eval_loss is not None:
        metrics["eval loss"] = float(result.eval_loss)
        metrics["eval perplexity"] = result.eval_perplexity
    last = result.history[-1] if result.history else {}
    for key in ("reward_accuracy", "reward_margin", "reward_mean"):
        if last.get(key) is not None:
            metrics[key.replace("_", " ")] = last[key]
    return ModelCard(
        repo_id=repo_id,
        kind=kind,
        base_model=base,
        base_description=None if base else (f"a local model ({Path(recorded).name})" if recorded else None),
        objective=cfg.train.objective,
        datasets=datasets,
        data_description=described,
        config=cfg.to_dict(),
        metrics=metrics,
        hardware=trainer.hw.to_dict(),
        version=__version__,
        lora=_read_json(folder / "adapter_config.json") or None,
    )


CARD_FACTS = "workbench_card.json"
"""Written beside the card: its facts, so ``push`` renders the card again for any repo id."""


def folder_card(folder: Path, repo_id: str) -> ModelCard:
    """`folder`'s card for `repo_id`: from the facts a command wrote beside it, else from its own files."""
    from workbench import __version__

    facts = _read_json(folder / CARD_FACTS)
    if facts:
        fields = {k: v for k, v in facts.items() if k in ModelCard.__dataclass_fields__}
        return ModelCard(**{**fields, "repo_id": repo_id, "kind": saved_kind(folder)})
    recorded = _recorded_base(folder)
    base = base_model_id(recorded)
    return ModelCard(
        repo_id=repo_id,
        kind=saved_kind(folder),
        base_model=base,
        base_description=f"a local model ({Path(recorded).name})" if recorded and not base else None,
        version=__version__,
        gguf_files=sorted(p.name for p in folder.glob("*.gguf")),
        lora=_read_json(folder / "adapter_config.json") or None,
    )


def export_card(model_dir: Any, folder: Path, repo_id: str) -> ModelCard:
    """The card of an export of `model_dir` (a `workbench.model_dirs.ModelDir`) written into `folder`: the
    facts its training run left beside it where there are some, the base at the bottom of its chain."""
    import dataclasses

    node, facts = model_dir, {}
    while node is not None and not facts:  # an adapter's run card, or its checkpoint's
        facts = _read_json(node.path / CARD_FACTS)
        node = node.base
    card = folder_card(folder, repo_id)
    root = model_dir.transformers_root
    base = card.base_model or base_model_id(str(root) if root is not None else None)
    fields = {
        k: v
        for k, v in facts.items()
        if k in ModelCard.__dataclass_fields__ and k not in ("repo_id", "kind", "gguf_files")
    }
    return dataclasses.replace(card, **{**fields, "base_model": fields.get("base_model") or base})


def write_card(folder: Path, card: ModelCard) -> Path:
    """Write `card` as `folder`'s ``README.md`` (replacing peft's generic one) and its facts beside it."""
    import dataclasses

    _write_atomically(folder / CARD_FACTS, json.dumps(dataclasses.asdict(card), indent=1, default=str) + "\n")
    return _write_atomically(folder / "README.md", card.render())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_atomically(target: Path, text: str) -> Path:
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes it private; a card is shared like the model
    os.replace(temporary, target)
    return target


# ---- the push ------------------------------------------------------------------------------------


def push_with_card(folder: Path, card: ModelCard, args: argparse.Namespace) -> PushResult:
    """Write the card into `folder` for the repo pushed to, push `folder` as the command's flags say, and
    print where it went."""
    import dataclasses

    write_card(folder, dataclasses.replace(card, repo_id=args.push_to_hub))
    result = push_folder(folder, args.push_to_hub, private=args.private, branch=args.branch)
    print(f"pushed {len(result.files)} files to {result.repo_id} ({result.revision}): {result.url}")
    return result


def publish_run(trainer: Any, result: Any, folder: Path, args: argparse.Namespace) -> PushResult | None:
    """After ``train --save-pretrained DIR``: the run's card into DIR, then the push ``--push-to-hub`` asks for."""
    repo = getattr(args, "push_to_hub", None)
    card = run_card(trainer, result, folder, repo or folder.name)
    if not repo:
        write_card(folder, card)
        return None
    return push_with_card(folder, card, args)


def push_to_hub(
    folder: str | Path,
    repo_id: str,
    *,
    trainer: Any = None,
    result: Any = None,
    private: bool = False,
    branch: str | None = None,
) -> PushResult:
    """Push a saved directory (``Trainer.save_pretrained``'s, an export's) to `repo_id` with its card, from
    Python: the card from `trainer` and its `result` (``Trainer.fit``'s) when given, else from the facts a
    command left in `folder`, else from `folder`'s own files. `HubError` when it cannot be pushed (a
    failed upload says what to run again; `folder` stays as it was)."""
    import dataclasses

    folder = Path(folder)
    check_can_push(repo_id, field="repo_id")
    if trainer is not None and result is not None:
        card = run_card(trainer, result, folder, repo_id)
    else:
        card = folder_card(folder, repo_id)
    write_card(folder, dataclasses.replace(card, repo_id=repo_id))
    return push_folder(folder, repo_id, private=private, branch=branch)


def add_push_command(sub: Any) -> None:
    push = sub.add_parser(
        "push",
        help="upload a saved model directory (train --save-pretrained, export) with its model card to the Hub",
        description="Upload DIR (an adapter, a transformers model or GGUF files, with the tokenizer) to the "
        "Hub repo ORG/NAME; a card is written into DIR first when it has none; exit 0 pushed, 1 the upload "
        "failed, 2 nothing could be pushed.",
    )
    push.add_argument("directory", metavar="DIR")
    push.add_argument("repo", metavar="ORG/NAME")
    push.add_argument("--private", action="store_true", help="make a new repo private")
    push.add_argument(
        "--branch", metavar="NAME", help="push to this branch (made when missing; default main)"
    )


def run_push_command(args: argparse.Namespace) -> int:
    """``python -m workbench push DIR ORG/NAME``; returns the exit code."""
    folder = Path(args.directory).expanduser()
    try:
        if not folder.is_dir():
            raise HubError(
                f"DIR={str(folder)!r} is not a directory: give what train --save-pretrained or export wrote"
            )
        if (folder / "manifest.json").is_file() and (folder / "state.json").is_file():
            raise HubError(
                f"{str(folder)!r} is a training checkpoint (weights with optimizer state), which is never pushed: "
                f"export it first: python -m workbench export --model {folder} --to merged OUT"
            )
        check_can_push(args.repo, field="ORG/NAME")
        write_card(folder, folder_card(folder, args.repo))
    except HubError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        result = push_folder(folder, args.repo, private=args.private, branch=args.branch)
    except HubError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"pushed {len(result.files)} files to {result.repo_id} ({result.revision}): {result.url}")
    return 0
