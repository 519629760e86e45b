"""A stand-in for the Hugging Face Hub's HTTP API on 127.0.0.1, started by the tests (no network).

It answers what ``huggingface_hub`` asks when the workbench reads and pushes:

- reads: a repo's info at a revision (``/api/{models,datasets}/ORG/NAME/revision/REV``) and its file
  tree, for the repos of a hand-built Hub cache (its ``refs/main`` commit and snapshot files), so
  ``snapshot_download`` finds every file already cached and downloads nothing; any other repo is
  404 ``RepoNotFound``; repos listed as gated are 403 ``GatedRepo``;
- pushes: ``/api/validate-yaml`` (a card's header: a mapping whose ``base_model`` is a string and whose
  ``tags`` and ``datasets`` are lists of strings, as the Hub requires), ``/api/repos/create``, ``.../branch/BRANCH``, ``.../preupload/REV`` (every file "regular")
  and ``.../commit/REV`` (the NDJSON payload decoded file by file into `StandIn.pushed`).

Each request's ``Authorization`` header is kept in `StandIn.tokens` (a test checks the token arrived
and was printed nowhere). Use it as a context manager; ``endpoint`` goes in ``HF_ENDPOINT``.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

_REPO = r"(?P<kind>models|datasets)/(?P<repo>[^/]+/[^/]+)"


class StandIn:
    """The stand-in server; `pushed` maps repo id -> branch -> path -> bytes, `created` repo id -> options."""

    def __init__(
        self, cache: Path | None = None, *, gated: tuple[str, ...] = (), fail_commits: int = 0
    ) -> None:
        self.cache, self.gated, self.fail_commits = cache, set(gated), fail_commits
        self.pushed: dict[str, dict[str, dict[str, bytes]]] = {}
        self.created: dict[str, dict[str, Any]] = {}
        self.commit_messages: list[str] = []
        self.tokens: list[str] = []
        self.requests: list[str] = []
        self.validated = 0
        """Cards whose YAML header ``huggingface_hub`` sent for validation (each checked by `_card_problems`)."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StandIn:
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ---- reads from the hand-built cache ----
    def _snapshot(self, kind: str, repo: str, revision: str) -> tuple[str, Path] | None:
        if self.cache is None:
            return None
        root = self.cache / f"{kind}--{repo.replace('/', '--')}"
        ref = root / "refs" / revision
        sha = ref.read_text().strip() if ref.is_file() else revision
        folder = root / "snapshots" / sha
        return (sha, folder) if folder.is_dir() else None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _note(self) -> str:
                path = unquote(urlparse(self.path).path)
                standin.requests.append(f"{self.command} {path}")
                if self.headers.get("Authorization"):
                    standin.tokens.append(self.headers["Authorization"])
                return path

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_GET(self) -> None:
                path = self._note()
                info = re.fullmatch(rf"/api/{_REPO}/revision/(?P<rev>.+)", path)
                tree = re.fullmatch(rf"/api/{_REPO}/tree/(?P<rev>[^/]+)(?:/.*)?", path)
                match = info or tree
                if match is None:
                    return self._send(404, {"error": f"not served: {path}"})
                kind, repo = match["kind"], match["repo"]
                if repo in standin.gated:
                    return self._send(403, {"error": f"{repo} is gated"}, {"X-Error-Code": "GatedRepo"})
                found = standin._snapshot(kind, repo, match["rev"])
                if found is None and standin._snapshot(kind, repo, "main") is not None:
                    return self._send(404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
                if found is None:
                    return self._send(
                        404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
                    )
                sha, folder = found
                files = [p for p in sorted(folder.rglob("*")) if p.is_file()]
                names = [p.relative_to(folder).as_posix() for p in files]
                if info is not None:
                    return self._send(
                        200,
                        {
                            "id": repo,
                            "sha": sha,
                            "siblings": [{"rfilename": n} for n in names],
                            "private": False,
                        },
                    )
                entries = [
                    {"type": "file", "path": n, "size": p.stat().st_size, "oid": "0" * 40}
                    for n, p in zip(names, files)
                ]
                return self._send(200, entries)

            def do_POST(self) -> None:
                path = self._note()
                body = self._body()
                if path == "/api/validate-yaml":
                    problems = _card_problems(json.loads(body)["content"])
                    standin.validated += 1
                    return self._send(400 if problems else 200, {"errors": problems, "warnings": []})
                if path == "/api/repos/create":
                    options = json.loads(body or b"{}")
                    repo = f"{options.get('organization') or 'user'}/{options['name']}"
                    standin.created[repo] = options
                    return self._send(200, {"url": f"{standin.endpoint}/{repo}", "name": repo})
                branch = re.fullmatch(rf"/api/{_REPO}/branch/(?P<branch>.+)", path)
                if branch is not None:
                    standin.pushed.setdefault(branch["repo"], {}).setdefault(branch["branch"], {})
                    return self._send(200, {})
                pre = re.fullmatch(rf"/api/{_REPO}/preupload/(?P<rev>.+)", path)
                if pre is not None:
                    files = json.loads(body)["files"]
                    modes = [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
                    ]
                    return self._send(200, {"files": modes, "commitOid": "0" * 40})
                commit = re.fullmatch(rf"/api/{_REPO}/commit/(?P<rev>.+)", path)
                if commit is not None:
                    if standin.fail_commits:
                        standin.fail_commits -= 1
                        return self._send(500, {"error": "the stand-in failed this commit on purpose"})
                    files = standin.pushed.setdefault(commit["repo"], {}).setdefault(commit["rev"], {})
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "header":
                            standin.commit_messages.append(item["value"].get("summary", ""))
                        elif item["key"] == "file":
                            files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    url = f"{standin.endpoint}/{commit['repo']}/commit/{'c' * 40}"
                    return self._send(200, {"commitUrl": url, "commitOid": "c" * 40, "success": True})
                return self._send(404, {"error": f"not served: {path}"})

        return Handler


def _card_problems(readme: str) -> list[dict[str, str]]:
    """What the Hub would refuse in a card's YAML header (the fields the workbench writes)."""
    import yaml

    match = re.match(r"^---\n(.*?)\n---", readme, re.DOTALL)
    if match is None:
        return [{"message": "no YAML header"}]
    header = yaml.safe_load(match.group(1))
    if not isinstance(header, dict):
        return [{"message": "the header is not a mapping"}]
    problems = []
    if "base_model" in header and not isinstance(header["base_model"], str):
        problems.append({"message": '"base_model" must be a string'})
    for key in ("tags", "datasets"):
        value = header.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append({"message": f'"{key}" must be a list of strings'})
    return problems
