"""Decoding speed of one bundle: our onnxruntime engine against PyTorch and CTranslate2.

    python bench/decode.py --checkpoint CKPT --bundle BUNDLE --test TEST.tsv \
        [--sentences 256] [--rounds 3] [--threads 2] [--batch-sizes 1,8,32] [--max-length 128]
    python bench/decode.py --import SOURCE --test TEST.tsv [...]

``--import`` takes a model in a format ``translate-train import`` reads (a MarianMT
directory, e.g. one ``bench/random_marian.py`` builds at Opus-MT's size, or a CTranslate2
directory), imports it (fp32 and int8, calibrated on TEST.tsv) and compares ours with
CTranslate2 on its weights: converted by ctranslate2's own converter from a MarianMT
directory, or the CTranslate2 directory itself. The torch paths are left out there.

Engines, all on the same weights and the first ``--sentences`` source sentences of TEST.tsv:

* ours fp32 / ours int8: ``service.engine.Engine`` on the bundle's variants (int8 skipped
  when the bundle has none); ``max_batch_rows`` = batch x beam, so "batch" means sentences;
  the best workers x threads layout for each configuration, from the same layouts as CT2's
  (``Engine(workers=...)`` replicas sharing the batches, as ``inter_threads`` do).
* torch kv-cache: ``encode_cross`` once, then ``decode_step`` with the self cache, reordered
  by index_select for beams; ``--torch-threads`` (default ``--threads``).
* torch no-cache: the encoder once, then the whole target prefix through the decoder at every
  step, what the cache graphs exist to avoid.
* Both torch paths search with ``_beam_search`` (greedy = beam 1): the engine's search
  (scores, length normalisation, stopping rule, per-sentence limit), finished sentences
  leaving the batch.
* ct2 fp32 / ct2 int8: CTranslate2 converted from the same checkpoint
  (``bench/ctranslate2_convert.py``), compute_type float32 / int8, with the best
  inter_threads x intra_threads layout for each configuration.

Engines run interleaved (for each configuration, round r runs every engine once, then round
r+1). Figures are medians over rounds; "x CT2" is CT2's time / the engine's time in the same
round (> 1 = faster than CTranslate2), median over rounds. Every engine stops at the same
``--max-length``; ours and the torch paths also stop at 2 x source tokens + 10 (the engine's
default ``max_length_ratio``), which CTranslate2's ``translate_batch`` cannot express, so the
generated-token count of every engine is printed too. Inputs are pre-tokenised for torch and
CT2; ours tokenises inside ``Engine.translate`` (negligible next to decoding).

A script that prints; it never asserts and is not part of the test suite.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ctranslate2  # noqa: E402
import onnxruntime  # noqa: E402
import torch  # noqa: E402

from bench.ctranslate2_convert import convert  # noqa: E402
from service.bundle import load_bundle  # noqa: E402
from service.engine import Engine  # noqa: E402
from service.search import NEG_INF, DecodeOptions  # noqa: E402
from training.config import BOS_ID, EOS_ID, PAD_ID, ModelConfig  # noqa: E402
from training.export import load_checkpoint  # noqa: E402

Outputs = list[list[int]]
# A beam search's model step: (last tokens [rows], order, shrunk) -> log-probs [rows, vocab].
# ``order`` [rows] gives each row's parent among the previous step's rows (None at the first
# step); ``shrunk`` says whether sentences left, so rows of the source side must go too.
Step = Callable[[torch.Tensor, torch.Tensor | None, bool], torch.Tensor]


@dataclass
class Runner:
    """One engine setting. ``run(batch, beam)`` returns token ids per sentence (no BOS/EOS),
    or None when the engine cannot do that search."""

    name: str
    family: str  # rows of one family (the CT2 layouts) are merged into one figure
    run: Callable[[int, int], Outputs | None]
    layout: str = ""


@dataclass
class Measure:
    seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    outputs: Outputs | None = None


# -- engines ------------------------------------------------------------------------------------
def ours_runner(
    bundle: Path,
    variant: str,
    sentences: list[str],
    threads: int,
    max_length: int,
    engine: Engine | None = None,
    ratio: float = DecodeOptions().max_length_ratio,
    workers: int = 1,
) -> Runner:
    """``workers`` replicas of ``threads`` threads each share the batches, like CTranslate2's
    ``inter_threads`` x ``intra_threads``."""
    engine = engine or Engine(
        bundle, device="cpu", threads=threads * workers, variant=variant, workers=workers
    )

    def run(batch: int, beam: int) -> Outputs:
        results = engine.translate(
            sentences,
            beam_size=beam,
            max_length=max_length,
            max_length_ratio=ratio,
            # The plain search the other engines run, whatever the bundle recommends.
            length_penalty=DecodeOptions().length_penalty,
            no_repeat_ngram_size=0,
            # Nor the service's ban on digits a source lacks: on a random model whose
            # peaked output bias favours a piece with digits it changed 13 of 16 sentences.
            digits_from_source=False,
            max_batch_rows=batch * beam,
        )
        return [r.hypotheses[0].token_ids for r in results]

    family = f"ours {variant}"
    return Runner(f"{family} {workers}x{threads}", family, run, f"{workers}x{threads}")


def _batches(sources: list[list[int]], batch: int):
    """Longest first, like the engine and CTranslate2; yields (indices, padded tensor)."""
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    for start in range(0, len(order), batch):
        rows = order[start : start + batch]
        width = max(len(sources[i]) for i in rows)
        src = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
        for r, i in enumerate(rows):
            src[r, : len(sources[i])] = torch.tensor(sources[i])
        yield rows, src


def _kv_cache_step(model, src: torch.Tensor, beam: int) -> Step:
    """``decode_step`` with the self cache: grown by the model, reordered here by parents."""
    cross_keys, cross_values, src_mask = model.encode_cross(src)
    # Each sentence gets ``beam`` rows; its source side is repeated once, here.
    cross_keys = cross_keys.repeat_interleave(beam, dim=1)
    cross_values = cross_values.repeat_interleave(beam, dim=1)
    src_mask = src_mask.repeat_interleave(beam, dim=0)
    layers, rows, heads, _, head_dim = cross_keys.shape
    keys = values = cross_keys.new_zeros(layers, rows, heads, 0, head_dim)

    def step(tokens: torch.Tensor, order: torch.Tensor | None, shrunk: bool) -> torch.Tensor:
        nonlocal keys, values, cross_keys, cross_values, src_mask
        if order is not None:
            keys, values = keys.index_select(1, order), values.index_select(1, order)
        if shrunk:  # parents lie in their own sentence: ``order`` keeps its source rows too
            cross_keys = cross_keys.index_select(1, order)
            cross_values = cross_values.index_select(1, order)
            src_mask = src_mask.index_select(0, order)
        past = keys.size(3)
        log_probs, keys, values = model.decode_step(
            tokens,
            torch.full_like(tokens, past),
            keys,
            values,
            torch.ones(len(tokens), past + 1, dtype=torch.bool),
            cross_keys,
            cross_values,
            src_mask,
        )
        return log_probs

    return step


@torch.no_grad()
def _no_cache_step(model, src: torch.Tensor, beam: int) -> Step:
    """The whole prefix through the decoder at every step (no cache at all)."""
    memory, src_mask = model.encode(src)
    memory = memory.repeat_interleave(beam, dim=0)
    src_mask = src_mask.repeat_interleave(beam, dim=0)
    prefix = torch.zeros(len(memory), 0, dtype=torch.long)
    lowest = torch.finfo(torch.float32).min

    def step(tokens: torch.Tensor, order: torch.Tensor | None, shrunk: bool) -> torch.Tensor:
        nonlocal prefix, memory, src_mask
        if order is not None:
            prefix = prefix.index_select(0, order)
        if shrunk:
            memory, src_mask = memory.index_select(0, order), src_mask.index_select(0, order)
        prefix = torch.cat([prefix, tokens[:, None]], dim=1)
        logits = model.generator(model.decode(prefix, memory, src_mask)[:, -1]).float()
        return torch.log_softmax(logits.masked_fill(model.never_generate, lowest), dim=-1)

    return step


@torch.no_grad()
def _beam_search(step: Step, limits: list[int], beam: int) -> Outputs:
    """Batched beam search with the engine's rules (``DecodeBatch._beam``, ``_beam_done`` and
    ``result`` in service/search.py, default ``DecodeOptions``, one hypothesis): scores are
    float64 sums of log-probs; of the 2 x beam best continuations an EOS ranked within the
    beam finishes a hypothesis and the beam best others go on; a sentence stops at
    ``limits[i]`` tokens, or once its best finished hypothesis beats its best active beam
    (both normalised at their length + EOS). Returns the best finished hypothesis's ids per
    sentence, ranked by score / length ** length_penalty (EOS counted unless at the limit).
    PAD and BOS come with log-prob ~ -3e38 from the step, so they never make the beam."""
    penalty = DecodeOptions().length_penalty

    def normalised(score: float, length: int) -> float:
        return score / max(length, 1) ** penalty

    count = len(limits)
    alive = list(range(count))  # sentences still searching, in the order of their row blocks
    scores = torch.full((count, beam), NEG_INF, dtype=torch.float64)
    scores[:, 0] = 0.0  # all beams start identical: only one may expand at the first step
    prefixes = [[[] for _ in range(beam)] for _ in range(count)]
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(count)]
    tokens = torch.full((count * beam,), BOS_ID, dtype=torch.long)
    order, shrunk = None, False
    for steps in range(1, max(limits) + 1):
        log_probs = step(tokens, order, shrunk).double()
        vocab = log_probs.size(1)
        candidates = (scores.reshape(-1, 1) + log_probs).view(len(alive), beam * vocab)
        top_scores, top_ids = candidates.topk(2 * beam, dim=1)
        still, next_scores, rows, next_tokens = [], [], [], []
        for block, (i, row_scores, row_ids) in enumerate(
            zip(alive, top_scores.tolist(), top_ids.tolist(), strict=True)
        ):
            parents, chosen, kept, grown = [], [], [], []
            for rank, (score, index) in enumerate(zip(row_scores, row_ids, strict=True)):
                parent, token = divmod(index, vocab)
                if score <= NEG_INF / 2:
                    break
                if token == EOS_ID:
                    if rank < beam:  # only an ending that would have made the beam counts
                        finished[i].append((score, prefixes[i][parent]))
                        if beam == 1:  # greedy (the engine's _greedy): the argmax ends it
                            break
                    continue
                parents.append(parent)
                chosen.append(token)
                kept.append(score)
                grown.append([*prefixes[i][parent], token])
                if len(parents) == beam:
                    break
            if steps >= limits[i]:
                finished[i] += zip(kept, grown, strict=True)
                continue
            if not parents:
                continue
            if finished[i]:  # _beam_done for one hypothesis
                best = max(normalised(s, len(p) + 1) for s, p in finished[i])
                if normalised(max(kept), steps + 1) < best:
                    continue
            padding = beam - len(parents)  # dead beams keep the block's width, never win
            still.append(i)
            rows += [block * beam + p for p in parents + parents[:1] * padding]
            next_tokens += chosen + chosen[:1] * padding
            next_scores.append(kept + [NEG_INF] * padding)
            prefixes[i] = grown + grown[:1] * padding
        if not still:
            break
        shrunk, alive = len(still) < len(alive), still
        order, tokens = torch.tensor(rows), torch.tensor(next_tokens)
        scores = torch.tensor(next_scores, dtype=torch.float64)
    outputs = []
    for i, hypotheses in enumerate(finished):
        ranked = [(normalised(s, len(p) + (len(p) < limits[i])), p) for s, p in hypotheses]
        outputs.append(max(ranked, key=lambda item: item[0])[1] if ranked else [])
    return outputs


def torch_runner(model, sources: list[list[int]], limits: list[int], cached: bool) -> Runner:
    def run(batch: int, beam: int) -> Outputs:
        outputs: Outputs = [[] for _ in sources]
        for rows, src in _batches(sources, batch):
            # Greedy is beam 1 of the same search: finished sentences leave the batch at once,
            # as in our engine and CTranslate2, rather than riding along to the longest.
            step = (_kv_cache_step if cached else _no_cache_step)(model, src, beam)
            decoded = _beam_search(step, [limits[i] for i in rows], beam)
            for i, ids in zip(rows, decoded, strict=True):
                outputs[i] = ids[: limits[i]]
        return outputs

    name = "torch kv-cache" if cached else "torch no-cache"
    return Runner(name, name, run)


def thread_layouts(threads: int) -> list[tuple[int, int]]:
    """(inter, intra) thread layouts tried for every engine: one replica with all the
    threads, one thread per replica, and two replicas sharing them."""
    return sorted({(1, threads), (threads, 1), (2, max(threads // 2, 1))})


def ct2_runners(
    model_dir: Path, compute_type: str, tokens: list[list[str]], to_id: Callable[[str], int],
    threads: int, max_length: int, suppress: list[list[str]],
) -> list[Runner]:
    runners = []
    for inter, intra in thread_layouts(threads):
        translator = ctranslate2.Translator(
            str(model_dir),
            device="cpu",
            compute_type=compute_type,
            inter_threads=inter,
            intra_threads=intra,
        )

        def run(batch: int, beam: int, translator=translator) -> Outputs:
            results = translator.translate_batch(
                tokens,
                max_batch_size=batch,
                beam_size=beam,
                max_decoding_length=max_length,
                min_decoding_length=0,  # ours may emit EOS first; CT2's default is 1
                disable_unk=False,
                # Our decoder step masks PAD and BOS; CTranslate2 would emit them otherwise.
                suppress_sequences=suppress or None,
            )
            return [[to_id(p) for p in r.hypotheses[0]] for r in results]

        family = f"ct2 {'fp32' if compute_type == 'float32' else compute_type}"
        runners.append(Runner(f"{family} {inter}x{intra}", family, run, f"{inter}x{intra}"))
    return runners


# -- reporting --------------------------------------------------------------------------------
def _same(a: Sequence[int], b: Sequence[int], limit: int) -> bool:
    """Equal up to the shorter of the two length limits (greedy output is prefix-stable)."""
    return list(a[:limit]) == list(b[:limit])


def match_rate(a: Outputs | None, b: Outputs | None, limits: list[int]) -> str:
    if a is None or b is None:
        return "n/a"
    same = sum(_same(x, y, n) for x, y, n in zip(a, b, limits, strict=True))
    return f"{same}/{len(a)} ({100 * same / len(a):.1f}%)"


def first_mismatches(a: Outputs, b: Outputs, limits: list[int], count: int = 3) -> list[str]:
    lines = []
    for i, (x, y, n) in enumerate(zip(a, b, limits, strict=True)):
        if not _same(x, y, n):
            x, y = x[:n], y[:n]
            at = next((k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
            at = min(len(x), len(y)) if at is None else at
            lines.append(
                f"  sentence {i}: first difference at token {at}; "
                f"ours {x[max(at - 2, 0) : at + 3]} (len {len(x)}) vs "
                f"other {y[max(at - 2, 0) : at + 3]} (len {len(y)})"
            )
            if len(lines) == count:
                break
    return lines


def _load_sentences(path: Path, count: int) -> list[str]:
    sentences = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            source = line.rstrip("\n").split("\t")[0].strip()
            if source:
                sentences.append(source)
            if len(sentences) == count:
                break
    return sentences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="our training checkpoint (with --bundle)")
    parser.add_argument("--bundle", help="its exported bundle")
    parser.add_argument("--import", dest="source", type=Path,
                        help="a model to import and compare with CTranslate2 (see above)")
    parser.add_argument("--test", required=True, help="TSV; the source column is translated")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch intra-op threads (default: --threads); 1 avoids OpenMP's collapse when "
        "other processes hold the cores",
    )
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument(
        "--max-length-ratio",
        type=float,
        default=DecodeOptions().max_length_ratio,
        help="ours/torch also stop at ratio x source tokens + 10; a large value makes every "
        "engine stop at --max-length alone (for random-weight models that never emit EOS)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: process CPU time (all threads), steadier than wall time when other "
        "processes share the cores",
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated engine families to leave out, e.g. 'torch no-cache,ct2 int8'",
    )
    parser.add_argument("--ct2-dir", help="keep the converted CTranslate2 model here")
    args = parser.parse_args(argv)
    if not args.source and not (args.checkpoint and args.bundle):
        parser.error("give --checkpoint and --bundle, or --import")
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        return _main(args, Path(scratch))


def _imported(source: Path, scratch: Path, calibration: Path) -> tuple[Path, Path]:
    """(our bundle of ``source``, CTranslate2's model of the same weights)."""
    from ctranslate2.converters import TransformersConverter

    from training.importers import hf_marian, import_model

    # 64 calibration sentences: a random-weight model decodes each to its length cap.
    sample = scratch / "calibration.txt"
    with open(calibration, encoding="utf-8") as lines:
        sample.write_text("".join(itertools.islice(lines, 64)), encoding="utf-8")
    bundle = import_model(source, scratch / "bundle", int8=True, calibration=sample,
                          default_variant="fp32", source_lang="xx", target_lang="yy")
    if not hf_marian.recognise(source):
        return bundle, source
    return bundle, Path(TransformersConverter(str(source)).convert(str(scratch / "ct2")))


def _main(args: argparse.Namespace, scratch: Path) -> int:
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    searches = [1, args.beam]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    torch.set_num_threads(args.torch_threads or args.threads)
    load_before = os.getloadavg()

    # -- inputs ---------------------------------------------------------------------------
    if args.source:
        bundle, ct2_dir = _imported(args.source, scratch, Path(args.test))
        model = None  # the torch paths speak our own special ids: left out
        skip |= {"torch kv-cache", "torch no-cache"}
        suppress: list[list[str]] = []
    else:
        bundle, ct2_dir = Path(args.bundle), None
        model = load_checkpoint(args.checkpoint)[0]
        suppress = [["<pad>"], ["<s>"]]
    manifest = load_bundle(bundle).manifest
    config = ModelConfig(**{k: v for k, v in manifest["model"].items() if k != "head_dim"})
    # Every engine gets exactly the ids ours encodes (input normalisation included).
    engine = Engine(bundle, device="cpu", threads=args.threads, variant="fp32")
    vocabulary = engine.vocabulary
    sentences = [
        s
        for s in _load_sentences(Path(args.test), args.sentences * 2)
        if len(engine.tokenize(s)) <= config.max_positions
    ][: args.sentences]
    sources = [engine.tokenize(s) for s in sentences]
    ratio = args.max_length_ratio
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    # The engine's per-sentence cap (DecodeBatch.add); the torch paths use the same.
    limits = [
        min(args.max_length, int(ratio * len(ids)) + 10, config.max_positions - 1)
        for ids in sources
    ]
    pieces = [[vocabulary.source_piece(i) for i in ids] for ids in sources]

    # -- engines --------------------------------------------------------------------------
    runners: list[Runner] = []
    variants = manifest["variants"]
    # The same workers x threads layouts as CTranslate2's (see ct2_runners); the fastest counts.
    for variant in ("fp32", "int8"):
        if variant in variants and f"ours {variant}" not in skip:
            for workers, threads in thread_layouts(args.threads):
                reuse = engine if (variant, workers, threads) == ("fp32", 1, args.threads) else None
                runners.append(
                    ours_runner(
                        bundle,
                        variant,
                        sentences,
                        threads,
                        args.max_length,
                        reuse,
                        ratio,
                        workers,
                    )
                )
    for cached in (True, False):
        if model is not None and ("torch kv-cache" if cached else "torch no-cache") not in skip:
            runners.append(torch_runner(model, sources, limits, cached))
    if ct2_dir is None:
        ct2_dir = convert(args.checkpoint, Path(args.ct2_dir or scratch) / "model")
    for compute_type, family in (("float32", "ct2 fp32"), ("int8", "ct2 int8")):
        if family not in skip:
            runners += ct2_runners(ct2_dir, compute_type, pieces, vocabulary.target_id,
                                   args.threads, args.max_length, suppress)

    print(
        f"# decode benchmark\n\nmodel: d_model {config.d_model}, d_ff {config.d_ff}, "
        f"heads {config.heads}, layers {config.encoder_layers}+{config.decoder_layers}, "
        f"vocab {config.vocab_size}, pre_norm {config.pre_norm}, activation "
        f"{config.activation}; checkpoint {args.checkpoint or '-'}; bundle {bundle}"
        f"{f' (imported from {args.source})' if args.source else ''}\n"
        f"{len(sentences)} sentences of {args.test} ({sum(map(len, sources))} source tokens "
        f"with EOS); max_length {args.max_length} (+ ratio {ratio} for ours/torch); "
        f"{args.rounds} rounds; {args.clock} clock; threads {args.threads} (torch "
        f"{torch.get_num_threads()})\n"
        f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average before {load_before[0]:.2f}; torch {torch.__version__}, "
        f"onnxruntime {onnxruntime.__version__}, ctranslate2 {ctranslate2.__version__}",
        flush=True,
    )
    for runner in runners:  # warm-up: sessions, allocators, OpenMP pools
        runner.run(8, 1)

    # -- measure: for each configuration, round r runs every engine once ---------------
    results: dict[tuple[str, int, int], Measure] = {}
    for batch in batch_sizes:
        for beam in searches:
            for round_index in range(args.rounds):
                for runner in runners:
                    started = clock()
                    outputs = runner.run(batch, beam)
                    elapsed = clock() - started
                    if outputs is None:
                        continue
                    measure = results.setdefault((runner.name, batch, beam), Measure())
                    measure.seconds.append(elapsed)
                    if round_index == 0:
                        measure.outputs = outputs
                        measure.tokens = sum(map(len, outputs))
                    print(
                        f"  batch {batch:>2} beam {beam} round {round_index + 1}: "
                        f"{runner.name:<18} {elapsed:7.2f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    load_after = os.getloadavg()

    report(args, runners, results, batch_sizes, searches, sentences, limits)
    print(f"\nload average after: {load_after[0]:.2f} (1 min), {load_after[1]:.2f} (5 min)")
    return 0


def report(args, runners, results, batch_sizes, searches, sentences, limits) -> None:
    families = list(dict.fromkeys(r.family for r in runners))
    # Best CTranslate2 layout per configuration: lowest median time.
    chosen: dict[tuple[str, int, int], Runner] = {}
    for family in families:
        members = [r for r in runners if r.family == family]
        for batch in batch_sizes:
            for beam in searches:
                timed = [r for r in members if (r.name, batch, beam) in results]
                if timed:
                    chosen[(family, batch, beam)] = min(
                        timed,
                        key=lambda r, b=batch, k=beam: statistics.median(
                            results[(r.name, b, k)].seconds
                        ),
                    )

    def measure(family: str, batch: int, beam: int) -> Measure | None:
        runner = chosen.get((family, batch, beam))
        return results[(runner.name, batch, beam)] if runner else None

    def versus(mine: Measure, ct2: Measure | None) -> str:
        if ct2 is None:
            return "n/a"
        ratios = [c / m for m, c in zip(mine.seconds, ct2.seconds, strict=True)]
        return f"{statistics.median(ratios):.2f}"

    n = len(sentences)
    print(
        "\n| engine | batch | search | ms/sentence | tok/s (median) | tok/s (best) "
        "| x CT2 fp32 | x CT2 int8 | tokens | layout |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for batch in batch_sizes:
        for beam in searches:
            search = "greedy" if beam == 1 else f"beam {beam}"
            ct2_fp32 = measure("ct2 fp32", batch, beam)
            ct2_int8 = measure("ct2 int8", batch, beam)
            for family in families:
                m = measure(family, batch, beam)
                if m is None:
                    print(f"| {family} | {batch} | {search} |" + " n/a |" * 6 + " |")
                    continue
                median = statistics.median(m.seconds)
                layout = chosen[(family, batch, beam)].layout
                print(
                    f"| {family} | {batch} | {search} | {1000 * median / n:.1f} "
                    f"| {m.tokens / median:.0f} | {m.tokens / min(m.seconds):.0f} "
                    f"| {versus(m, ct2_fp32)} | {versus(m, ct2_int8)} | {m.tokens} | {layout} |"
                )

    print("\nbeam / greedy time at batch 8:" if 8 in batch_sizes else "", end="")
    if 8 in batch_sizes and len(searches) == 2:
        print()
        for family in families:
            greedy, beam = measure(family, 8, 1), measure(family, 8, searches[1])
            if greedy and beam:
                value = statistics.median(beam.seconds) / statistics.median(greedy.seconds)
                print(f"  {family}: beam{searches[1]}/greedy = {value:.2f}")
            else:
                print(f"  {family}: n/a")

    print("\nidentical token ids (greedy, compared up to the engine's per-sentence limit):")

    def outputs(family: str, batch: int, beam: int = 1) -> Outputs | None:
        m = measure(family, batch, beam)
        return m.outputs if m else None

    pairs = [
        ("ours fp32", "ct2 fp32"),
        ("ours fp32", "torch kv-cache"),
        ("torch kv-cache", "torch no-cache"),
        ("ours int8", "ours fp32"),
        ("ct2 int8", "ct2 fp32"),
        ("ours int8", "ct2 int8"),
    ]
    for batch in batch_sizes:
        for a, b in pairs:
            rate = match_rate(outputs(a, batch), outputs(b, batch), limits)
            print(f"  batch {batch:>2}: {a} vs {b}: {rate}")
    first, last = batch_sizes[0], batch_sizes[-1]
    if first != last:
        print(
            f"  ours fp32 batch {first} vs batch {last}: "
            f"{match_rate(outputs('ours fp32', first), outputs('ours fp32', last), limits)}"
        )
    if len(searches) == 2:
        for batch in batch_sizes:
            print(
                f"  beam {searches[1]}, batch {batch:>2}: ours fp32 vs ct2 fp32 (informative: "
                "stopping rules differ): "
                + match_rate(
                    outputs("ours fp32", batch, searches[1]),
                    outputs("ct2 fp32", batch, searches[1]),
                    limits,
                )
            )
            # Same search rules as ours; they differ only where near-ties meet rounding.
            for a, b in (("ours fp32", "torch kv-cache"), ("torch kv-cache", "torch no-cache")):
                rate = match_rate(
                    outputs(a, batch, searches[1]), outputs(b, batch, searches[1]), limits
                )
                print(f"  beam {searches[1]}, batch {batch:>2}: {a} vs {b}: {rate}")
    ours, ct2 = outputs("ours fp32", batch_sizes[0]), outputs("ct2 fp32", batch_sizes[0])
    if ours and ct2:
        for line in first_mismatches(ours, ct2, limits):
            print(line)
        at_limit = sum(len(x) >= n for x, n in zip(ours, limits, strict=True))
        ct2_at_limit = sum(len(x) >= args.max_length for x in ct2)
        print(
            f"  sentences stopped by the length limit (greedy, batch {batch_sizes[0]}): "
            f"ours {at_limit}, ct2 {ct2_at_limit} (ct2 has no per-sentence ratio limit)"
        )
    torch_ids = outputs("torch kv-cache", batch_sizes[0])
    if ours and torch_ids:
        same = sum(_same(x, y, n) for x, y, n in zip(ours, torch_ids, limits, strict=True))
        if same < 0.95 * len(ours):
            print(
                "  WARNING: ours fp32 and the checkpoint in PyTorch disagree on "
                f"{len(ours) - same} sentences: is the bundle an export of this checkpoint?"
            )
    # PAD and BOS are masked in our decoder step; seeing them means a stale export or a
    # conversion that lost the mask.
    never = (PAD_ID, BOS_ID) if not args.source else ()  # an import's ids are its own
    for (name, batch, beam), m in sorted(results.items()):
        bad = sum(any(t in never for t in ids) for ids in m.outputs or [])
        if bad:
            print(f"  WARNING: {name} batch {batch} beam {beam}: {bad} outputs contain PAD/BOS")


if __name__ == "__main__":
    sys.exit(main())
