"""Score saved translations of a prepared split by domain, with bootstrap intervals, without
decoding again; optionally only on the pairs another train split does not hold:

    python scripts/score-hypotheses.py runs/en-de/data/test.tsv runs/baseline/test.hyp \\
        configs/en-de.toml [--unseen-by runs/en-de-v1/data/train.tsv --leave-out bible]

``--unseen-by TRAIN.tsv`` leaves out every pair whose normalised source or target is in that
train split (what a model trained on it has seen), and first prints how many that is per
domain; ``--leave-out NAME`` leaves out the sources whose names contain NAME. The hypotheses
are one a line, in the split's order (``translate-train evaluate --hypotheses``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.config import load_config  # noqa: E402
from training.corpus import normalise, read_tsv  # noqa: E402
from training.evaluate import Rows, rows_by_domain, rows_by_source, score_rows  # noqa: E402


def _keep(rows: Rows, wanted) -> Rows:
    kept = [row for row in zip(*rows, strict=True) if wanted(row)]
    return tuple([row[i] for row in kept] for i in range(3))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("split", type=Path, help="the prepared split (TSV)")
    parser.add_argument("hypotheses", type=Path, help="its translations, one a line")
    parser.add_argument("config", type=Path, help="the config that prepared the split")
    parser.add_argument("--unseen-by", type=Path, help="leave out pairs this train split holds")
    parser.add_argument("--leave-out", action="append", default=[], metavar="NAME",
                        help="leave out sources whose name contains NAME (repeatable)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples (0: none)")
    args = parser.parse_args()
    data = load_config(args.config).data
    pairs = read_tsv(args.split)
    hypotheses = args.hypotheses.read_text(encoding="utf-8").split("\n")[: len(pairs)]
    groups = {name: rows for name, rows in rows_by_source(pairs, hypotheses, data).items()
              if not any(part in name for part in args.leave_out)}
    domains = {"all": list(groups), **{name: names for name, names in data.domains.items()
                                        if any(n in groups for n in names)}}
    if args.unseen_by:
        train = read_tsv(args.unseen_by)
        seen_sources = {normalise(s) for s, _ in train}
        seen_targets = {normalise(t) for _, t in train}

        def unseen(row: tuple[str, str, str]) -> bool:
            return normalise(row[0]) not in seen_sources and normalise(row[2]) not in seen_targets

        unseen_groups = {name: _keep(rows, unseen) for name, rows in groups.items()}
        for name, rows in rows_by_domain(groups, domains).items():
            left = len(_keep(rows, unseen)[0])
            print(f"{name}: {len(rows[0]) - left} of {len(rows[0])} pairs seen in "
                  f"{args.unseen_by}")
        groups = unseen_groups
    for name, (sources, hyps, refs) in rows_by_domain(groups, domains).items():
        scores = score_rows(sources, hyps, refs)
        kept = ", ".join(f"{kind} {v['rate']}% of {v['expected']}"
                         for kind, v in scores["verbatim"].items() if v["expected"])
        if args.bootstrap:
            bleu = BLEU().corpus_score(hyps, [refs], n_bootstrap=args.bootstrap)
            chrf = CHRF().corpus_score(hyps, [refs], n_bootstrap=args.bootstrap)
            figures = (f"BLEU {bleu.score:.2f} ± {bleu._ci:.2f}, "
                       f"chrF {chrf.score:.2f} ± {chrf._ci:.2f}")
        else:
            figures = f"BLEU {scores['bleu']}, chrF {scores['chrf']}"
        print(f"{name}: {len(hyps)} sentences, {figures}; kept: {kept}")


if __name__ == "__main__":
    main()
