"""Subtitles: SubRip (``.srt``, the srt library) and WebVTT (``.vtt``, webvtt-py); numbering,
identifiers, timing, cue settings and notes kept, each subtitle's lines translated together."""

from __future__ import annotations

from dataclasses import dataclass

import srt
import webvtt

from service.documents.cues import Cue, decode, encode
from service.documents.errors import DocumentError


@dataclass
class Subtitles:
    document: list[srt.Subtitle] | webvtt.WebVTT
    cues: list[Cue]


def read_srt(text: str) -> tuple[Subtitles, list[str]]:
    try:
        subtitles = list(srt.parse(text))
    except srt.SRTParseError as exc:
        raise DocumentError(f"The subtitles cannot be read: {exc}") from None
    cues = [encode(subtitle.content, escaped=False) for subtitle in subtitles]
    return Subtitles(subtitles, cues), [cue.fragment for cue in cues]


def write_srt(document: Subtitles, translations: list[str]) -> str:
    """The subtitles with their translations; a subtitle without a number stays without."""
    blocks = []
    for subtitle, cue, translation in zip(document.document, document.cues, translations,
                                          strict=True):
        subtitle.content = decode(translation, cue, escaped=False)
        block = subtitle.to_srt()
        blocks.append(block.split("\n", 1)[1] if subtitle.index is None else block)
    return "".join(blocks)


def read_vtt(text: str) -> tuple[Subtitles, list[str]]:
    try:
        captions = webvtt.from_string(text)
    except webvtt.errors.MalformedFileError as exc:
        raise DocumentError(f"The subtitles cannot be read: {exc}") from None
    cues = [encode(caption.raw_text, escaped=True) for caption in captions]
    return Subtitles(captions, cues), [cue.fragment for cue in cues]


def write_vtt(document: Subtitles, translations: list[str]) -> str:
    for caption, cue, translation in zip(document.document, document.cues, translations,
                                          strict=True):
        caption.text = decode(translation, cue, escaped=True)
    return document.document.content
