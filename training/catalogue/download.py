"""HTTP downloads that resume and say how far they are: a file grows in ``<name>.part`` beside
its destination, a cut connection is picked up where it stopped (``Range``), and the file
only takes its name once its size is the one the server announced."""

from __future__ import annotations

import http.client
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from training.catalogue import CatalogueError

CHUNK = 1 << 16
ATTEMPTS = 4  # a connection cut this many times in a row is a failure, not a hiccup
TIMEOUT_S = 30.0


class Offline(CatalogueError):
    """The server cannot be reached at all (no network, name not resolved, refused)."""


def _cause(error: BaseException) -> str:
    reason = getattr(error, "reason", None) or error
    return str(reason).strip() or type(reason).__name__


def read_location(location: str) -> bytes:
    """The bytes of ``location``: an http(s) URL, a file:// URL or a path."""
    if location.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(location, timeout=TIMEOUT_S) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            raise CatalogueError(f"{location}: HTTP {error.code} {error.reason}") from error
        except (urllib.error.URLError, OSError) as error:
            raise Offline(f"offline: cannot reach {location} ({_cause(error)})") from error
    path = Path(location.removeprefix("file://"))
    try:
        return path.read_bytes()
    except OSError as error:
        raise CatalogueError(f"{location}: {error.strerror or error}") from error


class Progress:
    """A bar on a terminal, a line per quarter in a log (which a bar would fill with
    carriage returns)."""

    def __init__(self, label: str, total: int | None, done: int) -> None:
        self.label, self.total, self.done = label, total, done
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit="B", unit_scale=True, desc=label)
        self.reported = -1
        self._report()

    def _report(self) -> None:
        if self.bar is not None or not self.total:
            return
        quarter = 4 * self.done // self.total
        if quarter > self.reported:
            self.reported = quarter
            print(f"{self.label}: {self.done / 1e6:.1f} of {self.total / 1e6:.1f} MB",
                  file=sys.stderr, flush=True)

    def advance(self, size: int) -> None:
        self.done += size
        if self.bar is not None:
            self.bar.update(size)
        self._report()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _total(response, offset: int) -> int | None:
    """The whole file's size, from a 206's Content-Range or a 200's Content-Length."""
    content_range = response.headers.get("Content-Range", "")
    if response.status == 206 and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        return int(total) if total.isdigit() else None
    length = response.headers.get("Content-Length")
    return int(length) + (offset if response.status == 206 else 0) if length else None


def download(url: str, destination: Path, label: str,
             verify: Callable[[Path], None] | None = None) -> Path:
    """``url`` into ``destination`` (kept when already there), resuming from a ``.part`` a
    previous attempt left; ``verify`` checks the complete file before it takes its name (a
    file it refuses is deleted, so the next attempt downloads it again)."""
    if destination.is_file():
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    part = destination.with_name(destination.name + ".part")
    last: BaseException | None = None
    for attempt in range(ATTEMPTS):
        offset = part.stat().st_size if part.is_file() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"}
                                         if offset else {})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                if offset and response.status != 206:  # no ranges here: start again
                    offset = 0
                total = _total(response, offset)
                progress = Progress(label, total, offset)
                try:
                    with part.open("ab" if offset else "wb") as out:
                        while chunk := response.read(CHUNK):
                            out.write(chunk)
                            progress.advance(len(chunk))
                finally:
                    progress.close()
            size = part.stat().st_size
            if total is not None and size != total:
                raise ConnectionError(f"the connection closed after {size} of {total} bytes")
            break
        except urllib.error.HTTPError as error:
            if error.code == 416:  # the part is already whole (or longer): check it below
                break
            raise CatalogueError(f"{label}: {url}: HTTP {error.code} {error.reason}") from error
        except urllib.error.URLError as error:
            if offset == 0 and attempt == 0:
                raise Offline(f"{label}: offline: cannot reach {url} ({_cause(error)})") from error
            last = error
        except (OSError, http.client.HTTPException) as error:  # IncompleteRead: cut short
            last = error
        time.sleep(min(0.2 * 2 ** attempt, 2.0))
    else:
        raise CatalogueError(f"{label}: {url}: download failed after {ATTEMPTS} attempts "
                             f"({_cause(last) if last else 'unknown'}); run it again to "
                             "resume")
    if verify is not None:
        try:
            verify(part)
        except CatalogueError:
            part.unlink(missing_ok=True)
            raise
    part.replace(destination)
    return destination
