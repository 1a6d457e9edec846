"""The decoding engine: onnxruntime sessions, greedy and beam search, continuous batching.

Public surface, as small as CTranslate2's::

    engine = Engine("models/en-de")
    engine.translate(["Hello world."], beam_size=4, num_hypotheses=2)

Underneath, a ``DecodeBatch`` holds the rows being decoded together. Sentences join it between
steps (their encoder runs once, its cross-attention keys/values are written into the batch's
buffers, ``service.cache``) and
answer the step they finish, which is what the service's scheduler builds on; their rows idle
until a newcomer takes them over (see ``_Hole``). ``translate`` uses the same machinery, so
offline and served decoding cannot drift apart.

Cache layout (the ONNX contract, ``service.bundle``): each row's self-attention cache is
left-aligned, its ``position`` earlier tokens in columns 0 .. position - 1, whatever the other
rows hold; the decoder graph attends over those columns (and the row's real source positions)
only and writes the new key/value after them, in place. So a sentence joins a running batch at
once, and its numbers are bit-identical to its own, decoded alone.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnxruntime as ort

from service.bundle import Bundle, BundleError, load_bundle
from service.cache import BatchCache
from service.normalize import build_tables, clean_text
from service.vocabulary import Vocabulary

NEG_INF = -1e30
# onnxruntime would fuse the encoder's Add & LayerNorm pairs into SkipLayerNormalization, whose
# CPU kernel is ~3x slower on a sentence's worth of rows (training.export._GraphBuilder).
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]
T = TypeVar("T")
R = TypeVar("R")
# The encoder's outputs: cross keys, cross values, source mask, cross_last (service.bundle).
Encoded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class SourceTooLong(ValueError):
    """A sentence needs more source positions than the model has; split it first."""


@dataclass(frozen=True)
class DecodeOptions:
    beam_size: int = 1
    length_penalty: float = 1.0  # score = log P / length ** length_penalty
    max_length: int = 256  # absolute cap on generated target tokens
    max_length_ratio: float = 2.0  # and at most ratio * source tokens + 10
    num_hypotheses: int = 1  # n-best, at most beam_size
    no_repeat_ngram_size: int = 0  # > 0: no n-gram of this size twice in a translation

    def __post_init__(self) -> None:
        if self.no_repeat_ngram_size < 0:
            raise ValueError(
                f"no_repeat_ngram_size must be >= 0, got {self.no_repeat_ngram_size}"
            )
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if not 1 <= self.num_hypotheses <= self.beam_size:
            raise ValueError(
                f"num_hypotheses must be between 1 and beam_size={self.beam_size}, "
                f"got {self.num_hypotheses}"
            )
        if self.max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {self.max_length}")
        if self.max_length_ratio <= 0:
            raise ValueError(f"max_length_ratio must be > 0, got {self.max_length_ratio}")


@dataclass
class Hypothesis:
    text: str
    token_ids: list[int]
    tokens: list[str]
    score: float  # what the search ranks by: log_prob / length ** length_penalty
    log_prob: float  # of the scored tokens
    length: int  # scored tokens: the generated ones and the EOS, none when cut at max_length


@dataclass
class Translation:
    hypotheses: list[Hypothesis]  # best first

    @property
    def text(self) -> str:
        return self.hypotheses[0].text

    @property
    def score(self) -> float:
        return self.hypotheses[0].score


@dataclass
class _Sentence:
    """One sentence in flight: its rows are ``beam_size`` consecutive rows of the batch."""

    key: Hashable
    source_ids: list[int]
    options: DecodeOptions
    max_new: int
    scores: np.ndarray  # cumulative log-prob per beam
    prefixes: list[list[int]]  # generated ids per beam
    finished: list[tuple[float, list[int]]] = field(default_factory=list)
    steps: int = 0

    @property
    def width(self) -> int:
        return self.options.beam_size


@dataclass
class _Hole:
    """The rows of a sentence that left. A waiting sentence of the same width takes them over
    at the next step (its encoder output is written into them, no cache is copied). Until then
    they idle (position 0: they attend to nothing but themselves); once idle rows are a quarter
    of the batch they are compacted away (``COMPACT_IDLE_SHARE``)."""

    width: int


def available_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota
    (``docker run --cpus``, compose's ``cpus``), which ``os.cpu_count()`` ignores: a container
    limited to 2 CPUs on a 64-core host would otherwise start 64 threads that fight over 2."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = count or 1
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 here, or no quota
    return count


def auto_workers(device: str, threads: int) -> int:
    """Replicas to run when none are asked for: two on a CPU with two or more threads, else one.

    On 2 cores onnxruntime's intra-op threads barely help this small model, while two
    one-thread replicas decoding different batches nearly halve the time (docs/benchmarks.md).
    A GPU runs one replica: its kernels queue on one device anyway, and each replica would
    hold its own weights there.
    """
    return 2 if device == "cpu" and threads >= 2 else 1


def _finite_or_minus_inf(value: float) -> float:
    """A plain Python float, with anything not finite (inf, nan) as -inf."""
    return float(value) if math.isfinite(value) else float("-inf")


CANDIDATE_MARGINS = (4.0, 8.0)  # nats below the best total, tried in turn
# More entries than this within a margin (a flat distribution over a large vocabulary) cost more
# to sort than a partition per row costs to find a tighter cut-off.
CANDIDATE_SORT_LIMIT = 4096


def top_candidates(
    scores: np.ndarray, log_probs: np.ndarray, count: int, row_max: np.ndarray | None = None
) -> tuple[list[int], list[int], list[float]]:
    """The ``count`` best (beam, token) pairs by ``scores[beam] + log_probs[beam, token]``, best
    first, as (beams, tokens, totals).

    Exact, yet it never sorts the whole [beams, vocab] block, the largest cost of a beam step
    after the decoder. Next-token distributions are peaked, so few entries come within a
    margin of the best total and one vectorised comparison finds them; the margins cover most
    steps (docs/benchmarks.md). When even the widest admits fewer than ``count`` (rows so peaked
    that a wider margin would admit thousands of entries to sort), or a margin admits more than
    ``CANDIDATE_SORT_LIMIT`` (rows nearly flat over a large vocabulary), each row's
    ``count``-th best log-prob from a partition sets the cut-off: the best row alone then puts
    ``count`` entries over it. ``row_max`` is ``log_probs.max(axis=1)`` when the caller has it
    already. Every pair above the cut-off is a candidate, so the best ``count`` of them are the
    best overall."""
    if row_max is None:
        row_max = log_probs.max(axis=1)
    row_best = scores + row_max
    best = float(row_best.max())
    vocab = log_probs.shape[1]
    margins = [*CANDIDATE_MARGINS, None]
    while margins:
        margin = margins.pop(0)
        if margin is not None:
            cutoff = best - margin
        elif count <= vocab:
            kth = np.partition(log_probs, vocab - count, axis=1)[:, vocab - count]
            cutoff = float((scores + kth).max())
        else:  # no row holds ``count`` entries: every entry is a candidate
            cutoff = -math.inf
        # Per-row thresholds on the float32 log-probs; rows that cannot reach the cut-off
        # (a dead beam's score is NEG_INF) get +inf and contribute nothing.
        limits = np.where(row_best >= cutoff, cutoff - scores, np.inf).astype(np.float32)
        # flatnonzero and a divmod: numpy's 2-D nonzero is 13x slower on such a block.
        beams, tokens = np.divmod(np.flatnonzero(log_probs >= limits[:, None]), vocab)
        if len(beams) > CANDIDATE_SORT_LIMIT and margin is not None:
            margins = [None]  # too many to sort: the partition's cut-off admits fewer
        elif len(beams) >= count:
            break
    totals = scores[beams] + log_probs[beams, tokens].astype(np.float64)
    order = np.lexsort((tokens, beams, -totals))[:count]  # ties: lower beam, then lower token
    return beams[order].tolist(), tokens[order].tolist(), totals[order].tolist()


def repeated_ngram_ends(prefix: Sequence[int], size: int) -> list[int]:
    """The tokens that, appended to ``prefix``, would complete an n-gram of ``size`` tokens
    that ``prefix`` already holds."""
    if size == 1:
        return list(prefix)
    if len(prefix) < size:
        return []
    start = len(prefix) - size + 1  # the last size - 1 tokens: what a repeat would extend
    tail = prefix[start:]
    first = tail[0]
    # Comparing the first token before slicing: this runs for every row at every step.
    return [prefix[i + size - 1] for i in range(start)
            if prefix[i] == first and prefix[i : i + size - 1] == tail]


# Holes are compacted away once they hold this share of the rows. Until then a newcomer of the
# same width takes a hole over at no cost, where compacting copies every row's cache twice; an
# idle row costs only one row of a step.
COMPACT_IDLE_SHARE = 0.25

SMALL_DECODER_ROWS = 8  # up to this many rows an int8 decoder step runs on one thread
# Up to this many rows an offline call decodes in its replica's spare batch (Engine._batch_for).
# Beyond it setting a batch up is a small share of the call, and a larger spare's buffers
# would grow to tens of MB.
SPARE_BATCH_ROWS = 8

ENCODER_CALL_COST = 32  # source positions' worth of work that one more encoder call costs


def length_groups(lengths: Sequence[int], call_cost: int = ENCODER_CALL_COST) -> list[slice]:
    """Split ``lengths`` (sorted longest first) into runs encoded together, each padded to its
    first. A new run starts where the padding it saves, (run width - length) for this and
    every shorter sentence, outweighs the cost of one more encoder call: its fixed part
    (weights read again, kernel launches), which docs/benchmarks.md estimates."""
    groups, start = [], 0
    for i in range(1, len(lengths)):
        if (lengths[start] - lengths[i]) * (len(lengths) - i) > call_cost:
            groups.append(slice(start, i))
            start = i
    groups.append(slice(start, len(lengths)))
    return groups


class Engine:
    """Loads a bundle into onnxruntime and translates sentences with it.

    ``workers`` replicas of the sessions (like CTranslate2's ``inter_threads``) each decode
    their own batches in their own thread, sharing ``threads`` between them; 0 picks them
    (``auto_workers``). ``translate`` spreads its batches over the replicas, and the service's
    scheduler runs one worker thread per replica.
    """

    def __init__(
        self,
        bundle_dir: str | Path,
        device: str = "auto",
        threads: int = 0,
        variant: str | None = None,
        workers: int = 1,
        memory_arena: bool = False,
    ):
        if threads < 0 or workers < 0:
            raise ValueError(f"threads and workers must be >= 0, got {threads} and {workers}")
        self.bundle: Bundle = load_bundle(bundle_dir)
        self.memory_arena = memory_arena
        ids = self.bundle.special_ids
        self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]
        try:
            self.vocabulary = Vocabulary.from_manifest(self.bundle.dir, self.bundle.manifest)
        except (OSError, ValueError) as exc:
            raise BundleError(f"{self.bundle.dir}: {exc}") from exc
        if "vocabulary" not in self.bundle.manifest and (
                self.vocabulary.source.pad_id() != self.pad_id
                or self.vocabulary.source.eos_id() != self.eos_id):
            raise BundleError(f"{self.bundle.tokenizer_path}: special ids differ from the manifest")
        self.max_source_tokens = self.bundle.max_positions
        self.decoding_defaults = self.bundle.decoding  # the model's measured best settings
        try:
            self.options()
        except (TypeError, ValueError) as exc:
            raise BundleError(f"{self.bundle.dir}: bad 'decoding' in the manifest: {exc}") from exc
        build_tables()  # the normaliser's table, else the first non-ASCII sentence waits for it
        self.providers = self._providers(device)
        self.variant = variant or self._default_variant()
        model = self.bundle.manifest["model"]
        self.layers, self.heads = model["decoder_layers"], model["heads"]
        self.head_dim = model["head_dim"]
        self.vocab_size = model["vocab_size"]
        threads = threads or available_cpus()
        workers = workers or auto_workers(self.device, threads)
        # onnxruntime intra-op threads per replica: all of ``threads``, split as evenly as
        # they go (3 over 2 replicas: 2 and 1), at least one each.
        shares = [max(1, threads // workers + (i < threads % workers)) for i in range(workers)]
        self.threads = shares[0]
        self._open_sessions()
        # Each replica is a shallow copy with sessions of its own; everything else is shared.
        self.replicas: list[Engine] = [self]
        for share in shares[1:]:
            replica = copy.copy(self)
            replica.threads = share
            replica._open_sessions()
            replica.replicas = [replica]  # its own translate() must not use the others' sessions
            self.replicas.append(replica)
        for replica in self.replicas:  # each its own (see _batch_for)
            replica._spare, replica._spare_lock = None, threading.Lock()

    def _open_sessions(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        # Idle intra-op threads sleep instead of spinning: faster even alone on 2 cores, and far
        # better when the scheduler, the HTTP side or other containers need the cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # onnxruntime's arena keeps the largest batch's intermediate tensors for good; without it
        # the service holds less memory under load at the same throughput.
        options.enable_cpu_mem_arena = self.memory_arena
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        encoder_path, decoder_path = self.bundle.graph_paths(self.variant)
        session = functools.partial(ort.InferenceSession, providers=self.providers,
                                    disabled_optimizers=DISABLED_OPTIMIZERS)
        self.encoder = session(str(encoder_path), options)
        self.decoder = session(str(decoder_path), options)
        # The int8 decoder gets a second session with one thread for steps of up to
        # SMALL_DECODER_ROWS rows: a small step is ~70 kernels of microseconds each, and waking
        # a second thread for each costs more than it saves (not so for fp32 or the encoder).
        # Thread count changes no number (export checks it), so batch invariance holds.
        self.decoder_small = self.decoder
        small_sessions = self.variant == "int8" and self.providers[0] == "CPUExecutionProvider"
        if small_sessions and options.intra_op_num_threads > 1:
            options.intra_op_num_threads = 1
            self.decoder_small = session(str(decoder_path), options)

    @staticmethod
    def _providers(device: str) -> list[str]:
        available = ort.get_available_providers()
        if device == "cpu":
            return ["CPUExecutionProvider"]
        if device in ("cuda", "auto") and "CUDAExecutionProvider" in available:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        if device == "cuda":
            raise RuntimeError(
                "DEVICE=cuda but onnxruntime has no CUDAExecutionProvider "
                f"(available: {available}); install onnxruntime-gpu"
            )
        if device != "auto":
            raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
        return ["CPUExecutionProvider"]

    def _default_variant(self) -> str:
        """The manifest's choice, except on CUDA: the int8 graphs are shaped for onnxruntime's
        CPU integer kernels, so a GPU gets the fp32 graphs when the bundle has them."""
        manifest = self.bundle.manifest
        if self.providers[0] == "CUDAExecutionProvider" and "fp32" in manifest["variants"]:
            return "fp32"
        return manifest["default_variant"]

    @property
    def device(self) -> str:
        return "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"

    def tokenize(self, sentence: str, target_lang: str | None = None) -> list[int]:
        """Source ids of ``sentence``, normalised as the training corpus was, followed by EOS
        (after the target-language token of a multilingual model)."""
        return self.vocabulary.encode(clean_text(sentence), target_lang)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.vocabulary.decode(ids)

    def new_batch(self) -> DecodeBatch:
        """A batch for continuous batching."""
        return DecodeBatch(self)

    def translate(
        self, sentences: Sequence[str], max_batch_rows: int = 64,
        target_lang: str | None = None, **options
    ) -> list[Translation]:
        """Translate ``sentences`` (each already a single sentence) into ``target_lang`` (for a
        multilingual model: one of ``vocabulary.target_languages``) with ``DecodeOptions``
        fields as keyword options; those not given come from the bundle's recommended
        ``decoding``, then ``DecodeOptions``' defaults. Raises ``SourceTooLong`` for a
        sentence over the model's positions rather than cutting it."""
        unknown = set(options) - {f.name for f in fields(DecodeOptions)}
        if unknown:
            raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
        decode_options = self.options(**options)
        sources = [self.tokenize(s, target_lang) for s in sentences]
        for index, ids in enumerate(sources):
            if len(ids) > self.max_source_tokens:
                raise SourceTooLong(
                    f"sentence {index} has {len(ids)} tokens; the model "
                    f"accepts at most {self.max_source_tokens}"
                )
        # Longest first keeps the padded batch tight as rows retire; results go back in order.
        # Offline, batches run until they drain, as CTranslate2's do: a row that joins a
        # running batch widens every row's cache and source, which costs more than idle rows.
        # The service's scheduler keeps continuous batching.
        order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
        per_batch = max(max_batch_rows // decode_options.beam_size, 1)
        batches = [order[i : i + per_batch] for i in range(0, len(order), per_batch)]
        results: dict[int, Translation] = {}
        decode = functools.partial(Engine._decode, sources=sources, options=decode_options)
        for done in self.on_replicas(batches, decode):
            results.update(done)
        return [results[i] for i in range(len(sources))]

    def on_replicas(self, items: Sequence[T], work: Callable[[Engine, T], R]) -> list[R]:
        """``work(replica, item)`` for every item, each replica taking the next item as it
        comes free (onnxruntime releases the GIL); the results in the items' order."""
        if len(self.replicas) == 1 or len(items) <= 1:
            return [work(self, item) for item in items]
        queue = deque(enumerate(items))
        results: list[Any] = [None] * len(items)

        def run(replica: Engine) -> None:
            while True:
                try:
                    index, item = queue.popleft()
                except IndexError:  # the last item is taken
                    return
                results[index] = work(replica, item)

        with ThreadPoolExecutor(len(self.replicas)) as pool:
            list(pool.map(run, self.replicas))  # re-raises a replica's error
        return results

    def _decode(
        self, indices: list[int], sources: list[list[int]], options: DecodeOptions
    ) -> dict[int, Translation]:
        """One static batch, decoded to the end on this replica's sessions."""
        with self._batch_for(len(indices) * options.beam_size) as batch:
            for index in indices:
                batch.add(index, sources[index], options)
            results: dict[int, Translation] = {}
            while len(batch):
                results.update(batch.step())
            return results

    @contextlib.contextmanager
    def _batch_for(self, rows: int) -> Iterator[DecodeBatch]:
        """A batch for ``rows`` rows: for a few (``SPARE_BATCH_ROWS``), this replica's spare
        one, whose buffers and bindings outlive the call, as the service's running batches do:
        a new batch costs a lone sentence ~10% more, mostly in the decoder's first runs on
        fresh buffers. A new one when another thread has the spare; a call that fails
        leaves the spare behind, in whatever state, for a new one."""
        if rows > SPARE_BATCH_ROWS or not self._spare_lock.acquire(blocking=False):
            yield self.new_batch()
            return
        try:
            if self._spare is None:
                self._spare = self.new_batch()
            yield self._spare
        except BaseException:
            self._spare = None
            raise
        finally:
            self._spare_lock.release()

    def options(self, **overrides) -> DecodeOptions:
        """``DecodeOptions`` with the bundle's recommendations under ``overrides``."""
        return DecodeOptions(**{**self.decoding_defaults, **overrides})

    # -- the two graphs -------------------------------------------------------------------------
    def run_encoder(self, src_tokens: np.ndarray) -> Encoded:
        """Cross keys, cross values, source mask and cross_last (``service.bundle``)."""
        return tuple(self.encoder.run(None, {"src_tokens": src_tokens}))  # type: ignore[return-value]

    def decoder_for(self, rows: int) -> ort.InferenceSession:
        return self.decoder_small if rows <= SMALL_DECODER_ROWS else self.decoder

    def run_decoder(self, session: ort.InferenceSession, binding: ort.IOBinding) -> None:
        """One decoder step on ``binding``'s arrays (a ``DecodeBatch``'s; see service.cache),
        which the graph updates in place."""
        session.run_with_iobinding(binding)


class DecodeBatch:
    """Rows decoded together. ``add`` queues a sentence (encoded at the next step), ``step``
    runs one decoder step for every row and returns the sentences that finished."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.sentences: list[_Sentence | _Hole] = []  # in row order
        self.waiting: list[_Sentence] = []
        e = engine
        # Every cache lives in ``cache``'s buffers, which the graph updates in place; a row's
        # position is its self-cache length (see the module docstring).
        self.cache = BatchCache(e.layers, e.heads, e.head_dim, e.vocab_size,
                                e.bundle.max_positions)
        self.tokens = np.zeros(0, np.int64)
        self.positions = np.zeros(0, np.int64)
        self._holes = False  # some entries of self.sentences are _Hole
        self._bound: dict[int, tuple[ort.IOBinding, int]] = {}  # per session: binding, version

    def __len__(self) -> int:
        return sum(not isinstance(s, _Hole) for s in self.sentences) + len(self.waiting)

    @property
    def num_rows(self) -> int:
        live = sum(s.width for s in self.sentences if not isinstance(s, _Hole))
        return live + sum(s.width for s in self.waiting)

    def add(self, key: Hashable, source_ids: list[int], options: DecodeOptions) -> None:
        e = self.engine
        if not source_ids or source_ids[-1] != e.eos_id:
            raise ValueError("source_ids must end with EOS (use Engine.tokenize)")
        if len(source_ids) > e.max_source_tokens:
            raise SourceTooLong(
                f"{len(source_ids)} source tokens; the model accepts at most {e.max_source_tokens}"
            )
        max_new = min(
            options.max_length,
            int(options.max_length_ratio * len(source_ids)) + 10,
            e.bundle.max_positions - 1,
        )
        scores = np.full(options.beam_size, NEG_INF, np.float64)
        scores[0] = 0.0  # all beams start identical: only one may expand at the first step
        self.waiting.append(
            _Sentence(
                key, source_ids, options, max_new, scores, [[] for _ in range(options.beam_size)]
            )
        )

    def remove(self, key: Hashable) -> None:
        self.waiting = [s for s in self.waiting if s.key != key]
        row = 0
        for index, sentence in enumerate(self.sentences):
            if not isinstance(sentence, _Hole) and sentence.key == key:
                self.sentences[index] = _Hole(sentence.width)
                self.positions[row : row + sentence.width] = 0
                self._holes = True
            row += sentence.width

    def clear(self) -> None:
        """Drop every sentence, keeping the buffers: after a step that raised, whose rows are
        in no known state. A new batch instead would allocate them again, and one per failed
        step (a client sending a sentence that fails every time) grew the process from 170
        to ~800 MiB resident, freed memory the allocator kept."""
        self.sentences, self.waiting = [], []
        self.tokens = np.zeros(0, np.int64)
        self.positions = np.zeros(0, np.int64)
        self._holes = False
        self.cache.set_rows(0)

    # -- one step ---------------------------------------------------------------------------------
    def step(self) -> list[tuple[Hashable, Translation]]:
        if self.waiting:
            self._admit()
        if self._holes and self._idle_rows() >= COMPACT_IDLE_SHARE * len(self.tokens):
            self._compact()
        if not self.sentences:
            return []
        rows = len(self.tokens)
        self.cache.reserve(rows, columns=int(self.positions.max()) + 1)
        session = self.engine.decoder_for(rows)
        binding, version = self._bound.get(id(session), (None, -1))
        if binding is None:
            binding = session.io_binding()
        if version != self.cache.version:
            self.cache.bind(binding)
            self._bound[id(session)] = (binding, self.cache.version)
        binding.bind_cpu_input("tokens", self.tokens)
        binding.bind_cpu_input("positions", self.positions)
        self.engine.run_decoder(session, binding)
        log_probs = self.cache.log_probs

        order = np.arange(rows)  # rows of the next step, as indices into this step's rows
        next_tokens = np.full(rows, self.engine.bos_id, np.int64)
        dead: list[int] = []  # rows of sentences that finished: holes until refilled
        idle: list[int] = []  # rows of holes left earlier, idle this step
        done: list[tuple[Hashable, Translation]] = []
        moved = False
        row = 0
        self._ban_repeats(log_probs)
        # One pass over the whole block for every row's best (cheaper than one per row): the
        # beams' bound, and the greedy rows' pick. The argmax only once a greedy row needs it.
        row_max = log_probs.max(axis=1)
        best: list[int] | None = None
        picked: list[float] = []
        for index, sentence in enumerate(self.sentences):
            width = sentence.width
            if isinstance(sentence, _Hole):
                idle.extend(range(row, row + width))
                row += width
                continue
            if width == 1:
                if best is None:
                    best, picked = log_probs.argmax(axis=1).tolist(), row_max.tolist()
                parents, tokens = self._greedy(sentence, best[row], picked[row])
            else:
                parents, tokens = self._beam(
                    sentence, log_probs[row : row + width], row_max[row : row + width]
                )
            if parents is None:
                done.append((sentence.key, self._result(sentence)))
                self.sentences[index] = _Hole(width)
                self._holes = True
                dead.extend(range(row, row + width))
            elif width == 1:
                next_tokens[row] = tokens[0]
            else:
                if parents != list(range(width)):
                    order[row : row + width] = [row + p for p in parents]
                    moved = True
                next_tokens[row : row + width] = tokens
            row += width
        self._advance(order if moved else None, next_tokens, dead, idle)
        return done

    def _idle_rows(self) -> int:
        return sum(s.width for s in self.sentences if isinstance(s, _Hole))

    def _ban_repeats(self, log_probs: np.ndarray) -> None:
        """Rule out, row by row, each token that would repeat an n-gram of the row's prefix
        (sentences with ``no_repeat_ngram_size``), as CTranslate2 and Hugging Face do: an
        undertrained model's usual failure is a loop that runs to the length cap."""
        row = 0
        for sentence in self.sentences:
            if isinstance(sentence, _Hole):
                row += sentence.width
                continue
            size = sentence.options.no_repeat_ngram_size
            if size:
                for beam, prefix in enumerate(sentence.prefixes):
                    banned = repeated_ngram_ends(prefix, size)
                    if banned:
                        log_probs[row + beam, banned] = NEG_INF
            row += sentence.width

    def _greedy(self, sentence: _Sentence, token: int, log_prob: float):
        sentence.steps += 1
        sentence.scores[0] += log_prob
        if token == self.engine.eos_id:
            sentence.finished.append((sentence.scores[0], sentence.prefixes[0]))
            return None, None
        sentence.prefixes[0].append(token)
        if sentence.steps >= sentence.max_new:
            sentence.finished.append((sentence.scores[0], sentence.prefixes[0]))
            return None, None
        return [0], [token]

    def _normalised(self, score: float, length: int, options: DecodeOptions) -> float:
        return score / (max(length, 1) ** options.length_penalty)

    def _beam(self, sentence: _Sentence, log_probs: np.ndarray, row_max: np.ndarray):
        """One step of beam search for one sentence: keep the ``beam_size`` best continuations,
        set aside hypotheses that end in EOS."""
        width = sentence.width
        eos = self.engine.eos_id
        sentence.steps += 1
        count = min(2 * width, log_probs.size - 1)
        top = zip(*top_candidates(sentence.scores, log_probs, count, row_max=row_max), strict=True)
        parents, tokens, scores, prefixes = [], [], [], []
        for rank, (beam, token, score) in enumerate(top):
            if score <= NEG_INF / 2:
                break
            if token == eos:
                # Only an ending that would have made the beam counts (as in fairseq): EOS
                # candidates ranked below it would fill the n-best with poor early stops.
                if rank < width:
                    sentence.finished.append((score, sentence.prefixes[beam]))
                continue
            parents.append(beam)
            tokens.append(token)
            scores.append(score)
            prefixes.append([*sentence.prefixes[beam], token])
            if len(parents) == width:
                break
        at_limit = sentence.steps >= sentence.max_new
        if at_limit:
            sentence.finished.extend(zip(scores, prefixes, strict=True))
        if at_limit or not parents or self._beam_done(sentence, scores):
            return None, None
        while len(parents) < width:  # keep the block's width; dead rows never win
            parents.append(parents[0])
            tokens.append(tokens[0])
            scores.append(NEG_INF)
            prefixes.append(prefixes[0])
        sentence.scores = np.asarray(scores, np.float64)
        sentence.prefixes = prefixes
        return parents, tokens

    def _beam_done(self, sentence: _Sentence, active_scores: list[float]) -> bool:
        """Stop once the n-best are finished and the best active beam, normalised at its next
        length, no longer beats the worst of them (the heuristic of HF's early_stopping=False;
        counting finished hypotheses alone, as fairseq does, lets poor early endings of lower
        beams stop the search while the best beam is one token from its end)."""
        options = sentence.options
        if len(sentence.finished) < options.num_hypotheses:
            return False
        kept = sorted(
            (self._normalised(s, len(p) + 1, options) for s, p in sentence.finished), reverse=True
        )[: options.num_hypotheses]
        best_active = self._normalised(max(active_scores), sentence.steps + 1, options)
        return best_active < kept[-1]

    def _result(self, sentence: _Sentence) -> Translation:
        options = sentence.options
        eos = self.engine.eos_id
        ranked = []
        for log_prob, prefix in sentence.finished:
            length = len(prefix) + 1 if len(prefix) < sentence.max_new else len(prefix)
            ranked.append((self._normalised(log_prob, length, options), log_prob, length, prefix))
        ranked.sort(key=lambda item: -item[0])
        hypotheses = []
        for score, log_prob, length, prefix in ranked[: options.num_hypotheses]:
            ids = [t for t in prefix if t != eos]
            hypotheses.append(
                Hypothesis(
                    text=self.engine.detokenize(ids),
                    token_ids=ids,
                    tokens=[self.engine.vocabulary.piece(t) for t in ids],
                    score=_finite_or_minus_inf(score),
                    log_prob=_finite_or_minus_inf(log_prob),
                    length=length,
                )
            )
        return Translation(hypotheses)

    # -- batch bookkeeping ----------------------------------------------------------------------
    def _advance(
        self, order: np.ndarray | None, tokens: np.ndarray, dead: list[int], idle: list[int]
    ) -> None:
        """After a step: beams take their parents' cache rows (``order``, None when no row
        moved), every row gets its next token, finished rows become holes. Beams reorder only
        within their sentence, whose rows share one source: the cross keys/values stay put.
        Idle rows stay at position 0, seeing nothing but themselves."""
        self.tokens = tokens
        if order is None:
            self.positions = self.positions + 1
        else:
            # Columns up to the parents' positions: this step's key/value included.
            self.cache.gather(order, int(self.positions.max()) + 1, cross=False)
            self.positions = self.positions[order] + 1
        if idle:
            self.positions[idle] = 0
        if dead:
            self.positions[dead] = 0

    def _compact(self) -> None:
        """Drop the holes' rows."""
        order_list, row, live = [], 0, []
        for sentence in self.sentences:
            if not isinstance(sentence, _Hole):
                order_list.extend(range(row, row + sentence.width))
                live.append(sentence)
            row += sentence.width
        order = np.asarray(order_list, np.int64)
        self.sentences = live
        self._holes = False
        columns = int(self.positions.max()) if len(self.positions) else 0
        self.cache.gather(order, columns, cross=True)
        self.tokens, self.positions = self.tokens[order], self.positions[order]
        mask = self.cache.src_mask[: len(order)]
        src_width = int(mask.any(axis=0).nonzero()[0].max()) + 1 if mask.any() else 0
        self.cache.shrink(int(self.positions.max()) + 1 if len(order) else 0, src_width)

    def _admit(self) -> None:
        """Encode the waiting sentences; each takes over a hole of its width when there is
        one, the rest are appended to the running rows."""
        e = self.engine
        new, self.waiting = self.waiting, []
        if (self._holes and all(isinstance(s, _Hole) for s in self.sentences)
                and sorted(s.width for s in self.sentences) != sorted(s.width for s in new)):
            # Nothing running: start afresh rather than in old rows. Unless the newcomers
            # fill the holes exactly (a lone client's next sentence): then the rows, and so
            # the graph's bindings, stay as they are (compacting and binding anew cost ~10% of
            # such a step).
            self._compact()
        # After compacting, which may have given back the width of sources that left.
        self.cache.reserve(self.cache.rows, src_width=max(len(s.source_ids) for s in new))
        holes: dict[int, list[int]] = {}  # width -> [index in self.sentences]
        for index, sentence in enumerate(self.sentences):
            if isinstance(sentence, _Hole):
                holes.setdefault(sentence.width, []).append(index)
        starts = np.cumsum([0] + [s.width for s in self.sentences])
        first_rows = [0] * len(new)  # each newcomer's first row
        appended = []
        for i, sentence in enumerate(new):
            free = holes.get(sentence.width)
            if not free:
                appended.append(i)
                continue
            index = free.pop(0)
            first_rows[i] = int(starts[index])
            self.sentences[index] = sentence
            rows = slice(first_rows[i], first_rows[i] + sentence.width)
            self.tokens[rows] = e.bos_id  # its self cache is empty (position 0)
            self.positions[rows] = 0
        if appended:
            first = self.cache.rows
            added = sum(new[i].width for i in appended)
            self.cache.reserve(first + added)
            self.cache.set_rows(first + added)
            for i in appended:
                first_rows[i] = first
                self.sentences.append(new[i])
                first += new[i].width
            self.tokens = np.concatenate([self.tokens, np.full(added, e.bos_id, np.int64)])
            self.positions = np.concatenate([self.positions, np.zeros(added, np.int64)])
        # Each length group's outputs go straight into their rows, one copy per beam: one
        # write per layer for the whole group, not one per sentence (at 64 sentences of beam
        # 2 the per-sentence writes took a sixth of the decode).
        for members, encoded in self._encode([s.source_ids for s in new]):
            widths = [new[i].width for i in members]
            rows = np.concatenate(
                [np.arange(first_rows[i], first_rows[i] + new[i].width) for i in members]
            )
            picks = np.repeat(np.arange(len(members)), widths)
            self.cache.write_source(rows, encoded, picks)

    def _encode(self, sources: list[list[int]]) -> list[tuple[list[int], Encoded]]:
        """The encoder's outputs for ``sources``, as (members, outputs) per call: ``members``
        index ``sources``, whose outputs are the call's rows in that order, each padded to the
        call's longest.

        Sentences run through the encoder in groups of similar length (``length_groups``):
        its cost is rows x padded length, and the sentences the service admits together are
        of any length; one 150-token sentence would make each short one beside it cost 150."""
        lengths = [len(ids) for ids in sources]
        order = sorted(range(len(sources)), key=lambda i: -lengths[i])
        groups = length_groups([lengths[i] for i in order])
        if len(groups) == 1:  # one call, in the given order
            order, groups = list(range(len(sources))), [slice(0, len(sources))]
        run = self.engine.run_encoder
        return [(order[g], run(self._source_batch([sources[i] for i in order[g]]))) for g in groups]

    def _source_batch(self, sources: list[list[int]]) -> np.ndarray:
        """``sources`` as one int64 array, padded to the longest."""
        batch = np.full((len(sources), max(map(len, sources))), self.engine.pad_id, np.int64)
        for row, ids in enumerate(sources):
            batch[row, : len(ids)] = ids
        return batch
