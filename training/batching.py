"""Tokenised splits and length-bucketed, token-budget batches.

A split is tokenised once with the SentencePiece model and kept as flat int32 arrays plus
offsets (a ``.npz`` cache beside the TSV, keyed by the vocabulary and the length limit), so a
million pairs cost a few dozen megabytes instead of gigabytes of Python lists. Each source is
``pieces + EOS``; each target is ``BOS + pieces + EOS`` (the decoder reads ``target[:-1]`` and
predicts ``target[1:]``). Pairs that would not fit the model's positions are dropped and counted.

Batches are formed per epoch, deterministically from ``(seed, epoch)``: shuffle, cut into large
chunks, sort each chunk by length, fill batches up to ``batch_tokens`` padded tokens (target and
source), then shuffle the batch order. Under DDP every rank takes every ``world_size``-th batch.
``BatchIterator.state_dict()`` is the data position: resuming from it yields exactly the next
batch.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from training.config import BOS_ID, EOS_ID, PAD_ID

logger = logging.getLogger(__name__)

CACHE_VERSION = 1
_ENCODE_CHUNK = 50_000  # pairs tokenised at a time: bounds the Python lists alive at once


# ---------------------------------------------------------------------------------------------
# Tokenised splits


@dataclass
class TokenizedSplit:
    """Concatenated token ids of every kept pair; pair ``i`` is
    ``src[src_offsets[i]:src_offsets[i + 1]]`` (and likewise for the target)."""

    src: np.ndarray  # int32, each sequence ends with EOS
    src_offsets: np.ndarray  # int64 [n + 1]
    tgt: np.ndarray  # int32, each sequence is BOS ... EOS
    tgt_offsets: np.ndarray  # int64 [n + 1]
    kept: np.ndarray  # int64 [n]: the TSV line (0-based) each pair came from
    dropped: int  # pairs longer than the model's positions

    def __len__(self) -> int:
        return len(self.kept)

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.src[self.src_offsets[i] : self.src_offsets[i + 1]],
                self.tgt[self.tgt_offsets[i] : self.tgt_offsets[i + 1]])


def split_file(data_dir: str | Path, name: str) -> Path:
    """A prepared split ``{name}.tsv`` in ``data_dir``, or its compressed copy
    (``{name}.tsv.xz`` or ``.gz``, e.g. one carried to a GPU machine) where that is all there is."""
    for suffix in ("", ".xz", ".gz"):
        path = Path(data_dir) / f"{name}.tsv{suffix}"
        if path.is_file():
            return path
    raise FileNotFoundError(f"{Path(data_dir) / name}.tsv (or .tsv.xz, .tsv.gz) not found: "
                            "run `translate-train prepare` first")


def _iter_tsv(path: Path) -> Iterator[tuple[str, str]]:
    """Stream a prepared split, plain or compressed (the format ``training.corpus.read_tsv``
    reads, without holding it all in memory)."""
    from training.corpus import _open_text

    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != 2:
                raise ValueError(f"{path}:{lineno}: expected 2 tab-separated fields, "
                                 f"got {len(fields)}")
            yield fields[0], fields[1]


def _flatten(sequences: list[list[int]], prefix: list[int], suffix: list[int]) -> np.ndarray:
    total = sum(len(s) for s in sequences) + len(sequences) * (len(prefix) + len(suffix))
    flat = chain.from_iterable(chain(prefix, s, suffix) for s in sequences)
    return np.fromiter(flat, dtype=np.int32, count=total)


def encode_pairs(pairs, sp, max_positions: int, threads: int = 0) -> TokenizedSplit:
    """Tokenise ``(source, target)`` pairs; drop those whose source (with EOS) or decoder input
    (BOS + pieces) exceeds ``max_positions``."""
    src_parts, tgt_parts, src_lens, tgt_lens, kept = [], [], [], [], []
    dropped, line = 0, 0
    pairs = iter(pairs)
    while True:
        chunk = [p for _, p in zip(range(_ENCODE_CHUNK), pairs, strict=False)]
        if not chunk:
            break
        src_ids = sp.encode([s for s, _ in chunk], out_type=int, num_threads=threads or -1)
        tgt_ids = sp.encode([t for _, t in chunk], out_type=int, num_threads=threads or -1)
        keep_src, keep_tgt = [], []
        for j, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
            if len(s) + 1 > max_positions or len(t) + 1 > max_positions:
                dropped += 1
                continue
            keep_src.append(s)
            keep_tgt.append(t)
            src_lens.append(len(s) + 1)
            tgt_lens.append(len(t) + 2)
            kept.append(line + j)
        src_parts.append(_flatten(keep_src, [], [EOS_ID]))
        tgt_parts.append(_flatten(keep_tgt, [BOS_ID], [EOS_ID]))
        line += len(chunk)

    def offsets(lengths: list[int]) -> np.ndarray:
        out = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(lengths, dtype=np.int64), out=out[1:])
        return out

    empty = np.zeros(0, dtype=np.int32)
    return TokenizedSplit(
        src=np.concatenate(src_parts) if src_parts else empty,
        src_offsets=offsets(src_lens),
        tgt=np.concatenate(tgt_parts) if tgt_parts else empty,
        tgt_offsets=offsets(tgt_lens),
        kept=np.asarray(kept, dtype=np.int64),
        dropped=dropped,
    )


def _cache_path(tsv: Path, vocab: Path, max_positions: int) -> Path:
    stat = tsv.stat()
    key = hashlib.sha1()
    key.update(vocab.read_bytes())
    key.update(f"{CACHE_VERSION}/{max_positions}/{stat.st_size}/{stat.st_mtime_ns}".encode())
    stem = tsv.name.split(".")[0]  # train.tsv and train.tsv.xz share one cache name
    return tsv.parent / "cache" / f"{stem}.{key.hexdigest()[:16]}.npz"


def load_split(tsv: str | Path, vocab: str | Path, max_positions: int, *, cache: bool = True,
               threads: int = 0) -> TokenizedSplit:
    """Tokenise a prepared split with the SentencePiece model at ``vocab``, through a ``.npz``
    cache in ``{tsv dir}/cache/`` (rebuilt when the vocabulary, the limit or the file changes)."""
    from training.vocab import load_vocab

    tsv, vocab = Path(tsv), Path(vocab)
    path = _cache_path(tsv, vocab, max_positions)
    if cache and path.is_file():
        with np.load(path) as z:
            return TokenizedSplit(z["src"], z["src_offsets"], z["tgt"], z["tgt_offsets"],
                                  z["kept"], int(z["dropped"]))
    split = encode_pairs(_iter_tsv(tsv), load_vocab(vocab), max_positions, threads)
    logger.info("%s: %d pairs tokenised, %d dropped as longer than %d positions", tsv,
                len(split), split.dropped, max_positions)
    if cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
            np.savez(tmp, src=split.src, src_offsets=split.src_offsets, tgt=split.tgt,
                     tgt_offsets=split.tgt_offsets, kept=split.kept,
                     dropped=np.int64(split.dropped))
            os.replace(tmp, path)
        except OSError as error:  # a read-only data directory only costs re-tokenising
            logger.warning("could not write the token cache %s: %s", path, error)
    return split


# ---------------------------------------------------------------------------------------------
# Batches


def make_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, batch_tokens: int, *,
                 seed: int = 0, epoch: int = 0, shuffle: bool = True,
                 chunk_size: int = 1 << 16) -> list[np.ndarray]:
    """Group example indices into batches whose padded size (count x longest) stays within
    ``batch_tokens`` on the decoder input (target length - 1) and on the source.

    With ``shuffle`` the result depends only on ``(seed, epoch)``: examples are permuted, sorted
    by length within chunks of ``chunk_size`` (so a batch holds similar lengths but every epoch
    groups differently), and the batch order is permuted. Without it, all examples are sorted
    by length and batches come out in that order (for evaluation)."""
    n = len(tgt_lengths)
    dec_lengths = np.asarray(tgt_lengths, dtype=np.int64) - 1
    src_lengths = np.asarray(src_lengths, dtype=np.int64)
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(n)
        chunks = [order[i : i + chunk_size] for i in range(0, n, chunk_size)]
    else:
        rng = None
        chunks = [np.arange(n)]
    batches: list[np.ndarray] = []
    for chunk in chunks:
        # Sort by target then source length; the stable sort keeps the random order of ties.
        chunk = chunk[np.lexsort((src_lengths[chunk], dec_lengths[chunk]))]
        start, longest_src, longest_tgt = 0, 0, 0
        src_list, tgt_list = src_lengths[chunk].tolist(), dec_lengths[chunk].tolist()
        for j, (s, t) in enumerate(zip(src_list, tgt_list, strict=True)):
            count = j - start + 1
            new_src, new_tgt = max(longest_src, s), max(longest_tgt, t)
            if count > 1 and (count * new_src > batch_tokens or count * new_tgt > batch_tokens):
                batches.append(chunk[start:j])
                start, new_src, new_tgt = j, s, t
            longest_src, longest_tgt = new_src, new_tgt
        if start < len(chunk):
            batches.append(chunk[start:])
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def shard(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """Every ``world_size``-th batch starting at ``rank``; the tail that cannot be shared out
    evenly is dropped so that every rank takes the same number of steps."""
    usable = len(batches) // world_size * world_size
    return batches[rank:usable:world_size]


@dataclass
class Batch:
    src: Tensor  # [batch, src_len] int64, PAD-padded
    tgt_input: Tensor  # [batch, tgt_len] BOS ... (no EOS)
    tgt_output: Tensor  # [batch, tgt_len] ... EOS (targets shifted by one)
    indices: np.ndarray  # example indices in the split

    @property
    def target_tokens(self) -> int:
        return int((self.tgt_output != PAD_ID).sum())

    def to(self, device: torch.device | str) -> Batch:
        non_blocking = torch.device(device).type == "cuda"
        return Batch(self.src.to(device, non_blocking=non_blocking),
                     self.tgt_input.to(device, non_blocking=non_blocking),
                     self.tgt_output.to(device, non_blocking=non_blocking), self.indices)


def collate(split: TokenizedSplit, indices: np.ndarray) -> Batch:
    """Pad the chosen examples into tensors."""
    src_len = int(split.src_lengths[indices].max())
    tgt_len = int(split.tgt_lengths[indices].max())
    src = np.full((len(indices), src_len), PAD_ID, dtype=np.int64)
    tgt = np.full((len(indices), tgt_len), PAD_ID, dtype=np.int64)
    for row, i in enumerate(indices):
        s, t = split.pair(int(i))
        src[row, : len(s)] = s
        tgt[row, : len(t)] = t
    tgt_t = torch.from_numpy(tgt)
    return Batch(torch.from_numpy(src), tgt_t[:, :-1].clone(), tgt_t[:, 1:].clone(), indices)


class BatchIterator:
    """Endless stream of training batches for one rank, epoch after epoch.

    The position is ``(epoch, index)``: the next batch to yield is number ``index`` of this
    rank's share of epoch ``epoch``; ``state_dict``/``load_state_dict`` save and restore it."""

    def __init__(self, split: TokenizedSplit, batch_tokens: int, seed: int, *, rank: int = 0,
                 world_size: int = 1, chunk_size: int = 1 << 16):
        if len(split) == 0:
            raise ValueError("the training split has no pairs that fit the model")
        self.split, self.batch_tokens, self.seed = split, batch_tokens, seed
        self.rank, self.world_size, self.chunk_size = rank, world_size, chunk_size
        self.epoch, self.index = 0, 0
        self._batches: list[np.ndarray] | None = None

    def batches(self, epoch: int) -> list[np.ndarray]:
        all_batches = make_batches(self.split.src_lengths, self.split.tgt_lengths,
                                   self.batch_tokens, seed=self.seed, epoch=epoch,
                                   chunk_size=self.chunk_size)
        mine = shard(all_batches, self.rank, self.world_size)
        if not mine:
            raise ValueError(f"{len(all_batches)} batches cannot be shared by "
                             f"{self.world_size} ranks: lower batch_tokens or use more data")
        return mine

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._batches = None

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Batch:
        if self._batches is None:
            self._batches = self.batches(self.epoch)
        if self.index >= len(self._batches):
            self.epoch, self.index = self.epoch + 1, 0
            self._batches = self.batches(self.epoch)
        indices = self._batches[self.index]
        self.index += 1
        return collate(self.split, indices)
