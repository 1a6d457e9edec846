"""A loopback HTTP server that publishes models as their real publishers do, for
tests/test_catalogue.py: an index in Argos Translate's format with its ``.argosmodel``
packages, and hub-shaped routes from which ``huggingface_hub`` downloads a MarianMT
repository (``HF_ENDPOINT``). Both answer ``Range`` requests, and can cut a download short or
serve it corrupted, as networks and mirrors do.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS = (".safetensors", ".bin", ".spm")  # what the hub keeps in LFS (hashed with SHA-256)


@dataclass
class Mirror:
    """What the server publishes and how it misbehaves; ``requests`` logs (method, path,
    Range header) of every request."""

    index: list[dict] = field(default_factory=list)
    packages: dict[str, bytes] = field(default_factory=dict)  # name -> .argosmodel bytes
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo -> files
    cut_next: set[str] = field(default_factory=set)  # names whose next GET stops halfway
    corrupt: set[str] = field(default_factory=set)  # names served with a byte flipped
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""

    def package_url(self, name: str) -> str:
        return f"{self.url}/packages/{name}"

    def index_url(self) -> str:
        return f"{self.url}/index.json"


def _handler(mirror: Mirror) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: pytest shows failures, not traffic
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None,
                  head: bool = False, cut: bool = False) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            if cut:
                self.send_header("Connection", "close")
            self.end_headers()
            if head:
                return
            if cut:  # half the bytes, then the connection drops
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def _file(self, name: str, body: bytes, headers: dict[str, str], head: bool) -> None:
            if name in mirror.corrupt:
                middle = len(body) // 2
                body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1:]
            cut = not head and name in mirror.cut_next
            mirror.cut_next.discard(name) if cut else None
            ranged = self.headers.get("Range")
            if ranged and ranged.startswith("bytes="):
                start = int(ranged[6:].split("-")[0])
                if start >= len(body):
                    self._send(416, b"", {"Content-Range": f"bytes */{len(body)}"}, head)
                    return
                headers = {**headers, "Content-Range":
                           f"bytes {start}-{len(body) - 1}/{len(body)}"}
                self._send(206, body[start:], headers, head, cut)
                return
            self._send(200, body, {**headers, "Accept-Ranges": "bytes"}, head, cut)

        def _route(self, head: bool) -> None:
            path = urlparse(self.path).path
            mirror.requests.append((self.command, path, self.headers.get("Range")))
            if path == "/index.json":
                self._send(200, json.dumps(mirror.index).encode(), head=head)
            elif path.startswith("/packages/") and path[10:] in mirror.packages:
                self._file(path[10:], mirror.packages[path[10:]], {}, head)
            elif path == "/api/models":  # the hub's search: a substring, and the owner
                query = parse_qs(urlparse(self.path).query)
                search = query.get("search", [""])[0].lower()
                author = query.get("author", [""])[0]
                listed = [{"id": repo, "modelId": repo} for repo in mirror.repos
                          if search in repo.lower() and repo.startswith(f"{author}/"
                                                                         if author else "")]
                self._send(200, json.dumps(listed).encode(), head=head)
            elif path.startswith("/api/models/"):
                self._model_info(path[len("/api/models/"):].split("/revision/")[0], head)
            elif "/resolve/" in path:
                repo, rest = path[1:].split("/resolve/", 1)
                filename = rest.split("/", 1)[1]
                files = mirror.repos.get(repo, {})
                if filename not in files:
                    self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                    return
                body = files[filename]
                self._file(filename, body, {"X-Repo-Commit": COMMIT,
                                            "ETag": f'"{_etag(filename, body)}"'}, head)
            else:
                self._send(404, b"not found", head=head)

        def _model_info(self, repo: str, head: bool) -> None:
            if repo not in mirror.repos:
                self._send(404, b'{"error": "Repository not found"}',
                           {"X-Error-Code": "RepoNotFound"}, head)
                return
            siblings = []
            for name, body in mirror.repos[repo].items():
                sibling = {"rfilename": name, "size": len(body), "blobId": _etag(name, body)}
                if name.endswith(LFS):
                    sibling["lfs"] = {"sha256": _etag(name, body), "size": len(body),
                                      "pointerSize": 134}
                siblings.append(sibling)
            info = {"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings,
                    "private": False, "tags": ["marian"]}
            self._send(200, json.dumps(info).encode(), head=head)

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

    return Handler


def _etag(name: str, body: bytes) -> str:
    """The hub's ETag: the SHA-256 for LFS files, the git blob hash for the others."""
    if name.endswith(LFS):
        return hashlib.sha256(body).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()


class MirrorServer:
    """``mirror`` served on 127.0.0.1 in a thread, while the ``with`` block lasts."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(mirror))
        self.server.daemon_threads = True
        mirror.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Mirror:
        self.thread.start()
        return self.mirror

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def repo_files(directory: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted(directory.iterdir())
            if file.is_file()}
