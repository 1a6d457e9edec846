"""Measure a bundle's scores and write them into its manifest (``scores``), so that the numbers
a bundle carries are always from its own graphs, decoded by the serving engine:

    .venv/bin/python scripts/score-bundle.py models/en-de runs/en-de/data configs/en-de.toml

Dev and test, every decoding the model card reports: what the service answers by default (its
``DEFAULT_BEAM`` with the bundle's recommended decoding, its manifest ``decoding``, e.g. no
repeated 3-gram), the recommendation with greedy search, plain greedy, and beam 4 with and
without the recommendation; int8 and fp32; test BLEU per source file of the served decoding.
About 8 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.settings import Settings  # noqa: E402
from training.config import load_config  # noqa: E402
from training.evaluate import evaluate_bundle  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("data_dir", type=Path, help="holds dev.tsv and test.tsv")
    parser.add_argument("config", type=Path, help="the data config that prepared them")
    args = parser.parse_args()
    manifest_path = args.bundle / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    ngram = manifest.get("decoding", {}).get("no_repeat_ngram_size", 0)
    suffix = f"_no_repeat_{ngram}" if ngram else ""
    default_beam = Settings().default_beam  # what a request without beam_size gets
    served = f"beam{default_beam}{suffix}" if default_beam > 1 else f"greedy{suffix}"
    runs = [  # split, variant, name, beam, no_repeat_ngram_size (None: the bundle's)
        ("dev", "int8", served, default_beam, None),
        ("dev", "int8", f"greedy{suffix}", 1, None),
        ("dev", "int8", "greedy", 1, 0),
        ("dev", "fp32", "greedy", 1, 0),
        ("test", "int8", served, default_beam, None),
        ("test", "int8", f"greedy{suffix}", 1, None),
        ("test", "int8", "greedy", 1, 0),
        ("test", "int8", "beam4", 4, 0),
        ("test", "int8", f"beam4{suffix}", 4, None),
        ("test", "fp32", served, default_beam, None),
        ("test", "fp32", "greedy", 1, 0),
    ]
    runs = list(dict.fromkeys(runs))  # DEFAULT_BEAM 1 or 4 names a run twice
    variants = set(manifest["variants"])
    scores: dict = {"metric": "sacreBLEU 2.6.0 (13a) and chrF, detokenised, decoded by "
                              "service.decoding.Engine",
                    "served": served}
    data_config = load_config(args.config).data
    for split, variant, name, beam, no_repeat in runs:
        if variant not in variants:
            continue
        by_source = data_config if (split, variant, name) == ("test", "int8", served) else None
        result = evaluate_bundle(args.bundle, args.data_dir / f"{split}.tsv", beam_size=beam,
                                 no_repeat_ngram_size=no_repeat, variant=variant,
                                 by_source=by_source)
        scores.setdefault(split, {}).setdefault(variant, {})[name] = {
            key: result[key] for key in ("bleu", "chrf", "sentences")
        }
        if by_source is not None:
            scores[f"test_by_source_int8_{served}"] = result["by_source"]
        print(f"{split} {variant} {name}: BLEU {result['bleu']}, chrF {result['chrf']}",
              flush=True)
    manifest["scores"] = scores
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n",
                             encoding="utf-8")


if __name__ == "__main__":
    main()
