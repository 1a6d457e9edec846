"""HTML as Mastodon, Discourse, Lemmy and Misskey write it survives translation.

For every sample of tests/fixtures/platform-html/ and whatever the model does with its
segments (here: simulated models that rewrite, drop, break and reorder tags, and the real tiny
bundle through both compatible APIs), the translation has the source's tags in the same order
with every attribute as written; code, URLs, link texts that are addresses, mentions, hashtags
and emoji shortcodes come back byte for byte; no piece of a tag shows up as text; and only the
prose changes. Each output is read with the same parser the service uses (``html.parser``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from service.markup import parse
from service.placeholders import protect
from tests.test_api import check_app

CORPUS = sorted((Path(__file__).parent / "fixtures" / "platform-html").glob("*.html"))
SAMPLES = {path.stem: path.read_text(encoding="utf-8") for path in CORPUS}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
# Written here independently of service/placeholders.py: what must never be translated.
TOKEN = re.compile(
    r"https?://[^\s<>\"]+[^\s<>\".,:;!?)]"  # URLs
    r"|[@!][\w.-]*\w@[\w-]+(?:\.[\w-]+)+|@\w+"  # @user@host, !community@host, @user
    r"|#\w*[^\W\d_]\w*"  # hashtags
    r"|\u200b?:[\w+-]{2,}:\u200b?")  # emoji shortcodes, with Misskey's zero-width spaces
HANDLE_CLASSES = {"mention", "hashtag", "hashtag-cooked", "mention-group", "h-card"}
# Tags that do not end a run of text ("#<span>tag</span>" reads "#tag").
INLINE = {"a", "b", "del", "em", "i", "img", "s", "small", "span", "strong", "sub", "sup", "u"}


@dataclass
class Shape:
    """What must survive of a fragment: its tags as written, the text of its code, the text
    of each link or handle element (in order), all text outside code, and the texts outside
    code (to look for pieces of tags)."""

    tags: list[tuple[str, str]] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    links: list[tuple[dict[str, str | None], str]] = field(default_factory=list)
    prose: str = ""
    texts: list[str] = field(default_factory=list)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.shape = Shape()
        self.open: list[tuple[str, dict[str, str | None], list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.shape.tags.append(("start", self.get_starttag_text() or ""))
        self._cut(tag)
        if tag not in VOID:
            self.open.append((tag, dict(attrs), []))

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.shape.tags.append(("start", self.get_starttag_text() or ""))
        self._cut(tag)

    def handle_endtag(self, tag: str) -> None:
        self.shape.tags.append(("end", tag))
        self._cut(tag)
        while self.open:
            name, attrs, texts = self.open.pop()
            if name == "a" or HANDLE_CLASSES & set((attrs.get("class") or "").split()):
                self.shape.links.append((attrs, "".join(texts)))
            if name == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, _, texts in self.open:
            texts.append(data)
        if any(name in ("code", "pre") for name, _, _ in self.open):
            self.shape.code.append(data)
        else:
            self.shape.prose += data
            self.shape.texts.append(data)


    def _cut(self, tag: str) -> None:
        if tag not in INLINE:
            self.shape.prose += "\n"


def shape(fragment: str) -> Shape:
    reader = _Reader()
    reader.feed(fragment)
    reader.close()
    return reader.shape


def must_keep(attrs: dict[str, str | None], text: str) -> bool:
    """A link whose text is an untranslatable item, an address shown without its scheme, or
    an element marked as a mention or hashtag."""
    shown = text.strip().rstrip("\u2026")
    href = (attrs.get("href") or "").lower()
    return bool(TOKEN.fullmatch(shown) or (shown and " " not in shown and "." in shown
                                           and shown.lower() in href)
                or HANDLE_CLASSES & set((attrs.get("class") or "").split()))


def check_survives(source: str, translated: str) -> None:
    before, after = shape(source), shape(translated)
    assert after.tags == before.tags, "tags or attributes changed"
    assert after.code == before.code
    assert len(after.links) == len(before.links)
    for (attrs, text), (_, out) in zip(before.links, after.links, strict=True):
        if must_keep(attrs, text):
            assert out == text, (attrs, text, out)
    tokens = set(TOKEN.findall(before.prose))
    for token in tokens:
        assert after.prose.count(token) == before.prose.count(token), token
    # The samples' prose holds no "<" or ">": any in the output is a piece of a tag.
    assert not any(re.search("[<>]", text) for text in before.texts)
    assert not [text for text in after.texts if re.search("[<>]", text)]


def test_the_corpus_holds_every_platform_and_the_untranslatables_it_should():
    assert {name.split("-")[0] for name in SAMPLES} == {"mastodon", "discourse", "lemmy",
                                                        "misskey"}
    everything = "".join(SAMPLES.values())
    for needle in ('<span class="invisible">', '<span class="ellipsis">', 'class="h-card"',
                   'class="mention hashtag"', 'class="emojione custom-emoji"', "<br />",
                   '<aside class="quote', '<aside class="onebox', '<a class="mention"',
                   '<code class="lang-python">', "@alice@", "!selfhosted@", ":blobcat:",
                   "\u200b:blobcat_thumbsup:\u200b"):
        assert needle in everything, needle
    for name, html in SAMPLES.items():
        assert len(re.findall(r"\b[a-z]+ [a-z]+ [a-z]+\b", shape(html).prose)) >= 3, name


# Simulated models, each applied to a segment with its untranslatables masked, as the service
# masks them (service/placeholders.py): they do what the shipped model was seen to do.
def _reverse_words(text: str) -> str:  # rewrites every word, tag names included
    return re.sub(r"[A-Za-z]+", lambda m: m.group()[::-1], text)


def _without_tags(text: str) -> str:
    return re.sub(r"<[^<>]*>", "", text)


def _broken_closing_tags(text: str) -> str:  # "https://</span>" came back as "https://span>"
    return re.sub(r"</(\w+)>", r"\1>", text)


def _words_backwards(text: str) -> str:  # reorders words and tags
    return " ".join(reversed(text.split(" ")))


def _without_markers(text: str) -> str:
    return re.sub(r"\{\d+\}", "", text)


def _doubled(text: str) -> str:  # every tag and marker twice, a stray "<" and ">"
    return re.sub(r"<[^<>]*>|\{\d+\}", lambda m: m.group() * 2, text) + " <a >"


MODELS: dict[str, Callable[[str], str]] = {
    "reverse_words": _reverse_words, "without_tags": _without_tags,
    "broken_closing_tags": _broken_closing_tags, "words_backwards": _words_backwards,
    "without_markers": _without_markers, "doubled": _doubled,
}


def translate_markup(html: str, model: Callable[[str], str]) -> str:
    document = parse(html)
    translations = []
    for segment in document.segments:
        protected = protect(segment.replace("\n", " "))
        translations.append(protected.restore(model(protected.text)).text)
    return document.render(translations)


@pytest.mark.parametrize("name", SAMPLES)
def test_an_unchanged_translation_gives_the_sample_back_byte_for_byte(name):
    assert translate_markup(SAMPLES[name], lambda text: text) == SAMPLES[name]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", SAMPLES)
def test_whatever_the_model_does_markup_and_untranslatables_survive(name, model):
    translated = translate_markup(SAMPLES[name], MODELS[model])
    check_survives(SAMPLES[name], translated)
    if model == "reverse_words":
        assert shape(translated).prose != shape(SAMPLES[name]).prose  # the prose did change


def test_the_reported_mastodon_link_and_hashtag():
    link = ('<a href="https://example.com/x" rel="nofollow noopener" target="_blank"><span '
            'class="invisible">https://</span><span class="">example.com/x</span><span '
            'class="invisible"></span></a>')
    hashtag = ('<a href="https://m.social/tags/opensource" class="mention hashtag" rel="tag">'
               "#<span>opensource</span></a>")
    document = parse(f"<p>Read my blog {link} about {hashtag} software.</p>")
    # each stays whole, as one tag in its sentence: the model never sees "https://"
    assert document.segments == ["Read my blog <a/> about <a/> software."]
    out = document.render(["Lies meinen Blog <a/> über <a/>-Software."])
    assert out == f"<p>Lies meinen Blog {link} über {hashtag}-Software.</p>"


def test_a_dropped_item_goes_back_after_the_words_with_its_space():
    document = parse('<p>Thanks to <a href="/u/bob" class="mention">@bob</a> for this.</p>')
    assert document.render(["Danke dafür."]) == (
        '<p>Danke dafür <a href="/u/bob" class="mention">@bob</a>.</p>')


def test_tags_the_model_broke_are_mended_and_no_piece_of_them_is_left():
    # as the shipped model wrote "https://</span>" when it saw Mastodon's link
    document = parse("<p>See <span>https://</span><span>example.com</span> now</p>")
    assert document.render(["Siehe <span>https://span><span>example.com</span> jetzt"]) == (
        "<p>Siehe <span>https://</span><span>example.com</span> jetzt</p>")
    document = parse("<p>The <b>quick</b> fox and the <i>lazy</i> dog.</p>")
    out = document.render(["Der <b>schnelleb> Fuchs und der <i>faule /i> Hund."])
    assert out == "<p>Der <b>schnelle</b> Fuchs und der <i>faule </i> Hund.</p>"
    out = document.render(["Der <b schnelle Fuchs</b und der <i>faule Hund."])
    assert out == "<p>Der <b> schnelle Fuchs</b> und der <i>faule</i> Hund.</p>"
    # text of the source that looks like one stays
    assert parse("<p>Type <b>a></b> to go on.</p>").render(["Tippe <b>a></b> weiter."]) == (
        "<p>Tippe <b>a></b> weiter.</p>")


# The real tiny bundle (tests/conftest.py) through both compatible APIs: it translates these
# samples badly, which is fine, as what is checked holds whatever a model writes.
def test_the_corpus_through_the_libretranslate_api(tiny_bundle: Path) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        for name, html in SAMPLES.items():
            response = await client.post("/libretranslate/translate", json={
                "q": html, "source": "en", "target": "de", "format": "html"})
            assert response.status_code == 200, response.text
            translated = response.json()["translatedText"]
            check_survives(html, translated)
            assert shape(translated).prose != shape(html).prose, name

    check_app(tiny_bundle, check)


def test_the_corpus_through_the_deepl_api(tiny_bundle: Path) -> None:
    async def check(client: httpx.AsyncClient) -> None:
        response = await client.post("/v2/translate", json={
            "text": list(SAMPLES.values()), "target_lang": "DE", "tag_handling": "html"})
        assert response.status_code == 200, response.text
        translations = [t["text"] for t in response.json()["translations"]]
        for (name, html), translated in zip(SAMPLES.items(), translations, strict=True):
            check_survives(html, translated)
            assert shape(translated).prose != shape(html).prose, name

    check_app(tiny_bundle, check)
