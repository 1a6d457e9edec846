"""Text to the model's token ids and back: SentencePiece, and the vocabulary behind the ids.

A bundle trained here has one SentencePiece model whose ids are the model's ids. An imported
one may have two SentencePiece models (Marian: ``source.spm`` and ``target.spm``) whose pieces
are looked up in the model's own vocabulary (``vocab.json``), and a target-language token that
starts the source (``>>fra<<`` in Opus-MT's multilingual models). The manifest says which:
``tokenizer``, optional ``target_tokenizer``, optional ``vocabulary`` ({"source": file,
"target": file}, each a JSON list of pieces, the index being the id) and optional
``target_languages`` ({language: token}), and optional ``source_format`` (``SourceFormat``:
whether a source gets BOS and EOS).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sentencepiece as spm

_DIGIT = re.compile(r"\d")
_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPECIAL = re.compile(r"<[^<>]*>|>>[^<>]*<<")  # <s>, </s>, <unk>, >>fra<< write no text


def _written_digits(piece: str) -> frozenset[str]:
    """The digits a piece writes: those of its text, or the one it is the byte of."""
    byte = _BYTE.fullmatch(piece)
    if byte:  # an ASCII byte; one above 0x7F is part of a longer character ("ò": C3 B2)
        char = chr(int(byte.group(1), 16))
        return frozenset(char if char.isascii() and char.isdigit() else "")
    return frozenset() if _SPECIAL.fullmatch(piece) else frozenset(_DIGIT.findall(piece))


@dataclass(frozen=True)
class SourceFormat:
    """What a source gets besides its pieces, as the model was trained: a BOS first (some
    OpenNMT-tf models), an EOS last (models trained here, Marian; not OpenNMT-py's, and so
    not Argos Translate's). A multilingual model's target-language token comes after the BOS,
    before the pieces. The manifest's ``source_format``; its absence means EOS only."""

    add_bos: bool = False
    add_eos: bool = True

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> SourceFormat:
        found = manifest.get("source_format") or {}
        unknown = set(found) - {"add_bos", "add_eos"}
        if unknown or not all(isinstance(v, bool) for v in found.values()):
            raise ValueError(f"bad source_format {found!r}: add_bos and add_eos, true or false")
        return cls(**found)


class Vocabulary:
    """Encodes source text to ids (with BOS and EOS as its ``SourceFormat`` says) and decodes
    target ids to text."""

    def __init__(self, source_model: Path, target_model: Path | None = None,
                 source_pieces: list[str] | None = None,
                 target_pieces: list[str] | None = None, *, unk_id: int, eos_id: int,
                 target_languages: dict[str, str] | None = None, bos_id: int | None = None,
                 source_format: SourceFormat = SourceFormat()):
        self.source = spm.SentencePieceProcessor(model_file=str(source_model))
        self.target = (spm.SentencePieceProcessor(model_file=str(target_model))
                       if target_model else self.source)
        self.unk_id, self.eos_id, self.bos_id = unk_id, eos_id, bos_id
        self.source_format = source_format
        if source_format.add_bos and bos_id is None:
            raise ValueError("sources start with BOS (source_format) but no BOS id is given")
        self.source_pieces, self.target_pieces = source_pieces, target_pieces
        self._source_ids = ({piece: i for i, piece in enumerate(source_pieces)}
                            if source_pieces is not None else None)
        self._target_ids: dict[str, int] | None = None  # built when first needed
        self._banned_for: dict[frozenset[str], list[int]] = {}  # digits_not_in, by digits held
        self.target_languages = dict(target_languages or {})
        self._language_ids = {lang: self._piece_id(token)
                              for lang, token in self.target_languages.items()}
        unknown = [t for lang, t in self.target_languages.items()
                   if self._language_ids[lang] == unk_id]
        if unknown:
            raise ValueError(f"target-language token(s) {unknown} are not in the vocabulary")

    @classmethod
    def from_manifest(cls, directory: Path, manifest: dict[str, Any]) -> Vocabulary:
        ids = manifest["special_ids"]
        files = manifest.get("vocabulary") or {}
        pieces = {side: json.loads((directory / name).read_text(encoding="utf-8"))
                  for side, name in files.items()}
        target = manifest.get("target_tokenizer")
        return cls(directory / manifest["tokenizer"], directory / target if target else None,
                   pieces.get("source"), pieces.get("target"), unk_id=ids["unk"],
                   eos_id=ids["eos"], target_languages=manifest.get("target_languages"),
                   bos_id=ids.get("source_bos", ids["bos"]),
                   source_format=SourceFormat.from_manifest(manifest))

    def _piece_id(self, piece: str) -> int:
        if self._source_ids is None:
            return self.source.piece_to_id(piece)
        return self._source_ids.get(piece, self.unk_id)

    def encode(self, text: str, target_lang: str | None = None) -> list[int]:
        """Source ids of ``text`` as the model reads them: BOS and EOS as its source format
        says, the target-language token first when the model needs one (``target_lang``
        must then be one of ``target_languages``). Never empty: a text of no pieces, for a
        model without EOS, is EOS alone."""
        if self._source_ids is None:
            ids = self.source.encode(text)
        else:
            ids = [self._source_ids.get(p, self.unk_id)
                   for p in self.source.encode(text, out_type=str)]
        if self.target_languages:
            if target_lang not in self._language_ids:
                raise ValueError(f"target language {target_lang!r} is not one of "
                                 f"{sorted(self.target_languages)}")
            ids.insert(0, self._language_ids[target_lang])
        if self.source_format.add_bos:
            assert self.bos_id is not None  # checked in __init__
            ids.insert(0, self.bos_id)
        if self.source_format.add_eos or not ids:
            ids.append(self.eos_id)
        return ids

    @functools.cached_property
    def _source_digits(self) -> dict[int, frozenset[str]]:
        size = (len(self.source_pieces) if self.source_pieces is not None
                else self.source.get_piece_size())
        return {i: digits for i in range(size) if (digits := _written_digits(self.source_piece(i)))}

    @functools.cached_property
    def _target_digits(self) -> dict[int, frozenset[str]]:
        size = (len(self.target_pieces) if self.target_pieces is not None
                else self.target.get_piece_size())
        return {i: digits for i in range(size) if (digits := _written_digits(self.piece(i)))}

    def digits_not_in(self, source_ids: Sequence[int]) -> list[int]:
        """The target pieces that write a digit the source (ids from ``encode``) does not hold
        (``DecodeOptions.digits_from_source``): with no digit in the source, every digit
        piece; with the markers {0} and {1} of masked items, those that write a 2 ... 9."""
        held = frozenset().union(*(self._source_digits.get(token, ()) for token in source_ids))
        if held not in self._banned_for:
            self._banned_for[held] = [i for i, digits in self._target_digits.items()
                                      if not digits <= held]
        return self._banned_for[held]

    def source_piece(self, token: int) -> str:
        """The source piece of id ``token``."""
        if self.source_pieces is None:
            return self.source.id_to_piece(token)
        return self.source_pieces[token]

    def target_id(self, piece: str) -> int:
        """The id of target piece ``piece`` (the unknown id when it has none)."""
        if self.target_pieces is None:
            return self.target.piece_to_id(piece)
        if self._target_ids is None:
            self._target_ids = {p: i for i, p in enumerate(self.target_pieces)}
        return self._target_ids.get(piece, self.unk_id)

    def piece(self, token: int) -> str:
        """The target piece of id ``token``."""
        if self.target_pieces is None:
            return self.target.id_to_piece(token)
        return self.target_pieces[token]

    def decode(self, ids: Sequence[int]) -> str:
        """Target text of ``ids`` (without BOS/EOS); language tokens are left out, and so are
        byte pieces that form no character: SentencePiece decodes them as U+FFFD, which no
        translation means (an undertrained model emits such runs)."""
        if self.target_pieces is None:
            text = self.target.decode(list(ids))
        else:
            language_tokens = set(self.target_languages.values())
            text = self.target.decode_pieces(
                [p for p in map(self.target_pieces.__getitem__, ids) if p not in language_tokens])
        return text.replace("\ufffd", "")
