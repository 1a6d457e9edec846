"""Bring existing Transformer checkpoints in: each format's reader fills ``training.model``'s
Transformer, and the usual export (parity and batch-invariance checks included) writes the
bundle, so an imported model is served exactly like one trained here.

``import_model(source, out)`` recognises the format from the files: a Hugging Face MarianMT
directory (``hf_marian``, as Opus-MT models are published), a CTranslate2 model directory or
an Argos Translate package (``ctranslate2``, as LibreTranslate installs them). A source that
is not a Transformer encoder-decoder, or uses a feature this model does not have, is refused
with an ``UnsupportedModel`` naming it, never converted approximately.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from training.model import Transformer

# A multilingual model's target-language token, as Opus-MT writes it: >>fra<<, >>pt_BR<<
LANGUAGE_TOKEN = re.compile(r"^>>([A-Za-z]{2,3}(?:_[A-Za-z]+)?)<<$")


def language_tokens(pieces: list[str]) -> dict[str, str]:
    """{language: token} of the target-language tokens among a source vocabulary's pieces."""
    found = (LANGUAGE_TOKEN.match(piece) for piece in pieces)
    return {match.group(1).lower(): match.group(0) for match in found if match}


class UnsupportedModel(ValueError):
    """The source is not a model this project can serve, or uses a feature it lacks."""


@dataclasses.dataclass
class Imported:
    """A foreign checkpoint as our model, with what the bundle needs besides the weights."""

    model: Transformer
    source_tokenizer: Path
    target_tokenizer: Path | None  # None: the source's serves both sides
    vocabulary: dict[str, list[str]] | None  # {"source": pieces, "target": pieces}
    source_lang: str | None
    target_lang: str | None
    target_languages: dict[str, str]  # {language: token} of a multilingual model
    origin: dict[str, Any]
    # What a source gets besides its pieces (``service.vocabulary.SourceFormat``), and the
    # id of the BOS it starts with when it gets one.
    source_format: dict[str, bool] = dataclasses.field(
        default_factory=lambda: {"add_bos": False, "add_eos": True})
    source_bos_id: int | None = None


def read_source(source: str | Path) -> Imported:
    """Read ``source`` in whichever supported format its files show."""
    from training.importers import ctranslate2, hf_marian

    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_dir() and hf_marian.recognise(path):
        return hf_marian.read(path)
    if ctranslate2.recognise_argos(path):
        return ctranslate2.read_argos(path)
    if path.is_dir() and ctranslate2.recognise(path):
        return ctranslate2.read(path)
    raise UnsupportedModel(
        f"{path}: not a recognised model (expected a Hugging Face MarianMT directory: "
        "config.json, model.safetensors or pytorch_model.bin, source.spm, target.spm, "
        "vocab.json; a CTranslate2 directory: model.bin, config.json, vocabulary; or an "
        "Argos Translate package: .argosmodel or its folder with metadata.json and model/)")


def import_model(source: str | Path, out_dir: str | Path, *, int8: bool = False,
                 fp16: bool = False, calibration: str | Path | None = None,
                 source_lang: str | None = None,
                 target_lang: str | None = None, default_variant: str | None = None,
                 decoding: dict[str, Any] | None = None,
                 target_languages: dict[str, str] | None = None) -> Path:
    """Write a bundle of ``source`` to ``out_dir``; the flags' languages are used where the
    source's own metadata names none (and override it when given). ``target_languages``
    ({language: token}) serves those of a multilingual model's targets only, under those
    codes ({"es": ">>spa<<"}); None serves every target its vocabulary has a token for."""
    from training.export import export_bundle

    imported = read_source(source)
    source_lang = (source_lang or imported.source_lang or "").lower()
    target_lang = (target_lang or imported.target_lang or "").lower()
    if not source_lang or not target_lang:
        raise UnsupportedModel(f"{source}: its metadata names no languages; give "
                               "--source-lang and --target-lang")
    if target_languages is not None:
        unknown = set(target_languages.values()) - set(imported.target_languages.values())
        if unknown:
            raise UnsupportedModel(f"{source}: no target-language token {sorted(unknown)} in "
                                   "its vocabulary")
        imported.target_languages = dict(target_languages)
    model = imported.model
    checkpoint = {
        "model": model.state_dict(),
        "model_config": dataclasses.asdict(model.config),
        "vocab": str(imported.source_tokenizer),
        "step": None,
        "import": {
            "source_lang": source_lang,
            "target_lang": target_lang,
            "target_tokenizer": str(imported.target_tokenizer or ""),
            "vocabulary": imported.vocabulary,
            "target_languages": imported.target_languages,
            "origin": imported.origin,
            "source_format": imported.source_format,
            "source_bos_id": imported.source_bos_id,
        },
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "imported.pt"
        torch.save(checkpoint, path)
        return export_bundle(path, out_dir, int8=int8, fp16=fp16, calibration=calibration,
                             default_variant=default_variant or ("int8" if int8 else "fp32"),
                             decoding=decoding)
