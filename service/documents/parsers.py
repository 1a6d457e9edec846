"""Files parsed in worker processes: an upload's check (its zip inflated and counted, its
words read) and a job's reading and writing run in a pool of DOCUMENT_WORKERS processes, each
with its address space capped at DOCUMENT_WORKER_MB.

Why processes and not threads: a parse is Python and C holding the GIL (python-docx, lxml,
polib, markdown-it); in a thread of the server it takes the GIL from the event loop for as
long as it runs (the worst file the limits let through takes 7 s to read), and its tree lives
in the server's heap until the job ends. In a worker the event loop never waits for it, its
memory has a hard cap (a file that needs more is refused, 413, and the worker replaced), and a
parser that crashes takes only its worker down. The tree never reaches the server: a job's
texts come back from one call (``read_texts``), and its translated file from another that
reads the file again and writes the translations in (``rewritten``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from service import markup
from service.documents.archives import check_zip
from service.documents.errors import DocumentError
from service.documents.formats import FORMATS
from service.documents.uploads import document_text

T = TypeVar("T")


def _cap_memory(megabytes: int) -> None:
    """Its address space capped, so that an allocation past it fails (MemoryError) rather
    than the machine's memory running out."""
    limit = megabytes * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _start_worker(megabytes: int) -> None:
    """A worker's initializer: its memory capped, and a thread that ends it once the server
    is gone. A worker waits on a queue whose writing end it holds itself, so a server killed
    outright (SIGKILL, a crash) would otherwise leave it waiting for ever."""
    _cap_memory(megabytes)
    server = os.getppid()

    def watch() -> None:
        while os.getppid() == server:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch, name="server-watch", daemon=True).start()


def upload_words(kind: str, data: bytes, max_chars: int, what: str) -> str:
    """A zipped upload's words, for the limits and detection: its entries inflated and their
    text and elements counted first (``check_zip``), then read. A text upload's text,
    decoded, within the limit and read once so that a file its reader refuses is refused now
    rather than as a failed job."""
    entry = FORMATS[kind]
    if entry.words is not None:
        check_zip(data, what, max_chars)
        words = entry.words(data)
        if len(words) > max_chars:
            raise DocumentError(f"The document has {len(words)} characters; at most "
                                f"{max_chars} (MAX_DOCUMENT_CHARS).", status=413)
        return words
    text = document_text(data, max_chars)
    entry.read(text)
    return text


def _markup(kind: str, texts: list[str]) -> list[markup.Document] | None:
    """A markup format's texts cut into their markup and segments (``service.markup``), as
    the format's registry entry says (its inline elements, its attributes a reader sees);
    None for a format whose texts are plain."""
    entry = FORMATS[kind]
    if not entry.markup:
        return None
    return [markup.parse(text, attributes=entry.attributes, inline=entry.inline_tags)
            for text in texts]


def read_texts(kind: str, source: str | bytes) -> list[str]:
    """What a job sends to the Translator, as plain text: the format's reader's texts, or, for
    a markup format, their segments (``service.markup.segments_of``). The markup is cut here,
    in the worker, since a page or book of the largest size allowed takes seconds of Python
    holding the GIL to parse and render (docs/documents.md, "Memory")."""
    texts = FORMATS[kind].read(source)[1]
    documents = _markup(kind, texts)
    return texts if documents is None else markup.segments_of(documents)


def rewritten(kind: str, source: str | bytes, translations: list[str]) -> str | bytes:
    """The file read again and written with ``translations`` (of ``read_texts``'s texts) in
    place of its texts."""
    entry = FORMATS[kind]
    document, texts = entry.read(source)
    documents = _markup(kind, texts)
    if documents is not None:
        translations = markup.render_all(documents, translations)
    return entry.write(document, translations)


def _in_worker(work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` as a worker runs it: a MemoryError (the cap reached) is the file's
    fault, reported as such."""
    try:
        return work(*args)
    except MemoryError:
        raise DocumentError("The file needs more memory to read than a document may use "
                            "(DOCUMENT_WORKER_MB).", status=413) from None


class Parsers:
    """The pool of worker processes, started on first use and replaced when one dies."""

    def __init__(self, workers: int, memory_mb: int) -> None:
        self.workers = workers
        self.memory_mb = memory_mb
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # Spawned, not forked: the server's threads (the scheduler's, onnxruntime's)
                # and their locks must not be copied into a child.
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_worker, initargs=(self.memory_mb,))
            return self._pool

    def _broken(self, pool: concurrent.futures.ProcessPoolExecutor) -> DocumentError:
        """A worker died (killed past its memory, or a parser crashed): the pool is replaced
        for the next file, and this one refused."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)
        return DocumentError("The file could not be read: its reader stopped (more memory "
                             "than DOCUMENT_WORKER_MB, or a malformed file).", status=413)

    def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in a worker, waited for (from a thread: never the event loop's)."""
        pool = self._executor()
        try:
            return pool.submit(_in_worker, work, *args).result()
        except BrokenProcessPool:
            raise self._broken(pool) from None

    async def run_async(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in a worker, awaited."""
        pool = self._executor()
        try:
            return await asyncio.wrap_future(pool.submit(_in_worker, work, *args))
        except BrokenProcessPool:
            raise self._broken(pool) from None

    def close(self) -> None:
        """The workers stopped: terminated, since a stopping server must not wait out a
        parse, then the pool shut down and waited for, which frees its queues' semaphores
        (left to the interpreter's exit, the resource tracker warns of them as leaked)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)


_shared: dict[tuple[int, int], Parsers] = {}
_shared_lock = threading.Lock()


def parsers(workers: int, memory_mb: int) -> Parsers:
    """The process's pool for these settings (one per setting, shared by the APIs' routes and
    the jobs)."""
    with _shared_lock:
        found = _shared.get((workers, memory_mb))
        if found is None:
            found = _shared[workers, memory_mb] = Parsers(workers, memory_mb)
        return found


def close_all() -> None:
    """Every pool's workers stopped (the server's shutdown)."""
    with _shared_lock:
        pools = list(_shared.values())
    for pool in pools:
        pool.close()
