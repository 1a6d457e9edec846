"""``translate-train``: every training step from raw text to bundle, one subcommand each.

    translate-train prepare  --config configs/en-de.toml
    translate-train vocab    --config configs/en-de.toml
    translate-train vocab-coverage TEST.tsv MODEL.model [MODEL.model ...]
    translate-train train    --config configs/en-de.toml [--resume] [--set train.max_steps=1000]
    torchrun --nproc_per_node 4 -m training.cli train --config configs/en-de.toml
    translate-train recover  BUNDLE OUT.pt   (a bundle's weights back as a checkpoint)
    translate-train train    --config configs/en-de.toml --init-from OUT.pt
    translate-train average  OUT.pt CKPT.pt CKPT.pt ...   |   average OUT.pt --last 5 [--dir D]
    translate-train pack     CHECKPOINT OUT_DIR   |   unpack IN_DIR OUT.pt  (fp16 shards)
    translate-train export   CHECKPOINT OUT_DIR [--int8 [--default-variant int8]] [--fp16]
                             [--no-parity]
    translate-train fp16     BUNDLE   (add the fp16 graphs for CUDA to an existing bundle)
    translate-train evaluate BUNDLE TEST.tsv [--beam-size N] [--limit N]
    translate-train corpus   --target de --out runs/corpus/en-de [--sources a,b] [--debs DIR]
    translate-train place-names BUNDLE --gazetteer GAZ.tsv.xz --corpus TRAIN.tsv
                             (the exonyms the service writes the target language's way)

Every subcommand takes ``--config FILE.toml`` and repeated ``--set section.field=value``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from training.config import Config, load_config


def _prepare(args: argparse.Namespace, config: Config) -> None:
    from training.corpus import prepare_corpus

    report = prepare_corpus(config.data)
    print(json.dumps({"splits": report.get("splits"), "total": report.get("total")}, indent=2))


def _vocab(args: argparse.Namespace, config: Config) -> None:
    from training.vocab import train_vocab

    print(train_vocab(Path(config.data.out_dir) / "train.tsv", config.vocab))


def _vocab_coverage(args: argparse.Namespace, config: Config) -> None:
    from training.corpus import read_tsv
    from training.vocab import load_vocab, vocab_coverage

    pairs = read_tsv(args.tsv)
    report = {}
    for model in args.models:
        sp = load_vocab(model)
        report[model] = {side: vocab_coverage(sp, [pair[i] for pair in pairs])
                         for i, side in enumerate((config.data.source_lang,
                                                   config.data.target_lang))}
    print(json.dumps(report, indent=2, ensure_ascii=False))


def _train(args: argparse.Namespace, config: Config) -> None:
    from training.train import train

    result = train(config, resume=args.resume, init_from=args.init_from)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result, indent=2))


def _recover(args: argparse.Namespace, config: Config) -> None:
    from training.recover import checkpoint_from_bundle

    print(checkpoint_from_bundle(args.bundle, args.out))


def _place_names(args: argparse.Namespace, config: Config) -> None:
    from training.corpus import read_pairs
    from training.place_names import exonym_terms, write_bundle_terms

    gazetteer = list(read_pairs(args.gazetteer))
    corpus = read_pairs(args.corpus)
    terms = exonym_terms(gazetteer, corpus, args.min_count, args.min_share)
    path = write_bundle_terms(args.bundle, terms, (
        f"Place names written the target language's way: {args.gazetteer}'s "
        f"exonyms that {args.corpus} translates so in at least "
        f"{args.min_share:.0%} of at least {args.min_count} sentences "
        "(translate-train place-names)."))
    for english, target, count, share in terms:
        print(f"{english}\t{target}\t{count}\t{share}")
    print(f"{len(terms)} names -> {path}", file=sys.stderr)


def _average(args: argparse.Namespace, config: Config) -> None:
    from training.train import average_checkpoints, periodic_checkpoints

    paths = list(args.checkpoints)
    if args.last:
        directory = Path(args.dir or config.train.out_dir)
        paths += periodic_checkpoints(directory)[-args.last :]
    if not paths:
        raise SystemExit("average: name checkpoints, or --last N [--dir D]")
    print(average_checkpoints(paths, args.out))


def _pack(args: argparse.Namespace, config: Config) -> None:
    from training.shards import pack_checkpoint

    for path in pack_checkpoint(args.checkpoint, args.out_dir):
        print(f"{path}\t{path.stat().st_size}")


def _unpack(args: argparse.Namespace, config: Config) -> None:
    from training.shards import unpack_checkpoint

    vocab = args.vocab or f"{config.vocab.model_prefix}.model"
    print(unpack_checkpoint(args.in_dir, args.out, vocab=vocab,
                            data_dir=args.data_dir or config.data.out_dir))


def _export(args: argparse.Namespace, config: Config) -> None:
    from training.export import export_bundle

    print(export_bundle(args.checkpoint, args.out_dir, int8=args.int8, fp16=args.fp16,
                        calibration=args.calibration,
                        check_parity=not args.no_parity, default_variant=args.default_variant,
                        decoding=_decoding(args.decoding)))


def _decoding(items: list[str]) -> dict:
    decoding = {}
    for item in items:
        key, _, value = item.partition("=")
        decoding[key] = json.loads(value)
    return decoding


def _import(args: argparse.Namespace, config: Config) -> None:
    from training.importers import UnsupportedModel, import_model

    try:
        print(import_model(args.source, args.out_dir, int8=args.int8, fp16=args.fp16,
                           calibration=args.calibration, source_lang=args.source_lang,
                           target_lang=args.target_lang, decoding=_decoding(args.decoding)))
    except UnsupportedModel as exc:
        raise SystemExit(f"import: {exc}") from exc


def _fp16(args: argparse.Namespace, config: Config) -> None:
    from training.fp16 import add_fp16_variant

    print(add_fp16_variant(args.bundle))


def _evaluate(args: argparse.Namespace, config: Config) -> None:
    from training.evaluate import evaluate_bundle

    result = evaluate_bundle(args.bundle, args.test_tsv, beam_size=args.beam_size,
                             length_penalty=args.length_penalty,
                             max_length_ratio=args.max_length_ratio,
                             no_repeat_ngram_size=args.no_repeat_ngram_size, limit=args.limit,
                             variant=args.variant, threads=args.threads,
                             workers=args.workers, hypotheses_out=args.hypotheses,
                             by_source=config.data if args.by_source else None,
                             target_lang=args.target_lang)
    print(json.dumps(result, indent=2, default=str))


def _corpus(args: argparse.Namespace, config: Config) -> None:
    from training.recipe import DEFAULT_RECIPE, build_corpus, format_report

    sources = [s for s in args.sources.split(",") if s] if args.sources else None
    try:
        report = build_corpus(args.target, args.out, sources=sources,
                              recipe=args.recipe or DEFAULT_RECIPE, cache=args.cache,
                              debs=args.debs, lists=args.lists)
    except ValueError as exc:
        raise SystemExit(f"corpus: {exc}") from exc
    print(format_report(report))


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE.toml", help="configuration file")
    common.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.FIELD=VALUE", help="override one setting (repeatable)")
    parser = argparse.ArgumentParser(prog="translate-train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("prepare", parents=[common],
                            help="clean, filter, dedupe and split the corpus (data.*)")
    p.set_defaults(run=_prepare)
    p = commands.add_parser("vocab", parents=[common],
                            help="train the SentencePiece vocabulary on train.tsv (vocab.*)")
    p.set_defaults(run=_vocab)
    p = commands.add_parser("vocab-coverage", parents=[common],
                            help="how SentencePiece models cover a TSV's numbers, names and "
                            "characters")
    p.add_argument("tsv", help="a prepared split, e.g. runs/en-de/data/test.tsv")
    p.add_argument("models", nargs="+", help="SentencePiece models (.model) to compare")
    p.set_defaults(run=_vocab_coverage)
    p = commands.add_parser("train", parents=[common], help="train the model (model.*, train.*)")
    p.add_argument("--resume", action="store_true",
                   help="continue exactly from {train.out_dir}/checkpoint_last.pt")
    p.add_argument("--init-from", metavar="CHECKPOINT",
                   help="start from this checkpoint's weights and step with a fresh optimiser "
                   "(e.g. one made by 'recover'); vocab.model_prefix must hold its vocabulary")
    p.set_defaults(run=_train)
    p = commands.add_parser("recover", parents=[common],
                            help="rebuild a checkpoint from a bundle's fp32 graphs")
    p.add_argument("bundle")
    p.add_argument("out", help="the checkpoint to write")
    p.set_defaults(run=_recover)
    p = commands.add_parser("average", parents=[common], help="average checkpoints' parameters")
    p.add_argument("out", help="the averaged checkpoint to write")
    p.add_argument("checkpoints", nargs="*", help="checkpoints to average")
    p.add_argument("--last", type=int, default=0,
                   help="also average the last N checkpoint_{step}.pt of --dir")
    p.add_argument("--dir", help="run directory for --last (default: train.out_dir)")
    p.set_defaults(run=_average)
    p = commands.add_parser("pack", parents=[common],
                            help="a checkpoint's weights as fp16 shards of < 16 MiB")
    p.add_argument("checkpoint")
    p.add_argument("out_dir")
    p.set_defaults(run=_pack)
    p = commands.add_parser("unpack", parents=[common],
                            help="join packed shards into a checkpoint (export, --init-from)")
    p.add_argument("in_dir", help="the folder holding weights.json and its shards")
    p.add_argument("out", help="the checkpoint to write")
    p.add_argument("--vocab", help="the SentencePiece model the weights were trained with "
                   "(default: the --config's vocab.model_prefix + .model)")
    p.add_argument("--data-dir", help="the prepared data the checkpoint names (default: the "
                   "--config's data.out_dir)")
    p.set_defaults(run=_unpack)
    p = commands.add_parser("export", parents=[common], help="export a checkpoint to a bundle")
    p.add_argument("checkpoint")
    p.add_argument("out_dir")
    p.add_argument("--int8", action="store_true",
                   help="also write static int8 graphs (batch-invariant; training.quantize)")
    p.add_argument("--fp16", action="store_true",
                   help="also write fp16 graphs, which a CUDA device serves (training.fp16)")
    p.add_argument("--calibration", type=Path, default=None,
                   help="sentences to calibrate the int8 graphs on (TSV, source first, or one "
                   "a line; default: train.tsv of the data the checkpoint was trained on)")
    p.add_argument("--default-variant", choices=["fp32", "int8"], default="fp32",
                   help="the variant the service loads unless told otherwise")
    p.add_argument("--no-parity", action="store_true", help="skip the ONNX/PyTorch parity check")
    p.add_argument("--decoding", action="append", default=[], metavar="KEY=VALUE",
                   help="the model's recommended decoding, e.g. no_repeat_ngram_size=3 "
                   "(length_penalty, max_length_ratio, no_repeat_ngram_size; repeatable)")
    p.set_defaults(run=_export)
    p = commands.add_parser(
        "import", parents=[common],
        help="turn an existing model (Hugging Face MarianMT / Opus-MT) into a bundle")
    p.add_argument("source", help="the model's directory")
    p.add_argument("out_dir")
    p.add_argument("--int8", action="store_true",
                   help="also write static int8 graphs and serve them by default")
    p.add_argument("--fp16", action="store_true",
                   help="also write fp16 graphs, which a CUDA device serves (training.fp16)")
    p.add_argument("--calibration", type=Path, default=None,
                   help="source sentences to calibrate the int8 graphs on (one a line, or TSV "
                   "source first; default: sequences drawn from the model's vocabulary)")
    p.add_argument("--source-lang", default=None,
                   help="source language code, where the model's metadata names none")
    p.add_argument("--target-lang", default=None,
                   help="target language code, where the model's metadata names none")
    p.add_argument("--decoding", action="append", default=[], metavar="KEY=VALUE",
                   help="the model's recommended decoding (as for export)")
    p.set_defaults(run=_import)
    p = commands.add_parser("fp16", parents=[common],
                            help="add fp16 graphs (for CUDA) to a bundle from its fp32 ones")
    p.add_argument("bundle")
    p.set_defaults(run=_fp16)
    p = commands.add_parser("evaluate", parents=[common], help="BLEU/chrF of a bundle on a TSV")
    p.add_argument("bundle")
    p.add_argument("test_tsv")
    p.add_argument("--beam-size", type=int, default=None,
                   help="default: the service's (DEFAULT_BEAM, 2 unless set)")
    p.add_argument("--length-penalty", type=float, default=None,
                   help="beam score = log P / length ** this (default: the bundle's, else 1.0)")
    p.add_argument("--max-length-ratio", type=float, default=None,
                   help="at most this x source tokens + 10 generated (default: the bundle's, "
                   "else 2.0)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=None,
                   help="never repeat an n-gram of this many tokens, 0 allows (default: the "
                   "bundle's, else 0)")
    p.add_argument("--limit", type=int, default=None, help="only the first N pairs")
    p.add_argument("--variant", default=None,
                   help="fp32, int8 or fp16 (default: the bundle's)")
    p.add_argument("--threads", type=int, default=0,
                   help="onnxruntime threads (default: the service's, THREADS)")
    p.add_argument("--workers", type=int, default=0,
                   help="decoding workers (default: the service's, WORKERS)")
    p.add_argument("--hypotheses", default=None, help="write the translations to this file")
    p.add_argument("--target-lang", default=None,
                   help="the target language, for a multilingual bundle")
    p.add_argument("--by-source", action="store_true",
                   help="also score each corpus file's share (the --config's data.sources) "
                   "and each of its data.domains")
    p.set_defaults(run=_evaluate)
    p = commands.add_parser(
        "place-names", parents=[common],
        help="add to a bundle the exonyms its training corpus confirms (Vienna -> Wien)")
    p.add_argument("bundle")
    p.add_argument("--gazetteer", required=True,
                   help="English name -> target name pairs, e.g. the recipe's place-names source")
    p.add_argument("--corpus", required=True, help="the bundle's training pairs (TSV)")
    p.add_argument("--min-count", type=int, default=2,
                   help="sentences naming the place, at least (default 2)")
    p.add_argument("--min-share", type=float, default=0.8,
                   help="of which the target names it so, at least (default 0.8)")
    p.set_defaults(run=_place_names)
    p = commands.add_parser(
        "corpus", parents=[common],
        help="rebuild a training corpus (one TSV per source) from Debian packages")
    p.add_argument("--target", required=True, help="target language code: de, fr, es, ...")
    p.add_argument("--out", required=True, help="folder for {source}.tsv.xz, report.json and "
                   "PROVENANCE.md, e.g. runs/corpus/en-de")
    p.add_argument("--sources", default="",
                   help="comma-separated source names of the recipe (default: all)")
    p.add_argument("--recipe", default=None,
                   help="the sources and their packages, a TOML file (default: "
                   "training/recipes/debian.toml)")
    p.add_argument("--cache", default=None,
                   help="where downloaded .deb files and apt lists are kept (default: "
                   "OUT/../cache)")
    p.add_argument("--debs", default=None,
                   help="read packages from this folder of .deb files, downloading nothing")
    p.add_argument("--lists", default=None,
                   help="read Translation-* files (DDTP) from this folder instead of fetching")
    p.set_defaults(run=_corpus)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args.config, args.overrides)
    args.run(args, config)


if __name__ == "__main__":
    main()
