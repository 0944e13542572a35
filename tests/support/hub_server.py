"""A local Hugging Face hub for tests: the HTTP routes huggingface_hub uses to resolve a
revision, list its files and download them, served from memory on 127.0.0.1.

    GET  /api/models/ORG/REPO[/revision/REV]   model info; siblings with sizes, blob ids and
                                               LFS sha256s (files_metadata=True asks ?blobs)
    GET  /api/models/ORG/REPO/tree/REV         the file list snapshot_download walks
    HEAD /ORG/REPO/resolve/REV/FILE            X-Repo-Commit, ETag, Content-Length
    GET  /ORG/REPO/resolve/REV/FILE            the bytes; Range: bytes=A-[B] -> 206

Faults a test can arm: `cut` (send half a file, then drop the connection, once per arming),
`stall` (send half a file, set `stalled`, and hold the connection until `release` is set, so a
test can interrupt the client mid-transfer), `corrupt` (serve the file with one byte flipped
while the metadata keeps the true sha256).
Point huggingface_hub at it with HF_ENDPOINT=server.url; nothing of huggingface_hub is patched.
"""
import hashlib
import http.server
import json
import pathlib
import re
import threading
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors",)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self):
        self.commits: dict[str, dict[str, bytes]] = {}
        self.refs: dict[str, str] = {}

    def push(self, files: dict[str, bytes], branch: str = "main") -> str:
        commit = hashlib.sha1(repr(sorted((n, hashlib.sha256(d).hexdigest())
                                          for n, d in files.items())).encode()).hexdigest()
        self.commits[commit] = dict(files)
        self.refs[branch] = commit
        return commit

    def commit(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


class HubServer:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.cut: set[str] = set()
        self.corrupt: set[str] = set()
        self.stall: set[str] = set()
        self.stalled, self.release = threading.Event(), threading.Event()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, file or route, Range)
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def push_dir(self, repo: str, directory: pathlib.Path, branch: str = "main") -> str:
        files = {p.relative_to(directory).as_posix(): p.read_bytes()
                 for p in sorted(directory.rglob("*")) if p.is_file()}
        return self.repos.setdefault(repo, Repo()).push(files, branch)

    def served_bytes(self, name: str) -> list[str | None]:
        """The Range header of every GET of file `name` (None: the whole file)."""
        return [r for m, f, r in self.requests if m == "GET" and f == name]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()


def _info(repo_id: str, commit: str, files: dict[str, bytes]) -> dict:
    siblings = []
    for name, data in files.items():
        entry = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if name.endswith(LFS_SUFFIXES):
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": 134}
        siblings.append(entry)
    return {"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
            "siblings": siblings, "tags": [], "downloads": 0, "likes": 0}


def _tree(files: dict[str, bytes]) -> list[dict]:
    out = []
    for name, data in files.items():
        entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
        if name.endswith(LFS_SUFFIXES):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": 134}
        out.append(entry)
    return out


def _handler(hub: HubServer):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self._route(body=True)

        def do_HEAD(self):
            self._route(body=False)

        def _route(self, body: bool):
            path = unquote(urlsplit(self.path).path)
            tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)/?", path)
            if tree:
                hub.requests.append((self.command, "tree", None))
                found = self._lookup(*tree.groups())
                if found is not None:
                    self._send(200, json.dumps(_tree(found[1])).encode(),
                               {"Content-Type": "application/json"})
                return
            api = re.fullmatch(r"/api/models/([^/]+/[^/]+?)(?:/revision/(.+))?", path)
            if api:
                hub.requests.append((self.command, "api", None))
                return self._api(api.group(1), api.group(2) or "main")
            resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if not resolve:
                return self._error(404, "EntryNotFound")
            repo_id, revision, name = resolve.groups()
            hub.requests.append((self.command, name, self.headers.get("Range")))
            found = self._lookup(repo_id, revision)
            if found is None:
                return
            commit, files = found
            if name not in files:
                return self._error(404, "EntryNotFound", commit)
            self._file(commit, name, files[name], body)

        def _lookup(self, repo_id, revision):
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound")
            commit = repo.commit(revision)
            if commit is None:
                return self._error(404, "RevisionNotFound")
            return commit, repo.commits[commit]

        def _api(self, repo_id, revision):
            found = self._lookup(repo_id, revision)
            if found is not None:
                self._send(200, json.dumps(_info(repo_id, *found)).encode(),
                           {"Content-Type": "application/json"})

        def _file(self, commit, name, data, body):
            lfs = name.endswith(LFS_SUFFIXES)
            etag = hashlib.sha256(data).hexdigest() if lfs else git_blob_id(data)
            headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if body and name in hub.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 1])
            status, begin = 200, 0
            wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            if wanted:
                begin = int(wanted.group(1))
                end = min(int(wanted.group(2)) + 1 if wanted.group(2) else len(data), len(data))
                headers["Content-Range"] = f"bytes {begin}-{end - 1}/{len(data)}"
                status, data = 206, data[begin:end]
            if not body:
                return self._send(status, b"", headers, length=len(data))
            if name in (hub.cut | hub.stall) and not wanted:
                stall = name in hub.stall
                hub.cut.discard(name)
                hub.stall.discard(name)
                self._send(status, data[:len(data) // 2], headers, length=len(data))
                if stall:
                    hub.stalled.set()
                    hub.release.wait(120)
                self.close_connection = True
                return
            self._send(status, data, headers)

        def _error(self, status, code, commit=None):
            headers = {"X-Error-Code": code, "Content-Type": "application/json"}
            if commit:
                headers["X-Repo-Commit"] = commit
            self._send(status, json.dumps({"error": code}).encode(), headers)

        def _send(self, status, data, headers, length=None):
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data) if length is None else length))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
                self.wfile.flush()

    return Handler
