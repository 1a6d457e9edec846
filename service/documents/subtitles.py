"""Subtitles: SubRip (``.srt``, the srt library) and WebVTT (``.vtt``, webvtt-py); numbering,
identifiers, timing, cue settings and notes kept, each subtitle's lines translated together."""

from __future__ import annotations

import srt
import webvtt

from service.documents.errors import DocumentError


def read_srt(text: str) -> tuple[list[srt.Subtitle], list[str]]:
    try:
        subtitles = list(srt.parse(text))
    except srt.SRTParseError as exc:
        raise DocumentError(f"The subtitles cannot be read: {exc}") from None
    return subtitles, [subtitle.content for subtitle in subtitles]


def write_srt(subtitles: list[srt.Subtitle], translations: list[str]) -> str:
    for subtitle, content in zip(subtitles, translations, strict=True):
        subtitle.content = content
    return srt.compose(subtitles, reindex=False)


def read_vtt(text: str) -> tuple[webvtt.WebVTT, list[str]]:
    try:
        captions = webvtt.from_string(text)
    except webvtt.errors.MalformedFileError as exc:
        raise DocumentError(f"The subtitles cannot be read: {exc}") from None
    return captions, [caption.text for caption in captions]


def write_vtt(captions: webvtt.WebVTT, translations: list[str]) -> str:
    for caption, text in zip(captions, translations, strict=True):
        caption.text = text
    return captions.content


