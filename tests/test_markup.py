"""HTML/XML fragments: text translated, markup back byte for byte, tags never dropped."""

from __future__ import annotations

import random
import re

import pytest

from service.markup import parse

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Search &amp; replace</title>
  <style>p > b { color: red; }</style>
  <script>if (a < b && c) { document.write("<b>hi</b>"); }</script>
</head>
<body>
  <!-- navigation -->
  <h1 class="title">Welcome,   friends!</h1>
  <p>Click <a href="/find?q=1&amp;lang=en" title="Find &quot;it&quot;">here</a> to
     <b>search <i>everything</i></b>.</p>
  <ul>
    <li>One &mdash; first</li>
    <li><em>Two</em></li>
  </ul>
  First line<br>Second line<br/>
  <img src="a.png" alt="A picture"> A caption
  <pre>  keep   this  </pre>
  <p>Run <code>make &lt;target&gt;</code> and wait &#8230; &bogus; 5 &lt; 6</p>
  <p translate="no">Brand <b>Name</b></p>
  <div class="box notranslate">Do <div>not</div> touch</div>
  <textarea>Typed <b>text</b></textarea>
  <table><tr><td>Cell one</td><td>Cell two</td></tr></table>
</body>
</html>
"""

MALFORMED = [
    "<p>unclosed <b>bold <i>italic",
    "a < b and c > d",
    "stray < at the end <",
    "<p>Tom &amp Jerry &notanentity; &#xZZ; &#99999999;</p>",
    "</b>closing first<b>",
    "<p <b>broken tag</b>",
    '<a href="unterminated>text</a>',
    "<!-- unterminated comment",
    "<script>never closed",
    "<div translate=no>never closed <b>x</b>",
    "<![CDATA[x]]> <?pi x?> <!weird>",
    "<p>a<![</p><![if x>b</p>",  # CPython < 3.13's parser asserts on "<![" without a name
    "text with </> and <> and < / b>",
    "<b>x</i></b></b>",
    "",
    "   \n  ",
]


def tags(html: str) -> list[str]:
    return re.findall(r"<[^<>]*>", html)


@pytest.mark.parametrize(
    "html",
    [
        PAGE,
        "plain text, no markup",
        "  leading and trailing whitespace  \n",
        "<p>Hello <b>bold <i>nested</i></b> world</p>\n<p>Second</p>",
        '<a href="?a=1&amp;b=2" data-x=\'y\' disabled>Link</a>',
        "Fish &amp; chips &copy; 2024 &nbsp;&#169;&#xA9;",
        "<p>One<!-- note -->Two</p>",
        "<br><img src=x alt='Y'><hr/>",
        '<?xml version="1.0"?><doc><x:t a="1">Hello <g id="1">there</g></x:t>'
        "<![CDATA[raw <b>]]></doc>",
        "<DIV><P>Upper <B>case</B> tags</P></DIV>",
        *MALFORMED,
    ],
)
def test_identity_translation_gives_back_the_input_byte_for_byte(html):
    document = parse(html)
    assert document.render(document.segments) == html


def test_segments_are_the_texts_of_blocks_and_leave_the_rest_alone():
    assert parse(PAGE).segments == [
        "Search & replace",
        "Welcome,   friends!",
        'Click <a>here</a> to\n     <b>search <i>everything</i></b>.',
        "One \u2014 first",
        "Two",
        "First line",
        "Second line",
        "A caption",
        "Run <code/> and wait \u2026 &bogus; 5 < 6",
        "Cell one",
        "Cell two",
    ]


def test_upper_casing_changes_the_text_and_nothing_else():
    document = parse(PAGE)
    out = document.render([s.upper() for s in document.segments])
    assert tags(out) == tags(PAGE)
    assert '<a href="/find?q=1&amp;lang=en" title="Find &quot;it&quot;">HERE</a>' in out
    assert "<title>SEARCH &amp; REPLACE</title>" in out
    assert "<li>ONE &mdash; FIRST</li>" in out
    assert "<b>SEARCH <i>EVERYTHING</i></b>.</p>" in out
    assert "<pre>  keep   this  </pre>" in out
    assert "RUN <code>make &lt;target&gt;</code> AND WAIT" in out
    assert '<p translate="no">Brand <b>Name</b></p>' in out
    assert '<div class="box notranslate">Do <div>not</div> touch</div>' in out
    assert "<textarea>Typed <b>text</b></textarea>" in out
    assert 'document.write("<b>hi</b>")' in out
    assert "<!-- navigation -->" in out and out.startswith("<!DOCTYPE html>\n")
    assert "\n  <h1 class=\"title\">WELCOME,   FRIENDS!</h1>\n" in out


def test_inline_tags_follow_the_words_the_model_moved():
    document = parse('<p>Click <a href="/x">here</a> and <b>now</b>.</p>')
    assert document.segments == ["Click <a>here</a> and <b>now</b>."]
    out = document.render(["<b>Jetzt</b> <a>hier</a> klicken."])
    # a and b swapped places: order is kept by the tags matched in order (here <a>'s pair),
    # the other pair goes back by rule, and no tag is lost
    assert tags(out) == ["<p>", '<a href="/x">', "</a>", "<b>", "</b>", "</p>"]
    assert '<a href="/x">hier</a>' in out
    report = document.restore(["<b>Jetzt</b> <a>hier</a> klicken."])
    assert (report.text, report.by_model, report.by_rule) == (out, 2, 2)


def test_tags_the_model_dropped_come_back_where_the_source_had_them():
    document = parse("<p>Hello <b>world</b>!</p>")
    assert document.render(["Hallo Welt!"]) == "<p>Hallo <b>Welt</b>!</p>"
    assert document.render(["Hallo <b>Welt!"]) == "<p>Hallo <b>Welt</b>!</p>"
    assert document.render(["Hallo Welt</b>!"]) == "<p>Hallo <b>Welt</b>!</p>"
    # In a paragraph of several sentences a pair the model dropped stays about where it was
    # (its share of the text), on word edges: it does not spread over the sentences between
    # its neighbours.
    document = parse("<p>It batches sentences <em>continuously</em>: new ones join. It speaks "
                     "two APIs. Models ship in <code>m</code>.</p>")
    out = document.render(["Es bündelt Sätze: neue treten bei. Es spricht zwei APIs. Modelle "
                           "sind in <code/>."])
    assert out == ("<p>Es bündelt Sätze: <em>neue treten</em> bei. Es spricht zwei APIs. "
                   "Modelle sind in <code>m</code>.</p>")


def test_a_tag_put_back_by_rule_never_cuts_an_address():
    # The closing tag's share of the source lands on the dot of "example.org" in a shorter
    # translation; it goes to the nearer edge of the URL, not into it.
    document = parse('<p><a href="https://example.org/a">The cat is sleeping on the sofa.</a> '
                     "https://example.org/b</p>")
    assert document.render(["Das Kch. https://example.org/b"]) == (
        '<p><a href="https://example.org/a">Das Kch.</a> https://example.org/b</p>')
    assert document.render(["Die Katze schläft. Mail an anna.schmidt@example.com"]).count(
        "anna.schmidt@example.com") == 1


def test_tags_the_model_invented_or_mangled_are_not_let_through():
    document = parse("<p>The <i>quick</i> fox and the <b>lazy</b> dog.</p>")
    out = document.render(["Der <i>schnelle</b> Fuchs und der <b>faule</p> <br> Hund."])
    assert tags(out) == tags("<p>The <i>quick</i> fox and the <b>lazy</b> dog.</p>")
    assert out.startswith("<p>Der <i>schnelle")
    assert "faule</b> Hund" in out  # the invented <br> went with one of its spaces
    # tags with attributes of the model's own, and a tag it left open
    out = parse('<p>file <a href="/x">not</a> found</p>').render(
        ['Datei <a href="nota"> <a> nicht <a href="a>gefunden'])
    assert tags(out) == ["<p>", '<a href="/x">', "</a>", "</p>"]
    assert "&lt;a href" not in out and out.count("<a") == 1


def test_ignored_tags_are_left_alone_inside_their_sentence():
    fragment = "<p>Press <key>Ctrl+S</key> to save <x/> now.</p>"
    assert parse(fragment).segments == ["Press", "Ctrl+S", "to save", "now."]
    document = parse(fragment, ignore=["KEY", "x"])
    assert document.segments == ["Press <key/> to save <x/> now."]
    assert document.render(["Drücken Sie <key/>, um <x/> jetzt zu speichern."]) == (
        "<p>Drücken Sie <key>Ctrl+S</key>, um <x/> jetzt zu speichern.</p>")


def test_an_inline_element_left_alone_stays_whole_inside_its_sentence():
    document = parse("<p>Run <code>rm -rf &lt;dir&gt;</code> with care.</p>")
    assert document.segments == ["Run <code/> with care."]
    assert document.render(["Führe <code/> vorsichtig aus."]) == (
        "<p>Führe <code>rm -rf &lt;dir&gt;</code> vorsichtig aus.</p>")
    assert "<code>rm -rf &lt;dir&gt;</code>" in document.render(["Vorsichtig ausführen."])


def test_math_under_any_prefix_and_pandocs_tex_spans_stay_whole_in_their_sentence():
    fragment = ('<p>The area <m:math xmlns:m="http://www.w3.org/1998/Math/MathML"><m:mi>area'
                '</m:mi><m:mo>=</m:mo><m:msup><m:mi>r</m:mi><m:mn>2</m:mn></m:msup></m:math> '
                'grows with <span class="math inline">\\(r^2\\)</span> fast.</p>'
                '<p><mml:math display="block"><mml:mtext>Sum of all</mml:mtext></mml:math></p>'
                '<p><span class="math display">\\[\\text{total} = 1\\]</span></p>')
    document = parse(fragment)
    assert document.segments == ["The area <m:math/> grows with <span/> fast."]
    out = document.render(["Die Fläche <m:math/> wächst schnell mit <span/>."])
    assert out == fragment.replace("The area", "Die Fläche").replace(
        "grows with", "wächst schnell mit").replace(
        "</span> fast.", "</span>.")


def test_a_mark_alone_between_tags_stays_when_the_model_drops_it():
    # A Word paragraph whose period is a run of its own: the model keeps the tags, not it.
    document = parse('<r i="0">An external link in </r><r i="1">a popular site</r>'
                     '<r i="2">.</r>', inline=("r",))
    assert document.segments == ["<r>An external link in </r><r>a popular site</r><r>.</r>"]
    assert document.render(["<r>Ein externer Link in </r><r>eine beliebte Seite</r><r></r>"]) == (
        '<r i="0">Ein externer Link in </r><r i="1">eine beliebte Seite</r><r i="2">.</r>')
    # Where the model moved it into the words before, it is not doubled.
    assert document.render(["<r>Ein Link in </r><r>einer Seite.</r><r></r>"]) == (
        '<r i="0">Ein Link in </r><r i="1">einer Seite.</r><r i="2"></r>')


def test_tag_like_text_in_the_source_is_kept_too():
    document = parse("<p>if a < b > c then</p>")
    out = document.render(["wenn a c dann"])
    assert "< b >" in out


def test_the_model_reads_characters_and_entities_come_back_as_written():
    document = parse("<p>Fish &amp; chips&nbsp;&mdash; 5 &lt; 6 &amp;lt; &bogus; & more</p>")
    assert document.segments == ["Fish & chips\xa0\u2014 5 < 6 &amp;lt; &bogus; & more"]
    # the n-th "&" or "<" as the source wrote its n-th, a new one escaped, entities the
    # model wrote kept
    out = document.render(["Fisch & Pommes\xa0\u2014 & < &amp;lt; &bogus; Tom & Jerry <a x"])
    assert out == ("<p>Fisch &amp; Pommes&nbsp;&mdash; & &lt; &amp;lt; &bogus; "
                   "Tom &amp; Jerry &lt;a x</p>")


def test_whitespace_around_and_between_blocks_is_kept():
    html = "\n\t<p>  Hello  </p>\n\n<p>\n  World\n</p>  "
    document = parse(html)
    assert document.segments == ["Hello", "World"]
    assert document.render(["Hallo", "Welt"]) == "\n\t<p>  Hallo  </p>\n\n<p>\n  Welt\n</p>  "


def test_wrapping_tags_and_images_at_the_edges_stay_out_of_the_segment():
    document = parse('<li><b><a href="#">Whole item</a></b></li><p><img src=x> Caption</p>')
    assert document.segments == ["Whole item", "Caption"]


def test_render_needs_one_translation_a_segment():
    with pytest.raises(ValueError, match="2 segments, 1 translations"):
        parse("<p>a</p><p>b</p>").render(["x"])


def test_random_malformed_fragments_never_raise_and_round_trip():
    rng = random.Random(19)
    alphabet = [*"<>/&;=\"' abc\n", "<b>", "</b>", "<p>", "</i>", "&amp;", "<!--", "-->", "<br>",
                "<script>", "</script>", "<code>", "<![", "<![CDATA[", "]]>", "<?", "</>",
                "<!doctype"]
    for _ in range(2000):
        html = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        document = parse(html)
        assert document.render(document.segments) == html
        out = document.render(["x <b> y" for _ in document.segments])
        assert isinstance(out, str)


def test_alt_and_title_are_translated_only_when_asked():
    html = ('<p title="A &quot;tip&quot;">See <img src="c.png" alt="A cat &amp; dog"> and '
            "<a href=\"/\" TITLE='Home'>home</a>.</p><code title=\"Code\">x</code>"
            '<img alt=""><img alt=bare>')
    assert parse(html).segments == ["See <img/> and <a>home</a>."]
    document = parse(html, attributes=("alt", "title"))
    # texts first, then the quoted, non-empty values of tags not left alone
    assert document.segments == ["See <img/> and <a>home</a>.", 'A "tip"', "A cat & dog",
                                 "Home"]
    assert document.render(document.segments) == html
    out = document.render(["Siehe <img/> und <a>Start</a>.", 'Ein "Tipp" & mehr',
                           "Katze & Hund", "Start 'x'"])
    assert out == ('<p title="Ein &quot;Tipp&quot; &amp; mehr">Siehe <img src="c.png" '
                   'alt="Katze &amp; Hund"> und <a href="/" TITLE=\'Start &#39;x&#39;\'>Start'
                   '</a>.</p><code title="Code">x</code><img alt=""><img alt=bare>')
