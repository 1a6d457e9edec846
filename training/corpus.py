"""Turn raw parallel text into clean, deduplicated, leak-free train/dev/test splits.

The order of operations matters: cleaning before filtering (so lengths and duplicates are judged
on what the model will see), dedupe before the split (so a duplicate cannot sit on both sides of
it), and upsampling after the split (so dev/test measure each distinct pair once and never contain
copies of training pairs).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import lzma
import os
import random
import re
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from heapq import heapify, heappop, heappush
from itertools import zip_longest
from pathlib import Path
from typing import IO, Any

from service.normalize import clean_text
from training.config import DataConfig

logger = logging.getLogger(__name__)

# Held-out sets are filled only with small components: a component is a cluster of pairs that
# share a (normalised) source or target, and a single huge one (a dictionary headword with forty
# translations, "OK" in every UI catalogue) would otherwise be drawn whole into dev/test and make
# it unrepresentative, or overshoot its size.
MAX_HELDOUT_COMPONENT = 5

FILTERS = (
    "malformed",
    "empty",
    "too_short",
    "too_long",
    "ratio",
    "source_equals_target",
    "duplicate_exact",
    "duplicate_normalised",
)
_COMPRESSED = {".gz": gzip.open, ".xz": lzma.open}

# ---------------------------------------------------------------------------------------------
# Cleaning and normalisation

_PUNCT_RE = re.compile(r"[^\w\s]|_")
_DIGIT_RE = re.compile(r"\d")


def normalise(text: str) -> str:
    """The key under which near-identical sentences count as the same sentence.

    Case, punctuation, symbols and the actual digits rarely change what has to be learned, but
    they are exactly where copies of one UI string or verse differ ("Delete %s" / "Delete {0}",
    "Chapter 3" / "Chapter 4"); folding them keeps such copies out of dedupe and out of both
    sides of the split.
    """
    text = _DIGIT_RE.sub("0", _PUNCT_RE.sub("", text.casefold()))
    return " ".join(text.split())


def _copy_key(text: str) -> str:
    """``normalise`` without the case folding: the key under which a target counts as a copy of
    its source. Case is kept because it is often the whole translation (``trend`` -> ``Trend``,
    German capitalises nouns), whereas punctuation, digits and spacing are not."""
    return " ".join(_DIGIT_RE.sub("0", _PUNCT_RE.sub("", text)).split())


# ---------------------------------------------------------------------------------------------
# Reading


def _open_text(path: str | Path) -> IO[str]:
    opener = _COMPRESSED.get(Path(path).suffix, open)
    # newline="\n": a stray "\r" inside a field must not end the line (universal newlines would
    # split there and misalign the pair). Invalid UTF-8 becomes U+FFFD rather than aborting a
    # half-hour prepare over one bad byte.
    return opener(path, "rt", encoding="utf-8", errors="replace", newline="\n")


def _find_side(prefix: str, lang: str) -> Path | None:
    for suffix in ("", ".gz", ".xz"):
        candidate = Path(f"{prefix}.{lang}{suffix}")
        if candidate.is_file():
            return candidate
    return None


def _iter_raw(path: str, source_lang: str, target_lang: str) -> Iterator[tuple[str, str] | None]:
    """Yield raw pairs, and ``None`` for each line that is not a pair, so callers can count it."""
    if Path(path).is_file():
        with _open_text(path) as f:
            for line in f:
                fields = line.rstrip("\r\n").split("\t")
                yield (fields[0], fields[1]) if len(fields) == 2 else None
        return
    src_path, tgt_path = _find_side(path, source_lang), _find_side(path, target_lang)
    if src_path is None or tgt_path is None:
        raise FileNotFoundError(
            f"{path}: neither a TSV file nor a Moses pair {path}.{source_lang} + "
            f"{path}.{target_lang} (plain, .gz or .xz)"
        )
    with _open_text(src_path) as fs, _open_text(tgt_path) as ft:
        for lineno, (src, tgt) in enumerate(zip_longest(fs, ft), start=1):
            # A side that runs out first means the files are misaligned, and then every pair
            # read so far may be wrong: this must not pass silently.
            if src is None or tgt is None:
                raise ValueError(
                    f"{path}: {src_path.name} and {tgt_path.name} have different line counts "
                    f"({(src_path if tgt is None else tgt_path).name} ends at line {lineno - 1})"
                )
            yield src.rstrip("\r\n"), tgt.rstrip("\r\n")


def read_pairs(
    path: str, source_lang: str = "en", target_lang: str = "de"
) -> Iterator[tuple[str, str]]:
    """Raw pairs of one source (TSV file or Moses prefix, plain/.gz/.xz), uncleaned; lines that
    are not exactly two TSV fields are skipped."""
    for pair in _iter_raw(path, source_lang, target_lang):
        if pair is not None:
            yield pair


def read_tsv(path: str | Path) -> list[tuple[str, str]]:
    """Read a prepared split. Strict, because a malformed line here means a bug upstream."""
    pairs = []
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != 2:
                raise ValueError(f"{path}:{lineno}: expected 2 tab-separated fields, got "
                                 f"{len(fields)}")
            pairs.append((fields[0], fields[1]))
    return pairs


# ---------------------------------------------------------------------------------------------
# Splitting


class _UnionFind:
    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []

    def add(self) -> int:
        self.parent.append(len(self.parent))
        self.size.append(1)
        return len(self.parent) - 1

    def find(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving keeps later finds near O(1)
            i = parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a == b:
            return
        if self.size[a] < self.size[b]:
            a, b = b, a
        self.parent[b] = a
        self.size[a] += self.size[b]


def _stable_hash(text: str, seed: int) -> int:
    # Python's hash() is salted per process; the split must be the same on every run.
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=str(seed).encode())
    return int.from_bytes(digest.digest(), "big")


def _draw_per_source(queues: list[deque[int]], sizes: list[int], wanted: int,
                     shares: list[float]) -> list[int]:
    """Draw whole components (indices into ``sizes``) until ``wanted`` pairs are drawn, always
    from the source that has given the fewest pairs for its share so far, each source's
    components in draw order.

    So every source gets its share (``shares[s]`` relative to the others; 0 gives nothing), to
    within one component, unless it runs out of eligible components, and then the others make
    up the rest. Drawn components leave their queue.
    """
    drawn: list[int] = []
    total = 0
    given: dict[int, int] = {}
    # Ties go to the lower source index: the order of config.sources, hence deterministic.
    heap = [(0.0, s) for s, queue in enumerate(queues) if queue and shares[s] > 0]
    heapify(heap)
    while heap and total < wanted:
        _, s = heappop(heap)
        queue = queues[s]
        room = wanted - total
        j = next((j for j, k in enumerate(queue) if sizes[k] <= room), None)
        if j is None:
            continue  # room only shrinks, so this source cannot give anything more
        k = queue[j]
        del queue[j]  # almost always j == 0, which a deque removes in O(1)
        drawn.append(k)
        total += sizes[k]
        given[s] = given.get(s, 0) + sizes[k]
        if queue:
            heappush(heap, (given[s] / shares[s], s))
    return drawn


def _assign_splits(
    uf: _UnionFind,
    pair_hashes: list[int],
    origin: list[int],
    excluded: list[bool],
    dev_size: int,
    test_size: int,
    per_source: bool,
    shares: list[float] | None = None,
) -> tuple[list[int], list[int], list[int], dict[str, int]]:
    """Split pair indices into train, dev and test, whole components at a time.

    A component can be held out only if it has at most ``MAX_HELDOUT_COMPONENT`` pairs and none
    of them comes from an excluded source (``excluded[origin[i]]``). With ``per_source``, each
    component belongs to the source file of its first pair (the first one read, in the order of
    ``config.sources``; a component can span files when they share a sentence) and each source
    gets its share (``shares``, default equal) of test, then of dev; otherwise both are filled
    from one global order.
    """
    components: dict[int, list[int]] = {}
    for i in range(len(uf.parent)):
        components.setdefault(uf.find(i), []).append(i)
    # A component's place in the draw is its smallest member hash, which does not depend on the
    # order in which files were read or pairs were linked.
    ordered = sorted(components.values(), key=lambda members: min(pair_hashes[i] for i in members))
    eligible = [
        len(members) <= MAX_HELDOUT_COMPONENT and not any(excluded[origin[i]] for i in members)
        for members in ordered
    ]
    sizes = [len(members) for members in ordered]
    if per_source:
        # Members were appended in index order, so members[0] is the component's first pair.
        queues: list[deque[int]] = [deque() for _ in excluded]
        for k, members in enumerate(ordered):
            if eligible[k]:
                queues[origin[members[0]]].append(k)
        shares = shares or [1.0] * len(queues)
        test_ids = sorted(_draw_per_source(queues, sizes, test_size, shares))
        dev_ids = sorted(_draw_per_source(queues, sizes, dev_size, shares))
    else:
        test_ids, dev_ids = [], []
        n_test = n_dev = 0
        for k, size in enumerate(sizes):
            if eligible[k] and n_test + size <= test_size:
                test_ids.append(k)
                n_test += size
            elif eligible[k] and n_dev + size <= dev_size:
                dev_ids.append(k)
                n_dev += size
    test = [i for k in test_ids for i in ordered[k]]
    dev = [i for k in dev_ids for i in ordered[k]]
    heldout = set(test_ids) | set(dev_ids)
    train = sorted(i for k, members in enumerate(ordered) if k not in heldout for i in members)
    stats = {
        "components": len(components),
        "largest_component": max(sizes, default=0),
        "pairs_in_small_components": sum(size for size in sizes if size <= MAX_HELDOUT_COMPONENT),
        "pairs_eligible_for_heldout": sum(size for k, size in enumerate(sizes) if eligible[k]),
    }
    return train, dev, test, stats


def _train_outside(
    uf: _UnionFind, sources: list[str], targets: list[str], heldout: list[tuple[str, str]],
) -> tuple[list[int], dict[str, int]]:
    """Train is every pair whose component shares no normalised source or target with
    ``heldout``: the rule a fresh draw follows, applied to held-out sets drawn by another run."""
    heldout_sources = {normalise(src) for src, _ in heldout}
    heldout_targets = {normalise(tgt) for _, tgt in heldout}
    roots = [uf.find(i) for i in range(len(uf.parent))]
    linked = {roots[i] for i in range(len(roots))
              if normalise(sources[i]) in heldout_sources
              or normalise(targets[i]) in heldout_targets}
    train = [i for i, root in enumerate(roots) if root not in linked]
    sizes = Counter(roots).values()
    return train, {"components": len(sizes), "largest_component": max(sizes, default=0),
                   "pairs_linked_to_reused_heldout": len(roots) - len(train)}


# ---------------------------------------------------------------------------------------------
# The pipeline


def _progress(iterable: Iterable[Any], desc: str, enabled: bool) -> Iterable[Any]:
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is only in the train extra; per-file log lines still show progress
        return iterable
    return tqdm(iterable, desc=desc, unit=" lines", mininterval=1.0, leave=False)


def _write_tsv(path: Path, pairs: Iterable[tuple[str, str]]) -> None:
    # Write-then-rename so an interrupted prepare never leaves a truncated split that a later
    # training run would silently accept.
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for src, tgt in pairs:
            f.write(f"{src}\t{tgt}\n")
    os.replace(tmp, path)


def _new_counts() -> dict[str, int]:
    return {"read": 0, **dict.fromkeys(FILTERS, 0), "kept": 0, "train_ratio": 0,
            "train": 0, "dev": 0, "test": 0, "train_weighted": 0}


def _length_ratio(src: str, tgt: str) -> float:
    shorter, longer = sorted((len(src), len(tgt)))
    return (longer + 1) / (shorter + 1)


def prepare_corpus(config: DataConfig, progress: bool = True) -> dict:
    """Read, clean, filter, dedupe and split every source; write ``train.tsv``, ``dev.tsv``,
    ``test.tsv`` and ``report.json`` under ``config.out_dir`` and return the report."""
    if not config.sources:
        raise ValueError("data.sources is empty: nothing to prepare")
    for source in config.sources:
        if source.weight < 0:
            raise ValueError(f"{source.path}: weight must be >= 0, got {source.weight}")
        if source.heldout_share < 0:
            raise ValueError(f"{source.path}: heldout_share must be >= 0, got "
                             f"{source.heldout_share}")
    started = time.monotonic()
    flt = config.filters
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    sources: list[str] = []
    targets: list[str] = []
    origin: list[int] = []
    pair_hashes: list[int] = []
    uf = _UnionFind()
    first_with_source: dict[str, int] = {}
    first_with_target: dict[str, int] = {}
    seen_exact: set[tuple[str, str]] = set()
    seen_normalised: set[tuple[str, str]] = set()
    per_file = [_new_counts() for _ in config.sources]

    for file_index, source in enumerate(config.sources):
        counts = per_file[file_index]
        name = Path(source.path).name
        raw = _iter_raw(source.path, config.source_lang, config.target_lang)
        for pair in _progress(raw, name, progress):
            counts["read"] += 1
            if pair is None:
                counts["malformed"] += 1
                continue
            src, tgt = clean_text(pair[0]), clean_text(pair[1])
            if not src or not tgt:
                counts["empty"] += 1
                continue
            src_tokens, tgt_tokens = src.count(" ") + 1, tgt.count(" ") + 1
            if min(src_tokens, tgt_tokens) < flt.min_tokens:
                counts["too_short"] += 1
                continue
            if max(src_tokens, tgt_tokens) > flt.max_tokens:
                counts["too_long"] += 1
                continue
            if _length_ratio(src, tgt) > flt.max_ratio:
                counts["ratio"] += 1
                continue
            norm_src, norm_tgt = normalise(src), normalise(tgt)
            # Only untranslated copies: equal up to punctuation, digits and spacing, but not case.
            if (flt.drop_source_equals_target and norm_src == norm_tgt
                    and _copy_key(src) == _copy_key(tgt)):
                counts["source_equals_target"] += 1
                continue
            if flt.dedupe:
                if (src, tgt) in seen_exact:
                    counts["duplicate_exact"] += 1
                    continue
                if (norm_src, norm_tgt) in seen_normalised:
                    counts["duplicate_normalised"] += 1
                    continue
                seen_exact.add((src, tgt))
                seen_normalised.add((norm_src, norm_tgt))
            counts["kept"] += 1
            index = uf.add()
            sources.append(src)
            targets.append(tgt)
            origin.append(file_index)
            pair_hashes.append(_stable_hash(f"{norm_src}\t{norm_tgt}\t{src}\t{tgt}", config.seed))
            # Linking through the first pair with the same key is enough: union is transitive.
            linked = first_with_source.setdefault(norm_src, index)
            if linked != index:
                uf.union(index, linked)
            linked = first_with_target.setdefault(norm_tgt, index)
            if linked != index:
                uf.union(index, linked)
        dropped = sum(counts[f] for f in FILTERS)
        logger.info("%s: read %d, kept %d, dropped %d", source.path, counts["read"],
                    counts["kept"], dropped)
    # The dedupe and linking tables are the biggest structures; free them before splitting.
    del seen_exact, seen_normalised, first_with_source, first_with_target

    reused = bool(config.heldout_from)
    if reused:
        dev_pairs, test_pairs = (read_tsv(Path(config.heldout_from) / f"{name}.tsv")
                                 for name in ("dev", "test"))
        train, component_stats = _train_outside(uf, sources, targets, dev_pairs + test_pairs)
        dev, test = [], []
    else:
        excluded = [any(part in source.path for part in config.heldout_exclude)
                    for source in config.sources]
        train, dev, test, component_stats = _assign_splits(
            uf, pair_hashes, origin, excluded, config.dev_size, config.test_size,
            config.heldout_per_source, [source.heldout_share for source in config.sources],
        )
        dev_pairs = [(sources[i], targets[i]) for i in dev]
        test_pairs = [(sources[i], targets[i]) for i in test]
    del uf, pair_hashes
    if not reused and (len(dev) < config.dev_size or len(test) < config.test_size):
        logger.warning(
            "held-out sets are smaller than requested (dev %d/%d, test %d/%d): not enough pairs "
            "in components of <= %d pairs outside data.heldout_exclude", len(dev),
            config.dev_size, len(test), config.test_size, MAX_HELDOUT_COMPONENT,
        )

    if flt.train_max_ratio:
        kept = []
        for i in train:
            if _length_ratio(sources[i], targets[i]) <= flt.train_max_ratio:
                kept.append(i)
            else:
                per_file[origin[i]]["train_ratio"] += 1
        train = kept

    for split_name, members in (("train", train), ("dev", dev), ("test", test)):
        for i in members:
            per_file[origin[i]][split_name] += 1

    # Weights apply to train only: dev/test must score each distinct pair exactly once.
    weighted: list[int] = []
    rngs = [random.Random(f"{config.seed}/{k}/{s.path}") for k, s in enumerate(config.sources)]
    for i in train:
        weight = config.sources[origin[i]].weight
        copies = int(weight)
        if rngs[origin[i]].random() < weight - copies:
            copies += 1
        weighted.extend([i] * copies)
        per_file[origin[i]]["train_weighted"] += copies
    train_pairs = [(sources[i], targets[i]) for i in train]
    spelled = _spelled_numbers(config, train_pairs)
    swapped = _swapped_places(config, train_pairs, [
        (sources[i], targets[i]) for i in train
        if not any(part in config.sources[origin[i]].path for part in config.swap_places_skip)
    ] if config.swap_places > 0 else [])
    first_spelled = len(sources)
    for src, tgt in spelled + swapped:
        sources.append(src)
        targets.append(tgt)
    weighted.extend(range(first_spelled, len(sources)))
    # Shuffled once here so that train.tsv is not in file order: sampled subsets of it (the
    # vocabulary trainer's, a quick look with head) then see every source.
    random.Random(config.seed).shuffle(weighted)

    _write_tsv(out_dir / "train.tsv", ((sources[i], targets[i]) for i in weighted))
    _write_tsv(out_dir / "dev.tsv", dev_pairs)
    _write_tsv(out_dir / "test.tsv", test_pairs)

    total = _new_counts()
    for counts in per_file:
        for key, value in counts.items():
            total[key] += value
    report = {
        "files": {source.path: counts for source, counts in zip(config.sources, per_file,
                                                                strict=True)},
        "total": total,
        "splits": {"train": len(train), "train_weighted": len(weighted),
                   "spelled_numbers": len(spelled), "swapped_places": len(swapped),
                   "dev": len(dev_pairs),
                   "test": len(test_pairs)},
        "components": {**component_stats, "max_heldout_component": MAX_HELDOUT_COMPONENT},
        "config": dataclasses.asdict(config),
        "seconds": round(time.monotonic() - started, 1),
    }
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
    table = format_report(report)
    if progress:
        print(table)
    else:
        logger.info("\n%s", table)
    return report


def _spelled_numbers(config: DataConfig, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``config.spell_numbers`` copies of each pair that ``spell_out`` takes, the first with
    its own number, the others with numbers drawn (seeded) from the range it spells."""
    if config.spell_numbers <= 0:
        return []
    from training.number_words import LARGEST, SMALLEST, spell_out

    draw = random.Random(f"{config.seed}/spell_numbers")
    added = []
    for src, tgt in pairs:
        for copy in range(config.spell_numbers):
            number = None if copy == 0 else draw.randint(SMALLEST, LARGEST)
            pair = spell_out(src, tgt, config.source_lang, config.target_lang, number)
            if pair is None:
                break
            added.append(pair)
    logger.info("spelled out the numbers of %d train pairs (%d lines)",
                len(added) // max(config.spell_numbers, 1), len(added))
    return added


def _swapped_places(config: DataConfig, train: list[tuple[str, str]],
                    pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``config.swap_places`` copies of each of ``pairs`` whose place ``PlaceSwapper`` can swap,
    each with a place drawn (seeded) from the gazetteer ``config.place_names``, of those
    ``train`` itself uses."""
    if config.swap_places <= 0:
        return []
    if not config.place_names:
        raise ValueError("data.swap_places needs data.place_names (a gazetteer file)")
    from training.place_names import PlaceSwapper

    swapper = PlaceSwapper(read_pairs(config.place_names, config.source_lang,
                                      config.target_lang), config.target_lang, corpus=train)
    if not swapper.active:
        logger.warning("data.swap_places: no places to swap for %s in %s", config.target_lang,
                       config.place_names)
    draw = random.Random(f"{config.seed}/swap_places")
    added = []
    for src, tgt in pairs:
        for _ in range(config.swap_places):
            pair = swapper.swap(src, tgt, draw)
            if pair is None:
                break
            added.append(pair)
    logger.info("swapped the places of %d train pairs (%d lines)",
                len(added) // config.swap_places, len(added))
    return added


_COLUMNS = (
    ("read", "read"),
    ("malformed", "malf"),
    ("empty", "empty"),
    ("too_short", "short"),
    ("too_long", "long"),
    ("ratio", "ratio"),
    ("source_equals_target", "src=tgt"),
    ("duplicate_exact", "dup"),
    ("duplicate_normalised", "normdup"),
    ("kept", "kept"),
    ("train_ratio", "tr.ratio"),
    ("train", "train"),
    ("dev", "dev"),
    ("test", "test"),
    ("train_weighted", "train*w"),
)


def _short_name(path: str) -> str:
    name = Path(path).name
    for suffix in (".gz", ".xz", ".tsv"):
        name = name.removesuffix(suffix)
    return name


def format_report(report: dict) -> str:
    """A fixed-width table: one row per source and a total, one column per filter and split."""
    rows = [(_short_name(path), counts) for path, counts in report["files"].items()]
    rows.append(("TOTAL", report["total"]))
    cells = [[name] + [f"{counts[key]:,}" for key, _ in _COLUMNS] for name, counts in rows]
    header = ["source"] + [label for _, label in _COLUMNS]
    widths = [max(len(row[c]) for row in [header, *cells]) for c in range(len(header))]

    def render(row: list[str]) -> str:
        return "  ".join(
            cell.ljust(w) if c == 0 else cell.rjust(w)
            for c, (cell, w) in enumerate(zip(row, widths, strict=True))
        )

    rule = "-" * len(render(header))
    lines = [render(header), rule, *(render(r) for r in cells[:-1]), rule, render(cells[-1])]
    splits = report["splits"]
    comps = report["components"]
    spelled = "".join(f", {splits[key]:,} of them {what}" for key, what in (
        ("spelled_numbers", "with numbers spelled out"), ("swapped_places", "with places swapped"))
        if splits.get(key))
    lines.append(
        f"splits: train {splits['train']:,} distinct pairs ({splits['train_weighted']:,} lines "
        f"after weighting{spelled}), dev {splits['dev']:,}, test {splits['test']:,}; "
        f"{comps['components']:,} components, largest {comps['largest_component']:,} pairs"
    )
    config = report.get("config", {})
    if config.get("heldout_from"):
        lines.append(f"held-out: dev.tsv and test.tsv of {config['heldout_from']}, reused; "
                     f"{comps['pairs_linked_to_reused_heldout']:,} pairs linked to them kept "
                     "out of train")
    elif config.get("heldout_per_source") is not None:
        shares = {source.get("heldout_share", 1.0) for source in config.get("sources", [])}
        mode = ("one global draw" if not config["heldout_per_source"]
                else "equal share per source" if len(shares) <= 1
                else "configured share per source (data.sources.heldout_share)")
        exclude = config.get("heldout_exclude") or []
        lines.append(f"held-out: {mode}" + (f", never from {', '.join(exclude)}" if exclude
                                            else ""))
    return "\n".join(lines)
