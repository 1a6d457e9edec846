"""Measure a bundle's scores and write them into its manifest (``scores``), so that the numbers
a bundle carries are always from its own graphs, translated as the service translates
(``training.evaluate``: the service's ``Translator``):

    .venv/bin/python scripts/score-bundle.py models/en-de runs/en-de/data configs/en-de.toml

Dev and test, every decoding the model card reports: what the service answers by default (its
``DEFAULT_BEAM`` with the bundle's recommended decoding, its manifest ``decoding``, e.g. no
repeated 3-gram and a length penalty), the recommendation with greedy search, plain greedy, and
beam 4 with and without the no-repeat rule; int8 and fp32; for the served decoding also the
share of numbers, names and URLs kept (``training.verbatim``) and test scores per source file
and per domain of the config.
About 3 to 8 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.bundle import write_manifest  # noqa: E402
from service.settings import Settings  # noqa: E402
from training.config import load_config  # noqa: E402
from training.evaluate import evaluate_bundle  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("data_dir", type=Path, help="holds dev.tsv and test.tsv")
    parser.add_argument("config", type=Path, help="the data config that prepared them")
    parser.add_argument("--threads", type=int, default=0,
                        help="onnxruntime threads (0: the service's default)")
    args = parser.parse_args()
    manifest_path = args.bundle / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    decoding = manifest.get("decoding", {})
    ngram = decoding.get("no_repeat_ngram_size", 0)
    penalty = decoding.get("length_penalty", 1.0)
    default_beam = Settings().default_beam  # what a request without beam_size gets

    def name(beam: int, no_repeat: int | None) -> str:
        """The run's decoding in words; None takes the bundle's rule. The bundle's length
        penalty applies to every beam search (greedy has nothing to normalise)."""
        rule = ngram if no_repeat is None else no_repeat
        words = [f"beam{beam}" if beam > 1 else "greedy"]
        if rule:
            words.append(f"no_repeat_{rule}")
        if beam > 1 and penalty != 1.0:
            words.append(f"length_penalty_{penalty:g}")
        return "_".join(words)

    served = name(default_beam, None)
    runs = [  # split, variant, beam, no_repeat_ngram_size (None: the bundle's)
        ("dev", "int8", default_beam, None),
        ("dev", "int8", 1, None),
        ("dev", "int8", 1, 0),
        ("dev", "fp32", 1, 0),
        ("test", "int8", default_beam, None),
        ("test", "int8", 1, None),
        ("test", "int8", 1, 0),
        ("test", "int8", 4, 0),
        ("test", "int8", 4, None),
        ("test", "fp32", default_beam, None),
        ("test", "fp32", 1, 0),
    ]
    # The same decoding named twice (DEFAULT_BEAM 1 or 4, or a bundle without the rule, whose
    # "None" is 0) is measured once.
    unique: dict[tuple[str, str, str], tuple] = {}
    for run in runs:
        split, variant, beam, no_repeat = run
        unique.setdefault((split, variant, name(beam, no_repeat)), run)
    runs = list(unique.values())
    variants = set(manifest["variants"])
    scores: dict = {"metric": "sacreBLEU 2.6.0 (13a) and chrF, detokenised, each test line "
                              "translated as the service answers it (service.translator)",
                    "served": served}
    data_config = load_config(args.config).data
    for split, variant, beam, no_repeat in runs:
        if variant not in variants:
            continue
        run = name(beam, no_repeat)
        by_source = data_config if (split, variant, run) == ("test", "int8", served) else None
        result = evaluate_bundle(args.bundle, args.data_dir / f"{split}.tsv", beam_size=beam,
                                 no_repeat_ngram_size=no_repeat, variant=variant,
                                 by_source=by_source, threads=args.threads)
        kept = ("bleu", "chrf", "sentences") + (("verbatim",) if run == served else ())
        scores.setdefault(split, {}).setdefault(variant, {})[run] = {
            key: result[key] for key in kept
        }
        if by_source is not None:
            scores[f"test_by_source_int8_{served}"] = result["by_source"]
            scores[f"test_by_domain_int8_{served}"] = result["by_domain"]
        print(f"{split} {variant} {run}: BLEU {result['bleu']}, chrF {result['chrf']}",
              flush=True)
    manifest["scores"] = scores
    write_manifest(args.bundle, manifest)


if __name__ == "__main__":
    main()
