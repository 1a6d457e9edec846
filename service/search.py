"""The search: which continuations each sentence keeps at each decoder step (greedy, beam with
an n-best, the n-gram ban) and the translation it ends with. Plain functions on a sentence's
state and its rows' log-probabilities; the running batch (``service.batch``) calls them and
owns the rows, the engine (``service.engine``) runs the graphs."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from service.vocabulary import Vocabulary

NEG_INF = -1e30


@dataclass(frozen=True)
class DecodeOptions:
    beam_size: int = 1
    length_penalty: float = 1.0  # score = log P / length ** length_penalty
    max_length: int = 256  # absolute cap on generated target tokens
    max_length_ratio: float = 2.0  # and at most ratio * source tokens + 10
    num_hypotheses: int = 1  # n-best, at most beam_size
    no_repeat_ngram_size: int = 0  # > 0: no n-gram of this size twice in a translation
    # No digit in a translation that its source does not hold: a model that invents one turns
    # a number written as a word into another number ("twenty" -> "2"), also beside the
    # markers ({0}) of masked items, which hold digits of their own.
    digits_from_source: bool = True

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

    def max_new_tokens(self, source_length: int, max_positions: int | None = None) -> int:
        """The most target tokens a source of ``source_length`` tokens (EOS included) may get:
        ``max_length``, ``max_length_ratio`` x source + 10, and the model's positions."""
        cap = min(self.max_length, int(self.max_length_ratio * source_length) + 10)
        return cap if max_positions is None else min(cap, max_positions - 1)


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
class Sentence:
    """One sentence's search in flight: ``beam_size`` beams (consecutive rows of a batch)."""

    key: Hashable
    source_ids: list[int]
    options: DecodeOptions
    max_new: int
    scores: np.ndarray  # cumulative log-prob per beam
    prefixes: list[list[int]]  # generated ids per beam
    finished: list[tuple[float, list[int]]] = field(default_factory=list)
    steps: int = 0
    banned: list[int] = field(default_factory=list)  # target ids never generated
    # Each row's beam rank, 0 the best: a new beam takes its parent's row where it can
    # (``beam_step``), so rows are not in rank order, and ties go to the lower rank.
    ranks: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, key: Hashable, source_ids: list[int], options: DecodeOptions,
              max_positions: int, banned: list[int] | None = None) -> Sentence:
        scores = np.full(options.beam_size, NEG_INF, np.float64)
        scores[0] = 0.0  # all beams start identical: only one may expand at the first step
        return cls(key, source_ids, options,
                   options.max_new_tokens(len(source_ids), max_positions), scores,
                   [[] for _ in range(options.beam_size)], banned=banned or [],
                   ranks=list(range(options.beam_size)))

    @property
    def width(self) -> int:
        return self.options.beam_size


def _finite_or_minus_inf(value: float) -> float:
    """A plain Python float, with anything not finite (inf, nan) as -inf."""
    return float(value) if math.isfinite(value) else float("-inf")


CANDIDATE_MARGINS = (4.0, 8.0)  # nats below the best total, tried in turn
# More entries than this within a margin (a flat distribution over a large vocabulary) cost more
# to sort than a partition per row costs to find a tighter cut-off.
CANDIDATE_SORT_LIMIT = 4096
# Over a flat block the cut-off first comes from every this-many-th entry of the best row: its
# ``count``-th best is at most the row's own, so the cut-off admits at least ``count`` entries
# (about this many times ``count`` per row), found at a small part of a partition's cost.
CANDIDATE_SAMPLE_STRIDE = 16


def top_candidates(
    scores: np.ndarray, log_probs: np.ndarray, count: int, row_max: np.ndarray | None = None,
    ranks: Sequence[int] | None = None,
) -> tuple[list[int], list[int], list[float]]:
    """The ``count`` best (beam, token) pairs by ``scores[beam] + log_probs[beam, token]``, best
    first, as (beams, tokens, totals); equal totals in the order of the beams' ``ranks``
    (default: their rows), then of the tokens.

    Exact, yet it never sorts the whole [beams, vocab] block, the largest cost of a beam step
    after the decoder. Every pair at or above a cut-off is a candidate; any cut-off at or below
    the ``count``-th best total admits the best ``count``, so the best of the candidates are
    the best overall. Cut-offs tried in turn (docs/benchmarks.md has the measurements):

    * a margin below the best total (``CANDIDATE_MARGINS``): next-token distributions are
      peaked, so few entries come within it, and one vectorised comparison finds them;
    * when a margin admits more than ``CANDIDATE_SORT_LIMIT`` (rows nearly flat over a large
      vocabulary), the best row's sampled ``count``-th best (``CANDIDATE_SAMPLE_STRIDE``);
    * when even the widest margin admits fewer than ``count`` (rows so peaked that a wider
      margin would admit thousands), or the sample still admits too many, each row's
      ``count``-th best log-prob from a partition: the best row alone then puts ``count``
      entries over it.

    ``row_max`` is ``log_probs.max(axis=1)`` when the caller has it already."""
    if row_max is None:
        row_max = log_probs.max(axis=1)
    row_best = scores + row_max
    best = float(row_best.max())
    vocab = log_probs.shape[1]
    attempts: list[float | str] = [*CANDIDATE_MARGINS, "partition"]
    while True:
        attempt = attempts.pop(0)
        if attempt == "sample":
            beam = int(row_best.argmax())
            sample = log_probs[beam, ::CANDIDATE_SAMPLE_STRIDE]
            cutoff = float(scores[beam]) + float(
                np.partition(sample, len(sample) - count)[len(sample) - count])
        elif attempt == "partition":
            if count <= vocab:
                kth = np.partition(log_probs, vocab - count, axis=1)[:, vocab - count]
                cutoff = float((scores + kth).max())
            else:  # no row holds ``count`` entries: every entry is a candidate
                cutoff = -math.inf
        else:
            cutoff = best - attempt
        # Per-row thresholds on the float32 log-probs; rows that cannot reach the cut-off
        # (a dead beam's score is NEG_INF) get +inf and contribute nothing.
        limits = np.where(row_best >= cutoff, cutoff - scores, np.inf).astype(np.float32)
        admitted = log_probs >= limits[:, None]
        # Counted before they are listed: over a flat row a margin admits the whole block,
        # and listing it only to find it too long cost a third of the search's time.
        found = int(np.count_nonzero(admitted))
        if attempt == "partition":
            break
        if found > CANDIDATE_SORT_LIMIT:
            sampled = attempt == "sample" or -(-vocab // CANDIDATE_SAMPLE_STRIDE) < count
            attempts = ["partition"] if sampled else ["sample", "partition"]
        elif found >= count:
            break
    # flatnonzero and a divmod: numpy's 2-D nonzero is 13x slower on such a block.
    beams, tokens = np.divmod(np.flatnonzero(admitted), vocab)
    totals = scores[beams] + log_probs[beams, tokens].astype(np.float64)
    tie_order = beams if ranks is None else np.asarray(ranks)[beams]
    order = np.lexsort((tokens, tie_order, -totals))[:count]  # ties: lower rank, then token
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


def ban_repeats(sentence: Sentence, log_probs: np.ndarray) -> None:
    """Rule out in each beam's row of ``log_probs`` (the sentence's block) the sentence's
    banned tokens, and every token that would repeat an n-gram of the beam's prefix
    (``no_repeat_ngram_size``), as CTranslate2 and Hugging Face do: an undertrained model's
    usual failure is a loop that runs to the length cap."""
    if sentence.banned:
        log_probs[:, sentence.banned] = NEG_INF
    size = sentence.options.no_repeat_ngram_size
    if size:
        for beam, prefix in enumerate(sentence.prefixes):
            banned = repeated_ngram_ends(prefix, size)
            if banned:
                log_probs[beam, banned] = NEG_INF


def greedy_step(sentence: Sentence, token: int, log_prob: float, eos: int
                ) -> tuple[list[int], list[int]] | tuple[None, None]:
    """One greedy step: ``token`` (the row's best, at ``log_prob``) extends the sentence;
    (parents, tokens) for the next step, or (None, None) when it ended."""
    sentence.steps += 1
    sentence.scores[0] += log_prob
    if token == eos:
        sentence.finished.append((sentence.scores[0], sentence.prefixes[0]))
        return None, None
    sentence.prefixes[0].append(token)
    if sentence.steps >= sentence.max_new:
        sentence.finished.append((sentence.scores[0], sentence.prefixes[0]))
        return None, None
    return [0], [token]


def normalised(score: float, length: int, options: DecodeOptions) -> float:
    """What hypotheses are ranked by: log-probability / length ** length_penalty."""
    return score / (max(length, 1) ** options.length_penalty)


def beam_step(sentence: Sentence, log_probs: np.ndarray, row_max: np.ndarray, eos: int
              ) -> tuple[list[int], list[int]] | tuple[None, None]:
    """One step of beam search for one sentence: keep the ``beam_size`` best continuations,
    set aside hypotheses that end in EOS. Returns each row's parent row and next token."""
    width = sentence.width
    sentence.steps += 1
    count = min(2 * width, log_probs.size - 1)
    top = zip(*top_candidates(sentence.scores, log_probs, count, row_max=row_max,
                              ranks=sentence.ranks), strict=True)
    parents, tokens, scores, prefixes = [], [], [], []  # the new beams, best first
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
    if at_limit or not parents or beam_done(sentence, scores):
        return None, None
    rows = beam_rows(parents, width)
    # Rows no beam took stay dead (they never win) and keep their own history: no copy.
    dead = [row for row in range(width) if row not in rows]
    row_parents, row_tokens = list(range(width)), [tokens[0]] * width
    row_scores, row_prefixes = [NEG_INF] * width, [prefixes[0]] * width
    row_ranks = [0] * width
    for rank, row in enumerate(rows + dead):  # the dead rank after every live beam
        row_ranks[row] = rank
    for rank, row in enumerate(rows):
        row_parents[row], row_tokens[row] = parents[rank], tokens[rank]
        row_scores[row], row_prefixes[row] = scores[rank], prefixes[rank]
    sentence.scores = np.asarray(row_scores, np.float64)
    sentence.prefixes = row_prefixes
    sentence.ranks = row_ranks
    return row_parents, row_tokens


def beam_rows(parents: Sequence[int], width: int) -> list[int]:
    """The row of each new beam (best first) of parents ``parents``: a parent's first child
    takes over its row, the others the rows of parents that left none; each row so moved costs
    a copy of its whole self-attention history (``BatchCache.gather``). Keeping beams in
    rank order instead made 48% of the rows move at each step of beam 4 against 19%, and 24%
    against 13% at beam 2 (300 test sentences)."""
    rows: list[int | None] = []
    taken = [False] * width
    for parent in parents:
        rows.append(None if taken[parent] else parent)
        taken[parent] = True
    free = (row for row in range(width) if not taken[row])
    return [next(free) if row is None else row for row in rows]


def beam_done(sentence: Sentence, active_scores: list[float]) -> bool:
    """Stop once the n-best are finished and the best active beam, normalised at its next
    length, no longer beats the worst of them (the heuristic of HF's early_stopping=False;
    counting finished hypotheses alone, as fairseq does, lets poor early endings of lower
    beams stop the search while the best beam is one token from its end)."""
    options = sentence.options
    if len(sentence.finished) < options.num_hypotheses:
        return False
    kept = sorted(
        (normalised(s, len(p) + 1, options) for s, p in sentence.finished), reverse=True
    )[: options.num_hypotheses]
    best_active = normalised(max(active_scores), sentence.steps + 1, options)
    return best_active < kept[-1]


def result(sentence: Sentence, vocabulary: Vocabulary, eos: int) -> Translation:
    """The sentence's ``num_hypotheses`` best finished hypotheses, best first."""
    options = sentence.options
    ranked = []
    for log_prob, prefix in sentence.finished:
        length = len(prefix) + 1 if len(prefix) < sentence.max_new else len(prefix)
        ranked.append((normalised(log_prob, length, options), log_prob, length, prefix))
    ranked.sort(key=lambda item: -item[0])
    hypotheses = []
    for score, log_prob, length, prefix in ranked[: options.num_hypotheses]:
        ids = [t for t in prefix if t != eos]
        hypotheses.append(
            Hypothesis(
                text=vocabulary.decode(ids),
                token_ids=ids,
                tokens=[vocabulary.piece(t) for t in ids],
                score=_finite_or_minus_inf(score),
                log_prob=_finite_or_minus_inf(log_prob),
                length=length,
            )
        )
    return Translation(hypotheses)
