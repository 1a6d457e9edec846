"""LibreTranslate's own server, started so that it never reaches the network.

Run by ``bench/against_libretranslate.py`` with the Python of LibreTranslate's virtualenv
(``bench/libretranslate-venv.sh``), with LibreTranslate's command-line arguments:

    $LT_VENV/bin/python -P bench/libretranslate_offline.py --host 127.0.0.1 --port 5000 \
        --load-only en,de

(``-P``: this directory must not shadow the installed packages.) Two things LibreTranslate
1.9 does at start or on the first request would fetch files from GitHub; both are replaced:

* ``libretranslate.init.check_and_install_models``, which refreshes Argos' package index and
  downloads MiniSBD's sentence models whenever fewer than two packages are installed (the
  benchmark installs one, built locally): here it does nothing, and the installed package is
  served as it is.
* MiniSBD, Argos' default sentence splitter, downloads ``en.onnx`` on first use. Its
  ``split_sentences`` is replaced by a rule: a sentence ends at ``.``, ``!`` or ``?`` followed
  by white space. That costs LibreTranslate less per request than MiniSBD's model would, so
  the comparison errs in LibreTranslate's favour.

Everything else (Flask, waitress, Argos' tokenizer, CTranslate2 and its thread settings from
``ARGOS_INTER_THREADS``/``ARGOS_INTRA_THREADS``, beam from ``ARGOS_BEAM_SIZE``) is
LibreTranslate's as installed.
"""

from __future__ import annotations

import logging
import re
import sys

import argostranslate.sbd
import libretranslate.init
from libretranslate.main import main

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _installed_only(*args: object, **kwargs: object) -> None:
    print("offline: serving the installed Argos packages, no index refresh or download")


def _split_sentences(self: object, text: str) -> list[str]:
    return [part for part in _SENTENCE_END.split(text) if part.strip()] or [text]


libretranslate.init.check_and_install_models = _installed_only
# Argos logs every request's steps at INFO, and waitress' root handler prints them: this
# service runs at LOG_LEVEL=warning in the benchmark, and so does LibreTranslate.
logging.getLogger("argostranslate.utils").setLevel(logging.WARNING)
argostranslate.sbd.MiniSBDSentencizer.split_sentences = _split_sentences

if __name__ == "__main__":
    sys.exit(main())
