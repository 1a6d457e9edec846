"""Everyday sentences through one or more bundles, as the service answers them, as a Markdown
table: the probe the default model's card shows before and after.

    python scripts/everyday.py models/en-de runs/NEW-BUNDLE

scripts/score-everyday.py scores bundles on 210 such sentences against references.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.translator import Translator

# What a new user types first: travel, plans, greetings, requests, and numbers, an e-mail
# address, a URL and a name that must come through.
SENTENCES = [
    "Where is the train station?",
    "The train to Munich is twenty minutes late.",
    "We are going to the cinema tonight.",
    "The train to Munich is 20 minutes late.",
    "Hello. Good morning! Thank you very much. How are you?",
    "Excuse me, please, can I get past?",
    "The weather is nice today, so we are going for a walk in the park.",
    "Please send the invoice to anna.schmidt@example.com by 15 March 2024.",
    "Visit https://www.example.org/help for more information.",
    "Captain Reynolds wants 300 credits for the job.",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", help="bundle directories, one column each")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    columns = []
    for bundle in args.bundles:
        # The service's defaults (DEFAULT_BEAM, the bundle's decoding); no cache needed.
        with Translator.open(bundle, threads=args.threads, workers=1, cache_mb=0) as translator:
            columns.append([result.text for result in translator.translate_batch(SENTENCES)])
    print("| source | " + " | ".join(args.bundles) + " |")
    print("|---" * (len(args.bundles) + 1) + "|")
    for index, sentence in enumerate(SENTENCES):
        cells = [column[index].replace("|", "\\|") for column in columns]
        print(f"| {sentence} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
