"""Upload a saved model directory to a Hub repo: the model and its tokenizer, never training state.

`plan_upload` says what goes, file by file: weights (``*.safetensors``, ``*.gguf``), configs and
tokenizer files (``*.json``, ``*.model``, ``*.txt``, ``*.jinja``, ``*.tiktoken``) and the card
(``README.md``); nothing else (no optimizer state, no checkpoints, no ``*.bin``, no hidden files).
A base recorded as a local Hub-cache snapshot path (``.../models--org--name/snapshots/<commit>``) is
written as its Hub id in the uploaded ``adapter_config.json`` and ``workbench_base_model.json``, so the
adapter finds its base from anywhere.

`push_folder` creates the repo (``exist_ok``; ``--private`` makes a new one private), the branch
when one is asked for, and uploads the plan in one commit. A failure leaves the local directory as
it was and raises a `HubError` whose line says why and the command that pushes it again.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path

from workbench.hub.auth import WHERE_TOKENS_COME_FROM, hub_token
from workbench.hub.ids import HubError, HubRef, hub_ref_of_snapshot, parse_hub_id

UPLOADED = (
    "*.safetensors",
    "*.gguf",
    "*.json",
    "*.model",
    "*.txt",
    "*.jinja",
    "*.tiktoken",
    "README.md",
)
"""What a push uploads from a saved model directory (top level only)."""
NEVER_UPLOADED = (
    "manifest.json",
    "state.json",
    "optimizer*",
    "scheduler*",
    "rng_state*",
    "trainer_state.json",
)
"""Files of training state that never go, even where a pattern above would take them."""
BASE_RECORDS = ("adapter_config.json", "workbench_base_model.json")
"""The files naming an adapter's base, rewritten to the base's Hub id when they name a cache snapshot."""


@dataclass(frozen=True)
class PushResult:
    repo_id: str
    revision: str
    """The branch pushed to."""
    url: str
    """The commit's page on the Hub."""
    files: tuple[str, ...]


def check_repo_id(value: str, *, field: str = "--push-to-hub") -> HubRef:
    """`value` as the ``org/name`` of a repo to push to (no revision; `HubError` otherwise)."""
    ref = parse_hub_id(value)
    if ref is None or ref.revision:
        raise HubError(
            f"{field}={value!r} is not a Hub repo id: give org/name (your user or organization, a name)"
        )
    return ref


def check_can_push(repo_id: str, *, field: str = "--push-to-hub") -> HubRef:
    """The checks a push can make before any work: a repo id, the network allowed, a token to push with."""
    from huggingface_hub import constants, get_token

    ref = check_repo_id(repo_id, field=field)
    if getattr(constants, "HF_HUB_OFFLINE", False):
        raise HubError(
            f"{field} {repo_id}: HF_HUB_OFFLINE is set, so nothing can be uploaded: unset it, or leave out {field}"
        )
    if hub_token() is None and get_token() is None:
        raise HubError(f"{field} {repo_id} needs a Hub token with write access: {WHERE_TOKENS_COME_FROM}")
    return ref


def plan_upload(folder: str | Path) -> dict[str, bytes | Path]:
    """Path in the repo -> the bytes or local file that goes there (see the module's docstring)."""
    folder = Path(folder)
    plan: dict[str, bytes | Path] = {}
    for path in sorted(folder.iterdir()):
        name = path.name
        if not path.is_file() or name.startswith("."):
            continue
        if not any(fnmatch.fnmatch(name, p) for p in UPLOADED) or any(
            fnmatch.fnmatch(name, p) for p in NEVER_UPLOADED
        ):
            continue
        plan[name] = _with_hub_base(path) if name in BASE_RECORDS else path
    return plan


def _with_hub_base(path: Path) -> bytes | Path:
    """A base record naming a Hub-cache snapshot, rewritten to name the Hub id (else the file as it is)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return path
    changed = False
    for key in ("base_model_name_or_path", "name_or_path"):
        value = record.get(key) if isinstance(record, dict) else None
        hub = hub_ref_of_snapshot(value) if isinstance(value, str) and value.startswith("/") else None
        if hub is not None:
            record[key] = hub[1].repo_id
            if key == "base_model_name_or_path":
                record["revision"] = hub[1].revision
            changed = True
    return (json.dumps(record, indent=2) + "\n").encode() if changed else path


def rerun_command(
    folder: str | Path, repo_id: str, *, private: bool = False, branch: str | None = None
) -> str:
    """The command that pushes `folder` again."""
    flags = (" --private" if private else "") + (f" --branch {branch}" if branch else "")
    return f"python -m workbench push {folder} {repo_id}{flags}"


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    branch: str | None = None,
    commit_message: str | None = None,
) -> PushResult:
    """Upload `folder`'s `plan_upload` to `repo_id` (on `branch`, made when missing) in one commit."""
    from huggingface_hub import CommitOperationAdd, HfApi

    ref = check_repo_id(repo_id)
    plan = plan_upload(folder)
    if not plan:
        raise HubError(f"{folder} holds no model files to push ({', '.join(UPLOADED)})")
    api = HfApi(token=hub_token())
    try:
        api.create_repo(ref.repo_id, private=True if private else None, exist_ok=True)
        if branch:
            api.create_branch(ref.repo_id, branch=branch, exist_ok=True)
        info = api.create_commit(
            ref.repo_id,
            operations=[CommitOperationAdd(path_in_repo=k, path_or_fileobj=v) for k, v in plan.items()],
            commit_message=commit_message or f"Upload {len(plan)} files from the XLA Workbench",
            revision=branch,
        )
    except Exception as err:
        again = rerun_command(folder, ref.repo_id, private=private, branch=branch)
        raise HubError(
            f"pushing {folder} to {ref.repo_id} failed: {_reason(err, ref.repo_id)}; the local copy in {folder} "
            f"is intact: push it again with: {again}"
        ) from None
    return PushResult(ref.repo_id, branch or "main", str(getattr(info, "commit_url", "")), tuple(plan))


def _reason(err: BaseException, repo_id: str) -> str:
    from huggingface_hub import errors

    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, errors.OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set (unset it)"
    if status in (401, 403):
        return f"the Hub refused the token ({status}: it needs write access to {repo_id.split('/')[0]}; {WHERE_TOKENS_COME_FROM})"
    if isinstance(err, errors.HfHubHTTPError):
        return f"the Hub answered {' '.join(str(err).split())[:200]}"
    text = " ".join(str(err).split())[:200] or type(err).__name__
    return f"{type(err).__name__}: {text}"
