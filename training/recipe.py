"""Rebuild a parallel training corpus from public packages: ``translate-train corpus``.

    translate-train corpus --target de --out runs/corpus/en-de
    translate-train corpus --target fr --out runs/corpus/en-fr --sources gettext-software
    translate-train corpus --target de --out DIR --recipe training/recipes/small.toml

A *recipe* (``training/recipes/debian.toml``) lists the sources; each is one output file
``{out}/{name}.tsv.xz`` (``English<TAB>Target``, UTF-8, xz, unique pairs, whitespace folded:
the layout ``translate-train prepare`` reads) made by one of these kinds:

``gettext``
    the gettext catalogs (``.mo``/``.po``) of a list of Debian packages for the target
    locale: msgid→msgstr; fuzzy, obsolete and untranslated entries skipped, plural entries
    only where the language has two forms, keyboard mnemonics (``_``/``&``) removed.
``ding``
    the Ding dictionary (Debian ``trans-de-en``, German only): ``part = "sentences"`` keeps the
    example sentences, ``part = "phrases"`` every other sub-entry (words and phrases).
``ddtp``
    Debian's package-description translations (DDTP): ``Translation-en`` and
    ``Translation-{target}``, paired by ``Description-md5``: short descriptions, and long
    ones paragraph by paragraph where both have as many paragraphs.

Packages come from apt (``apt-get download``, cached under ``--cache``), or from a folder of
``.deb`` files (``--debs``: nothing is downloaded); either way they are read with ``dpkg-deb``.
A source that does not hold the target language is skipped with a note. Beside the files go
``report.json`` (pairs, packages, versions and licences per source) and ``PROVENANCE.md``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import lzma
import re
import subprocess
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# Recipes live beside the code, not under configs/, whose every .toml is a training config.
RECIPES = Path(__file__).resolve().parent / "recipes"
DEFAULT_RECIPE = RECIPES / "debian.toml"
KINDS = ("gettext", "ding", "ddtp")


@dataclass
class SourceSpec:
    """One output file of a recipe."""

    name: str
    kind: str
    domain: str = ""
    packages: list[str] = field(default_factory=list)
    # Shown where a package's copyright file names no licence this can read.
    licence: str = ""
    languages: list[str] = field(default_factory=list)  # empty: any the packages hold
    part: str = ""  # ding: "sentences" | "phrases"
    exclude: list[str] = field(default_factory=list)  # catalog-name prefixes to leave out
    include: list[str] = field(default_factory=list)  # catalog-name prefixes to keep (all)
    # Packages whose "_"/"&" are not mnemonics (Dink's "&var" variables): kept as they are;
    # "*": every package of the source.
    keep_mnemonics: list[str] = field(default_factory=list)
    # The mark that ends a disambiguation prefix of msgids (Wesnoth's "female^Elvish Fighter",
    # "time of day^None"): removed, up to its last occurrence, from both sides of a pair.
    context_mark: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"source {self.name!r}: kind {self.kind!r} is not one of {KINDS}")


def load_recipe(path: str | Path = DEFAULT_RECIPE) -> list[SourceSpec]:
    raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    return [SourceSpec(**entry) for entry in raw.get("sources", [])]


# --- text ------------------------------------------------------------------------------------


def fold(text: str) -> str:
    return " ".join(text.split())


# A mnemonic marker: "_" or "&" right before a letter or digit ("_Open", "Spei&chern"), but not
# an HTML/XML entity ("&amp;", "&#39;").
_MNEMONIC = re.compile(r"[_&](?=\w)(?!#?\w+;)")


def strip_mnemonic(text: str) -> str:
    """``_Open``/``&Open``/``Ö_ffnen`` → ``Open``/``Öffnen``; ``&&`` → ``&``. Only a string with
    exactly one marker is changed, so ``file_name_max`` or ``a_b & c_d`` stay as they are."""
    if "&&" in text:
        text = text.replace("&&", "&")
    if len(_MNEMONIC.findall(text)) != 1:
        return text
    return _MNEMONIC.sub("", text)


def strip_mnemonics(src: str, tgt: str) -> tuple[str, str]:
    """Both sides' mnemonics, where the English side has one: an identifier such as
    ``find_call`` (one marker, no mnemonic in English) stays the same on both sides."""
    if len(_MNEMONIC.findall(src.replace("&&", ""))) != 1:
        return src, tgt
    return strip_mnemonic(src), strip_mnemonic(tgt)


# --- packages --------------------------------------------------------------------------------


class PackageSource:
    """Finds a package's .deb: in ``debs`` (a folder of local files, nothing downloaded) or
    with ``apt-get download`` into ``cache`` (kept, so a second run downloads nothing)."""

    def __init__(self, cache: str | Path, debs: str | Path | None = None,
                 download: Callable[[str, Path], None] | None = None) -> None:
        self.cache = Path(cache)
        self.debs = Path(debs) if debs else None
        self.download = download or apt_download

    def find(self, package: str) -> Path | None:
        folders = [self.debs] if self.debs else [self.cache]
        for folder in folders:
            found = sorted(folder.glob(f"{package}_*.deb")) if folder.is_dir() else []
            if found:
                return found[-1]
        if self.debs:
            return None
        self.cache.mkdir(parents=True, exist_ok=True)
        try:
            self.download(package, self.cache)
        except subprocess.CalledProcessError as exc:
            log.warning("apt-get download %s failed: %s", package, (exc.stderr or "").strip())
            return None
        found = sorted(self.cache.glob(f"{package}_*.deb"))
        return found[-1] if found else None


def apt_download(package: str, folder: Path) -> None:
    """``apt-get download PACKAGE`` in ``folder`` (needs ``apt-get update`` once before)."""
    subprocess.run(["apt-get", "download", "-q", package], cwd=folder, check=True,
                   capture_output=True, text=True)


def deb_fields(deb: Path) -> dict[str, str]:
    out = subprocess.run(["dpkg-deb", "-f", str(deb), "Package", "Version"], check=True,
                         capture_output=True, text=True).stdout
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def deb_members(deb: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(path, content) of the regular files in a .deb's data for which ``wanted(path)``, read
    as a stream from ``dpkg-deb --fsys-tarfile`` (nothing unpacked to disk)."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if member.isfile() and wanted(name):
                    handle = tar.extractfile(member)
                    if handle is not None:
                        yield name, handle.read()
    finally:
        proc.stdout.close()
        if proc.wait() not in (0, -13):  # -13: SIGPIPE when the reader stopped early
            raise RuntimeError(f"dpkg-deb --fsys-tarfile {deb} failed")


_DEP5_LICENSE = re.compile(r"^License:\s*(\S.*)$", re.MULTILINE)
_LICENCE_WORDS = [
    (re.compile(r"GNU (?:Lesser|Library) General Public License", re.I), "LGPL"),
    (re.compile(r"GNU (?:Affero )?General Public License", re.I), "GPL"),
    (re.compile(r"Mozilla Public License", re.I), "MPL"),
    (re.compile(r"Creative Commons|CC-BY", re.I), "CC"),
    (re.compile(r"BSD", re.I), "BSD"),
    (re.compile(r"Apache License", re.I), "Apache"),
    (re.compile(r"\bMIT\b|Expat", re.I), "MIT"),
]


def licence_of(copyright_text: str) -> str:
    """A short licence name from a Debian copyright file: the ``License:`` of its
    ``Files: *`` paragraph (machine-readable format), else the licence families it names."""
    if copyright_text.startswith("Format:") or "\nFiles:" in copyright_text:
        for paragraph in re.split(r"\n\s*\n", copyright_text):
            if re.search(r"^Files:\s*\*\s*$", paragraph, re.MULTILINE):
                match = _DEP5_LICENSE.search(paragraph)
                if match:
                    return match.group(1).strip()
        match = _DEP5_LICENSE.search(copyright_text)
        if match:
            return match.group(1).strip()
    families = [name for pattern, name in _LICENCE_WORDS if pattern.search(copyright_text)]
    return "/".join(dict.fromkeys(families))


# --- gettext ---------------------------------------------------------------------------------


def locale_names(lang: str) -> tuple[str, ...]:
    """Locale folder names that hold language ``lang``: ``de``, ``de_DE``."""
    return (lang, f"{lang}_{lang.upper()}")


def is_catalog(path: str, lang: str) -> bool:
    """A gettext catalog of ``lang``: ``…/locale/de/LC_MESSAGES/x.mo`` (or ``de_DE``), or a file
    named ``de.po``/``de.mo``/``x.de.po``/``x_de.po``."""
    p = Path(path)
    if p.suffix not in (".mo", ".po", ".gmo"):
        return False
    names = locale_names(lang)
    if p.parent.name == "LC_MESSAGES" and p.parent.parent.name in names:
        return True
    return p.stem in names or any(p.stem.endswith(sep + n) for n in names for sep in "._-")


def _nplurals(catalog) -> int:
    match = re.search(r"nplurals\s*=\s*(\d+)", catalog.metadata.get("Plural-Forms", ""))
    return int(match.group(1)) if match else 2


def catalog_pairs(path: str, data: bytes, strip: bool = True,
                  context_mark: str = "") -> Iterator[tuple[str, str]]:
    """English→target pairs of one .mo/.po catalog (read with polib); ``context_mark``: msgids
    may start with a context ending in it ("female^"), removed."""
    import polib

    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / Path(path).name
        file.write_bytes(data)
        catalog = polib.mofile(str(file)) if file.suffix in (".mo", ".gmo") else \
            polib.pofile(str(file))
    two_forms = _nplurals(catalog) == 2
    for entry in catalog:
        if entry.obsolete or "fuzzy" in entry.flags or not entry.msgid:
            continue
        if entry.msgid_plural:
            forms = entry.msgstr_plural
            candidates = [(entry.msgid, forms.get(0, ""))]
            if two_forms:
                candidates.append((entry.msgid_plural, forms.get(1, "")))
        else:
            candidates = [(entry.msgid, entry.msgstr)]
        for src, tgt in candidates:
            if context_mark and context_mark in src:
                src, tgt = src.rpartition(context_mark)[2], tgt.rpartition(context_mark)[2]
            if strip:
                src, tgt = strip_mnemonics(src, tgt)
            src, tgt = fold(src), fold(tgt)
            if src and tgt:
                yield src, tgt


# --- Ding ------------------------------------------------------------------------------------

DING_PATH = "usr/share/trans/de-en"
_DING_NOTE = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>")
_SENTENCE_END = re.compile(r"[.!?…][\"'”’»«)]*$")


def _split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
    parts.append(text[start:])
    return parts


def _ding_text(alternatives: str) -> str:
    first = _split_top(alternatives, ";")[0]
    return fold(_DING_NOTE.sub(" ", first)).strip(" ,")


def is_sentence(en: str, de: str) -> bool:
    return (len(en.split()) >= 3 and bool(_SENTENCE_END.search(en))
            and bool(_SENTENCE_END.search(de)) and (en[:1].isupper() or not en[:1].isalpha()))


def ding_pairs(text: str, part: str) -> Iterator[tuple[str, str]]:
    """English→German pairs of the Ding file (``German :: English``, ``|`` between sub-entries,
    ``;`` between alternatives): the first alternative of each sub-entry, ``{m}``/``[coll.]``/
    ``<…>`` notes removed; ``part`` "sentences" keeps the example sentences, "phrases" the rest."""
    for line in text.splitlines():
        if not line or line.startswith("#") or " :: " not in line:
            continue
        de_side, en_side = line.split(" :: ", 1)
        de_subs, en_subs = de_side.split(" | "), en_side.split(" | ")
        if len(de_subs) != len(en_subs):
            continue
        for de_sub, en_sub in zip(de_subs, en_subs, strict=True):
            de, en = _ding_text(de_sub), _ding_text(en_sub)
            if not de or not en or de == en:
                continue
            if is_sentence(en, de) == (part == "sentences"):
                yield en, de


# --- DDTP ------------------------------------------------------------------------------------


def fetch_translations(lists: Path, lang: str) -> None:
    """Download Debian's description translations (``Translation-en``, ``Translation-{lang}``)
    for the configured archives into ``lists``: ``apt-get update`` with its own lists and cache
    folders, so the system's package lists stay as they are."""
    lists = lists.resolve()  # apt reads a relative Dir::State::Lists as under /var/lib/apt
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    cache = lists.parent / "apt-cache"
    (cache / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["apt-get", "update", "-q", f"-o=Dir::State::Lists={lists}", f"-o=Dir::Cache={cache}",
         "-o=Acquire::Languages=", "-o=Acquire::Languages::=en",
         f"-o=Acquire::Languages::={lang}",
         "-o=Acquire::IndexTargets::deb::Packages::DefaultEnabled=false",
         "-o=APT::Get::List-Cleanup=false"],
        check=True, capture_output=True, text=True)


def _read_list(path: Path) -> str:
    """An apt list file, whatever apt compressed it with (apt-helper reads them all)."""
    helper = Path("/usr/lib/apt/apt-helper")
    if not helper.exists():
        return path.read_text(encoding="utf-8", errors="replace")
    out = subprocess.run([str(helper), "cat-file", str(path)], check=True, capture_output=True)
    return out.stdout.decode("utf-8", errors="replace")


def translation_files(lists: Path, lang: str) -> list[Path]:
    return sorted(p for p in lists.glob(f"*Translation-{lang}*") if p.is_file()
                  and not p.name.endswith((".diff", ".Index")))


def parse_translations(text: str, lang: str) -> dict[str, tuple[str, list[str]]]:
    """``Description-md5`` → (short description, long-description paragraphs)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for stanza in re.split(r"\n\s*\n", text):
        md5 = re.search(r"^Description-md5:\s*(\S+)", stanza, re.MULTILINE)
        desc = re.search(rf"^Description-{re.escape(lang)}:[ \t]*(.*)\n?((?:[ \t].*\n?)*)",
                         stanza, re.MULTILINE)
        if not md5 or not desc:
            continue
        paragraphs, current = [], []
        for line in desc.group(2).splitlines():
            if line.strip() == ".":
                paragraphs.append(fold(" ".join(current)))
                current = []
            else:
                current.append(line)
        paragraphs.append(fold(" ".join(current)))
        out[md5.group(1)] = (fold(desc.group(1)), [p for p in paragraphs if p])
    return out


def ddtp_pairs(english: dict, target: dict) -> Iterator[tuple[str, str]]:
    for md5, (short_tgt, paras_tgt) in target.items():
        if md5 not in english:
            continue
        short_en, paras_en = english[md5]
        if short_en and short_tgt:
            yield short_en, short_tgt
        if len(paras_en) == len(paras_tgt):
            yield from zip(paras_en, paras_tgt, strict=True)


# --- building --------------------------------------------------------------------------------


@dataclass
class SourceResult:
    name: str
    kind: str
    domain: str
    file: str = ""
    pairs: int = 0
    licence: str = ""
    packages: list[dict] = field(default_factory=list)
    skipped: str = ""  # why nothing was written


class PairWriter:
    """Unique, whitespace-folded pairs into an xz-compressed TSV, in first-seen order."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], None] = {}

    def add(self, pairs: Iterable[tuple[str, str]]) -> int:
        before = len(self.seen)
        for src, tgt in pairs:
            src, tgt = fold(src), fold(tgt)
            if src and tgt:
                self.seen.setdefault((src, tgt), None)
        return len(self.seen) - before

    def write(self, path: Path) -> int:
        tmp = path.with_name(path.name + ".part")
        with lzma.open(tmp, "wt", encoding="utf-8", preset=6) as f:
            for src, tgt in self.seen:
                f.write(f"{src}\t{tgt}\n")
        tmp.replace(path)
        return len(self.seen)


def _copyright_path(package: str) -> str:
    return f"usr/share/doc/{package}/copyright"


def _package_record(deb: Path, members: dict[str, bytes], spec: SourceSpec) -> dict:
    fields = deb_fields(deb)
    package = fields.get("Package", deb.name.split("_")[0])
    text = members.get(_copyright_path(package), b"").decode("utf-8", errors="replace")
    return {"package": package, "version": fields.get("Version", ""),
            "licence": licence_of(text) or spec.licence or "see the package's copyright file",
            "sha256": _sha256(deb)}


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def build_gettext(spec: SourceSpec, lang: str, packages: PackageSource,
                  writer: PairWriter) -> SourceResult:
    result = SourceResult(spec.name, spec.kind, spec.domain)
    for name in spec.packages:
        name = name.replace("{lang}", lang)
        deb = packages.find(name)
        if deb is None:
            result.packages.append({"package": name, "missing": True})
            continue
        members = dict(deb_members(
            deb, lambda p: (is_catalog(p, lang)
                            and not any(Path(p).name.startswith(x) for x in spec.exclude)
                            and (not spec.include
                                 or any(Path(p).name.startswith(x) for x in spec.include)))
            or p.endswith("/copyright")))
        record = _package_record(deb, members, spec)
        catalogs = sorted(p for p in members if not p.endswith("/copyright"))
        added = 0
        for path in catalogs:
            try:
                added += writer.add(catalog_pairs(
                    path, members[path], context_mark=spec.context_mark,
                    strip=not {name, "*"} & set(spec.keep_mnemonics)))
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                log.warning("%s: %s: %s", name, path, exc)
        record.update(catalogs=len(catalogs), pairs=added)
        result.packages.append(record)
    return result


def build_ding(spec: SourceSpec, lang: str, packages: PackageSource,
               writer: PairWriter) -> SourceResult:
    result = SourceResult(spec.name, spec.kind, spec.domain)
    for name in spec.packages:
        deb = packages.find(name)
        if deb is None:
            result.packages.append({"package": name, "missing": True})
            continue
        members = dict(deb_members(deb, lambda p: p == DING_PATH or p.endswith("/copyright")))
        record = _package_record(deb, members, spec)
        text = members.get(DING_PATH, b"").decode("utf-8", errors="replace")
        record["pairs"] = writer.add(ding_pairs(text, spec.part or "phrases"))
        result.packages.append(record)
    return result


def build_ddtp(spec: SourceSpec, lang: str, lists: Path, writer: PairWriter,
               fetch: bool) -> SourceResult:
    result = SourceResult(spec.name, spec.kind, spec.domain)
    if fetch and not translation_files(lists, lang):
        try:
            fetch_translations(lists, lang)
        except subprocess.CalledProcessError as exc:
            result.skipped = f"apt-get update for Translation-{lang} failed: {exc.stderr.strip()}"
            return result
    files_en, files_tgt = translation_files(lists, "en"), translation_files(lists, lang)
    if not files_tgt:
        result.skipped = f"no Translation-{lang} in the archive's lists"
        return result
    english: dict = {}
    for path in files_en:
        english.update(parse_translations(_read_list(path), "en"))
    for path in files_tgt:
        added = writer.add(ddtp_pairs(english, parse_translations(_read_list(path), lang)))
        result.packages.append({"package": path.name, "pairs": added})
    result.licence = spec.licence
    return result


def build_corpus(target: str, out: str | Path, sources: list[str] | None = None,
                 recipe: str | Path = DEFAULT_RECIPE, cache: str | Path | None = None,
                 debs: str | Path | None = None, lists: str | Path | None = None,
                 source_lang: str = "en") -> dict:
    """Write ``{out}/{source}.tsv.xz`` for each recipe source that holds ``target``, and
    ``report.json`` and ``PROVENANCE.md`` beside them; returns the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache) if cache else out.parent / "cache"
    specs = load_recipe(recipe)
    if sources:
        unknown = set(sources) - {s.name for s in specs}
        if unknown:
            raise ValueError(f"unknown source(s) {sorted(unknown)}; the recipe has "
                             f"{[s.name for s in specs]}")
        specs = [s for s in specs if s.name in sources]
    packages = PackageSource(cache / "debs", debs)
    lists_dir = Path(lists) if lists else cache / "lists"
    results = []
    for spec in specs:
        if spec.languages and target not in spec.languages:
            results.append(SourceResult(spec.name, spec.kind, spec.domain, skipped=(
                f"holds {'/'.join(spec.languages)} only, not {target}")))
            log.info("%s: skipped (%s)", spec.name, results[-1].skipped)
            continue
        log.info("%s: building (%s, %d packages)", spec.name, spec.kind, len(spec.packages))
        writer = PairWriter()
        if spec.kind == "gettext":
            result = build_gettext(spec, target, packages, writer)
        elif spec.kind == "ding":
            result = build_ding(spec, target, packages, writer)
        else:
            result = build_ddtp(spec, target, lists_dir, writer, fetch=lists is None)
        if not result.licence:
            licences = [p["licence"] for p in result.packages if p.get("licence")]
            result.licence = ", ".join(dict.fromkeys(licences)) or spec.licence
        path = out / f"{spec.name}.tsv.xz"
        if writer.seen:
            result.pairs = writer.write(path)
            result.file = path.name
        else:
            path.unlink(missing_ok=True)
            if not result.skipped:
                missing = [p["package"] for p in result.packages if p.get("missing")]
                result.skipped = (f"no {target} pairs" + (
                    f" (packages not found: {', '.join(missing)})" if missing else ""))
        results.append(result)
        log.info("%s: %d pairs%s", spec.name, result.pairs,
                 f" ({result.skipped})" if result.skipped else "")
    report = {"source_lang": source_lang, "target_lang": target, "recipe": str(recipe),
              "sources": [asdict(r) for r in results],
              "total": sum(r.pairs for r in results)}
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    (out / "PROVENANCE.md").write_text(provenance_markdown(report), encoding="utf-8")
    return report


def _packages_text(result: dict) -> str:
    found = [f"{p['package']} {p.get('version', '')}".strip() for p in result["packages"]
             if not p.get("missing")]
    missing = [p["package"] for p in result["packages"] if p.get("missing")]
    text = ", ".join(found)
    if missing:
        text += f" (not found: {', '.join(missing)})"
    return text


def provenance_markdown(report: dict) -> str:
    src, tgt = report["source_lang"], report["target_lang"]
    lines = [f"# {src}→{tgt} parallel corpus, rebuilt by `translate-train corpus`", "",
             f"Each file is `English<TAB>{tgt}`, one pair a line, UTF-8, xz-compressed, unique "
             "pairs, whitespace folded. Recipe: `" + report["recipe"] + "`; per-package "
             "versions, licences and .deb checksums are in report.json.", "",
             "| file | pairs | kind | from | licence | domain |", "|---|---:|---|---|---|---|"]
    for r in report["sources"]:
        if r["skipped"] and not r["pairs"]:
            continue
        lines.append(f"| {r['file']} | {r['pairs']:,} | {r['kind']} | "
                     f"{_packages_text(r).replace('|', '/')} | {r['licence']} | {r['domain']} |")
    skipped = [r for r in report["sources"] if r["skipped"] and not r["pairs"]]
    if skipped:
        lines += ["", "Not built:", ""]
        lines += [f"- {r['name']}: {r['skipped']}" for r in skipped]
    return "\n".join(lines) + "\n"


def format_report(report: dict) -> str:
    width = max([len(r["name"]) for r in report["sources"]] + [6])
    rows = [f"{'source':<{width}}  {'pairs':>9}  licence / note"]
    for r in report["sources"]:
        note = f"skipped: {r['skipped']}" if r["skipped"] and not r["pairs"] else r["licence"]
        rows.append(f"{r['name']:<{width}}  {r['pairs']:>9,}  {note}")
    rows.append(f"{'total':<{width}}  {report['total']:>9,}")
    return "\n".join(rows)
