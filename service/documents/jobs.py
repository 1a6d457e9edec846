"""Document jobs: each upload translated in the background through the same Translator (and
so the same continuous batching) as everyone's texts, and kept until downloaded.

Jobs (``DocumentJobs``) run in the process that accepted them, at most MAX_DOCUMENTS
accepted at once, each kept DOCUMENT_TTL_S after it finished, and deleted once downloaded.
At most DOCUMENT_WORKERS are translated at once, their files read and written in worker
processes (``service.documents.parsers``), and as many uploads checked (``checking``); the
others wait their turn, "queued", holding only their bytes (docs/documents.md, "Memory").
Each has a ``document_key``, a secret its uploader must show to see its status or download
it (DeepL's scheme), and an owner, the API key that uploaded it (everyone's, "", when the
service asks for no keys): another key showing the right ``document_key`` is told there is
no such document. A job uploaded through LibreTranslate's ``/translate_file`` is ``linked``:
its download URL, which LibreTranslate's clients fetch without a key, holds its
``document_key`` and works once (``DocumentJobs.linked``); no other job can be fetched that
way.

With a shared state store (STATE_URL) each job's record (its key's and its owner's digests,
status, file name) is written there before its id is answered and again when it ends, with the
translated file, both expiring after DOCUMENT_TTL_S: a client that polls another replica reads
its status and downloads its file there. While a job runs, its replica renews a lease beside
the record every third of DOCUMENT_LEASE_S; a running job whose lease has lapsed (its replica
died) reads as failed on every other replica, rather than running until its record expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from service.documents.formats import FORMATS
from service.documents.parsers import Parsers, read_texts, rewritten
from service.shared_state import PREFIX, StateStore, StoreDown, digest, stored_owner
from service.translator import Pair, TextResult

if TYPE_CHECKING:
    import redis.asyncio

QUEUED, TRANSLATING, DONE, ERROR = "queued", "translating", "done", "error"


@dataclass(frozen=True)
class TextLayout:
    """What a text file holds besides its text: a byte-order mark and Windows line ends,
    taken off before it is read (its readers expect neither) and put back when written."""

    bom: bool
    crlf: bool

    @classmethod
    def of(cls, text: str) -> TextLayout:
        body = text.removeprefix("\ufeff")
        return cls(body != text, "\r\n" in body and "\n" not in body.replace("\r\n", ""))

    def plain(self, text: str) -> str:
        text = text.removeprefix("\ufeff")
        return text.replace("\r\n", "\n") if self.crlf else text

    def restored(self, text: str) -> bytes:
        text = text.replace("\n", "\r\n") if self.crlf else text
        return (("\ufeff" if self.bom else "") + text).encode("utf-8")


@dataclass
class DocumentJob:
    document_id: str
    document_key: str
    owner: str
    filename: str
    kind: str
    media_type: str
    pair: Pair
    characters: int
    status: str = QUEUED
    result: bytes | None = None
    error: str | None = None
    created: float = field(default_factory=time.monotonic)
    finished: float | None = None
    task: asyncio.Task[None] | None = None
    linked: bool = False  # downloadable by its URL alone (LibreTranslate's translatedFileUrl)
    local: bool = True  # run by this process (else read from the shared store)
    published: bool = False  # its record written to the shared store
    held: int = 0  # bytes this process holds for it: its upload, then its translated file

    def seconds_remaining(self) -> int | None:
        return 0 if self.status == DONE else None


Translate = Callable[[list[str]], Awaitable[list[TextResult]]]


class DocumentJobs:
    """The documents being translated or waiting for their download."""

    def __init__(self, max_jobs: int, ttl_s: float, parsers: Parsers,
                 store: StateStore | None = None, lease_s: float = 30.0,
                 max_bytes: int | None = None) -> None:
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.parsers = parsers
        self.store = store
        self.lease_s = lease_s
        self.workers = parsers.workers
        self._jobs: dict[str, DocumentJob] = {}
        self._publishing: set[asyncio.Task[None]] = set()
        # Made on first use, on the loop that uses them.
        self._running: asyncio.Semaphore | None = None
        self._checking: asyncio.Semaphore | None = None

    @contextlib.asynccontextmanager
    async def checking(self) -> AsyncIterator[None]:
        """A turn to check an upload (unpack, count, parse it for its words): at most
        ``workers`` at once, as many as there are worker processes; each check waits for its
        worker in a thread of the event loop's default pool, and uploads arriving together
        would otherwise hold the threads that texts need."""
        if self._checking is None:
            self._checking = asyncio.Semaphore(self.workers)
        async with self._checking:
            yield

    def expire(self) -> None:
        now = time.monotonic()
        for job in list(self._jobs.values()):
            if job.finished is not None and now - job.finished > self.ttl_s:
                del self._jobs[job.document_id]

    def full(self) -> bool:
        self.expire()
        return len(self._jobs) >= self.max_jobs

    def held(self) -> int:
        """The bytes the jobs of this process hold: uploads waiting or being translated,
        translated files waiting for their download."""
        self.expire()
        return sum(job.held for job in self._jobs.values())

    def room_for(self, size: int) -> bool:
        """Whether an upload of ``size`` bytes may be accepted within ``max_bytes``."""
        return self.max_bytes is None or self.held() + size <= self.max_bytes

    async def start(self, owner: str, filename: str, kind: str, media_type: str, pair: Pair,
                    text: str | bytes, translate: Translate | None, characters: int,
                    linked: bool = False) -> DocumentJob:
        """A job of ``owner``'s for ``text`` (the file's bytes for a binary format),
        translated by ``translate`` (plain texts in, results out) in the background, or, when
        None (a file already in the target language), given back as it came; with a shared
        store, its record is there before this returns (or, while the store is down, as soon
        as it answers again). ``linked``: downloadable by its URL alone (``linked``)."""
        job = DocumentJob(str(uuid.uuid4()).replace("-", "").upper(),
                          secrets.token_hex(32).upper(), owner, filename, kind, media_type,
                          pair, characters, linked=linked, held=len(text))
        self._jobs[job.document_id] = job
        if self.store is not None:
            try:
                await self._publish(job)
            except StoreDown:
                self._publish_later(job)
            self._keep_leased(job)
        job.task = asyncio.get_running_loop().create_task(self._run(job, text, translate))
        return job

    async def _run(self, job: DocumentJob, text: str | bytes,
                   translate: Translate | None) -> None:
        if self._running is None:
            self._running = asyncio.Semaphore(self.workers)
        try:
            async with self._running:  # its texts and translations are held from here on
                await self._translate(job, text, translate)
        except asyncio.CancelledError:
            job.status, job.error = ERROR, "The service stopped before the translation ended."
            raise
        finally:
            job.finished = time.monotonic()
            job.held = len(job.result or b"")
            if self.store is not None:
                self._publish_later(job, at_once=True)

    async def _translate(self, job: DocumentJob, text: str | bytes,
                         translate: Translate | None) -> None:
        job.status = TRANSLATING
        if translate is None:
            job.result, job.status = (text if isinstance(text, bytes) else text.encode()), DONE
            return
        try:
            document_format = FORMATS[job.kind]
            if isinstance(text, bytes) and not document_format.binary:
                text = text.decode("utf-8")
            layout = TextLayout.of(text) if isinstance(text, str) else None
            if layout is not None:
                text = layout.plain(text)
            # In a worker process (``parsers``): the file read for its texts (a markup
            # format's cut into segments), and read again to write their translations in; its
            # tree and markup never live in this process.
            texts = await self.parsers.run_async(read_texts, job.kind, text)
            results = await translate(texts) if texts else []
            translated = await self.parsers.run_async(
                rewritten, job.kind, text, [result.text for result in results])
            # Office files and EPUB are written as bytes, the text formats as text.
            job.result = (translated if isinstance(translated, bytes)
                          else layout.restored(translated) if layout is not None
                          else translated.encode("utf-8"))
            job.status = DONE
        except Exception as exc:  # any failure is the job's answer, not the process's
            job.status, job.error = ERROR, f"Translation failed: {exc}"

    @staticmethod
    def _name(document_id: str) -> str:
        return f"{PREFIX}document:{document_id}"

    async def _publish(self, job: DocumentJob) -> None:
        """The job's record (and, once done, its file) in the shared store."""
        assert self.store is not None
        record = json.dumps({
            "key": digest(job.document_key), "owner": stored_owner(job.owner),
            "filename": job.filename, "kind": job.kind, "media_type": job.media_type,
            "pair": list(job.pair), "characters": job.characters, "status": job.status,
            "error": job.error, "linked": job.linked})
        # Running: kept as long as a job may run and then be fetched; ended: DOCUMENT_TTL_S.
        ttl = max(1, round(self.ttl_s if job.finished is not None else self.ttl_s + 3600))
        name, result, running = self._name(job.document_id), job.result, job.finished is None

        async def write(r: redis.asyncio.Redis) -> None:
            async with r.pipeline(transaction=True) as pipe:
                pipe.set(name, record, ex=ttl)
                if running:
                    pipe.set(name + ":lease", 1, px=round(self.lease_s * 1000))
                if result is not None:
                    pipe.set(name + ":result", result, ex=ttl)
                await pipe.execute()

        await self.store.run(write)
        job.published = True

    def _keep_leased(self, job: DocumentJob) -> None:
        """The running job's lease renewed every third of ``lease_s`` until it ends; a
        renewal the store misses is tried again a second later."""
        assert self.store is not None
        store, lease = self.store, self._name(job.document_id) + ":lease"

        async def renew() -> None:
            wait = self.lease_s / 3
            while True:
                await asyncio.sleep(wait)
                if job.finished is not None or job.document_id not in self._jobs:
                    return
                try:
                    await store.run(lambda r: r.set(lease, 1, px=round(self.lease_s * 1000)))
                    wait = self.lease_s / 3
                except StoreDown:
                    wait = min(1.0, self.lease_s / 3)

        self._in_background(renew())

    def _in_background(self, work: Coroutine[None, None, None]) -> None:
        """``work`` as a task held until it ends (the loop keeps only weak references)."""
        task = asyncio.get_running_loop().create_task(work)
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    def _publish_later(self, job: DocumentJob, at_once: bool = False) -> None:
        """``_publish`` in the background (now, when ``at_once``), retried each second
        while the store is down, for as long as the job is kept."""

        async def publish() -> None:
            if not at_once:
                await asyncio.sleep(1)
            while job.document_id in self._jobs:
                try:
                    await self._publish(job)
                    return
                except StoreDown:
                    await asyncio.sleep(1)

        self._in_background(publish())

    async def get(self, document_id: str, document_key: str, owner: str) -> DocumentJob | None:
        """The job, when ``document_key`` is its key and ``owner`` its owner: None for any
        other key, as for a job that does not exist, so that a key learns nothing of another
        key's documents. StoreDown when only the store could say."""
        job = await self._find(document_id, document_key)
        if job is None or not hmac.compare_digest(job.owner.encode(),
                                                  _owner_form(job, owner).encode()):
            return None
        return job

    async def linked(self, document_id: str, document_key: str) -> DocumentJob | None:
        """The job, when ``document_key`` is its key and it was uploaded to be fetched by its
        URL alone (``start``'s ``linked``), whoever asks: the URL is the secret."""
        job = await self._find(document_id, document_key)
        return job if job is not None and job.linked else None

    async def _find(self, document_id: str, document_key: str) -> DocumentJob | None:
        """The job, when ``document_key`` is its key: this process's, else (with a shared
        store) another replica's, from its record."""
        self.expire()
        job = self._jobs.get(document_id)
        if job is not None and job.published and job.finished is not None:
            job = await self._not_taken(job)
        if job is None and self.store is not None:
            job = await self._remote(document_id)
        if job is None or not hmac.compare_digest(job.document_key.encode(),
                                                  _key_form(job, document_key).encode()):
            return None
        return job

    async def _not_taken(self, job: DocumentJob) -> DocumentJob | None:
        """This process's finished job, unless another replica's download took it (its
        record is gone from the store); while the store is down, as it is here."""
        assert self.store is not None
        try:
            if await self.store.run(lambda r: r.exists(self._name(job.document_id))):
                return job
        except StoreDown:
            return job
        self._jobs.pop(job.document_id, None)
        return None

    async def _remote(self, document_id: str) -> DocumentJob | None:
        assert self.store is not None
        if not document_id.isalnum():
            return None
        name = self._name(document_id)
        value, leased = await self.store.run(lambda r: r.mget([name, name + ":lease"]))
        if value is None:
            return None
        record = json.loads(value)
        status, error = record["status"], record["error"]
        if status in (QUEUED, TRANSLATING) and leased is None:
            status, error = ERROR, ("The service translating the document stopped before it "
                                    "ended: upload it again.")
        # document_key and owner hold digests: get() compares the digests of those shown. A
        # record without "linked" (written before jobs were marked) is not: a download URL
        # handed out by an older replica then fails on this one (404) during an upgrade.
        return DocumentJob(document_id, record["key"], record["owner"], record["filename"],
                           record["kind"], record["media_type"], tuple(record["pair"]),
                           record["characters"], status=status, error=error, local=False,
                           linked=record.get("linked", False))

    async def take(self, job: DocumentJob) -> bytes | None:
        """A finished job's translated file, the job deleted with its download (here and in
        the shared store); None when another download took it first."""
        self._jobs.pop(job.document_id, None)
        name = self._name(job.document_id)
        if job.local:
            assert job.result is not None
            if self.store is not None:
                with contextlib.suppress(StoreDown):
                    await self.store.run(lambda r: r.delete(name, name + ":result"))
            return job.result
        assert self.store is not None

        async def take(r: redis.asyncio.Redis) -> list:
            async with r.pipeline(transaction=True) as pipe:
                pipe.get(name + ":result")
                pipe.delete(name, name + ":result")
                return await pipe.execute()

        return (await self.store.run(take))[0]

    async def close(self) -> None:
        tasks = [job.task for job in self._jobs.values() if job.task and not job.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in list(self._publishing):  # the records of jobs just ended, once more
            task.cancel()
        if self.store is not None:
            for job in [job for job in self._jobs.values() if job.finished is not None]:
                with contextlib.suppress(StoreDown):
                    await self._publish(job)


def _key_form(job: DocumentJob, document_key: str) -> str:
    """The key shown, in the form the job holds it: as given for this process's jobs, its
    digest for another replica's."""
    return document_key if job.local else digest(document_key)


def _owner_form(job: DocumentJob, owner: str) -> str:
    """The owner shown (an API key, or "" without keys), in the form the job holds it: as
    given for this process's jobs, as the store keeps it for another replica's."""
    return owner if job.local else stored_owner(owner)
