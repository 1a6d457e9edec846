"""The running batch: rows decoded together, which sentences join between steps and leave the
step they finish (what the service's scheduler builds on).

A sentence's encoder runs once as it joins; its cross-attention keys/values are written into
the batch's buffers (``service.cache``). The rows of a sentence that left idle until a newcomer
takes them over (``Hole``). Cache layout (the ONNX contract, ``service.bundle``): each row's
self-attention cache is left-aligned, its ``position`` earlier tokens in columns
0 .. position - 1, whatever the other rows hold; the decoder graph attends over those columns
(and the row's real source positions) only and writes the new key/value after them, in place.
So a sentence joins a running batch at once, and its numbers are bit-identical to its own,
decoded alone.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnxruntime as ort

from service import search
from service.cache import BatchCache
from service.search import DecodeOptions, Sentence, Translation
from service.vocabulary import Vocabulary

# The encoder's outputs: cross keys, cross values, source mask, cross_last (service.bundle).
Encoded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class SourceTooLong(ValueError):
    """A sentence needs more source positions than the model has; split it first."""


class Model(Protocol):
    """What a batch needs of the model it decodes with (``service.engine.Engine``): its graphs,
    its cache buffers and its special tokens. Named here so that the batch does not import the
    engine that builds it."""

    bos_id: int
    eos_id: int
    pad_id: int
    vocabulary: Vocabulary

    def new_cache(self) -> BatchCache: ...

    def run_encoder(self, src_tokens: np.ndarray) -> Encoded: ...

    def decoder_for(self, rows: int) -> ort.InferenceSession: ...

    def run_decoder(self, session: ort.InferenceSession, binding: ort.IOBinding) -> None: ...



@dataclass
class Hole:
    """The rows of a sentence that left. A waiting sentence of the same width takes them over
    at the next step (its encoder output is written into them, no cache is copied). Until then
    they idle (position 0: they attend to nothing but themselves); once idle rows are a quarter
    of the batch they are compacted away (``COMPACT_IDLE_SHARE``)."""

    width: int


# Holes are compacted away once they hold this share of the rows. Until then a newcomer of the
# same width takes a hole over at no cost, where compacting copies every row's cache twice; an
# idle row costs only one row of a step.
COMPACT_IDLE_SHARE = 0.25

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


class DecodeBatch:
    """Rows decoded together. ``add`` queues a sentence (encoded at the next step), ``step``
    runs one decoder step for every row and returns the sentences that finished."""

    def __init__(self, engine: Model):
        self.engine = engine
        self.sentences: list[Sentence | Hole] = []  # in row order
        self.waiting: list[Sentence] = []
        # Every cache lives in ``cache``'s buffers, which the graph updates in place; a row's
        # position is its self-cache length (see the module docstring).
        self.cache = engine.new_cache()
        self.tokens = np.zeros(0, np.int64)
        self.positions = np.zeros(0, np.int64)
        self._holes = False  # some entries of self.sentences are Hole
        self._bound: dict[int, tuple[ort.IOBinding, int]] = {}  # per session: binding, version
        self._draining = False  # reserve_to_drain: runs until it empties, keeps its buffers

    def __len__(self) -> int:
        return sum(not isinstance(s, Hole) for s in self.sentences) + len(self.waiting)

    @property
    def num_rows(self) -> int:
        live = sum(s.width for s in self.sentences if not isinstance(s, Hole))
        return live + sum(s.width for s in self.waiting)

    def add(self, key: Hashable, source_ids: list[int], options: DecodeOptions) -> None:
        e = self.engine
        if not source_ids:
            raise ValueError("source_ids is empty (use Engine.tokenize)")
        if len(source_ids) > e.max_source_tokens:
            raise SourceTooLong(
                f"{len(source_ids)} source tokens; the model accepts at most {e.max_source_tokens}"
            )
        banned = e.vocabulary.digits_not_in(source_ids) if options.digits_from_source else None
        self.waiting.append(Sentence.start(key, source_ids, options, e.bundle.max_positions,
                                           banned))

    def reserve_to_drain(self) -> None:
        """Room at once for the rows and the longest history the queued sentences can reach,
        for a batch that runs until it drains (``Engine.translate``): growing the self caches
        midway copies them into new memory, which cost a 64-row beam-4 batch of the
        Opus-MT-size model 7% of its decode. Pages of columns never written are never
        touched, so the memory used stays what the sentences need. Such a batch is not shrunk
        as its sentences leave (it ends when the last does): shrinking, then growing again as
        the longest went on, cost the default model 8% of a 32-sentence beam-4 decode."""
        self._draining = True
        if self.waiting:
            columns = max(s.max_new for s in self.waiting) + 1
            self.cache.reserve(self.cache.rows + sum(s.width for s in self.waiting), columns)

    def remove(self, key: Hashable) -> None:
        self.waiting = [s for s in self.waiting if s.key != key]
        row = 0
        for index, sentence in enumerate(self.sentences):
            if not isinstance(sentence, Hole) and sentence.key == key:
                self.sentences[index] = Hole(sentence.width)
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
        eos, vocabulary = self.engine.eos_id, self.engine.vocabulary
        self._ban_repeats(log_probs)
        # One pass over the whole block for every row's best (cheaper than one per row): the
        # beams' bound, and the greedy rows' pick. The argmax only once a greedy row needs it.
        row_max = log_probs.max(axis=1)
        best: list[int] | None = None
        picked: list[float] = []
        for index, sentence in enumerate(self.sentences):
            width = sentence.width
            if isinstance(sentence, Hole):
                idle.extend(range(row, row + width))
                row += width
                continue
            if width == 1:
                if best is None:
                    best, picked = log_probs.argmax(axis=1).tolist(), row_max.tolist()
                parents, tokens = search.greedy_step(sentence, best[row], picked[row], eos)
            else:
                parents, tokens = search.beam_step(
                    sentence, log_probs[row : row + width], row_max[row : row + width], eos
                )
            if parents is None:
                done.append((sentence.key, search.result(sentence, vocabulary, eos)))
                self.sentences[index] = Hole(width)
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
        return sum(s.width for s in self.sentences if isinstance(s, Hole))

    def _ban_repeats(self, log_probs: np.ndarray) -> None:
        """``search.ban_repeats`` on every sentence's block of rows, before any row's best is
        taken."""
        row = 0
        for sentence in self.sentences:
            if not isinstance(sentence, Hole):
                search.ban_repeats(sentence, log_probs[row : row + sentence.width])
            row += sentence.width

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
            if not isinstance(sentence, Hole):
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
        if not self._draining:
            self.cache.shrink(int(self.positions.max()) + 1 if len(order) else 0, src_width)

    def _admit(self) -> None:
        """Encode the waiting sentences; each takes over a hole of its width when there is
        one, the rest are appended to the running rows."""
        e = self.engine
        new, self.waiting = self.waiting, []
        if (self._holes and all(isinstance(s, Hole) for s in self.sentences)
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
            if isinstance(sentence, Hole):
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
