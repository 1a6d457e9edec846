"""The translator's web page: ``GET /`` and its files under ``/page/``, and
``GET /page/settings``, the little the page must know before its first request (whether keys
are needed, the limits). The page calls the service's own API (``/languages``, ``/translate``),
as any client does; nothing it loads comes from elsewhere, which its Content-Security-Policy
enforces in the browser.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from service.documents import extensions
from service.state import State

PAGE_DIR = Path(__file__).resolve().parent.parent / "page"
TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
# Everything from this origin only, and nothing inline: an injected script cannot run, and the
# page cannot be framed (clickjacking).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True)
class PageFile:
    body: bytes
    media_type: str
    etag: str


def _load() -> dict[str, PageFile]:
    files = {}
    for path in sorted(PAGE_DIR.iterdir()):
        if path.suffix in TYPES:
            body = path.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            files[path.name] = PageFile(body, TYPES[path.suffix], etag)
    return files


FILES = _load()


class PageSettings(BaseModel):
    key_required: bool = Field(description="Whether /languages and /translate need a key.")
    max_chars: int = Field(description="Most characters in one text (MAX_CHARS).")
    max_beam: int = Field(description="Largest beam_size (MAX_BEAM): alternatives need 2+.")
    documents: list[str] = Field(description="File extensions /translate/document takes.")
    max_document_chars: int = Field(description="Most characters in a document.")


router = APIRouter(include_in_schema=False)


def _serve(request: Request, name: str) -> Response:
    file = FILES.get(name)
    if file is None:
        return Response(status_code=404)
    # Revalidated each visit (no-cache), answered 304 when unchanged: a new version of the
    # service is picked up at once, an unchanged page costs one small round trip.
    headers = {**SECURITY_HEADERS, "ETag": file.etag, "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == file.etag:
        return Response(status_code=304, headers=headers)
    return Response(file.body, media_type=file.media_type, headers=headers)


@router.api_route("/", methods=["GET", "HEAD"])
async def page(request: Request) -> Response:
    return _serve(request, "index.html")


@router.get("/page/settings", response_model=PageSettings)
async def page_settings(state: State) -> PageSettings:
    settings = state.settings
    return PageSettings(key_required=state.keys.required, max_chars=settings.max_chars,
                        max_beam=settings.max_beam, documents=extensions(),
                        max_document_chars=settings.max_document_chars)


@router.api_route("/page/{name}", methods=["GET", "HEAD"])
async def page_file(request: Request, name: str) -> Response:
    return _serve(request, name)
