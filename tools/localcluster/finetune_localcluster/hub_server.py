"""A local stand-in for the Hugging Face Hub's file API, served on 127.0.0.1.

Why: the operator reads a hub model's config.json and safetensors index, and every trainer pod
downloads the model, through the real `huggingface_hub` client. Nothing here reaches the real
hub, so the client is pointed (`endpoint=` / `HF_ENDPOINT`) at this server, which answers the
requests that client makes (read from huggingface_hub 2.x's `file_download`, `_snapshot_download`,
`hf_api` and `utils/_http`) the way the hub does:

- `HEAD|GET /{repo}/resolve/{revision}/{path}`: a small (git) file answers 200 with
  `ETag: "<git blob sha1>"`, `X-Repo-Commit` and `Content-Length`; a large (LFS) file answers
  302 to a signed URL on another origin (the "CDN", a second port), with `X-Linked-Etag:
  "<sha256>"`, `X-Linked-Size` and `X-Repo-Commit`, which the client reads without following
  the redirect; the CDN checks the signature and serves `Range` requests (the client resumes
  interrupted downloads with them);
- `GET /api/models/{repo}[/revision/{revision}]` (`model_info`, `repo_info`): id, sha, gated,
  private and the siblings (with sizes, blob ids and LFS data under `?blobs=true`);
- `GET /api/models/{repo}/tree/{revision}[/{path}]?recursive=...` (`list_repo_tree`, which
  `snapshot_download` lists a commit with);
- revisions are branches, tags or full commit hashes; an unknown one is 404 `RevisionNotFound`;
- errors carry the hub's `X-Error-Code` / `X-Error-Message` headers, which the client turns into
  its typed errors: a missing repo (or a private one without access) is 401 `RepoNotFound`
  without a token and 404 with one; a gated repo is 401 `GatedRepo` without a token and 403
  `GatedRepo` for a user not on its access list; an unknown token is 401 "Invalid credentials in
  Authorization header" (on any repo); a missing file is 404 `EntryNotFound`.

`content_bytes` counts the file bytes sent in GET bodies (hub and CDN), per repo, so a test can
tell a download from a cache hit. `python -m finetune_localcluster.hub_server FOLDER...` serves
folders as repos (`org--name` folder names) for manual use.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".h5", ".msgpack")
"""Files the hub's default .gitattributes keeps in LFS (and any file over LFS_THRESHOLD)."""
LFS_THRESHOLD = 10 * 2**20
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SECRET = b"hub-stand-in"


def git_blob_sha(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def is_lfs(path: str, content: bytes) -> bool:
    return path.endswith(LFS_SUFFIXES) or len(content) > LFS_THRESHOLD


@dataclass
class HubRepo:
    """A model repository: commits (hash → files), refs (branch or tag → commit), who may read it."""

    repo_id: str
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    private: bool = False
    users: set[str] = field(default_factory=set)
    """Users with access to a gated or private repo."""

    def commit(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        return revision if _COMMIT.match(revision) and revision in self.commits else None


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class HubServer:
    """The stand-in; `with HubServer() as hub:` or `start()`/`stop()`. `endpoint` is the hub's URL."""

    def __init__(self, tokens: dict[str, str] | None = None) -> None:
        self.tokens = dict(tokens or {})
        """Token → user name."""
        self.repos: dict[str, HubRepo] = {}
        self.content_bytes: Counter[str] = Counter()
        self.requests: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []

    # -- content ---------------------------------------------------------------------------
    def add_commit(self, repo_id: str, files: dict[str, bytes], ref: str = "main", **access: Any) -> str:
        """Commit `files` (path → bytes) to `repo_id` (created on first use, with `access`:
        gated, private, users) and point `ref` at it; returns the commit hash."""
        with self._lock:
            repo = self.repos.get(repo_id)
            if repo is None:
                repo = self.repos[repo_id] = HubRepo(repo_id, **access)
            digest = hashlib.sha1(repo_id.encode())
            digest.update(repo.refs.get(ref, "").encode())
            for path in sorted(files):
                digest.update(path.encode() + b"\0" + git_blob_sha(files[path]).encode())
            sha = digest.hexdigest()
            repo.commits[sha] = dict(files)
            repo.refs[ref] = sha
            return sha

    def add_folder(self, repo_id: str, folder: Path, ref: str = "main", **access: Any) -> str:
        """Commit every file below `folder` (paths relative to it)."""
        files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.add_commit(repo_id, files, ref, **access)

    def downloaded(self, repo_id: str) -> int:
        with self._lock:
            return self.content_bytes[repo_id]

    # -- serving ---------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def start(self) -> Self:
        for role in ("hub", "cdn"):
            server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, role))
            server.daemon_threads = True
            thread = threading.Thread(target=server.serve_forever, name=f"hub-stand-in-{role}", daemon=True)
            thread.start()
            self._servers.append(server)
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        self._servers, self._threads = [], []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- the hub's rules -------------------------------------------------------------------
    def _user(self, authorization: str | None) -> str | None:
        if not authorization:
            return None
        token = authorization.removeprefix("Bearer ").strip()
        user = self.tokens.get(token)
        if user is None:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        return user

    def _repo(self, repo_id: str, user: str | None, *, files: bool) -> HubRepo:
        """The repo if `user` may see it (`files`: may download its files, which gating guards)."""
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and user not in repo.users):
            raise HubError(404 if user else 401, "RepoNotFound", "Repository not found")
        if files and repo.gated and user not in repo.users:
            if user is None:
                raise HubError(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to "
                    "access it. Please log in.",
                )
            raise HubError(
                403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted and you are not in the authorized list. Visit "
                f"{self.endpoint}/{repo_id} to ask for access.",
            )
        return repo

    @staticmethod
    def _commit(repo: HubRepo, revision: str) -> str:
        sha = repo.commit(revision)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha

    def _entry(self, repo: HubRepo, path: str, content: bytes, blobs: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {"rfilename": path}
        if blobs:
            entry.update(size=len(content), blobId=git_blob_sha(content))
            if is_lfs(path, content):
                sha = hashlib.sha256(content).hexdigest()
                entry["lfs"] = {"sha256": sha, "size": len(content), "pointerSize": 134}
        return entry

    def model_info(self, repo_id: str, revision: str, user: str | None, blobs: bool) -> dict[str, Any]:
        repo = self._repo(repo_id, user, files=False)
        sha = self._commit(repo, revision)
        files = repo.commits[sha]
        return {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/", maxsplit=1)[0],
            "sha": sha,
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": [],
            "lastModified": "2026-01-01T00:00:00.000Z",
            "siblings": [self._entry(repo, p, files[p], blobs) for p in sorted(files)],
        }

    def tree(self, repo_id: str, revision: str, folder: str, recursive: bool, user: str | None) -> list[dict[str, Any]]:
        repo = self._repo(repo_id, user, files=False)
        files = repo.commits[self._commit(repo, revision)]
        prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
        out: list[dict[str, Any]] = []
        folders: set[str] = set()
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix) :].split("/")
            for depth in range(1, len(parts)):
                sub = prefix + "/".join(parts[:depth])
                if sub not in folders and (recursive or depth == 1):
                    folders.add(sub)
                    out.append({"type": "directory", "oid": hashlib.sha1(sub.encode()).hexdigest(), "size": 0,
                                "path": sub})  # fmt: skip
            if len(parts) > 1 and not recursive:
                continue
            content = files[path]
            item: dict[str, Any] = {"type": "file", "oid": git_blob_sha(content), "size": len(content), "path": path}
            if is_lfs(path, content):
                item["lfs"] = {"oid": hashlib.sha256(content).hexdigest(), "size": len(content), "pointerSize": 134}
            out.append(item)
        if prefix and not out:
            raise HubError(404, "EntryNotFound", f"{folder} does not exist on {revision}")
        return out

    def resolve(self, repo_id: str, revision: str, path: str, user: str | None) -> tuple[str, bytes]:
        repo = self._repo(repo_id, user, files=True)
        sha = self._commit(repo, revision)
        content = repo.commits[sha].get(path)
        if content is None:
            raise HubError(404, "EntryNotFound", "Entry not found", commit=sha)
        return sha, content

    def signed(self, repo_id: str, content: bytes) -> str:
        sha = hashlib.sha256(content).hexdigest()
        expires = str(int(time.time()) + 3600)
        signature = hmac.new(_SECRET, f"{repo_id}|{sha}|{expires}".encode(), "sha256").hexdigest()
        return f"{self.cdn}/blobs/{sha}?repo={quote(repo_id, safe='')}&expires={expires}&sig={signature}"

    def blob(self, sha: str, query: dict[str, list[str]]) -> tuple[str, bytes]:
        repo_id, expires, sig = (query.get(k, [""])[0] for k in ("repo", "expires", "sig"))
        wanted = hmac.new(_SECRET, f"{repo_id}|{sha}|{expires}".encode(), "sha256").hexdigest()
        if not hmac.compare_digest(wanted, sig) or not expires.isdigit() or int(expires) < time.time():
            raise HubError(403, None, "Request has expired or is not signed")
        repo = self.repos.get(repo_id)
        for files in repo.commits.values() if repo else ():
            for content in files.values():
                if hashlib.sha256(content).hexdigest() == sha:
                    return repo_id, content
        raise HubError(404, None, "NoSuchKey")

    def count(self, repo_id: str, sent: int, method: str, path: str, status: int) -> None:
        with self._lock:
            self.content_bytes[repo_id] += sent
            self.requests.append((method, path, status))


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(/(?P<path>.*))?$")
_BLOB = re.compile(r"^/blobs/(?P<sha>[0-9a-f]{64})$")


def _handler(hub: HubServer, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: tests read `hub.requests`

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        def _serve(self, head: bool) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            try:
                if role == "cdn":
                    match = _BLOB.match(url.path)
                    if match is None:
                        raise HubError(404, None, "NoSuchKey")
                    repo_id, content = hub.blob(match["sha"], query)
                    self._content(repo_id, content, head, {"ETag": f'"{match["sha"]}"'})
                    return
                user = hub._user(self.headers.get("Authorization"))
                if (match := _RESOLVE.match(url.path)) is not None:
                    self._resolve(unquote(match["repo"]), unquote(match["rev"]), unquote(match["path"]), user, head)
                elif (match := _TREE.match(url.path)) is not None:
                    recursive = query.get("recursive", ["False"])[0].lower() == "true"
                    body = hub.tree(unquote(match["repo"]), unquote(match["rev"]), unquote(match["path"] or ""),
                                    recursive, user)  # fmt: skip
                    self._json(body, head)
                elif (match := _INFO.match(url.path)) is not None:
                    blobs = query.get("blobs", ["False"])[0].lower() == "true"
                    self._json(hub.model_info(unquote(match["repo"]), unquote(match["rev"] or "main"), user, blobs),
                               head)  # fmt: skip
                else:
                    raise HubError(404, None, "Not Found")
            except HubError as exc:
                self._error(exc, head)

        def _resolve(self, repo_id: str, revision: str, path: str, user: str | None, head: bool) -> None:
            commit, content = hub.resolve(repo_id, revision, path, user)
            headers = {"X-Repo-Commit": commit}
            if is_lfs(path, content):
                sha = hashlib.sha256(content).hexdigest()
                headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(content)), "ETag": f'"{sha}"',
                                "Location": hub.signed(repo_id, content)})  # fmt: skip
                self._send(302, b"", head, headers)
                hub.count(repo_id, 0, self.command, self.path, 302)
                return
            headers["ETag"] = f'"{git_blob_sha(content)}"'
            self._content(repo_id, content, head, headers)

        def _content(self, repo_id: str, content: bytes, head: bool, headers: dict[str, str]) -> None:
            status, body = 200, content
            ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if ranged is not None:
                start = int(ranged[1])
                end = int(ranged[2]) if ranged[2] else len(content) - 1
                if start >= len(content):
                    self._send(416, b"", head, {"Content-Range": f"bytes */{len(content)}"})
                    return
                status, body = 206, content[start : end + 1]
                headers = {**headers, "Content-Range": f"bytes {start}-{start + len(body) - 1}/{len(content)}"}
            self._send(status, body, head, {**headers, "Accept-Ranges": "bytes"})
            hub.count(repo_id, 0 if head else len(body), self.command, self.path, status)

        def _json(self, body: Any, head: bool) -> None:
            self._send(200, json.dumps(body).encode(), head, {"Content-Type": "application/json"})
            hub.count("", 0, self.command, self.path, 200)

        def _error(self, exc: HubError, head: bool) -> None:
            headers = {"X-Error-Message": exc.message, "Content-Type": "application/json"}
            if exc.code:
                headers["X-Error-Code"] = exc.code
            if exc.commit:
                headers["X-Repo-Commit"] = exc.commit
            self._send(exc.status, json.dumps({"error": exc.message}).encode(), head, headers)
            hub.count("", 0, self.command, self.path, exc.status)

        def _send(self, status: int, body: bytes, head: bool, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

    return Handler


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="serve folders as hub model repos on 127.0.0.1")
    parser.add_argument("folders", nargs="+", type=Path, help="folders named org--name")
    args = parser.parse_args(argv)
    with HubServer() as hub:
        for folder in args.folders:
            hub.add_folder(folder.name.replace("--", "/", 1), folder)
        print(f"HF_ENDPOINT={hub.endpoint}", flush=True)
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
