"""Markdown documents: each paragraph, heading, list item, table cell and HTML block is one
text, its inline formatting as HTML tags for the markup machinery, written back as Markdown.

Read and written with markdown-it-py (CommonMark, GitHub's tables, strikethrough and
autolinks via mdformat-gfm, front matter via mdit-py-plugins, kept byte for byte) and
rendered with mdformat, which escapes what the translation says where Markdown would read it
as syntax.
An inline text goes to the Translator as the HTML markdown-it renders it (``<em>``,
``<strong>``, ``<a href>``, ``<code>``, ``<img>``, ``<br>``), so a sentence crossing a link or
an emphasis is translated as one sentence, code spans and autolinks are kept whole, and the
translation's tags, which ``service.markup`` returns as the source's and in the same order,
are mapped back to the inline tokens they came from. Code blocks, front matter and link
destinations are not translated. The output is the document as mdformat writes it: the same
structure, with its normal spelling of list markers, emphasis and tables.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from types import SimpleNamespace

import mdformat.plugins
from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from mdformat.renderer import MDRenderer, RenderContext, RenderTreeNode
from mdit_py_plugins.container import container_plugin
from mdit_py_plugins.front_matter import front_matter_plugin

# A YAML (or TOML) header as static site generators read it: written back as it came.
FRONT_MATTER = SimpleNamespace(
    update_mdit=lambda mdit: mdit.use(front_matter_plugin),
    RENDERERS={"front_matter": lambda node, context: "\n".join(
        [node.markup, *node.content.splitlines(), node.markup])})


def _div(node: RenderTreeNode, context: RenderContext) -> str:
    """A pandoc fenced div (``::: {.cell .markdown}`` ... ``:::``), as pandoc writes it: its
    fences as they came around its blocks, which alone are translated."""
    opening, closing = node.nester_tokens.opening, node.nester_tokens.closing
    body = "\n\n".join(child.render(context) for child in node.children)
    return "\n".join(part for part in (opening.markup + opening.info, body, closing.markup)
                      if part)


# Pandoc's fenced divs (Jupytext and Quarto write them): a fence's attributes are not words.
PANDOC_DIVS = SimpleNamespace(
    update_mdit=lambda mdit: mdit.use(container_plugin, name="div",
                                      validate=lambda params, markup: True),
    RENDERERS={"container_div": _div})
_TAG = re.compile(r"(<[^<>]*>)")
_ATTRIBUTE = re.compile(r'\s(alt|title)="([^"]*)"')  # as markdown-it renders them
_SPACES = re.compile(r"\s+")
_WORD = re.compile(r"[^\W\d_]", re.UNICODE)


def _parser() -> MarkdownIt:
    """markdown-it set up as mdformat sets it up for its renderer: GitHub's flavour, front
    matter."""
    mdit = MarkdownIt("commonmark", renderer_cls=MDRenderer)
    mdit.options["mdformat"] = {"wrap": "keep", "number": True}  # 1. 2. 3., not 1. 1. 1.
    mdit.options["store_labels"] = True  # reference links keep their labels
    mdit.options["codeformatters"] = {}
    mdit.options["parser_extension"] = []
    # GitHub's flavour, footnotes, TeX math ($...$, $$...$$) and pandoc's fenced divs:
    # written back as they came.
    for plugin in (*(mdformat.plugins.PARSER_EXTENSIONS[name]
                     for name in ("gfm", "footnote", "dollarmath")), FRONT_MATTER, PANDOC_DIVS):
        mdit.options["parser_extension"].append(plugin)
        plugin.update_mdit(mdit)
    return mdit


@dataclass
class Markdown:
    parser: MarkdownIt
    tokens: list[Token]
    env: dict
    translated: list[Token]  # the inline and html_block tokens whose text is translated
    to_html: RendererHTML


def _to_html() -> RendererHTML:
    """markdown-it's HTML renderer, with TeX math and footnote references as code spans: the
    markup machinery keeps each whole, one tag in its sentence, and it comes back as written."""
    renderer = RendererHTML()

    def as_code(tokens: list[Token], index: int, options: dict, env: dict) -> str:
        return f"<code>{html.escape(tokens[index].content, quote=False)}</code>"

    for kind in ("math_inline", "math_inline_double", "footnote_ref"):
        renderer.rules[kind] = as_code
    return renderer


def read_markdown(text: str) -> tuple[Markdown, list[str]]:
    """A Markdown document and its texts: each inline (paragraph, heading, cell) holding a
    word, as HTML, and each HTML block."""
    parser, env = _parser(), {}
    tokens = parser.parse(text, env)
    to_html = _to_html()
    translated, texts = [], []
    for token in tokens:
        if token.type == "inline" and any(child.type == "text" and _WORD.search(child.content)
                                          for child in token.children or ()):
            translated.append(token)
            texts.append(to_html.renderInline(token.children or [], parser.options, env))
        elif token.type == "html_block" and _WORD.search(token.content):
            translated.append(token)
            texts.append(token.content)
    return Markdown(parser, tokens, env, translated, to_html), texts


def write_markdown(document: Markdown, translations: list[str]) -> str:
    for token, translation in zip(document.translated, translations, strict=True):
        if token.type == "html_block":
            token.content = translation.rstrip("\n") + "\n"
        else:
            token.children = _inline_tokens(token.children or [], document.to_html,
                                            document.parser.options, document.env, translation)
    return document.parser.renderer.render(document.tokens, document.parser.options,
                                           document.env)


def _inline_tokens(source: list[Token], to_html: RendererHTML, options: dict, env: dict,
                   translation: str) -> list[Token]:
    """The translated inline: its text as text tokens, each tag the source token it was
    rendered from, in order. A token rendered as several tags (a code span: ``<code>``, its
    code, ``</code>``) comes back whole at its first; what lies up to its last is its own."""
    tagged = iter([(token, count) for token in source
                   if (count := len(_TAG.findall(to_html.renderInline([token], options, env))))])
    out: list[Token] = []
    after_break, inside = False, 0  # inside: the tags still to pass of a token given back
    for piece in _TAG.split(translation):
        is_tag = bool(_TAG.fullmatch(piece))
        if inside:
            inside -= is_tag
            continue
        if is_tag:
            token, count = next(tagged, (None, 0))
            if token is not None:
                out.append(_with_attributes(token, piece))
                after_break, inside = token.type == "hardbreak", count - 1
                continue
        text = _SPACES.sub(" ", html.unescape(piece))
        if after_break or not out:
            text = text.lstrip()
        after_break = False
        if text:
            out.append(Token("text", "", 0, content=text))
    # Tags left over: never expected (the markup machinery returns every tag), never lost.
    out.extend(token for token, _ in tagged)
    if out and out[-1].type == "text":
        out[-1].content = out[-1].content.rstrip()
    return _spaces_outside(out)


def _with_attributes(token: Token, tag: str) -> Token:
    """``token`` (an image, a link) with the alt and title its translated ``tag`` carries:
    an image's alt text is its children, a title an attribute."""
    values = {name: html.unescape(value) for name, value in _ATTRIBUTE.findall(tag)}
    if not values:
        return token
    token = token.copy()
    if "title" in values and token.attrGet("title"):
        token.attrSet("title", values["title"])
    if token.type == "image" and values.get("alt"):
        token.children = [Token("text", "", 0, content=values["alt"])]
        token.content = values["alt"]
    return token


def _spaces_outside(tokens: list[Token]) -> list[Token]:
    """Spaces the model put just inside an emphasis, a strikethrough or a link moved out of
    it: Markdown does not read ``*word *`` as emphasis."""
    out: list[Token] = []
    for token in tokens:
        last = out[-1] if out else None
        if token.type.endswith("_close") and last is not None and last.type == "text" \
                and last.content != last.content.rstrip():
            last.content = last.content.rstrip()
            out += [token, Token("text", "", 0, content=" ")]
            continue
        if token.type == "text" and last is not None and last.type.endswith("_open") \
                and token.content != token.content.lstrip():
            token.content = token.content.lstrip()
            out.insert(len(out) - 1, Token("text", "", 0, content=" "))
        if token.type == "text" and last is not None and last.type == "text":
            last.content = _SPACES.sub(" ", last.content + token.content)
            continue
        out.append(token)
    return [token for token in out if token.type != "text" or token.content]
