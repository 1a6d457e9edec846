"""The continuous-batching scheduler.

Most tests drive it with ``FakeEngine``, whose sentences take exactly as many decoder steps as
they have source tokens, so orderings are deterministic; the last ones use the real tiny bundle
and check that batching changes no translation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable
from pathlib import Path

import pytest

from service.engine import Engine
from service.metrics import Metrics
from service.scheduler import (
    POISON_FAILURES,
    DeadlineExceeded,
    QueueFull,
    RequestTooLarge,
    Scheduler,
    SchedulerError,
    SchedulerFailed,
    ShuttingDown,
    TranslationFailed,
    WorkerRestarted,
    reserved_tokens,
)
from service.search import DecodeOptions, Hypothesis, Translation
from tests.faults import Faults, FaultyEngine

FIXTURE = Path(__file__).parent / "fixtures" / "overfit.tsv"
EOS = 2


class FakeBundle:
    def __init__(self, directory: Path, source_lang: str = "en", target_lang: str = "de"):
        self.dir = directory
        self.source_lang = source_lang
        self.target_lang = target_lang
        self.manifest = {"source_lang": source_lang, "target_lang": target_lang}
        self.pairs = [(source_lang, target_lang)]
        self.terms: dict[str, str] = {}  # a bundle's place names (service.bundle)


class FakeEngine:
    """Engine stand-in: a sentence of n source tokens needs n decoder steps (capped by its
    max_length); its "translation" is its words upper-cased. Records what the scheduler does."""

    def __init__(
        self,
        directory: Path = Path("fake"),
        step_s: float = 0.002,
        max_source_tokens: int = 64,
        source_lang: str = "en",
        target_lang: str = "de",
    ) -> None:
        self.bundle = FakeBundle(directory, source_lang, target_lang)
        self.variant = "fp32"
        self.step_s = step_s
        self.max_source_tokens = max_source_tokens
        self.vocab: dict[str, int] = {}
        self.words: dict[int, str] = {}
        self.max_rows_seen = 0
        self.max_sentences_seen = 0
        self.removed: list[Hashable] = []
        self.steps = 0

    def tokenize(self, sentence: str, target_lang: str | None = None) -> list[int]:
        ids = []
        for word in sentence.split():
            if word not in self.vocab:
                self.vocab[word] = len(self.vocab) + 10
                self.words[self.vocab[word]] = word
            ids.append(self.vocab[word])
        return [*ids, EOS]

    def new_batch(self) -> FakeBatch:
        return FakeBatch(self)

    def options(self, **overrides) -> DecodeOptions:
        return DecodeOptions(**overrides)


class FakeBatch:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.rows: dict[Hashable, tuple[list[int], DecodeOptions, int]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def num_rows(self) -> int:
        return sum(options.beam_size for _, options, _ in self.rows.values())

    def add(self, key: Hashable, source_ids: list[int], options: DecodeOptions) -> None:
        assert source_ids[-1] == EOS
        if len(source_ids) > self.engine.max_source_tokens:
            raise ValueError("source too long")
        self.rows[key] = (source_ids, options, min(len(source_ids), options.max_length))

    def remove(self, key: Hashable) -> None:
        del self.rows[key]
        self.engine.removed.append(key)

    def clear(self) -> None:
        self.rows.clear()

    def step(self) -> list[tuple[Hashable, Translation]]:
        engine = self.engine
        engine.steps += 1
        engine.max_rows_seen = max(engine.max_rows_seen, self.num_rows)
        engine.max_sentences_seen = max(engine.max_sentences_seen, len(self.rows))
        time.sleep(engine.step_s)
        done = []
        for key, (source, options, left) in list(self.rows.items()):
            if left > 1:
                self.rows[key] = (source, options, left - 1)
                continue
            del self.rows[key]
            words = [engine.words[i].upper() for i in source[:-1]]
            length = len(source)  # the words and EOS
            # -0.1 * rank a token, ranked as a length penalty of 1.6 would rank them
            hypotheses = [
                Hypothesis(
                    " ".join(words) + "!" * rank,
                    source[:-1],
                    words,
                    score=-0.1 * (rank + 1) * length / length**1.6,
                    log_prob=-0.1 * (rank + 1) * length,
                    length=length,
                )
                for rank in range(options.num_hypotheses)
            ]
            done.append((key, Translation(hypotheses)))
        return done


def with_replicas(engine: FakeEngine, count: int) -> FakeEngine:
    """``engine`` with ``count`` replicas (itself first) that share its vocabulary, like
    ``Engine(workers=count)``: the scheduler then runs one worker per replica."""
    engine.replicas = [engine]  # type: ignore[attr-defined]
    for _ in range(count - 1):
        twin = FakeEngine(step_s=engine.step_s, max_source_tokens=engine.max_source_tokens)
        twin.vocab, twin.words = engine.vocab, engine.words
        engine.replicas.append(twin)  # type: ignore[attr-defined]
    return engine


def make_scheduler(engine: FakeEngine | Engine, **kwargs) -> Scheduler:
    scheduler = Scheduler({"en-de": engine}, metrics=Metrics(), **kwargs)
    scheduler.start()
    return scheduler


def words(n: int, stem: str = "w") -> str:
    return " ".join(f"{stem}{i}" for i in range(n))


def test_reserved_tokens_is_the_worst_case() -> None:
    assert reserved_tokens(10, DecodeOptions()) == 10 + 30
    assert reserved_tokens(10, DecodeOptions(max_length=5)) == 15
    assert reserved_tokens(10, DecodeOptions(beam_size=4, num_hypotheses=2)) == 4 * 40


def test_translates_and_returns_in_order() -> None:
    engine = FakeEngine()
    scheduler = make_scheduler(engine)

    async def main() -> list[Translation]:
        sources = [engine.tokenize(s) for s in ["a b c", "d", "e f"]]
        return await scheduler.translate("en-de", sources, DecodeOptions())

    results = asyncio.run(main())
    assert [t.text for t in results] == ["A B C", "D", "E F"]
    scheduler.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_short_request_overtakes_a_running_long_one(workers: int) -> None:
    engine = with_replicas(FakeEngine(step_s=0.003), workers)
    scheduler = make_scheduler(engine)
    finished: list[str] = []

    async def job(name: str, text: str, delay: float) -> None:
        await asyncio.sleep(delay)
        await scheduler.translate("en-de", [engine.tokenize(text)], DecodeOptions())
        finished.append(name)

    async def main() -> None:
        # 60 steps (~0.2 s) for the long one; the short one joins while it runs.
        await asyncio.gather(job("long", words(59), 0), job("short", "hi", 0.03))

    asyncio.run(main())
    assert finished == ["short", "long"]
    seen = [replica.max_sentences_seen for replica in engine.replicas]
    # One worker: they shared the batch. Two: the busy worker left the newcomer to the idle
    # one, and each ran alone.
    assert seen == ([2] if workers == 1 else [1, 1])
    scheduler.stop()


def test_a_lone_client_is_served_by_one_replica() -> None:
    """Idle workers leave a newcomer to the lowest-numbered idle one: taking turns made each
    request start on a replica whose weights had left the caches."""
    engine = with_replicas(FakeEngine(step_s=0.001), 2)
    scheduler = make_scheduler(engine)

    async def main() -> None:
        for i in range(8):
            sources = [engine.tokenize(words(3, f"q{i}_"))]
            await scheduler.translate("en-de", sources, DecodeOptions())

    asyncio.run(main())
    assert [replica.steps > 0 for replica in engine.replicas] == [True, False]
    scheduler.stop()


def test_workers_share_the_queue_and_answer_every_request() -> None:
    engine = with_replicas(FakeEngine(step_s=0.002), 2)
    scheduler = make_scheduler(engine, max_batch_rows=8)
    assert scheduler.workers == 2
    texts = [words(1 + (7 * i) % 23, stem=f"r{i}x") for i in range(40)]

    async def one(i: int) -> Translation:
        await asyncio.sleep(0.001 * (i % 5))
        return (await scheduler.translate("en-de", [engine.tokenize(texts[i])], DecodeOptions()))[0]

    async def main() -> list[Translation]:
        return await asyncio.gather(*(one(i) for i in range(len(texts))))

    results = asyncio.run(main())
    assert [r.hypotheses[0].text for r in results] == [t.upper() for t in texts]
    # Both replicas decoded, each within its own row budget.
    for replica in engine.replicas:
        assert replica.steps > 0
        assert replica.max_rows_seen <= 8
    assert scheduler.wait_idle(5) and scheduler.in_flight == 0 and scheduler.queue_depth == 0
    scheduler.stop()


def test_a_small_request_does_not_queue_behind_a_large_one() -> None:
    engine = FakeEngine(step_s=0.002)
    scheduler = make_scheduler(engine, max_batch_rows=4)
    finished: list[str] = []

    async def job(name: str, sources: list[list[int]], delay: float) -> None:
        await asyncio.sleep(delay)
        await scheduler.translate("en-de", sources, DecodeOptions())
        finished.append(name)

    async def main() -> None:
        large = [engine.tokenize(words(9, f"l{i}_")) for i in range(40)]  # 10 waves of 4
        await asyncio.gather(job("large", large, 0), job("small", [engine.tokenize("hi")], 0.02))

    asyncio.run(main())
    assert finished == ["small", "large"]
    scheduler.stop()


async def _background(scheduler: Scheduler, sources: list[list[int]]) -> list[Translation]:
    """``sources`` as one background request (a document's), as the Translator sends it."""
    with scheduler.admitted("en-de", len(sources), background=True) as admitted:
        return await admitted.translate(sources, DecodeOptions())


def test_interactive_sentences_go_before_waiting_background_ones() -> None:
    # Two requests of the same size, the document's first: taking turns, it would finish
    # first; behind the interactive one, it finishes last.
    engine = FakeEngine(step_s=0.002)
    scheduler = make_scheduler(engine, max_batch_rows=8)
    finished: list[str] = []

    async def main() -> None:
        async def background() -> None:
            sources = [engine.tokenize(words(6, f"d{i}_")) for i in range(40)]
            assert len(await _background(scheduler, sources)) == 40
            finished.append("background")

        async def interactive() -> None:
            await asyncio.sleep(0.01)  # the document's sentences already wait
            sources = [engine.tokenize(words(6, f"i{i}_")) for i in range(40)]
            assert len(await scheduler.translate("en-de", sources, DecodeOptions())) == 40
            finished.append("interactive")

        await asyncio.gather(background(), interactive())

    asyncio.run(main())
    assert finished == ["interactive", "background"]
    assert scheduler.queue_depth == scheduler.background_depth == 0
    scheduler.stop()


def test_background_work_progresses_under_constant_interactive_load() -> None:
    # Interactive clients keep more sentences waiting than the batch holds, all along; the
    # document's sentences still get their share of the batch and it completes meanwhile.
    engine = FakeEngine(step_s=0.002)
    scheduler = make_scheduler(engine, max_batch_rows=8)
    done = asyncio.Event

    async def main() -> tuple[int, bool]:
        finished = done()
        answered = 0

        async def client(index: int) -> None:
            nonlocal answered
            stop = time.monotonic() + 30
            while not finished.is_set() and time.monotonic() < stop:
                sources = [engine.tokenize(words(6, f"c{index}_{k}_")) for k in range(4)]
                await scheduler.translate("en-de", sources, DecodeOptions())
                answered += 1

        async def document() -> bool:
            await asyncio.sleep(0.05)  # the clients fill the queue first
            sources = [engine.tokenize(words(6, f"d{i}_")) for i in range(24)]
            complete = len(await _background(scheduler, sources)) == 24
            busy = scheduler.queue_depth > 0  # the clients' sentences still waited
            finished.set()
            return complete and busy

        results = await asyncio.gather(document(), *(client(i) for i in range(16)))
        return answered, bool(results[0])

    answered, completed_under_load = asyncio.run(main())
    assert completed_under_load
    assert answered > 0
    scheduler.stop()


def test_background_requests_have_queue_room_of_their_own() -> None:
    engine = FakeEngine()
    scheduler = make_scheduler(engine, max_queue=10)
    document = scheduler.admit("en-de", 10, background=True)
    with pytest.raises(QueueFull):  # the documents' room is full ...
        scheduler.admit("en-de", 1, background=True)
    scheduler.check_room()  # ... and an interactive request still finds its own
    interactive = scheduler.admit("en-de", 10)
    with pytest.raises(QueueFull):
        scheduler.check_room()
    scheduler.release(interactive)
    scheduler.release(document)
    scheduler.admit("en-de", 10, background=True)
    scheduler.stop()


def test_batching_off_runs_one_sentence_at_a_time() -> None:
    engine = FakeEngine()
    scheduler = make_scheduler(engine, batching=False)

    async def main() -> list[list[Translation]]:
        sources = [[engine.tokenize(words(3, f"s{i}_"))] for i in range(6)]
        return await asyncio.gather(
            *(scheduler.translate("en-de", s, DecodeOptions()) for s in sources)
        )

    results = asyncio.run(main())
    assert len(results) == 6
    assert engine.max_sentences_seen == 1
    scheduler.stop()


def test_token_and_row_budgets_bound_the_batch() -> None:
    engine = FakeEngine()
    # Each 4-token sentence reserves 4 + 18 = 22 tokens: three fit in 70.
    scheduler = make_scheduler(engine, max_batch_tokens=70, max_batch_rows=100)

    async def main() -> None:
        sources = [engine.tokenize(words(3, f"t{i}_")) for i in range(12)]
        await scheduler.translate("en-de", sources, DecodeOptions())

    asyncio.run(main())
    assert engine.max_sentences_seen == 3
    scheduler.stop()

    engine = FakeEngine()
    scheduler = make_scheduler(engine, max_batch_rows=8)

    async def beams() -> None:
        sources = [engine.tokenize(words(3, f"b{i}_")) for i in range(5)]
        await scheduler.translate("en-de", sources, DecodeOptions(beam_size=3))

    asyncio.run(beams())
    assert engine.max_rows_seen == 6  # two beam-3 sentences; a third would need 9 rows
    scheduler.stop()


def test_an_oversize_sentence_still_runs_alone() -> None:
    engine = FakeEngine()
    scheduler = make_scheduler(engine, max_batch_tokens=5)

    async def main() -> list[Translation]:
        return await scheduler.translate("en-de", [engine.tokenize(words(10))], DecodeOptions())

    assert asyncio.run(main())[0].text == words(10).upper()
    scheduler.stop()


def test_queue_full_refuses_without_losing_accepted_requests() -> None:
    engine = FakeEngine(step_s=0.002)
    scheduler = make_scheduler(engine, max_queue=4, max_batch_rows=1)
    outcomes: dict[int, object] = {}

    async def one(i: int) -> None:
        try:
            result = await scheduler.translate(
                "en-de", [engine.tokenize(f"x{i} y")], DecodeOptions()
            )
            outcomes[i] = result[0].text
        except QueueFull as exc:
            assert exc.retry_after >= 1
            outcomes[i] = "full"

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(20)))

    asyncio.run(main())
    accepted = {i: text for i, text in outcomes.items() if text != "full"}
    assert len(outcomes) == 20
    assert 4 <= len(accepted) < 20
    assert all(text == f"X{i} Y" for i, text in accepted.items())
    assert scheduler.queue_depth == 0
    scheduler.stop()


def test_a_request_over_the_limit_is_refused_before_it_queues() -> None:
    engine = FakeEngine()
    scheduler = make_scheduler(engine, max_queue=8, max_request_sentences=4)
    assert scheduler.max_request_sentences == 4
    with pytest.raises(RequestTooLarge) as refused:
        scheduler.admit("en-de", 5)
    assert (refused.value.sentences, refused.value.limit) == (5, 4)

    async def main(count: int) -> list[Translation]:
        sources = [engine.tokenize(f"z{i}") for i in range(count)]
        return await scheduler.translate("en-de", sources, DecodeOptions())

    with pytest.raises(RequestTooLarge):  # the estimate fell short: the real count decides
        asyncio.run(main(5))
    assert len(asyncio.run(main(4))) == 4
    assert scheduler.queue_depth == 0
    scheduler.stop()
    # The limit never exceeds the queue: no request is larger than the queue.
    assert Scheduler({"en-de": engine}, max_queue=3).max_request_sentences == 3


def test_admission_holds_queue_room_until_the_sentences_queue() -> None:
    engine = FakeEngine(step_s=0.002)
    scheduler = make_scheduler(engine, max_queue=6)
    first = scheduler.admit("en-de", 4)  # held while its text is being tokenised
    with pytest.raises(QueueFull):
        scheduler.admit("en-de", 3)
    second = scheduler.admit("en-de", 2)
    scheduler.release(second)
    scheduler.release(second)  # twice is harmless
    third = scheduler.admit("en-de", 2)

    async def main() -> tuple[list[Translation], list[Translation]]:
        # Fewer sentences than estimated: the rest of the room is given back.
        sources = [engine.tokenize(f"a{i} b") for i in range(3)]
        one = scheduler.translate("en-de", sources, DecodeOptions(), admission=first)
        two = scheduler.translate(
            "en-de", [engine.tokenize("c d")], DecodeOptions(), admission=third
        )
        return tuple(await asyncio.gather(one, two))  # type: ignore[return-value]

    one, two = asyncio.run(main())
    assert [t.text for t in one] == ["A0 B", "A1 B", "A2 B"] and two[0].text == "C D"
    assert not scheduler.wait_idle(0.05)  # two requests are still open
    scheduler.release(first)
    scheduler.release(third)
    assert scheduler.wait_idle(2)
    scheduler.admit("en-de", 6)  # all the room is free again
    scheduler.stop()


def test_an_accepted_requests_later_passes_are_queued_when_full_and_while_draining() -> None:
    """A request's second pass (a glossary's masked sentences, a wider beam) uses its open
    admission: a full queue or a drain begun in between must not lose the request, and the
    drain waits for it."""
    engine = FakeEngine(step_s=0.002)
    scheduler = make_scheduler(engine, max_queue=2)

    async def main() -> tuple[list[Translation], list[Translation]]:
        admission = scheduler.admit("en-de", 1)
        first = await scheduler.translate("en-de", [engine.tokenize("a b")], DecodeOptions(),
                                          admission=admission)
        scheduler.release_room(admission)
        others = scheduler.admit("en-de", 2)  # another request fills the queue
        with pytest.raises(QueueFull):
            await scheduler.translate("en-de", [engine.tokenize("x")], DecodeOptions())
        draining = asyncio.create_task(scheduler.drain(5))
        await asyncio.sleep(0.05)
        assert not draining.done()  # the open request holds the drain
        again = await scheduler.translate(
            "en-de", [engine.tokenize("c d"), engine.tokenize("e")], DecodeOptions(beam_size=2),
            admission=admission)
        scheduler.release(others)
        scheduler.release(admission)
        assert await draining  # everything accepted finished
        return first, again

    first, again = asyncio.run(main())
    assert first[0].text == "A B" and [t.text for t in again] == ["C D", "E"]


def test_a_request_admitted_in_a_block_holds_its_standing_until_the_block_ends() -> None:
    """``admitted`` is a request's admission for all its passes: its sentences take the room
    the estimate held, a later pass queues even into a full queue, and leaving the block,
    however it is left, lets a drain finish."""
    engine = FakeEngine(step_s=0.002)
    scheduler = make_scheduler(engine, max_queue=3)

    async def main() -> tuple[list[Translation], list[Translation]]:
        with scheduler.admitted("en-de", 3, request_id="req1") as admitted:
            with pytest.raises(QueueFull):  # the estimate holds the whole queue
                scheduler.admit("en-de", 1)
            first = await admitted.translate([engine.tokenize("a b")], DecodeOptions())
            others = scheduler.admit("en-de", 3)  # the room the first pass did not take
            again = await admitted.translate(
                [engine.tokenize("c d"), engine.tokenize("e")], DecodeOptions())
            scheduler.release(others)
            draining = asyncio.create_task(scheduler.drain(5))
            await asyncio.sleep(0.05)
            assert not draining.done()  # the request is still open
        assert await draining
        return first, again

    first, again = asyncio.run(main())
    assert first[0].text == "A B" and [t.text for t in again] == ["C D", "E"]

    scheduler = make_scheduler(engine, max_queue=3)

    async def cached() -> None:
        with scheduler.admitted("en-de", 3) as admitted:
            # A first pass with nothing to queue (every sentence cached) gives the room back.
            assert await admitted.translate([], DecodeOptions()) == []
            scheduler.release(scheduler.admit("en-de", 3))

    asyncio.run(cached())
    with pytest.raises(RuntimeError), scheduler.admitted("en-de", 3):
        raise RuntimeError("the request failed while it was prepared")
    scheduler.admit("en-de", 3)  # its room and standing were given back
    scheduler.stop()


def test_a_first_pass_answered_from_the_cache_still_holds_the_request_accepted() -> None:
    """The sentence cache answers a request's whole first pass, so nothing is queued: the
    request was accepted all the same, and its later passes (a glossary's, the number
    check's) are queued into a full queue, past the per-request limit and while draining."""
    engine = FakeEngine(step_s=0.002)
    scheduler = make_scheduler(engine, max_queue=2, max_request_sentences=2)

    async def main() -> tuple[list[Translation], list[Translation]]:
        with scheduler.admitted("en-de", 1) as admitted:
            assert await admitted.translate([], DecodeOptions()) == []
            others = scheduler.admit("en-de", 2)  # another request fills the queue
            sources = [engine.tokenize(f"p{i} q") for i in range(3)]
            full = await admitted.translate(sources, DecodeOptions())
            draining = asyncio.create_task(scheduler.drain(5))
            await asyncio.sleep(0.05)
            assert not draining.done()  # the request is still open
            late = await admitted.translate([engine.tokenize("r s")], DecodeOptions())
            scheduler.release(others)
        assert await draining
        return full, late

    full, late = asyncio.run(main())
    assert [t.text for t in full] == ["P0 Q", "P1 Q", "P2 Q"] and late[0].text == "R S"


def test_the_largest_request_leaves_room_and_rows_for_small_ones() -> None:
    """While the largest request the limits allow decodes, one-sentence requests are admitted
    (never QueueFull) and finish long before it: requests take turns for free rows."""
    engine = FakeEngine(step_s=0.002)
    scheduler = make_scheduler(engine, max_queue=64, max_request_sentences=16, max_batch_rows=4)
    finished: list[str] = []

    async def small(i: int) -> None:
        await asyncio.sleep(0.01 * i)
        result = await scheduler.translate("en-de", [engine.tokenize(f"s{i}")], DecodeOptions())
        assert result[0].text == f"S{i}"
        finished.append("small")

    async def main() -> None:
        sources = [engine.tokenize(words(9, f"l{i}_")) for i in range(16)]  # 4 waves of 4
        large = scheduler.translate("en-de", sources, DecodeOptions(), admission=None)
        await asyncio.gather(large, *(small(i) for i in range(1, 6)))
        finished.append("large")

    asyncio.run(main())
    assert finished == ["small"] * 5 + ["large"]
    scheduler.stop()


def test_deadline_drops_the_sentences_and_spares_the_others() -> None:
    engine = FakeEngine(step_s=0.003)
    metrics = Metrics()
    scheduler = Scheduler({"en-de": engine}, metrics=metrics)
    scheduler.start()

    async def main() -> tuple[BaseException | None, str]:
        loop = asyncio.get_running_loop()
        slow = scheduler.translate(
            "en-de", [engine.tokenize(words(60))], DecodeOptions(), loop.time() + 0.05
        )
        quick = scheduler.translate("en-de", [engine.tokenize("ok then")], DecodeOptions())
        slow_result, quick_result = await asyncio.gather(slow, quick, return_exceptions=True)
        return slow_result, quick_result[0].text

    slow_result, quick_text = asyncio.run(main())
    assert isinstance(slow_result, DeadlineExceeded)
    assert quick_text == "OK THEN"
    assert scheduler.wait_idle(2)
    assert len(engine.removed) == 1  # the slow sentence left the batch early
    assert engine.steps < 60
    dropped = metrics.registry.get_sample_value(
        "translate_sentences_total", {"pair": "en-de", "outcome": "dropped"}
    )
    assert dropped == 1
    scheduler.stop()


def test_cancelled_waiter_frees_its_rows() -> None:
    engine = FakeEngine(step_s=0.003)
    scheduler = make_scheduler(engine)

    async def main() -> None:
        task = asyncio.create_task(
            scheduler.translate("en-de", [engine.tokenize(words(60))], DecodeOptions())
        )
        await asyncio.sleep(0.03)
        task.cancel()  # what a client disconnect does to the request's task
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert scheduler.wait_idle(2)
    assert len(engine.removed) == 1
    scheduler.stop()


def test_a_failed_step_is_retried_alone_and_its_requests_succeed() -> None:
    faults = Faults()
    engine = FakeEngine(step_s=0.002)
    metrics = Metrics()
    scheduler = Scheduler({"en-de": FaultyEngine(engine, faults)}, metrics=metrics)
    scheduler.start()

    async def main() -> list[str]:
        first = [engine.tokenize(words(5, f"a{i}_")) for i in range(3)]
        running = asyncio.create_task(scheduler.translate("en-de", first, DecodeOptions()))
        await asyncio.sleep(0.005)
        faults.fail_steps = 1  # one transient failure, mid-decode
        second = scheduler.translate("en-de", [engine.tokenize("c d")], DecodeOptions())
        results = await asyncio.gather(running, second)
        return [t.text for r in results for t in r]

    assert asyncio.run(main()) == [words(5, f"a{i}_").upper() for i in range(3)] + ["C D"]
    assert faults.steps_failed == 1
    sample = metrics.registry.get_sample_value
    assert sample("translate_step_failures_total", {"pair": "en-de"}) == 1
    assert sample("translate_sentences_total", {"pair": "en-de", "outcome": "retried"}) >= 1
    assert sample("translate_sentences_total", {"pair": "en-de", "outcome": "failed"}) == 0
    assert scheduler.healthy_workers == 1
    scheduler.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_poison_sentence_fails_only_its_request(
    workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    engine = with_replicas(FakeEngine(step_s=0.002), workers)
    poison = engine.tokenize("poison pill")
    faults = Faults(poison=poison)
    metrics = Metrics()
    scheduler = Scheduler({"en-de": FaultyEngine(engine, faults)}, metrics=metrics)
    scheduler.start()
    texts = [words(1 + i % 7, f"r{i}_") for i in range(30)]

    async def one(i: int) -> object:
        await asyncio.sleep(0.001 * (i % 5))
        sources = [engine.tokenize(texts[i])]
        if i == 7:
            sources.append(poison)  # one request carries it, beside an innocent sentence
        try:
            result = await scheduler.translate(
                "en-de", sources, DecodeOptions(), request_id=f"req{i}"
            )
        except TranslationFailed as exc:
            return exc
        return result[0].text

    async def main() -> list[object]:
        return await asyncio.gather(*(one(i) for i in range(len(texts))))

    with caplog.at_level("ERROR", logger="service.scheduler"):
        outcomes = asyncio.run(main())
    failed = outcomes[7]
    assert isinstance(failed, TranslationFailed)
    assert (failed.request_id, failed.index) == ("req7", 1)
    assert [o for i, o in enumerate(outcomes) if i != 7] == [
        t.upper() for i, t in enumerate(texts) if i != 7
    ]
    sample = metrics.registry.get_sample_value
    assert sample("translate_sentences_total", {"pair": "en-de", "outcome": "failed"}) == 1
    assert sample("translate_step_failures_total", {"pair": "en-de"}) >= 2
    assert "req7" in caplog.text  # the log names the request that failed
    assert scheduler.wait_idle(2) and scheduler.healthy_workers == workers
    scheduler.stop()


def test_a_request_given_up_while_its_sentences_are_retried_frees_them() -> None:
    faults = Faults()
    engine = FakeEngine(step_s=0.005)
    metrics = Metrics()
    scheduler = Scheduler({"en-de": FaultyEngine(engine, faults)}, metrics=metrics)
    scheduler.start()

    async def main() -> tuple[object, str]:
        loop = asyncio.get_running_loop()
        sources = [engine.tokenize(words(30, f"g{i}_")) for i in range(4)]
        expiring = asyncio.ensure_future(scheduler.translate(
            "en-de", sources, DecodeOptions(), loop.time() + 0.1
        ))
        await asyncio.sleep(0.02)
        faults.fail_steps = 1  # all four go to be retried alone, one after another
        outcome = (await asyncio.gather(expiring, return_exceptions=True))[0]
        later = await scheduler.translate("en-de", [engine.tokenize("x y")], DecodeOptions())
        return outcome, later[0].text

    outcome, later = asyncio.run(main())
    assert isinstance(outcome, DeadlineExceeded)
    assert later == "X Y"
    assert scheduler.wait_idle(2) and scheduler.in_flight == 0
    dropped = metrics.registry.get_sample_value(
        "translate_sentences_total", {"pair": "en-de", "outcome": "dropped"}
    )
    assert dropped == 4  # the one being retried and the three waiting for their turn
    scheduler.stop()


def test_a_worker_that_dies_is_restarted() -> None:
    faults = Faults()
    engine = FakeEngine(step_s=0.005)
    metrics = Metrics()
    scheduler = Scheduler({"en-de": FaultyEngine(engine, faults)}, metrics=metrics)
    scheduler.start()

    async def main() -> tuple[object, object, str]:
        loop = asyncio.get_running_loop()
        await scheduler.translate("en-de", [engine.tokenize("warm up")], DecodeOptions())
        faults.fail_removes = 1  # the expiring request's removal kills the worker
        expiring = scheduler.translate(
            "en-de", [engine.tokenize(words(40))], DecodeOptions(), loop.time() + 0.03
        )
        running = scheduler.translate("en-de", [engine.tokenize(words(40))], DecodeOptions())
        outcomes = await asyncio.gather(expiring, running, return_exceptions=True)
        later = await scheduler.translate("en-de", [engine.tokenize("x y")], DecodeOptions())
        return outcomes[0], outcomes[1], later[0].text

    expiring, running, later = asyncio.run(main())
    assert isinstance(expiring, DeadlineExceeded)
    assert isinstance(running, WorkerRestarted)  # answered, not left hanging
    assert later == "X Y"  # served by the new worker
    assert not scheduler.failed and scheduler.accepting and scheduler.healthy_workers == 1
    assert metrics.registry.get_sample_value("translate_worker_failures_total") == 1
    scheduler.stop()


def test_one_poisoned_sentence_sent_again_and_again_kills_no_worker() -> None:
    """Copies of one bad sentence in a row, with nothing succeeding between them (as when the
    sentence cache answers every innocent request), fail their requests only."""
    engine = FakeEngine(step_s=0.001)
    poison = engine.tokenize("poison pill")
    scheduler = Scheduler({"en-de": FaultyEngine(engine, Faults(poison=poison))})
    scheduler.start()

    async def main() -> tuple[list[object], str]:
        outcomes: list[object] = []
        for _ in range(12):
            try:
                await scheduler.translate("en-de", [poison], DecodeOptions())
            except SchedulerError as exc:
                outcomes.append(exc)
        later = await scheduler.translate("en-de", [engine.tokenize("x y")], DecodeOptions())
        return outcomes, later[0].text

    outcomes, later = asyncio.run(main())
    assert all(isinstance(outcome, TranslationFailed) for outcome in outcomes)
    assert len(outcomes) == 12 and later == "X Y"
    assert not scheduler.failed and scheduler.healthy_workers == 1
    scheduler.stop()


def test_an_engine_failing_for_good_fails_the_scheduler(caplog: pytest.LogCaptureFixture,
                                                       ) -> None:
    """Every step failing, the canary's too, for ``engine_failure_s``: the scheduler gives up
    (the service's cue to exit), says why, and answers what it held."""
    faults = Faults()
    engine = FakeEngine(step_s=0.001)
    scheduler = Scheduler({"en-de": FaultyEngine(engine, faults)}, engine_failure_s=0.3)
    scheduler.start()
    began = 0.0

    async def main() -> list[object]:
        nonlocal began
        await scheduler.translate("en-de", [engine.tokenize("warm up")], DecodeOptions())
        faults.fail_steps = 10**6  # the replica is broken for good
        began = time.monotonic()
        outcomes = []
        for i in range(20):
            try:
                await scheduler.translate("en-de", [engine.tokenize(f"q{i}")], DecodeOptions())
                outcomes.append("ok")
            except (TranslationFailed, WorkerRestarted, SchedulerFailed) as exc:
                outcomes.append(exc)
            if scheduler.failed:
                break
        return outcomes

    with caplog.at_level("WARNING", logger="service.scheduler"):
        outcomes = asyncio.run(main())
    assert "ok" not in outcomes
    assert isinstance(outcomes[0], SchedulerFailed)  # it waited for the fault to pass
    assert time.monotonic() - began >= 0.3
    assert scheduler.failed and not scheduler.accepting and scheduler.healthy_workers == 0
    assert "failed for" in caplog.text and "broken for good" in caplog.text

    async def later() -> None:
        with pytest.raises(SchedulerFailed):
            await scheduler.translate("en-de", [engine.tokenize("x")], DecodeOptions())

    asyncio.run(later())


@pytest.mark.parametrize("outage_s", [0.1, 0.25])
def test_every_step_failing_for_a_while_heals_by_itself(outage_s: float) -> None:
    """The whole engine fails every step for a while, under load, beside a poison sentence:
    every innocent request still gets its translation, none is quarantined, the workers live
    on, and the poison still fails alone and only its own request."""
    faults = Faults()
    engine = with_replicas(FakeEngine(step_s=0.002), 2)
    poison = engine.tokenize("poison pill")
    faults.poison = tuple(poison)
    metrics = Metrics()
    scheduler = Scheduler({"en-de": FaultyEngine(engine, faults)}, metrics=metrics)
    scheduler.start()
    texts = [words(2 + i % 6, f"h{i}_") for i in range(40)]

    async def one(i: int, delay: float) -> str:
        await asyncio.sleep(delay)  # requests arriving before, during and after the fault
        sources = [engine.tokenize(texts[i]), engine.tokenize(f"also {i}")]
        result = await scheduler.translate("en-de", sources, DecodeOptions(), request_id=f"r{i}")
        return " | ".join(t.text for t in result)

    async def main() -> tuple[list[str], object, object]:
        await scheduler.translate("en-de", [engine.tokenize("warm up")], DecodeOptions())
        requests = [asyncio.create_task(one(i, 0.008 * i)) for i in range(len(texts))]
        await asyncio.sleep(0.02)
        faults.break_for(outage_s)
        poisoned = asyncio.create_task(scheduler.translate(
            "en-de", [engine.tokenize("innocent too"), poison], DecodeOptions(),
            request_id="bad"))
        outcomes = await asyncio.gather(*requests)  # any error fails the test
        failed = (await asyncio.gather(poisoned, return_exceptions=True))[0]
        steps = faults.steps_failed
        copy = (await asyncio.gather(scheduler.translate(
            "en-de", [poison], DecodeOptions()), return_exceptions=True))[0]
        assert faults.steps_failed == steps  # the copy was refused unrun, from quarantine
        return outcomes, failed, copy

    outcomes, failed, copy = asyncio.run(main())
    assert outcomes == [f"{t.upper()} | ALSO {i}" for i, t in enumerate(texts)]
    assert isinstance(failed, TranslationFailed) and (failed.request_id, failed.index) == (
        "bad", 1)
    assert isinstance(copy, TranslationFailed)
    assert faults.steps_failed > 2 * POISON_FAILURES  # the outage was met, not missed
    sample = metrics.registry.get_sample_value
    assert sample("translate_sentences_total", {"pair": "en-de", "outcome": "failed"}) == 1
    assert not scheduler.failed and scheduler.healthy_workers == 2
    assert sample("translate_worker_failures_total") == 0

    async def again() -> list[str]:  # none of the innocent sentences was quarantined
        return [t.text for t in await scheduler.translate(
            "en-de", [engine.tokenize(t) for t in texts], DecodeOptions())]

    assert asyncio.run(again()) == [t.upper() for t in texts]
    scheduler.stop()


def test_a_drain_during_an_outage_finishes_the_accepted_work() -> None:
    """SIGTERM while the engine fails every step: the requests accepted wait out the fault in
    the queue and are translated before the drain ends, none lost."""
    faults = Faults()
    engine = FakeEngine(step_s=0.002)
    scheduler = Scheduler({"en-de": FaultyEngine(engine, faults)})
    scheduler.start()

    async def main() -> tuple[bool, list[str], object]:
        await scheduler.translate("en-de", [engine.tokenize("warm up")], DecodeOptions())
        faults.break_for(0.25)
        accepted = [scheduler.translate("en-de", [engine.tokenize(f"d{i} e")], DecodeOptions())
                    for i in range(8)]
        results = asyncio.gather(*accepted)
        await asyncio.sleep(0.05)
        drained = await scheduler.drain(5)
        refused = (await asyncio.gather(scheduler.translate(
            "en-de", [engine.tokenize("late")], DecodeOptions()), return_exceptions=True))[0]
        return drained, [r[0].text for r in await results], refused

    drained, texts, refused = asyncio.run(main())
    assert drained and texts == [f"D{i} E" for i in range(8)]
    assert isinstance(refused, ShuttingDown)


def test_one_replica_failing_leaves_the_work_to_the_other() -> None:
    """One replica's engine fails every step for a while, the other's works: the requests the
    failing one held go back to the queue, and the other translates them meanwhile."""
    engine = with_replicas(FakeEngine(step_s=0.002), 2)
    broken = Faults()
    front = FaultyEngine(engine, Faults(), replica=True)
    front.replicas = [front, FaultyEngine(engine.replicas[1], broken, replica=True)]
    scheduler = Scheduler({"en-de": front})
    scheduler.start()

    async def main() -> tuple[list[str], bool]:
        await scheduler.translate("en-de", [engine.tokenize("warm up")], DecodeOptions())
        broken.break_for(5.0)

        async def one(i: int) -> str:
            await asyncio.sleep(0.003 * i)
            result = await scheduler.translate("en-de", [engine.tokenize(f"r{i} s")],
                                               DecodeOptions())
            return result[0].text

        texts = await asyncio.gather(*(one(i) for i in range(24)))
        return texts, time.monotonic() < broken.broken_until

    texts, during = asyncio.run(main())
    assert texts == [f"R{i} S" for i in range(24)]
    assert during  # answered while the replica was still failing, not after
    assert broken.steps_failed > 0 and not scheduler.failed
    scheduler.stop()


def test_faults_far_apart_are_not_one_long_fault() -> None:
    """A worker backing off with nothing left to run (its request gave up) proves itself until
    the fault passes: a second short fault long after is new, not the first one's tail
    reaching ``engine_failure_s``."""
    faults = Faults()
    engine = FakeEngine(step_s=0.002)
    scheduler = Scheduler({"en-de": FaultyEngine(engine, faults)}, engine_failure_s=0.4)
    scheduler.start()

    async def main() -> tuple[object, str]:
        loop = asyncio.get_running_loop()
        await scheduler.translate("en-de", [engine.tokenize("warm up")], DecodeOptions())
        faults.break_for(0.2)
        expired = (await asyncio.gather(scheduler.translate(
            "en-de", [engine.tokenize("a b")], DecodeOptions(), loop.time() + 0.05),
            return_exceptions=True))[0]
        await asyncio.sleep(0.6)  # no traffic, and past engine_failure_s
        faults.break_for(0.1)
        later = await scheduler.translate("en-de", [engine.tokenize("c d")], DecodeOptions())
        return expired, later[0].text

    expired, later = asyncio.run(main())
    assert isinstance(expired, DeadlineExceeded)
    assert later == "C D" and not scheduler.failed and scheduler.healthy_workers == 1
    scheduler.stop()


def test_a_refused_sentence_fails_only_its_request() -> None:
    engine = FakeEngine(max_source_tokens=5)
    scheduler = make_scheduler(engine)

    async def main() -> tuple[object, object]:
        bad = scheduler.translate(
            "en-de", [engine.tokenize("fine"), engine.tokenize(words(9))], DecodeOptions()
        )
        good = scheduler.translate("en-de", [engine.tokenize("good one")], DecodeOptions())
        return tuple(await asyncio.gather(bad, good, return_exceptions=True))

    bad, good = asyncio.run(main())
    assert isinstance(bad, ValueError)
    assert good[0].text == "GOOD ONE"
    assert scheduler.wait_idle(2)
    scheduler.stop()


def test_drain_finishes_accepted_work_then_refuses() -> None:
    engine = FakeEngine(step_s=0.003)
    scheduler = make_scheduler(engine)

    async def main() -> tuple[list[Translation], bool]:
        running = asyncio.create_task(
            scheduler.translate("en-de", [engine.tokenize(words(40))], DecodeOptions())
        )
        await asyncio.sleep(0.02)
        drained = await scheduler.drain(grace_s=10)
        with pytest.raises(ShuttingDown):
            await scheduler.translate("en-de", [engine.tokenize("late")], DecodeOptions())
        return await running, drained

    result, drained = asyncio.run(main())
    assert drained
    assert result[0].text == words(40).upper()


def test_drain_past_the_grace_period_fails_the_rest() -> None:
    engine = FakeEngine(step_s=0.01)
    scheduler = make_scheduler(engine)

    async def main() -> tuple[BaseException | None, bool]:
        running = asyncio.create_task(
            scheduler.translate("en-de", [engine.tokenize(words(60))], DecodeOptions())
        )
        await asyncio.sleep(0.02)
        drained = await scheduler.drain(grace_s=0.05)
        outcome = (await asyncio.gather(running, return_exceptions=True))[0]
        return outcome, drained

    outcome, drained = asyncio.run(main())
    assert not drained
    assert isinstance(outcome, ShuttingDown)


def test_lanes_per_language_pair() -> None:
    en_de, de_en = FakeEngine(), FakeEngine(source_lang="de", target_lang="en")
    scheduler = Scheduler({"en-de": en_de, "de-en": de_en})
    scheduler.start()

    async def main() -> list[list[Translation]]:
        return await asyncio.gather(
            scheduler.translate("en-de", [en_de.tokenize("hello")], DecodeOptions()),
            scheduler.translate("de-en", [de_en.tokenize("hallo")], DecodeOptions()),
        )

    first, second = asyncio.run(main())
    assert (first[0].text, second[0].text) == ("HELLO", "HALLO")
    assert en_de.steps and de_en.steps
    scheduler.stop()


def test_metrics_are_recorded() -> None:
    engine = FakeEngine()
    metrics = Metrics()
    scheduler = Scheduler({"en-de": engine}, metrics=metrics)
    scheduler.start()

    async def main() -> None:
        sources = [engine.tokenize("one two three"), engine.tokenize("four")]
        await scheduler.translate("en-de", sources, DecodeOptions())

    asyncio.run(main())
    scheduler.stop()
    sample = metrics.registry.get_sample_value
    assert sample("translate_generated_tokens_total", {"pair": "en-de"}) == 4
    assert sample("translate_decode_steps_total", {"pair": "en-de"}) == 4
    assert sample("translate_source_tokens_total", {"pair": "en-de"}) == 6
    assert sample("translate_batch_rows_count", {"pair": "en-de"}) == 4
    assert sample("translate_queue_depth") == 0


def test_the_event_loop_is_not_blocked_while_decoding() -> None:
    engine = FakeEngine(step_s=0.05)
    scheduler = make_scheduler(engine)

    async def main() -> int:
        task = asyncio.create_task(
            scheduler.translate("en-de", [engine.tokenize(words(9))], DecodeOptions())
        )
        ticks = 0
        while not task.done():
            await asyncio.sleep(0.001)
            ticks += 1
        await task
        return ticks

    # 10 steps of 50 ms: a loop that ran them itself would tick about once a step; a free one
    # ticks hundreds of times (counted, not timed, so a busy machine cannot fail it).
    assert asyncio.run(main()) > 50
    scheduler.stop()


# -- the real engine ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_bundle: Path) -> Engine:
    return Engine(tiny_bundle, device="cpu", threads=1)


def fixture_sentences() -> list[str]:
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[0] for line in lines if line.strip()]


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("workers", [1, 2])
def test_concurrent_requests_match_offline_translation(
    engine: Engine, tiny_bundle: Path, beam_size: int, workers: int
) -> None:
    sentences = fixture_sentences()[:24]
    options = DecodeOptions(beam_size=beam_size, num_hypotheses=min(2, beam_size))
    expected = engine.translate(sentences, beam_size=beam_size, num_hypotheses=min(2, beam_size))
    served = engine if workers == 1 else Engine(tiny_bundle, device="cpu", threads=2, workers=2)
    scheduler = make_scheduler(served, max_batch_tokens=600)
    assert scheduler.workers == workers

    async def one(i: int) -> Translation:
        await asyncio.sleep(0.002 * (i % 7))  # staggered: sentences join a running batch
        return (await scheduler.translate("en-de", [engine.tokenize(sentences[i])], options))[0]

    async def main() -> list[Translation]:
        return await asyncio.gather(*(one(i) for i in range(len(sentences))))

    results = asyncio.run(main())
    scheduler.stop()
    for got, want in zip(results, expected, strict=True):
        assert [h.token_ids for h in got.hypotheses] == [h.token_ids for h in want.hypotheses]
        assert got.score == pytest.approx(want.score, abs=1e-4)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_poison_sentence_spares_concurrent_requests_on_the_real_engine(
    engine: Engine, tiny_bundle: Path, workers: int
) -> None:
    sentences = fixture_sentences()[:24]
    poisoned = 5
    options = DecodeOptions(beam_size=2)
    expected = engine.translate(sentences, beam_size=2)
    served = engine if workers == 1 else Engine(tiny_bundle, device="cpu", threads=2, workers=2)
    faults = Faults(poison=engine.tokenize(sentences[poisoned]))
    scheduler = make_scheduler(FaultyEngine(served, faults), max_batch_tokens=600)

    async def one(i: int) -> object:
        await asyncio.sleep(0.002 * (i % 7))  # staggered: sentences join a running batch
        try:
            sources = [engine.tokenize(sentences[i])]
            return (await scheduler.translate("en-de", sources, options))[0]
        except TranslationFailed as exc:
            return exc

    async def main() -> list[object]:
        return await asyncio.gather(*(one(i) for i in range(len(sentences))))

    results = asyncio.run(main())
    scheduler.stop()
    assert faults.steps_failed >= 2  # its batch's step, and its own retry
    assert isinstance(results[poisoned], TranslationFailed)
    for i, (got, want) in enumerate(zip(results, expected, strict=True)):
        if i != poisoned:
            assert isinstance(got, Translation), (i, got)
            assert got.hypotheses[0].token_ids == want.hypotheses[0].token_ids
